"""The dependency direction, derived from the source (docs/adr/0027-layers-and-composition-root.md).

The import graph of the installed packages is read with ``ast`` (every ``import``, also
those inside functions and under ``TYPE_CHECKING``: a type-only import still says which way
a module depends). Each module has a layer; an import may only run to the same layer or a
lower one, and no module may reach itself again through imports. The pure layers do no I/O.

``python -m tests.unit.test_architecture`` prints the figures: modules, upward imports,
circles and the largest modules.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "callgate": ROOT / "services" / "callgate",
    "callgate_projections": ROOT / "projections" / "callgate_projections",
}

# Lowest first. The longest matching prefix names a module's layer.
DOMAIN, CORE, SHELL, APPLICATION, SURFACE, ROOT_LAYER, ENTRY = range(7)
LAYER_NAMES = (
    "domain", "core", "shell", "application", "surfaces", "composition root", "entry points"
)  # fmt: skip
LAYERS: dict[str, int] = {
    "callgate": DOMAIN,  # the package itself (its version)
    "callgate.domain": DOMAIN,  # pure: values, rules, vocabulary
    "callgate.decider": CORE,  # pure processes
    "callgate_projections": CORE,
    "callgate.executor": SHELL,
    "callgate.providers": SHELL,
    "callgate.adapters": SHELL,
    "callgate.config": SHELL,
    "callgate.settings": SHELL,
    "callgate.state_dir": SHELL,
    "callgate.logs": SHELL,
    "callgate.tracing": SHELL,  # spans and the trace context they carry (ADR 0036)
    "callgate.gc_settings": SHELL,
    "callgate.stopping": SHELL,  # signals to a stop event, no lock in the handler
    "callgate.sqlite": SHELL,
    "callgate.application": APPLICATION,  # the use cases over their ports
    "callgate.surfaces": SURFACE,
    "callgate.bootstrap": ROOT_LAYER,
    # Entry points: each turns an invocation into a wired application (they call the root).
    # They live together in ``surfaces`` (``test_the_entry_points_live_in_surfaces``).
    "callgate.surfaces.cli": ENTRY,  # the command line
    "callgate.surfaces.commands": ENTRY,
    "callgate.surfaces.sdk": ENTRY,  # ``connect``
    "callgate.surfaces.http.server": ENTRY,  # HTTP
    "callgate.surfaces.mcp.serve": ENTRY,  # MCP
    "callgate.surfaces.kafka_worker": ENTRY,  # one process on Kafka, spawned by ``serve``
    "callgate.surfaces.demo": ENTRY,  # ``callgate demo``
}
PURE = (DOMAIN, CORE)
# What a pure module may not import or call: files, processes, sockets, the environment.
IO_MODULES = frozenset({"os", "tempfile", "shutil", "socket", "subprocess", "sqlite3", "io"})
IO_CALLS = frozenset(
    {"open", "read_text", "read_bytes", "write_text", "write_bytes", "mkdir", "unlink"}
)
# Modules of the pure layers allowed one of ``IO_MODULES`` for a name, never a call.
IO_NAME_ONLY = {"callgate.domain.codes": {"sqlite3"}}  # the exception type a runner retries


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int


def layer_of(module: str) -> int:
    prefix = module
    while prefix:
        if prefix in LAYERS:
            return LAYERS[prefix]
        prefix = prefix.rpartition(".")[0]
    raise KeyError(f"{module}: no layer (add its package to LAYERS)")


@cache
def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, directory in PACKAGES.items():
        for path in sorted(directory.rglob("*.py")):
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(name: str) -> str | None:
    known = modules()
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _imported_names(module: str, path: Path, node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, *([base] if base else [])])
    return [f"{base}.{alias.name}" for alias in node.names]


def trees() -> Iterator[tuple[str, Path, ast.Module]]:
    for module, path in modules().items():
        yield module, path, ast.parse(path.read_text(encoding="utf-8"))


@cache
def imports() -> tuple[Import, ...]:
    """Every import of one package module by another, once per (source, target)."""
    seen: dict[tuple[str, str], Import] = {}
    for module, path, tree in trees():
        for node in ast.walk(tree):
            for name in _imported_names(module, path, node):
                target = _resolve(name)
                if target and target != module and (module, target) not in seen:
                    seen[module, target] = Import(module, target, getattr(node, "lineno", 0))
    return tuple(seen.values())


def upward() -> list[Import]:
    return [i for i in imports() if layer_of(i.target) > layer_of(i.source)]


def circles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    edges: dict[str, list[str]] = {}
    for i in imports():
        edges.setdefault(i.source, []).append(i.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(modules())))
    try:
        for node in modules():
            if node not in index:
                visit(node)
    finally:
        sys.setrecursionlimit(limit)
    return found


def io_in_pure_layers() -> list[str]:
    found = []
    for module, _, tree in trees():
        if layer_of(module) not in PURE:
            continue
        allowed = IO_NAME_ONLY.get(module, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = (
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                )
                for name in names:
                    top = (name or "").partition(".")[0]
                    if top in IO_MODULES and top not in allowed:
                        found.append(f"{module}:{node.lineno} imports {name}")
            elif isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                if called in IO_CALLS:
                    found.append(f"{module}:{node.lineno} calls {called}()")
    return found


def test_every_module_has_a_layer() -> None:
    for module in modules():
        layer_of(module)


def test_no_import_runs_upward() -> None:
    """An adapter never imports the composition root, a surface never an entry point, the
    pure core never the shell."""
    assert [
        f"{i.source}:{i.line} ({LAYER_NAMES[layer_of(i.source)]}) imports {i.target} "
        f"({LAYER_NAMES[layer_of(i.target)]})"
        for i in upward()
    ] == []


def spawned_modules() -> list[tuple[str, str]]:
    """``(module, spawned)`` for every ``[..., "-m", "<module>", ...]`` in the packages: the
    modules the product runs as programs of their own."""
    found = []
    for module, _, tree in trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.List | ast.Tuple):
                continue
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for flag, name in pairwise(items):
                if flag == "-m" and isinstance(name, str):
                    found.append((module, name))
    return found


def test_the_entry_points_live_in_surfaces() -> None:
    """The command line, the SDK's ``connect``, HTTP, MCP, the Kafka worker and the demo
    live together: every entry point is a module of ``callgate.surfaces``, and so is every
    program the product starts (``pyproject.toml``'s scripts, the ``-m`` of a spawned
    process)."""
    import tomllib

    entries = [m for m in modules() if layer_of(m) == ENTRY]
    assert "callgate.surfaces.kafka_worker" in entries
    assert [m for m in entries if not m.startswith("callgate.surfaces.")] == []
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    scripts = [target.partition(":")[0] for target in pyproject["project"]["scripts"].values()]
    spawned = spawned_modules()
    assert spawned, "serve spawns its Kafka workers with -m"
    started = [*scripts, *(name for _, name in spawned)]
    assert [m for m in started if m not in modules() or layer_of(m) != ENTRY] == []


def test_no_import_circle() -> None:
    assert circles() == []


def test_providers_and_adapters_do_not_import_each_other() -> None:
    """Two kinds of shell (the tools callgate calls; the stores and brokers it runs on):
    what both need lives below them (``domain.codes``, ``callgate.sqlite``)."""

    def side(module: str) -> str:
        return module.split(".")[1] if module.count(".") >= 1 else ""

    assert [
        f"{i.source} imports {i.target}"
        for i in imports()
        if {side(i.source), side(i.target)} == {"providers", "adapters"}
    ] == []


def test_the_pure_layers_do_no_io() -> None:
    """domain, the deciders and the projections read no file, socket or environment: key
    files and profiles are read by adapters (``adapters.keyfiles``, ``adapters.profiles``)."""
    assert io_in_pure_layers() == []


def test_no_adapter_holds_a_module_global_kafka_connection() -> None:
    """The connection properties travel with the servers (``Brokers``), never set
    process-wide: two clients in one process may reach two differently secured clusters."""
    from callgate.adapters.kafka import connection

    held = [
        name
        for name, value in vars(connection).items()
        if not name.startswith("__") and isinstance(value, dict | list | set)
    ]
    assert held == []


RUNNERS = frozenset({"KafkaRunner", "EmbeddedRunner", "MemoryRunner"})
# The one place that builds runners for the product and the tools (serve, CLI, SDK, HTTP,
# MCP, benchmarks, chaos): ``App.kafka_runner`` and ``App.embedded_runner``.
RUNNER_BUILDER = ROOT / "services" / "callgate" / "bootstrap.py"


def runners_built_outside_the_root() -> list[str]:
    """``file:line`` of every call of a runner class in the packages and ``tools/``, except
    in the composition root."""
    paths = [*modules().values(), *sorted((ROOT / "tools").rglob("*.py"))]
    found = []
    for path in paths:
        if path == RUNNER_BUILDER:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name in RUNNERS:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_runners_are_built_by_the_composition_root_alone() -> None:
    """Product and tools get runners from ``App``: one place decides their wiring."""
    assert runners_built_outside_the_root() == []


def figures() -> str:
    sizes = sorted(
        ((len(p.read_text(encoding="utf-8").splitlines()), m) for m, p in modules().items()),
        reverse=True,
    )
    lines = [
        f"modules: {len(modules())}, imports between them: {len(imports())}",
        f"upward imports: {len(upward())}",
        *(f"  {i.source} -> {i.target}" for i in upward()),
        f"circles: {len(circles())}",
        *(f"  {' <-> '.join(c)}" for c in circles()),
        f"I/O in the pure layers: {len(io_in_pure_layers())}",
        "largest modules (lines):",
        *(f"  {n:5d} {m}" for n, m in sizes[:8]),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(figures())


# Module-level values that are not state: the constructors of immutable values.
IMMUTABLE_CALLS = frozenset({"MappingProxyType", "Path", "TypeVar", "NewType", "TypeAdapter"})


@cache
def frozen_classes() -> frozenset[str]:
    """The classes of the packages whose instances cannot change: frozen dataclasses."""
    found = set()
    for _, _, tree in trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and any(
                    k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in deco.keywords
                ):
                    found.add(node.name)
    return frozenset(found)


def module_state() -> dict[str, set[str]]:
    """Each module's top-level names bound to a constructed object (``X = Thing()``): a
    registry, a lock, a cache, anything a caller could change for every other caller."""
    found: dict[str, set[str]] = {}
    for module, _, tree in trees():
        for node in tree.body:
            if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
                continue
            value = node.value
            if not isinstance(value, ast.Call | ast.Dict | ast.List | ast.Set):
                continue
            if isinstance(value, ast.Call):
                func = value.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                immutable = IMMUTABLE_CALLS | frozen_classes()
                if called in immutable or not called[:1].isupper():
                    continue
            else:
                continue  # literal tables: read-only by convention, checked by review
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            found.setdefault(module, set()).update(names)
    return found


def shared_state_across_layers() -> list[str]:
    state = module_state()
    shared = []
    for module, path, tree in trees():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            for name in _imported_names(module, path, node):
                owner, _, attr = name.rpartition(".")
                if attr in state.get(owner, ()) and layer_of(owner) != layer_of(module):
                    shared.append(f"{module}:{node.lineno} imports {owner}.{attr}")
    return shared


def test_no_module_global_links_two_layers() -> None:
    """A registry or cache at module level shared by two layers is a hidden port: the
    composition root makes such an object and hands it to both (the channels to waiting
    agents, ADR 0075)."""
    assert shared_state_across_layers() == []
