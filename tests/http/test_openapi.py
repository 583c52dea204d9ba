"""The OpenAPI document: checked in, equal to the generated one, and true of the server.

Schemathesis generates requests from the checked-in document (a short run: a few
examples per operation; ``make fuzz-http`` runs 200 each) and sends them to a running
``callgate serve --http``: no response is a 5xx, and every status, content type and body
matches the document. The event stream is left out (it does not end by itself); its own
test reads it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from callgate.surfaces.http.openapi import render
from tests.http_support import HttpServe

DOC = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"

schema = schemathesis.openapi.from_path(str(DOC)).exclude(operation_id="streamPending")


def test_checked_in_document_equals_the_generated_one() -> None:
    assert DOC.read_text() == render(), "docs/openapi.json is stale: run `make openapi`"


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServe]:
    root = tmp_path_factory.mktemp("http-fuzz")
    env = {"CALLGATE_HTTP_RATE_PER_S": "1000", "CALLGATE_HTTP_RATE_BURST": "1000"}
    env["CALLGATE_HTTP_PROPOSE_WAIT_S"] = "5"
    serve = HttpServe(root / "state", root / "serve.log", env=env, dev=True)
    try:
        serve.wait_ready()
        yield serve
    finally:
        assert serve.stop() == 0
        log = serve.log.read_text()
        assert "Traceback" not in log, log


def test_the_server_serves_the_checked_in_document(fuzz_server: HttpServe) -> None:
    """The checked-in document is a production server's; development mode only adds the
    sample-user routes."""
    served = httpx.get(f"{fuzz_server.url}/v1/openapi.json").json()
    checked_in = json.loads(DOC.read_text())
    for path, operations in checked_in["paths"].items():
        assert served["paths"][path] == operations, path
    assert set(served["paths"]) - set(checked_in["paths"]) == {
        "/v1/dev/users",
        "/v1/dev/sessions",
    }
    for name, model in checked_in["components"]["schemas"].items():
        assert served["components"]["schemas"][name] == model, name


@schema.parametrize()
@settings(
    max_examples=int(os.environ.get("CALLGATE_FUZZ_EXAMPLES", "6")),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
@pytest.mark.fuzz
def test_the_api_conforms_to_its_document(case: Any, fuzz_server: HttpServe) -> None:
    token = fuzz_server.token("alice", "acme", "support", "finance-approver")
    response = case.call(base_url=fuzz_server.url, headers={"Authorization": f"Bearer {token}"})
    case.validate_response(
        response,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
