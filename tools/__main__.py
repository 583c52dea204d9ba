"""``python -m tools bench|chaos|disk-full ...`` (run by ``make bench``, ``make chaos`` and
``make disk-full``)."""

from __future__ import annotations

import functools

from callgate.surfaces.cli import build_parser, main

PARSER = functools.partial(
    build_parser,
    modules=("tools.commands",),
    prog="python -m tools",
    description="callgate's developer tools: benchmarks, the chaos run and the full-disk campaign.",
)

if __name__ == "__main__":
    raise SystemExit(main(parser=PARSER))
