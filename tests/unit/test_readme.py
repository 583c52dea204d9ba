"""Executable documentation: every ```python block in the README runs and its asserts hold."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_python_blocks_run() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README should carry a runnable SDK example"
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
