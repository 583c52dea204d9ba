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


def test_readme_topic_table_is_the_one_callgate_creates(tmp_path: Path) -> None:
    """The README's topic reference is generated from the specs `callgate serve` creates."""
    from callgate.adapters.kafka.serve import views_of
    from callgate.adapters.kafka.topics import Topics, topic_table_markdown
    from callgate.bootstrap import Settings, bootstrap

    app = bootstrap(Settings(state_dir=tmp_path))
    table = topic_table_markdown(Topics("callgate", 6).specs(app.processes(), views_of(app)))
    assert table.strip() in README.read_text()
