"""A short smoke of each atheris target (``make fuzz-atheris`` runs them for longer): the
decoders of hostile input refuse with their one kind of error and never crash."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from tests.fuzz.campaign import TARGETS, main

pytestmark = pytest.mark.fuzz

REPO = Path(__file__).resolve().parents[2]
MODULE = "tests.fuzz.atheris_targets"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("atheris-corpus")
    subprocess.run([sys.executable, "-m", MODULE, "seeds", str(directory)], cwd=REPO, check=True)
    return directory


@pytest.mark.parametrize("target", TARGETS)
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


def test_the_campaign_prints_its_figures_and_keeps_its_corpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``make fuzz-campaign``'s driver: seeds an empty corpus, runs the target to its count
    and prints one line of figures; a second campaign starts from the kept corpus."""
    args = ["--runs", "2000", "--seconds", "60", "--corpus", str(tmp_path / "corpus")]
    args += ["--findings", str(tmp_path / "findings"), "state"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "state    inputs     2,000 (reached)" in first and "findings 0" in first, first
    kept = {p.name for p in (tmp_path / "corpus" / "state").iterdir()}
    assert main(args) == 0
    assert kept <= {p.name for p in (tmp_path / "corpus" / "state").iterdir()}
