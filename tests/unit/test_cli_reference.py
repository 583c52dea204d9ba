"""The command reference (docs/reference/cli.md) names every command, sub-command and option
of the parser ``callgate`` runs, and names none that it does not have.

The reference's tables start each row with the command lines in code spans
(``| `approve ID --session TOKEN` | ...``); a command's rows are those with a span that
starts with its name, and its options must appear in those spans.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from callgate.surfaces.cli import _global_options, build_parser

REFERENCE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "cli.md"
OPTION = re.compile(r"(?<![\w-])(--?[a-z][a-z-]*)")


@dataclass(frozen=True)
class Command:
    name: str  # "audit", "session issue"
    options: frozenset[str]  # its own options, not the global ones
    actions: tuple[str, ...]  # choices of its first positional ("audit verify")


def commands(parser: argparse.ArgumentParser, path: str = "") -> Iterator[Command]:
    shared = {s for a in _global_options()._actions for s in a.option_strings}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from commands(sub, f"{path} {name}".strip())
    if not path or any(isinstance(a, argparse._SubParsersAction) for a in parser._actions):
        return  # the program itself, or a group ("session") that needs a sub-command
    own = {s for a in parser._actions for s in a.option_strings} - shared - {"-h", "--help"}
    positionals = [a for a in parser._actions if not a.option_strings]
    choices = positionals[0].choices if positionals and positionals[0].choices else ()
    yield Command(path, frozenset(own), tuple(str(c) for c in choices))


def first_cells() -> list[list[str]]:
    """The code spans of the first cell of every table row in the reference."""
    cells = []
    for line in REFERENCE.read_text().splitlines():
        if line.startswith("| `"):
            cell = re.split(r"(?<!\\)\|", line)[1]
            cells.append(re.findall(r"`([^`]+)`", cell.replace("\\|", "|")))
    return cells


def spans_of(name: str) -> list[str]:
    return [
        span
        for cell in first_cells()
        for span in cell
        if span == name or span.startswith(f"{name} ") or span.startswith(f"{name}[")
    ]


def test_every_command_and_option_is_in_the_reference() -> None:
    missing = []
    for command in commands(build_parser()):
        spans = spans_of(command.name)
        if not spans:
            missing.append(command.name)
            continue
        named = {o for span in spans for o in OPTION.findall(span)}
        missing += [f"{command.name} {o}" for o in sorted(command.options - named)]
        missing += [
            f"{command.name} {a}"
            for a in command.actions
            if not any(s.startswith(f"{command.name} {a}") for s in spans)
        ]
    assert not missing, f"not in {REFERENCE.name}: {missing}"


def test_every_global_option_is_in_the_reference() -> None:
    named = {o for cell in first_cells() for span in cell for o in OPTION.findall(span)}
    options = {s for a in _global_options()._actions for s in a.option_strings}
    assert options <= named, sorted(options - named)


def test_the_reference_names_no_option_a_command_lacks() -> None:
    """The other way round: a documented option that the parser dropped is drift too."""
    shared = {s for a in _global_options()._actions for s in a.option_strings}
    wrong = []
    for command in commands(build_parser()):
        for span in spans_of(command.name):
            rest = span[len(command.name) :]
            wrong += [
                f"{span}: {o}" for o in OPTION.findall(rest) if o not in command.options | shared
            ]
    assert not wrong, wrong


def test_the_check_sees_a_missing_option() -> None:
    """The walk finds a sub-command's own options and its actions (so a missing one
    would be reported)."""
    found = {c.name: c for c in commands(build_parser())}
    assert "--wait" in found["wait"].options and "--json" not in found["wait"].options
    assert found["audit"].actions == ("verify", "export")
    assert "session issue" in found and "session" not in found
    assert not spans_of("no-such-command")
