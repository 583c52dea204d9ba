"""``callgate --backend kafka demo`` runs on Kafka, through ``callgate serve`` on topics of
its own, and refuses with ``broker_unavailable`` when no broker answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from tests.e2e.helpers import EXIT_FAILED, callgate_argv, cli_env
from tests.kafka_support import librdkafka_lines

pytestmark = pytest.mark.e2e


def demo(tmp_path: Path, bootstrap: str, *extra: str) -> tuple[int, str, str]:
    import subprocess

    argv = [*callgate_argv(), "--json", "--state-dir", str(tmp_path / "state")]
    argv += ["--backend", "kafka", "--bootstrap-servers", bootstrap, *extra, "demo"]
    done = subprocess.run(
        argv, capture_output=True, text=True, env=cli_env(), timeout=240, check=False
    )
    return done.returncode, done.stdout, done.stderr


@pytest.mark.kafka
def test_the_demo_runs_on_kafka_and_removes_its_topics(
    tmp_path: Path, kafka_bootstrap: str
) -> None:
    rc, stdout, stderr = demo(tmp_path, kafka_bootstrap)
    assert rc == 0, (stdout, stderr[-3000:])
    summary = json.loads(stdout)
    assert summary["backend"] == "kafka"
    assert summary["steps"] and all(step["ok"] for step in summary["steps"]), summary
    assert summary["audit_ok"] is True and summary["audit_records"] >= 7
    assert not librdkafka_lines(stderr)
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap, "log_level": 0})
    assert not [t for t in admin.list_topics(timeout=30).topics if t.startswith("demo-")]


def test_the_kafka_demo_without_a_broker_is_broker_unavailable(tmp_path: Path) -> None:
    from tools.ports import free_port

    nowhere = f"127.0.0.1:{free_port()}"
    rc, stdout, _ = demo(tmp_path, nowhere, "--timeout", "3")
    assert rc == EXIT_FAILED, stdout
    error = json.loads(stdout)["error"]
    assert error["code"] == "broker_unavailable" and nowhere in error["message"], error
