"""``callgate keys generate`` and ``callgate config check`` as an adopter runs them, and a
broken configuration failing at start (docs/reference/configuration.md, ADR 0013)."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.e2e.helpers import EXIT_MISUSE, run

pytestmark = pytest.mark.e2e


def test_keys_generate_then_config_check(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    made = run(None, "keys", "generate", "--kind", "session", "--alg", "ES256",
               "--kid", "idp-1", "--out", str(keys)).value  # fmt: skip
    assert made["alg"] == "ES256" and made["jwks_kids"] == ["idp-1"]
    assert stat.S_IMODE(Path(made["private_key"]).stat().st_mode) == 0o600
    for kid, alg in (("apr-1", "EdDSA"), ("apr-2", "RS256")):
        run(None, "keys", "generate", "--kind", "approval", "--alg", alg, "--kid", kid,
            "--out", str(keys))  # fmt: skip
    jwks = json.loads((keys / "approval-jwks.json").read_text())
    assert [k["kid"] for k in jwks["keys"]] == ["apr-1", "apr-2"]
    assert all("d" not in k for k in jwks["keys"])  # public keys only
    again = run(None, "keys", "generate", "--kind", "approval", "--kid", "apr-1",
                "--out", str(keys), rc=EXIT_MISUSE)  # fmt: skip
    assert again.value["error"]["code"] == "usage"
    assert "already exists" in again.value["error"]["message"]

    conf = tmp_path / "callgate.toml"
    conf.write_text(
        "[[sessions.issuers]]\n"
        'issuer = "https://idp.example"\n'
        'jwks_file = "keys/session-jwks.json"\n'
        'algorithms = ["ES256"]\n'
        "clock_skew_s = 10\n"
        "[approvals]\n"
        'signing_kid = "apr-2"\n'
        'signing_key_file = "keys/apr-2.pem"\n'
        'jwks_file = "keys/approval-jwks.json"\n'
    )
    view = run(tmp_path / "state", "--config", str(conf), "config", "check", dev=False).value
    assert view["ok"] is True and view["config_file"] == str(conf)
    assert view["development_mode"] is False and view["development_issuer"] is None
    assert view["session_issuers"] == [
        {
            "issuer": "https://idp.example",
            "audience": "callgate",
            "algorithms": ["ES256"],
            "clock_skew_s": 10,
            "kids": ["idp-1"],
        }
    ]
    assert view["approvals"] == {
        "source": "configuration",
        "signing_kid": "apr-2",
        "signing_alg": "RS256",
        "verification_kids": ["apr-1", "apr-2"],
    }
    assert "PRIVATE KEY" not in json.dumps(view)
    # callgate.toml in the state directory is found without --config.
    state = tmp_path / "state2"
    state.mkdir()
    (state / "callgate.toml").write_text(conf.read_text().replace("keys/", f"{keys}/"))
    found = run(state, "config", "check").value
    assert found["config_file"] == str(state / "callgate.toml")
    assert found["development_mode"] is True  # CALLGATE_DEV=1 from the test environment


def test_a_broken_configuration_fails_at_start_naming_the_file_and_the_key(
    tmp_path: Path,
) -> None:
    conf = tmp_path / "callgate.toml"
    conf.write_text('[[sessions.issuers]]\nissuer = "https://idp"\nalgorithms = ["none"]\n')
    for argv in (("serve",), ("config", "check"), ("catalog",)):
        failed = run(tmp_path / "s", "--config", str(conf), *argv, rc=EXIT_MISUSE)
        error = failed.value["error"]  # with --json, errors are the one JSON value too
        assert error["code"] == "usage"
        assert (
            f"configuration {conf}: key 'sessions.issuers[0].algorithms[0]'" in (error["message"])
        )
    text = run(tmp_path / "s", "--config", str(conf), "serve", rc=EXIT_MISUSE, json_mode=False)
    assert text.stdout == ""
    assert f"configuration {conf}: key 'sessions.issuers[0].algorithms[0]'" in text.stderr
    conf.write_text('[[sessions.issuers]]\nissuer = "https://idp"\njwks_file = "gone.json"\n')
    failed = run(tmp_path / "s", "--config", str(conf), "serve", rc=EXIT_MISUSE)
    assert (
        f"configuration {conf}: key 'sessions.issuers[0]': {tmp_path}/gone.json"
        in (failed.value["error"]["message"])
    )
