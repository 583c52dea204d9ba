"""Print the OpenAPI document of the HTTP API (``make openapi`` writes docs/openapi.json).

A test compares the checked-in document with this output, so they cannot drift.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from callgate.surfaces.http.app import create_app


def document() -> dict[str, Any]:
    return create_app().openapi()


def render() -> str:
    return json.dumps(document(), indent=2, sort_keys=True) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
