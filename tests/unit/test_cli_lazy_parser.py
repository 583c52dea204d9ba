"""The command line builds only the parser of the command it is given
(``callgate.surfaces.cli._parse``): the map from command to module must be what the
modules register, and the one-module parser must read a line as the whole parser does."""

from __future__ import annotations

import argparse
import importlib

import pytest

from callgate.surfaces import cli
from callgate.surfaces.commands import COMMANDS, MODULES


def _registered(module: str) -> list[str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    importlib.import_module(f"callgate.surfaces.commands.{module}").register(
        sub, cli._global_options()
    )
    return list(sub.choices)


def test_the_command_map_is_what_each_module_registers() -> None:
    registered = {name: module for module in MODULES for name in _registered(module)}
    assert registered == COMMANDS


@pytest.mark.parametrize(
    "line",
    [
        ["propose", "--session", "s", "--tool", "t", "--args", "{}"],
        ["--json", "--timeout", "3", "status", "inv-1", "--session", "s"],
        ["--state-dir", "serve", "serve"],  # the first word naming a command is a value
        ["-v", "freeze", "--tool", "x", "--reason", "r", "--session", "s"],
    ],
)
def test_one_module_reads_a_line_as_the_whole_parser(line: list[str]) -> None:
    assert _values(cli._parse(cli.build_parser, line)) == _values(
        cli.build_parser().parse_args(line)
    )


def _values(ns: argparse.Namespace) -> dict[str, object]:
    """The namespace, a function by its name (each build makes its own lambdas)."""
    return {k: getattr(v, "__qualname__", v) if callable(v) else v for k, v in vars(ns).items()}


@pytest.mark.parametrize(
    "line", [["--help", "propose"], ["-vh", "propose"], ["--he", "status"], ["--", "propose"]]
)
def test_a_line_that_may_ask_for_the_main_help_gets_the_whole_parser(line: list[str]) -> None:
    assert cli._module_named(line) is None
