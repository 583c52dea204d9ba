"""One fixture per concept: a fixture name is defined in one place of ``tests/``.

A fixture shared by several modules lives in the ``conftest.py`` of the folder that holds
them (``tests/conftest.py``: the Kafka deployment of a module, its ``serve`` and an SDK
client of it; ``tests/e2e/conftest.py``: MCP gates; ``tests/http/conftest.py``: the
browser), named for what it gives; where modules need variants it takes their options
(``KAFKA_DEPLOYMENT``) or is a factory (``make_mcp_gate``). Two definitions of one name
would make a reader find out which one a test gets.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# Names defined twice on purpose, each with why: the second module overrides the first's
# fixture for the tests it imports from it.
OVERRIDES = {
    "notify_setup": "tests/http/test_notify_kafka.py runs test_notify's stories, imported, "
    "on a Kafka deployment: its notify_setup replaces the embedded one",
    "oidc_deployment": "tests/http/test_console_oidc_kafka.py runs test_console_oidc's "
    "stories, imported, on a Kafka deployment: its oidc_deployment replaces the embedded one",
}


def _fixture_name(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The name a ``@pytest.fixture`` function defines (``name=`` if given), else None."""
    for decorator in node.decorator_list:
        call = decorator if isinstance(decorator, ast.Call) else None
        func = call.func if call is not None else decorator
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if called != "fixture":
            continue
        for keyword in call.keywords if call is not None else ():
            if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
        return node.name
    return None


def fixtures() -> Iterator[tuple[str, str]]:
    """``(fixture name, where)`` for every fixture defined under ``tests/``, in a module or
    a class of one."""
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        where = path.relative_to(TESTS.parent).as_posix()
        for node in tree.body:
            members = node.body if isinstance(node, ast.ClassDef) else [node]
            for member in members:
                if isinstance(member, ast.FunctionDef | ast.AsyncFunctionDef):
                    name = _fixture_name(member)
                    if name is not None:
                        yield name, f"{where}:{member.lineno}"


def defined_more_than_once() -> dict[str, list[str]]:
    places: dict[str, list[str]] = {}
    for name, where in fixtures():
        places.setdefault(name, []).append(where)
    return {name: wheres for name, wheres in places.items() if len(wheres) > 1}


def test_each_fixture_name_is_defined_once() -> None:
    twice = {n: w for n, w in defined_more_than_once().items() if n not in OVERRIDES}
    assert twice == {}, "define each fixture once, in the conftest.py its users share"


def test_the_listed_overrides_still_override() -> None:
    """A name listed in ``OVERRIDES`` that is no longer defined twice leaves the list."""
    assert sorted(OVERRIDES) == sorted(n for n in defined_more_than_once() if n in OVERRIDES)


def test_the_check_sees_fixtures() -> None:
    names = {name for name, _ in fixtures()}
    assert {"kafka_deployment", "kafka_gateway", "make_mcp_gate", "browser"} <= names
