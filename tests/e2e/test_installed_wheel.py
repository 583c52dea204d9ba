"""callgate installed the way Python users install things: from the wheel, into a fresh
virtual environment, with no checkout on ``sys.path``.

The sdist and the wheel are built with uv (``uv build``: the sdist, then the wheel from the
sdist, so the sdist is proved complete too); the wheel goes into a new venv with its
dependencies pinned by the lock (``uv export --frozen`` as constraints; uv's cache serves
them, so this takes seconds). Then the whole story runs through the venv's ``callgate``
from an unrelated directory that also holds a folder named ``callgate`` (which would shadow
the package if the current directory leaked onto ``sys.path``): sessions, a read, V1, a
high-impact refund through ``approval_required``, approval and the confirming call, the
replay of its key, ``audit verify`` and ``replay``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.helpers import REPO

pytestmark = pytest.mark.e2e

RUNTIME_FILES = ("profiles/default.yaml", "profiles/default.cedar")


def find_uv() -> str | None:
    """The repository's pinned uv (``make install`` puts it in ``.tools``), else PATH's."""
    pinned = REPO / ".tools" / "bin" / "uv"
    return str(pinned) if pinned.exists() else shutil.which("uv")


def clean_env(**extra: str) -> dict[str, str]:
    """No ``CALLGATE_*`` setting, no ``PYTHONPATH``, no active venv leaking in."""
    drop = ("CALLGATE_", "PYTHONPATH", "VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    return {**env, "UV_PYTHON_DOWNLOADS": "never", **extra}


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path
    venv: Path

    @property
    def callgate(self) -> Path:
        return self.venv / "bin" / "callgate"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    uv = find_uv()
    if uv is None:
        reason = "packaging test skipped: no uv (run `make install`, which installs it)"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"

    def sh(*argv: str, cwd: Path = REPO) -> str:
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=clean_env(), cwd=cwd, timeout=300
        )
        assert proc.returncode == 0, f"{' '.join(argv)}\n{proc.stdout}\n{proc.stderr}"
        return proc.stdout

    sh(uv, "build", "--quiet", "--out-dir", str(dist))
    [wheel] = dist.glob("callgate-*.whl")
    [sdist] = dist.glob("callgate-*.tar.gz")
    constraints = root / "constraints.txt"
    constraints.write_text(sh(uv, "export", "--frozen", "--no-hashes", "--no-emit-project"))
    venv = root / "venv"
    sh(uv, "venv", "--quiet", "--python", sys.executable, str(venv))
    sh(uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
       "-c", str(constraints), str(wheel))  # fmt: skip
    yield Built(wheel, sdist, venv)


def schema_names() -> set[str]:
    schemas = REPO / "schemas"
    return {str(p.relative_to(schemas)) for p in schemas.rglob("*.avsc")}


def test_the_wheel_holds_every_file_the_program_reads(built: Built) -> None:
    names = set(zipfile.ZipFile(built.wheel).namelist())
    shipped = {n.removeprefix("callgate/_schemas/") for n in names if "/_schemas/" in n}
    assert shipped == schema_names()  # schemas and every released version
    assert any(n.startswith("callgate/_schemas/released/v1/") for n in names)
    assert {f"callgate/{f}" for f in RUNTIME_FILES} <= names
    assert not [n for n in names if n.startswith(("tests/", "services/", "schemas/"))]


def test_the_wheel_holds_the_product_alone(built: Built) -> None:
    """No developer tool (benchmarks, chaos, broker launchers, fuzzers: ``tools/``) and no
    test ships: every file is under the two packages or the wheel's metadata (ADR 0025)."""
    names = zipfile.ZipFile(built.wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"callgate", "callgate_projections", "callgate-0.1.0.dist-info"}, tops
    harness = ("bench", "chaos", "apache_kafka", "tansu", "fuzz", "atheris")
    leaked = [n for n in names if any(h in Path(n).stem for h in harness)]
    assert not leaked, leaked


def test_the_sdist_holds_the_schemas_and_the_lock(built: Built) -> None:
    with tarfile.open(built.sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert {f"schemas/{n}" for n in schema_names()} <= names
    assert {f"services/callgate/{f}" for f in RUNTIME_FILES} <= names
    assert {"pyproject.toml", "uv.lock", "README.md", "tools/apache_kafka.py"} <= names


def test_the_installed_program_runs_the_whole_story_from_an_unrelated_directory(
    built: Built, tmp_path: Path
) -> None:
    work = tmp_path / "unrelated"
    decoy = work / "callgate"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise ImportError('the checkout leaked onto sys.path')\n")
    state = str(tmp_path / "state")

    def cg(*args: str, rc: int = 0) -> Any:
        argv = [str(built.callgate), "--json", "--dev", "--state-dir", state, *args]
        proc = subprocess.run(
            argv, capture_output=True, text=True, env=clean_env(), cwd=work, timeout=120
        )
        assert "Traceback" not in proc.stderr, proc.stderr
        assert proc.returncode == rc, f"{args}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"
        return json.loads(proc.stdout)

    where = subprocess.run(
        [str(built.venv / "bin" / "python"), "-c", "import callgate; print(callgate.__file__)"],
        capture_output=True, text=True, env=clean_env(), cwd=tmp_path, check=True,
    ).stdout  # fmt: skip
    assert Path(where.strip()).is_relative_to(built.venv), where

    issue = ["session", "issue", "--tenant", "acme", "--user"]
    alice = cg(*issue, "alice", "--roles", "support")["token"]
    bob = cg(*issue, "bob", "--roles", "finance-approver")["token"]

    def propose(args: dict[str, Any], tool: str, *extra: str) -> dict[str, Any]:
        answer: dict[str, Any] = cg(
            "propose", "--session", alice, "--tool", tool, "--args", json.dumps(args), *extra
        )
        return answer

    assert propose({"ticket_id": "T-1"}, "tickets.read")["outcome"] == "executed"
    spoof = propose({"title": "x", "requester_id": "mallory"}, "tickets.create")
    assert spoof["outcome"] == "identity_spoof"  # V1

    refund = {"order_id": "ORD-7", "amount_cents": 25000, "currency": "EUR"}
    first = propose(refund, "refunds.issue", "--idempotency-key", "r-7")
    assert first["outcome"] == "approval_required" and first["dry_run"]["amount_cents"] == 25000
    [pending] = cg("pending", "--session", bob)
    assert pending["invocation_id"] == first["invocation_id"]
    approval = cg("approve", first["invocation_id"], "--session", bob)["approval_id"]
    key_and_approval = ("--idempotency-key", "r-7", "--approval-id", approval)
    done = propose(refund, "refunds.issue", *key_and_approval)
    assert done["outcome"] == "executed", done
    again = propose(refund, "refunds.issue", "--idempotency-key", "r-7")
    assert again["outcome"] == "replayed" and again["result"] == done["result"]
    refunds = [e for e in cg("effects") if e["tool"] == "refunds.issue"]
    assert len(refunds) == 1 and refunds[0]["invocation_id"] == done["invocation_id"]

    verified = cg("audit", "verify")
    assert verified["ok"] is True and verified["records"] >= 5
    assert cg("replay")["equal"] is True
    assert not (work / ".callgate").exists()  # the state went where it was told
