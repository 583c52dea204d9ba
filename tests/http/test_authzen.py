"""The AuthZEN Authorization API 1.0 against a real ``callgate serve --http`` (ADR 0083).

The server runs the interop's API-gateway scenario as a profile (``authzen/interop.yaml``
and ``.cedar``), and the scenario's published decision set (``authzen/decisions.json``,
copied from openid/authzen, see ``authzen/SOURCE.md``) is replayed through the single and
the batch endpoints (development mode: the tests mint tokens of the development issuer;
the deployment's issuer works the same). A PEP authenticates with its own session
(``callgate-pep``); each subject's session token is forwarded in
``subject.properties.token``, as callgate never takes a subject on the caller's word.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.http_support import HttpServe, running

HERE = Path(__file__).parent / "authzen"
DECISIONS: list[dict[str, Any]] = json.loads((HERE / "decisions.json").read_text())["evaluation"]
TENANT = "interop"
# The scenario's users (their ``sub``) and roles, as its PIP lists them.
ROLES = {
    "CiRmZDA2MTRkMy1jMzlhLTQ3ODEtYjdiZC04Yjk2ZjVhNTEwMGQSBWxvY2Fs": ("admin", "evil_genius"),
    "CiRmZDE2MTRkMy1jMzlhLTQ3ODEtYjdiZC04Yjk2ZjVhNTEwMGQSBWxvY2Fs": ("editor",),
    "CiRmZDI2MTRkMy1jMzlhLTQ3ODEtYjdiZC04Yjk2ZjVhNTEwMGQSBWxvY2Fs": ("editor",),
    "CiRmZDM2MTRkMy1jMzlhLTQ3ODEtYjdiZC04Yjk2ZjVhNTEwMGQSBWxvY2Fs": ("viewer",),
    "CiRmZDQ2MTRkMy1jMzlhLTQ3ODEtYjdiZC04Yjk2ZjVhNTEwMGQSBWxvY2Fs": ("viewer",),
}
RICK, _, _, BETH, _ = ROLES


@pytest.fixture(scope="module")
def interop_http_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HttpServe]:
    root = tmp_path_factory.mktemp("authzen")
    serve = HttpServe(root / "state", root / "serve.log", profile=HERE / "interop.yaml", dev=True)
    with running(serve):
        yield serve


@pytest.fixture(scope="module")
def tokens(interop_http_serve: HttpServe) -> dict[str, str]:
    return {user: interop_http_serve.token(user, TENANT, *roles) for user, roles in ROLES.items()}


@pytest.fixture(scope="module")
def pep(interop_http_serve: HttpServe) -> httpx.Client:
    return interop_http_serve.client(
        interop_http_serve.token("todo-gateway", TENANT, "callgate-pep")
    )


def forwarded(request: dict[str, Any], tokens: dict[str, str]) -> dict[str, Any]:
    """The harness's request as a PEP sends it to callgate: with the subject's token."""
    out = copy.deepcopy(request)
    subject = out["subject"]
    subject["properties"] = {**subject.get("properties", {}), "token": tokens[subject["id"]]}
    return out


def audited(interop_http_serve: HttpServe) -> list[dict[str, Any]]:
    with interop_http_serve.client(
        interop_http_serve.token("auditor", TENANT, "callgate-operator")
    ) as c:
        r = c.get("/v1/audit")
    assert r.status_code == 200, r.text
    records: list[dict[str, Any]] = r.json()
    return records


def test_metadata_names_the_evaluation_endpoints(interop_http_serve: HttpServe) -> None:
    r = httpx.get(f"{interop_http_serve.url}/.well-known/authzen-configuration")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {
        "policy_decision_point": interop_http_serve.url,
        "access_evaluation_endpoint": f"{interop_http_serve.url}/access/v1/evaluation",
        "access_evaluations_endpoint": f"{interop_http_serve.url}/access/v1/evaluations",
        "access_request_endpoint": f"{interop_http_serve.url}/access/v1/requests",
        "capabilities": ["urn:openid:authzen:capability:access-request"],
    }


def new_records(interop_http_serve: HttpServe, before: set[str]) -> list[dict[str, Any]]:
    return [r for r in audited(interop_http_serve) if r["invocation_id"] not in before]


def asked(case: dict[str, Any]) -> tuple[str, str, str]:
    request = case["request"]
    return request["subject"]["id"], request["action"]["name"], request["resource"]["id"]


def assert_audited(records: list[dict[str, Any]], cases: list[dict[str, Any]]) -> None:
    """One audit record per evaluation: who, what, on which target, the policy's decision
    and the outcome, with nothing run."""
    found = sorted(
        (
            r["authorized_by"]["principal"]["user"],
            r["tool"],
            r["target"],
            r["authorized_by"]["decision"],
            r["outcome"],
        )
        for r in records
    )
    wanted = sorted(
        (*asked(c), "permit" if c["expected"] else "deny",
         "permitted" if c["expected"] else "tool_forbidden")
        for c in cases
    )  # fmt: skip
    assert found == wanted
    assert all(r["proposed_by"] == "model" for r in records)


def test_every_interop_decision_one_by_one_each_in_the_audit(
    interop_http_serve: HttpServe, pep: httpx.Client, tokens: dict[str, str]
) -> None:
    before = {r["invocation_id"] for r in audited(interop_http_serve)}
    for case in DECISIONS:
        r = pep.post("/access/v1/evaluation", json=forwarded(case["request"], tokens))
        assert r.status_code == 200, r.text
        assert r.json()["decision"] is case["expected"], (asked(case), r.text)
        if not case["expected"]:
            context = r.json()["context"]
            assert context["outcome"] == "tool_forbidden" and context["invocation_id"]
    assert_audited(new_records(interop_http_serve, before), DECISIONS)


def test_every_interop_decision_in_one_batch_round_trip(
    interop_http_serve: HttpServe, pep: httpx.Client, tokens: dict[str, str]
) -> None:
    before = {r["invocation_id"] for r in audited(interop_http_serve)}
    body = {"evaluations": [forwarded(c["request"], tokens) for c in DECISIONS]}
    r = pep.post("/access/v1/evaluations", json=body)
    assert r.status_code == 200, r.text
    got = [d["decision"] for d in r.json()["evaluations"]]
    assert got == [c["expected"] for c in DECISIONS]
    assert_audited(new_records(interop_http_serve, before), DECISIONS)


def beth_asks(tokens: dict[str, str], semantic: str, *methods: str) -> dict[str, Any]:
    """A batch with top-level defaults: Beth (a viewer) on /todos, one method each."""
    return {
        "subject": {"type": "identity", "id": BETH, "properties": {"token": tokens[BETH]}},
        "resource": {"type": "route", "id": "/todos"},
        "options": {"evaluations_semantic": semantic},
        "evaluations": [{"action": {"name": m}} for m in methods],
    }


@pytest.mark.parametrize(
    ("semantic", "methods", "decisions"),
    [
        ("execute_all", ("GET", "POST", "GET"), [True, False, True]),
        ("deny_on_first_deny", ("GET", "POST", "GET"), [True, False]),
        ("permit_on_first_permit", ("POST", "GET", "POST"), [False, True]),
        ("permit_on_first_permit", ("POST", "PUT"), [False, False]),
    ],
)
def test_batch_semantics_stop_where_the_specification_says(
    interop_http_serve: HttpServe,
    pep: httpx.Client,
    tokens: dict[str, str],
    semantic: str,
    methods: tuple[str, ...],
    decisions: list[bool],
) -> None:
    before = {r["invocation_id"] for r in audited(interop_http_serve)}
    r = pep.post("/access/v1/evaluations", json=beth_asks(tokens, semantic, *methods))
    assert r.status_code == 200, r.text
    assert [d["decision"] for d in r.json()["evaluations"]] == decisions
    assert len(new_records(interop_http_serve, before)) == len(decisions)  # nothing past the stop


def test_evaluations_without_an_array_is_one_evaluation(
    pep: httpx.Client, tokens: dict[str, str]
) -> None:
    body = forwarded(DECISIONS[0]["request"], tokens)
    r = pep.post("/access/v1/evaluations", json=body)
    assert r.status_code == 200 and r.json() == {"decision": True}, r.text


def test_a_self_asserted_subject_is_refused_and_nothing_recorded(
    interop_http_serve: HttpServe, pep: httpx.Client, tokens: dict[str, str]
) -> None:
    before = {r["invocation_id"] for r in audited(interop_http_serve)}
    bare = copy.deepcopy(DECISIONS[0]["request"])  # Rick, no token: the harness's shape
    r = pep.post("/access/v1/evaluation", json=bare)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated", r.text
    # Beth's token, Rick's id: a subject id the forwarded session does not hold.
    spoofed = forwarded(DECISIONS[0]["request"], tokens)
    spoofed["subject"]["properties"]["token"] = tokens[BETH]
    r = pep.post("/access/v1/evaluation", json=spoofed)
    assert r.status_code == 403 and r.json()["error"]["code"] == "identity_spoof", r.text
    forged = forwarded(DECISIONS[0]["request"], tokens)
    forged["subject"]["properties"]["token"] = tokens[RICK][:-4] + "AAAA"
    r = pep.post("/access/v1/evaluation", json=forged)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated", r.text
    # One bad subject refuses the whole batch: nothing of it is decided.
    batch = {"evaluations": [forwarded(DECISIONS[0]["request"], tokens), bare]}
    r = pep.post("/access/v1/evaluations", json=batch)
    assert r.status_code == 401, r.text
    assert new_records(interop_http_serve, before) == []


def test_only_an_authenticated_pep_may_ask(
    interop_http_serve: HttpServe, tokens: dict[str, str]
) -> None:
    body = forwarded(DECISIONS[0]["request"], tokens)
    r = httpx.post(f"{interop_http_serve.url}/access/v1/evaluation", json=body)
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
    # A subject's own session is no PEP: it cannot ask about itself or anyone.
    with interop_http_serve.client(tokens[RICK]) as c:
        r = c.post("/access/v1/evaluation", json=body)
    assert r.status_code == 403 and r.json()["error"]["code"] == "pep_required"
    # A PEP of another tenant does not decide for this one.
    with interop_http_serve.client(
        interop_http_serve.token("other-gw", "globex", "callgate-pep")
    ) as c:
        r = c.post("/access/v1/evaluation", json=body)
    assert r.status_code == 403 and r.json()["error"]["code"] == "pep_required"


@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (lambda b: b.pop("resource"), "resource"),
        (lambda b: b["resource"].update(type="document"), "target argument 'route'"),
        (lambda b: b.update(context={"route": "/users/x"}), "differs from resource.id"),
        (lambda b: b["action"].pop("name"), "action.name"),
        (lambda b: b.update(subject="Rick"), "subject"),
    ],
)
def test_bad_input_is_400_invalid_request(
    pep: httpx.Client, tokens: dict[str, str], edit: Any, says: str
) -> None:
    body = forwarded(DECISIONS[0]["request"], tokens)
    edit(body)
    r = pep.post("/access/v1/evaluation", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_request" and says in r.text


@pytest.mark.parametrize(
    "body",
    [
        b'{"subject": {"type": "identity", "id": "a", "id": "b"}}',
        b'{"subject": {"type": "identity", "i\\u0064": "a", "id": "b"}}',
        b'{"context": {"n": NaN}}',
        b'{"context": {"s": "\\ud800"}}',
        b'{"context": {"s": "\xff"}}',
    ],
)
def test_the_strict_reader_refuses_what_parsers_could_read_differently(
    pep: httpx.Client, body: bytes
) -> None:
    r = pep.post(
        "/access/v1/evaluation", content=body, headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text


def test_unknown_members_are_ignored_and_the_request_id_echoed(
    pep: httpx.Client, tokens: dict[str, str]
) -> None:
    body = forwarded(DECISIONS[0]["request"], tokens)
    body["subject"]["properties"]["department"] = "R&D"
    body["future_member"] = {"x": 1}
    r = pep.post("/access/v1/evaluation", json=body, headers={"X-Request-ID": "req-41"})
    assert r.status_code == 200 and r.json() == {"decision": True}, r.text
    assert r.headers["X-Request-ID"] == "req-41"
    assert r.headers["Cache-Control"] == "no-store"


def test_an_unknown_action_is_a_recorded_denial(
    interop_http_serve: HttpServe, pep: httpx.Client, tokens: dict[str, str]
) -> None:
    before = {r["invocation_id"] for r in audited(interop_http_serve)}
    body = forwarded(DECISIONS[0]["request"], tokens)
    body["action"]["name"] = "PATCH"
    r = pep.post("/access/v1/evaluation", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["decision"] is False
    assert r.json()["context"]["outcome"] == "unknown_tool"
    [record] = new_records(interop_http_serve, before)
    assert record["outcome"] == "unknown_tool" and record["tool"] == "PATCH"
