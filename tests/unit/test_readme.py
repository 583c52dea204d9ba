"""Executable documentation: the README's SDK example and its quickstart run, and the topic
table in the events reference is the one callgate creates."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
EVENTS = REPO / "docs" / "reference" / "events.md"


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README should carry a runnable SDK example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})


def test_readme_topic_table_is_the_one_callgate_creates(tmp_path: Path) -> None:
    """The topic reference is generated from the specs `callgate serve` creates."""
    from callgate.adapters.kafka.serve import views_of
    from callgate.adapters.kafka.topics import Topics, topic_table_markdown
    from callgate.bootstrap import Settings, bootstrap

    app = bootstrap(Settings(state_dir=tmp_path))
    table = topic_table_markdown(Topics("callgate", 6).specs(app.processes(), views_of(app)))
    assert table.strip() in EVENTS.read_text()


def test_readme_quickstart_runs_with_no_id_copied_by_hand(tmp_path: Path) -> None:
    """The quickstart's shell block, as written, in a fresh folder: every step succeeds
    (``set -e``) and the ids travel through ``--json`` and ``python3``."""
    [block] = re.findall(r"## Quickstart.*?```sh\n(.*?)```", README.read_text(), flags=re.S)
    assert "<" not in block, "a placeholder to fill in by hand"
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{block}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    outcomes = [line for line in done.stdout.splitlines() if line and not line[0].isspace()]
    for expected in ("executed", "identity_spoof", "replayed"):
        assert expected in outcomes, outcomes
    assert '"equal": true' in done.stdout  # replay equals the live views
