"""The state directory is found the same way from any current directory (docs/contract.md,
"Command line"): ``--state-dir``, then ``CALLGATE_STATE_DIR``, then the nearest ``.callgate``
directory upward, else ``$XDG_STATE_HOME/callgate`` (``~/.local/state/callgate``). A session
token signed by another state directory's keys is refused as ``unauthenticated`` with a
message that says so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from callgate.state_dir import default_state_dir, nearest_project_dir, user_state_dir
from tests.e2e.helpers import Run, callgate_argv, cli_env, propose, session

pytestmark = pytest.mark.e2e

ISSUE = ["session", "issue", "--user", "alice", "--tenant", "acme", "--roles", "support"]


def call(cwd: Path, *args: str, env: dict[str, str] | None = None) -> Run:
    """``callgate --json ARGS`` from ``cwd``, with no ``CALLGATE_*`` variable but ``env``'s."""
    argv = [*callgate_argv(), "--json", *args]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        env={**cli_env(), **(env or {})},
        cwd=cwd,
        timeout=60,
        check=False,
    )
    result = Run(argv, proc.returncode, proc.stdout, proc.stderr)
    assert result.returncode == 0, result
    return result


def read_ticket(cwd: Path, token: str, env: dict[str, str] | None = None) -> dict[str, str]:
    args = json.dumps({"ticket_id": "T-1"})
    answer = call(
        cwd, "propose", "--session", token, "--tool", "tickets.read", "--args", args, env=env
    )
    value: dict[str, str] = answer.value
    return value


def test_the_nearest_dot_callgate_upward_is_the_state_from_any_subdirectory(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    deep = project / "src" / "deep"
    deep.mkdir(parents=True)
    (project / ".callgate").mkdir()
    home = {"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "xdg")}
    token = call(deep, *ISSUE, env=home).value["token"]
    assert (project / ".callgate" / "keys").is_dir()
    assert read_ticket(project, token, env=home)["outcome"] == "executed"  # same keys
    [record] = call(deep / "..", "audit", "--session", token, env=home).value
    assert record["tool"] == "tickets.read"
    assert not (tmp_path / "xdg").exists() and not (deep / ".callgate").exists()


@pytest.fixture
def outside_any_project(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory with no ``.callgate`` at or above it: ``tmp_path`` if that holds
    (a ``/tmp/.callgate`` left by someone would not), else one under ``/var/tmp`` or
    ``/dev/shm``."""
    if nearest_project_dir(tmp_path) is None:
        yield tmp_path
        return
    for base in (Path("/var/tmp"), Path("/dev/shm")):
        if base.is_dir() and nearest_project_dir(base) is None:
            folder = Path(tempfile.mkdtemp(prefix="callgate-test-", dir=base))
            try:
                yield folder
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            return
    pytest.skip(f"every temporary directory has a .callgate above it ({tmp_path})")


def test_without_a_project_directory_the_per_user_state_is_used(
    outside_any_project: Path,
) -> None:
    tmp_path = outside_any_project
    somewhere, elsewhere = tmp_path / "a", tmp_path / "b" / "c"
    somewhere.mkdir()
    elsewhere.mkdir(parents=True)
    xdg = {"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "xdg")}
    token = call(somewhere, *ISSUE, env=xdg).value["token"]
    assert (tmp_path / "xdg" / "callgate" / "keys").is_dir()
    assert read_ticket(elsewhere, token, env=xdg)["outcome"] == "executed"

    home = {"HOME": str(tmp_path / "home")}  # XDG_STATE_HOME unset: ~/.local/state
    call(somewhere, *ISSUE, env=home)
    assert (tmp_path / "home" / ".local" / "state" / "callgate" / "keys").is_dir()


def test_the_flag_beats_the_variable_which_beats_the_project_directory(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    (project / ".callgate").mkdir(parents=True)
    by_env, by_flag = tmp_path / "by-env", tmp_path / "by-flag"
    env = {"CALLGATE_STATE_DIR": str(by_env), "HOME": str(tmp_path / "home")}
    call(project, *ISSUE, env=env)
    assert (by_env / "keys").is_dir() and not (project / ".callgate" / "keys").exists()
    call(project, "--state-dir", str(by_flag), *ISSUE, env=env)
    assert (by_flag / "keys").is_dir()


def test_a_token_of_another_state_directory_is_unauthenticated_and_says_why(
    tmp_path: Path,
) -> None:
    """Each state directory has its own development keys: a token issued by one is not
    trusted by another, and the message says the key is not one this state trusts."""
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    foreign = session(theirs, "alice", "acme", "support")
    session(ours, "bob", "acme", "support")  # ours has keys of its own
    answer = propose(ours, foreign, "tickets.read", {"ticket_id": "T-1"})
    assert answer["outcome"] == "unauthenticated", answer
    assert "signed by a key this state does not trust" in answer["error"]["message"], answer


def test_default_state_dir_resolution_order(tmp_path: Path) -> None:
    """The pure part, unit-sized: nearest ``.callgate`` (a file of that name does not
    count), else XDG (a relative ``XDG_STATE_HOME`` is ignored, as the spec says)."""
    (tmp_path / "p" / ".callgate").mkdir(parents=True)
    (tmp_path / "p" / "q").mkdir()
    (tmp_path / "p" / "q" / ".callgate").write_text("not a directory")
    assert nearest_project_dir(tmp_path / "p" / "q") == (tmp_path / "p" / ".callgate").resolve()
    assert default_state_dir(tmp_path / "p" / "q", {}) == (tmp_path / "p" / ".callgate").resolve()
    assert user_state_dir({"XDG_STATE_HOME": str(tmp_path / "x")}) == tmp_path / "x" / "callgate"
    assert user_state_dir({"XDG_STATE_HOME": "relative"}) == (
        Path.home() / ".local" / "state" / "callgate"
    )
