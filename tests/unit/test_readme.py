"""Executable documentation: the README's SDK example and its quickstart run, and the topic
table in the events reference is the one callgate creates.

The quickstarts (the README's and the tutorial's) are shell blocks in which ``# → TEXT``
beside a command is what that command prints, ``…`` standing for ids, counts and times,
and a command without one prints nothing. The tests run each block twice in one state
directory and compare every command's output with the comment beside it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
EVENTS = REPO / "docs" / "reference" / "events.md"
TUTORIAL = REPO / "docs" / "tutorial" / "quickstart.md"
WAIT_HOW_TO = REPO / "docs" / "how-to" / "wait-for-approval.md"
PRINTS = "# → "
DONE = "@@ step done @@"
EPOCH_MS = re.compile(r"(?<![\w.])1\d{12}(?![\w.])")  # a time as epoch milliseconds


@pytest.mark.parametrize("page", [README, WAIT_HOW_TO], ids=lambda p: p.name)
def test_python_blocks_run(page: Path) -> None:
    """The README's SDK example and the SDK part of the how-to on waiting for an approval."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    assert blocks, f"{page.name} should carry a runnable SDK example"
    for block in blocks:
        exec(compile(block, str(page), "exec"), {"__name__": "readme"})


def test_readme_topic_table_is_the_one_callgate_creates(tmp_path: Path) -> None:
    """The topic reference is generated from the specs `callgate serve` creates."""
    from callgate.adapters.kafka.serve import views_of
    from callgate.adapters.kafka.topics import Topics, topic_table_markdown
    from callgate.bootstrap import Settings, bootstrap

    app = bootstrap(Settings(state_dir=tmp_path))
    table = topic_table_markdown(Topics("callgate", 6).specs(app.processes(), views_of(app)))
    assert table.strip() in EVENTS.read_text()


@dataclass(frozen=True)
class Step:
    """One command of a shell block: its text, and what its ``# →`` comment says it prints
    (``None``: nothing)."""

    command: str
    prints: str | None


def steps_of(block: str) -> list[Step]:
    """The commands of a shell block: continued lines (``\\``) and a function's body are one
    command; blank lines and whole-line comments are none."""
    found: list[Step] = []
    lines: list[str] = []
    in_function = False
    for line in block.splitlines():
        if not lines and (not line.strip() or line.lstrip().startswith("#")):
            continue
        lines.append(line)
        if re.match(r"^\w+\(\) \{", line) and not line.rstrip().endswith("}"):
            in_function = True
        if in_function:
            in_function = line != "}"
            if in_function:
                continue
        if line.split(" #")[0].rstrip().endswith("\\"):
            continue
        comments = [c for ln in lines if PRINTS in ln for c in [ln.split(PRINTS, 1)[1]]]
        assert len(comments) <= 1, f"two answers for one command: {lines}"
        found.append(Step("\n".join(lines), comments[0].strip() if comments else None))
        lines = []
    assert not lines, f"an unfinished command: {lines}"
    return found


def says(expected: str, printed: str) -> bool:
    """``printed`` begins with ``expected`` and a line ends where it does; ``…`` in
    ``expected`` stands for any text, and any run of spaces or line ends for any other."""
    parts = [r"\s+".join(map(re.escape, part.split())) for part in expected.split("…")]
    pattern = r"\s*" + r".*?".join(parts) + r"[ \t]*(?:\n|$)"
    return re.match(pattern, printed, flags=re.S) is not None


def run_steps(steps: list[Step], cwd: Path) -> list[str]:
    """What each command printed (stdout and stderr), running them in order in one shell
    with ``set -euo pipefail``, as a reader pastes them."""
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CALLGATE_")}
    env["PATH"] = os.pathsep.join([bin_dir, env.get("PATH", "")])
    script = "set -euo pipefail\n" + "".join(
        f"{step.command}\nprintf '\\n%s\\n' '{DONE}'\n" for step in steps
    )
    done = subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=300, check=False,
    )  # fmt: skip
    printed = done.stdout.split(f"\n{DONE}\n")
    finished = printed[:-1]
    assert done.returncode == 0, (
        f"exit {done.returncode} in: {steps[len(finished)].command}",
        printed[-1][-3000:],
    )
    return finished


def check_block(steps: list[Step], cwd: Path) -> None:
    """Each command printed what its comment says, and no time as epoch milliseconds."""
    for step, printed in zip(steps, run_steps(steps, cwd), strict=True):
        if step.prints is None:
            assert not printed.strip(), (step.command, printed[-2000:])
        else:
            assert says(step.prints, printed), (step.command, step.prints, printed[-2000:])
        assert not EPOCH_MS.search(printed), (step.command, printed[-2000:])


def readme_quickstart() -> list[Step]:
    [block] = re.findall(r"## Quickstart.*?```sh\n(.*?)```", README.read_text(), flags=re.S)
    return steps_of(block)


def tutorial_steps() -> list[Step]:
    """The tutorial's blocks in order, but the first terminal's (``make run``)."""
    blocks = re.findall(r"```sh\n(.*?)```", TUTORIAL.read_text(), flags=re.S)
    return [s for b in blocks for s in steps_of(b) if not s.command.startswith("make ")]


@pytest.mark.parametrize(
    "quickstart", [readme_quickstart, tutorial_steps], ids=["readme", "tutorial"]
)
def test_quickstart_prints_what_its_comments_say_twice_over(
    quickstart: object, tmp_path: Path
) -> None:
    """The block as written, in a fresh folder and then again in the same one: every
    command succeeds (``set -e``) and prints what the comment beside it says; ids travel
    through ``--json`` and ``field``, never copied by hand."""
    assert callable(quickstart)
    steps: list[Step] = quickstart()
    assert not any("<" in s.command for s in steps), "a placeholder to fill in by hand"
    assert sum(s.prints is not None for s in steps) >= 8
    check_block(steps, tmp_path)
    check_block(steps, tmp_path)


def test_the_comments_are_checked() -> None:
    """``says`` holds a command to its comment: a different word, a missing line end or a
    different elided line each fail."""
    printed = "approved\n  invocation 1f.2e\n  the call: executed\n"
    assert says("approved … the call: executed", printed)
    assert says("approved", printed)
    assert not says("approved … the call: replayed", printed)
    assert not says("approve", printed)
    assert not says("executed", printed)
    assert not says("replayed", "executed\n")
    [step] = steps_of("callgate wait X \\\n    --session S   # → executed\n")
    assert step.prints == "executed" and "--session S" in step.command
