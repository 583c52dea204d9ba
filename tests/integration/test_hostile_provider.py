"""A provider that answers what callgate cannot record never stalls the executor (C12).

A real HTTP server stands in for a hostile or broken system of record: every answer is a
well-formed JSON object holding a number canonical JSON cannot represent (``1e400``, which
parses to infinity). Whatever the call (dry-run, execute, lookup, describe), the answer
becomes a coded outcome of that one call and the executor goes on deciding the next:
a dry-run fails, an ownership question fails closed, an execution is ``outcome_uncertain``
(the effect may exist) and stays so when its lookup answers the same.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from tests.integration.test_http_provider import CREDENTIAL, crm_profile

from callgate.bootstrap import Settings
from callgate.surfaces.sdk import Gateway, connect

HUGE = b"1e400"  # valid JSON; float('inf') in Python, which no canonical JSON holds


class Hostile(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        asked = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        if self.path == "/describe" and asked["target"] == "C-2":  # a sound answer
            body = b'{"found": true, "tenant": "acme", "attributes": {}}'
        elif self.path == "/describe":
            body = b'{"found": true, "tenant": "acme", "attributes": {"score": %s}}' % HUGE
        elif self.path == "/dry_run":
            body = b'{"snapshot": {"balance": %s}}' % HUGE
        else:  # /execute
            body = b'{"result": {"id": "C-9", "balance": %s}}' % HUGE
        self._reply(body)

    def do_GET(self) -> None:  # /lookup/{token}
        self._reply(b'{"found": true, "result": {"balance": %s}}' % HUGE)

    def _reply(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def hostile_provider_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setenv("CRM_TOKEN", CREDENTIAL)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    profile = crm_profile(tmp_path / "profile", url)
    g = connect(Settings(state_dir=tmp_path / "state", profile=profile, dev=True))
    try:
        yield g
    finally:
        g.close()
        server.shutdown()
        server.server_close()


def test_unrecordable_answers_are_coded_outcomes_and_nothing_stalls(
    hostile_provider_gateway: Gateway,
) -> None:
    alice = hostile_provider_gateway.app.session_issuer.issue(
        "alice", "acme", ["support"], hostile_provider_gateway.app.clock()
    )

    # describe: the attributes cannot be recorded in the decision, so nobody owns it.
    read = hostile_provider_gateway.propose(alice, "crm.read", {"contact_id": "C-1"}, timeout_s=20)
    assert read["outcome"] == "tool_forbidden", read
    assert "provider answer unusable" in json.dumps(read), read

    # dry-run (C-2 is described soundly): no snapshot to confirm, so no approval either.
    update = {"contact_id": "C-2", "fields": {"tier": "gold"}}
    dry = hostile_provider_gateway.propose(alice, "crm.update", update, "u-1", timeout_s=20)
    assert dry["outcome"] == "execution_failed", dry  # what a failed dry-run answers
    assert "provider answer unusable" in json.dumps(dry), dry

    # execute: the effect may exist; uncertain, then the retry's lookup answers the same.
    create = hostile_provider_gateway.propose(
        alice, "crm.create", {"name": "Ada"}, "c-1", timeout_s=20
    )
    assert create["outcome"] == "outcome_uncertain", create
    again = hostile_provider_gateway.propose(
        alice, "crm.create", {"name": "Ada"}, "c-1", timeout_s=20
    )
    assert again["outcome"] == "outcome_uncertain", again

    # The same executor still decides and runs the next call of another provider.
    ticket = hostile_provider_gateway.propose(
        alice, "tickets.read", {"ticket_id": "T-77"}, timeout_s=20
    )
    assert ticket["outcome"] == "executed", ticket
