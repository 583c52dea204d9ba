"""The checked-in HTTP provider protocol is the reference server's generated OpenAPI."""

from __future__ import annotations

from pathlib import Path

from callgate.providers.reference_server import openapi_document

DOC = Path(__file__).resolve().parents[2] / "docs" / "provider-http.openapi.yaml"


def test_the_checked_in_protocol_document_matches_the_reference_server() -> None:
    assert DOC.read_text() == openapi_document(), (
        "regenerate: python -m callgate.providers.reference_server --openapi"
        " > docs/provider-http.openapi.yaml"
    )
