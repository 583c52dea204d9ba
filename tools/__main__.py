"""``python -m tools bench|chaos ...`` (run by ``make bench`` and ``make chaos``)."""

from __future__ import annotations

import functools

from callgate.surfaces.cli import build_parser, main

PARSER = functools.partial(
    build_parser,
    modules=("tools.commands",),
    prog="python -m tools",
    description="callgate's developer tools: benchmarks and the chaos run.",
)

if __name__ == "__main__":
    raise SystemExit(main(parser=PARSER))
