"""The Apache Kafka launcher run as a program stops its broker on SIGTERM and on SIGINT:
its JVM is gone and its temporary folder removed when it exits (it used to wait for
signals it never blocked and leave both behind)."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.e2e.helpers import REPO
from tests.kafka_support import require_broker

pytestmark = pytest.mark.kafka

LAUNCHER = "tools.apache_kafka"


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def cmdline(pid: int) -> list[str]:
    return (Path("/proc") / str(pid) / "cmdline").read_text().split("\0")


def alive(pid: int) -> bool:
    """Does ``pid`` still run (a zombie does not)?"""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def launcher_env() -> dict[str, str]:
    paths = [str(REPO / "services"), str(REPO / "projections"), str(REPO)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def read_line(proc: subprocess.Popen[str], timeout_s: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no line from the launcher within {timeout_s}s"
    return proc.stdout.readline().strip()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_launcher_stops_its_jvm_and_removes_its_folder(signum: signal.Signals) -> None:
    require_broker()
    proc = subprocess.Popen(
        [sys.executable, "-m", LAUNCHER, "run"],
        stdout=subprocess.PIPE,
        text=True,
        env=launcher_env(),
        start_new_session=True,  # the signal reaches the launcher alone, not its JVM
    )
    jvm = 0
    try:
        bootstrap = read_line(proc, 120)
        assert bootstrap.startswith("127.0.0.1:"), bootstrap
        [jvm] = [c for c in children(proc.pid) if "kafka.Kafka" in cmdline(c)]
        config = Path(cmdline(jvm)[-2])  # kafka.Kafka <server.properties>
        folder = config.parent
        assert folder.name.startswith("callgate-kafka-") and folder.is_dir()
        os.kill(proc.pid, signum)
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 5
        while alive(jvm) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(jvm), f"the broker's JVM {jvm} outlived its launcher"
        assert not folder.exists(), f"{folder} was left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if jvm and alive(jvm):
            os.kill(jvm, signal.SIGKILL)


def jvms_of(data_dir: Path) -> list[int]:
    """Live JVMs whose broker configuration lies in ``data_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = cmdline(int(entry.name))
            except OSError:
                continue
            if "kafka.Kafka" in argv and any(str(data_dir) in a for a in argv):
                found.append(int(entry.name))
    return [pid for pid in found if alive(pid)]


def test_start_runs_in_the_background_keeps_its_data_and_stop_leaves_no_process(
    tmp_path: Path,
) -> None:
    """``make kafka`` / ``make kafka-stop`` (with a free port here): the broker answers on the
    port asked for, a topic created before a stop is there after the next start, and a stop
    leaves no launcher, no JVM and no pid file."""
    from confluent_kafka.admin import AdminClient
    from confluent_kafka.cimpl import NewTopic
    from tools.ports import free_port

    require_broker()
    data, port = tmp_path / "kafka", free_port()

    def tool(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", LAUNCHER, *args, "--data-dir", str(data)]
        return subprocess.run(
            argv, capture_output=True, text=True, env=launcher_env(), timeout=240, check=False
        )

    def topics() -> set[str]:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
        return set(admin.list_topics(timeout=30).topics)

    try:
        started = tool("start", "--port", str(port))
        assert started.returncode == 0, started
        assert f"127.0.0.1:{port}" in started.stdout
        pid = int((data / "kafka.pid").read_text())
        assert tool("start", "--port", str(port)).stdout.startswith("apache kafka already runs")
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
        admin.create_topics([NewTopic("kept", 1, 1)])["kept"].result(30)
        assert tool("stop").returncode == 0
        assert not alive(pid) and not jvms_of(data) and not (data / "kafka.pid").exists()

        assert tool("start", "--port", str(port)).returncode == 0
        assert "kept" in topics()
    finally:
        stopped = tool("stop")
    assert stopped.returncode == 0, stopped
    assert not jvms_of(data) and not (data / "kafka.pid").exists()
    assert tool("stop").stdout.strip() == "apache kafka is not running"
