"""The runtime dependencies are exactly what the installed program imports.

``[project].dependencies`` must name every distribution that a module of ``callgate`` or
``callgate_projections`` imports (at the top or inside a function), and nothing else: a
declared dependency that nothing imports is a defect, and so is an import that a plain
``pip install callgate`` would not satisfy. Packages of the developer tools (``tools/``:
matplotlib for the bench's plot) and of the tests live in the ``dev`` extra and are never
imported by the program; nor are ``tools`` and ``tests`` themselves (ADR 0025).
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from functools import cache
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (REPO / "services" / "callgate", REPO / "projections" / "callgate_projections")
OWN = {"callgate", "callgate_projections"}
REPO_ONLY = {"tools", "tests"}  # the repository's, not the wheel's (checked apart)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(requirement: str) -> str:
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
    assert match, requirement
    return normalize(match.group(0))


def project() -> dict[str, object]:
    doc = tomllib.loads((REPO / "pyproject.toml").read_text())
    value: dict[str, object] = doc["project"]
    return value


def imported_modules(full: bool = False) -> dict[str, set[str]]:
    """Top-level module name -> the files importing it (absolute imports, not stdlib);
    ``full``: the dotted names as imported (``from a.b import c``: ``a.b.c``)."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [f"{node.module}.{alias.name}" for alias in node.names]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in OWN:
                        key = name if full else top
                        found.setdefault(key, set()).add(str(path.relative_to(REPO)))
    return found


def imported_distributions() -> dict[str, set[str]]:
    """Distribution name (normalized) -> the files importing one of its modules."""
    owners = packages_distributions()
    found: dict[str, set[str]] = {}
    for module, files in imported_modules(full=True).items():
        top = module.split(".")[0]
        if top in REPO_ONLY:
            continue  # no distribution: the upward-import test reports it
        dists = owners.get(top)
        assert dists, f"no installed distribution provides {top!r} (imported by {files})"
        for dist in providers_of(module, tuple(dists)):
            found.setdefault(normalize(dist), set()).update(files)
    return found


def providers_of(module: str, dists: tuple[str, ...]) -> tuple[str, ...]:
    """The distributions of a namespace package (``opentelemetry``: the API, the SDK, the
    exporters...) that hold ``module``, by their files; any other package's owners."""
    if len(set(dists)) <= 1:
        return dists
    name = module
    while "." in name:
        path = name.replace(".", "/")
        holding = tuple(
            d for d in dict.fromkeys(dists) if any(f.startswith((path + "/", path + ".py"))
            for f in files_of(d))
        )  # fmt: skip
        if holding:
            return holding
        name = name.rpartition(".")[0]
    return dists


@cache
def files_of(dist: str) -> tuple[str, ...]:
    return tuple(str(f) for f in distribution(dist).files or ())


def test_runtime_dependencies_are_exactly_what_the_program_imports() -> None:
    meta = project()
    declared = {requirement_name(r) for r in meta["dependencies"]}  # type: ignore[attr-defined]
    imported = imported_distributions()

    unused = declared - set(imported)
    assert not unused, f"declared runtime dependencies that nothing imports: {sorted(unused)}"
    undeclared = {d: sorted(f) for d, f in imported.items() if d not in declared}
    assert not undeclared, f"imported but not declared as runtime dependencies: {undeclared}"


def test_the_program_imports_neither_tools_nor_tests_nor_their_packages() -> None:
    extras: dict[str, list[str]] = project()["optional-dependencies"]  # type: ignore[assignment]
    assert set(extras) == {"dev"}, "the wheel has no optional parts: tools live in the repo"
    dev = {requirement_name(r) for r in extras["dev"]}
    imported = imported_distributions()
    upward = {m: sorted(f) for m, f in imported_modules().items() if m in REPO_ONLY}
    assert not upward, f"the program imports the repository's tools or tests: {upward}"
    test_only = {"pytest", "pytest-timeout", "hypothesis", "schemathesis", "matplotlib"}
    assert test_only <= dev
    leaked = {d: sorted(f) for d, f in imported.items() if d in test_only}
    assert not leaked, f"the program imports test-only packages: {leaked}"
