"""How the command line reports an error: one JSON value on stdout with ``--json``, one line
on stderr otherwise. Light on purpose (no rich, no pydantic): a misused command line reports
through it before anything heavy is imported."""

from __future__ import annotations

import json
import sys

from callgate.domain.codes import Code


def report_error(code: Code, message: str, json_mode: bool) -> None:
    """One JSON value on stdout with ``--json``; one line on stderr otherwise."""
    if json_mode:
        sys.stdout.write(json.dumps({"error": {"code": code.value, "message": message}}) + "\n")
        sys.stdout.flush()
    else:
        label = "error" if code is Code.USAGE else code.value
        sys.stderr.write(f"callgate: {label}: {message}\n")
