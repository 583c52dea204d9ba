"""A short smoke of each atheris target (``make fuzz-atheris`` runs them for longer): the
decoders of hostile input refuse with their one kind of error and never crash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fuzz

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.fuzz.atheris_targets"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("atheris-corpus")
    subprocess.run([sys.executable, "-m", MODULE, "seeds", str(directory)], cwd=REPO, check=True)
    return directory


@pytest.mark.parametrize("target", ["avro", "token", "args"])
def test_atheris_target_runs_clean(target: str, corpus: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", MODULE, target, "-runs=3000", "-seed=1", str(corpus / target)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Done 3000 runs" in proc.stderr
