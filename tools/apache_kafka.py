"""Start a single-node Apache Kafka broker (KRaft, combined mode) on loopback, from Maven.

Used by the test suite, ``python -m tools chaos --broker apache`` and anyone who wants the real
broker without Docker (docs/adr/0015-apache-kafka-and-many-instances.md). The broker's jars are
``org.apache.kafka:kafka_2.13:KAFKA_VERSION`` and its runtime dependencies, fetched once by
Maven (``mvn dependency:copy-dependencies``) into a cache directory; the broker runs as
``java -cp <jars> kafka.Kafka server.properties`` after ``kafka.tools.StorageTool format``.
Every start gets a fresh log directory (nothing survives a stop) and free loopback ports.

The configuration is the one a test broker needs: replication factor 1 everywhere (a
transactional producer never initialises on a single node otherwise), no initial rebalance
delay, group session timeouts down to 1 s allowed, few internal-topic partitions (quick to
create), and timed-out transactions aborted within a second or two (the takeover of a lost
instance waits for its open transaction: ADR 0015).

``python -m tools.apache_kafka fetch`` fills the cache (CI runs it);
``python -m tools.apache_kafka run`` starts a broker in the foreground, prints its
bootstrap address and stops it (JVM and temporary folder) on SIGTERM or SIGINT;
``start --data-dir D`` / ``stop --data-dir D`` (``make kafka``, ``make kafka-stop``) run
one in the background on 127.0.0.1:9092, its data kept in D across restarts.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from callgate.adapters.kafka.client import LIBRDKAFKA_LOG
from tools import end_process
from tools.cache import tool_cache
from tools.ports import free_port

KAFKA_VERSION = "4.4.0"  # docker-compose.yml runs apache/kafka with the same version
LOG4J_VERSION = "2.24.3"  # the log4j-core that kafka_2.13 depends on; binds its slf4j logging
CACHE_ENV = "CALLGATE_KAFKA_CACHE"
JAVA_ENV = "CALLGATE_JAVA"
HEAP = "-Xmx768m"
DEFAULT_PORT = 9092  # ``make kafka``: Kafka's usual port, callgate's default bootstrap


def port_is_free(port: int) -> bool:
    """Can a listener bind 127.0.0.1:``port`` right now? (as the broker binds it: connections
    of a stopped broker in TIME_WAIT do not count)"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


POM = """<?xml version="1.0" encoding="UTF-8"?>
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>callgate.local</groupId>
  <artifactId>apache-kafka-broker</artifactId>
  <version>{kafka}</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""

LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = WARN
logger.kafka-request.name = kafka.request.logger
logger.kafka-request.level = WARN
logger.org-apache-kafka.name = org.apache.kafka
logger.org-apache-kafka.level = WARN
"""


class KafkaUnavailable(RuntimeError):
    """Java or Maven is missing, the jars could not be fetched, or the broker did not start."""


def cache_dir() -> Path:
    """Where the jars live: ``$CALLGATE_KAFKA_CACHE``, else ``~/.cache/callgate/kafka``."""
    return tool_cache("kafka", CACHE_ENV)


def find_java() -> str:
    """``$CALLGATE_JAVA``, else ``$JAVA_HOME/bin/java``, else ``java`` on PATH (17 or newer)."""
    candidates = [os.environ.get(JAVA_ENV, "")]
    if os.environ.get("JAVA_HOME"):
        candidates.append(str(Path(os.environ["JAVA_HOME"]) / "bin" / "java"))
    candidates.append(shutil.which("java") or "")
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise KafkaUnavailable("no Java runtime (java on PATH, JAVA_HOME or CALLGATE_JAVA)")


def jars(version: str = KAFKA_VERSION, cache: Path | None = None) -> list[Path]:
    """The broker's classpath, fetched by Maven into the cache the first time."""
    libs = (cache or cache_dir()) / version / "libs"
    done = libs / ".complete"
    if not done.exists():
        _fetch(version, libs)
        done.touch()
    found = sorted(libs.glob("*.jar"))
    if not any(p.name == f"kafka_2.13-{version}.jar" for p in found):
        raise KafkaUnavailable(f"{libs} holds no kafka_2.13-{version}.jar")
    return found


def _fetch(version: str, libs: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaUnavailable("no Maven (mvn on PATH) to fetch the Apache Kafka jars")
    work = libs.parent
    work.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(libs, ignore_errors=True)
    (work / "pom.xml").write_text(POM.format(kafka=version, log4j=LOG4J_VERSION))
    argv = [
        mvn, "-q", "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
        "-DincludeScope=runtime", f"-DoutputDirectory={libs}",
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
    except subprocess.TimeoutExpired as exc:
        raise KafkaUnavailable("mvn did not fetch the Apache Kafka jars within 900 s") from exc
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise KafkaUnavailable(f"mvn exited {done.returncode}: {' | '.join(tail)}")


def unavailable() -> str | None:
    """Why no Apache Kafka broker can start here (fetching the jars if need be), or None."""
    try:
        find_java()
        jars()
    except KafkaUnavailable as exc:
        return str(exc)
    return None


def java_major(java: str) -> int | None:
    """The feature release of ``java`` (17 for "17.0.15", 8 for "1.8.0"), None if unknown."""
    try:
        done = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in (done.stderr + done.stdout).splitlines():
        if "version" in line and '"' in line:
            parts = line.split('"')[1].split(".")
            digits = parts[1] if parts[0] == "1" and len(parts) > 1 else parts[0]
            return int(digits) if digits.isdigit() else None
    return None


def cached_unavailable(version: str = KAFKA_VERSION) -> str | None:
    """Why no Apache Kafka broker can start here *without fetching anything* (Java 17 or
    newer, the jars already in the cache), or None. ``unavailable`` fetches the jars."""
    try:
        java = find_java()
    except KafkaUnavailable as exc:
        return str(exc)
    major = java_major(java)
    if major is None or major < 17:
        return f"{java} is not Java 17 or newer (found: {major or 'unknown'})"
    if not (cache_dir() / version / "libs" / ".complete").exists():
        return f"the Apache Kafka {version} jars are not fetched yet (make kafka-fetch)"
    return None


def cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def sasl_accounts(users: Mapping[str, str]) -> dict[str, str]:
    """The ``SASL_PLAINTEXT`` listener's PLAIN mechanism and its accounts (name -> password):
    a client reaches that listener only with the right ``sasl.*`` settings."""
    quote = json.dumps  # JAAS values are double-quoted strings
    accounts = " ".join(f"user_{name}={quote(pw)}" for name, pw in users.items())
    return {
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": (
            f"org.apache.kafka.common.security.plain.PlainLoginModule required {accounts};"
        ),
        "sasl.enabled.mechanisms": "PLAIN",
    }


def broker_properties(
    port: int,
    controller_port: int,
    log_dir: Path,
    sasl_port: int = 0,
    node_id: int = 1,
    voters: str = "",
    replicas: int = 1,
    external: tuple[int, str] | None = None,
) -> dict[str, str]:
    """The test broker's ``server.properties`` (module docstring); with a ``SASL_PLAINTEXT``
    listener on ``sasl_port`` when given (its accounts: ``sasl_listener``). A node of a
    cluster (``tools.kafka_cluster``) gives its ``node_id``, the cluster's controller
    ``voters`` and the ``replicas`` of the internal topics (``min.insync.replicas`` 2).
    ``external`` (port, address): a plaintext ``EXTERNAL`` listener on that port that
    advertises that address (a fault proxy's, ``tools.toxiproxy``): a client that
    bootstraps there is told to reach the broker at that address, so all its connections
    pass through the proxy."""
    listeners = f"PLAINTEXT://127.0.0.1:{port}"
    advertised = listeners
    if sasl_port:
        listeners += f",SASL_PLAINTEXT://127.0.0.1:{sasl_port}"
        advertised = listeners
    if external is not None:
        listeners += f",EXTERNAL://127.0.0.1:{external[0]}"
        advertised += f",EXTERNAL://{external[1]}"
    rf, isr = str(replicas), str(min(2, replicas))
    return {
        "process.roles": "broker,controller",
        "node.id": str(node_id),
        "controller.quorum.voters": voters or f"{node_id}@127.0.0.1:{controller_port}",
        "listeners": f"{listeners},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": advertised,
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": (
            "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,"
            "EXTERNAL:PLAINTEXT"
        ),
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "6",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": "6",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "default.replication.factor": rf,
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "group.consumer.min.session.timeout.ms": "1000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        # A lost producer's open transaction is aborted soon after its timeout (default
        # check: every 10 s), so a takeover does not wait for the check (ADR 0015).
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
        "log.retention.check.interval.ms": "60000",
    }


def warm_up(client: Mapping[str, Any], timeout_s: float) -> None:
    """Create the offsets and transaction-state topics now and wait until their
    coordinators answer, so that the first group or transaction of a test does not meet
    ``NOT_COORDINATOR`` / ``COORDINATOR_LOAD_IN_PROGRESS``. ``client``: the settings that
    reach the broker or cluster."""
    deadline = time.monotonic() + timeout_s
    probe = f"callgate.warm-up.{uuid.uuid4().hex[:8]}"
    consumer = Consumer({**client, "group.id": probe})
    try:
        while True:
            try:
                consumer.committed([TopicPartition(probe, 0)], timeout=5)
                break
            except KafkaException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    finally:
        consumer.close()
    # librdkafka's lines ("coordinator load in progress") go to callgate's logger
    producer = Producer({**client, "transactional.id": probe})
    producer.init_transactions(max(1.0, deadline - time.monotonic()))


class ApacheKafka:
    """Context manager: an Apache Kafka broker on free loopback ports; ``.bootstrap``.

    ``with ApacheKafka() as kafka: ... kafka.bootstrap`` -- stopped (SIGTERM, then SIGKILL)
    on exit, its log directory removed. ``.log`` is the broker's own log file.
    """

    def __init__(
        self,
        start_timeout_s: float = 90.0,
        version: str = KAFKA_VERSION,
        sasl_users: Mapping[str, str] | None = None,
        port: int = 0,
        data_dir: Path | None = None,
        advertise_external: str = "",
    ) -> None:
        """``sasl_users`` (name -> password): also listen with ``SASL_PLAINTEXT`` (PLAIN) on
        ``.sasl_bootstrap``, for those accounts. ``port``: listen there (its controller on
        the next port) instead of on free ports. ``data_dir``: keep the broker's data and
        logs there across restarts instead of in a temporary folder removed on stop.
        ``advertise_external`` (host:port of a proxy): also listen on ``.external_port``
        and advertise that address there (``broker_properties``' ``external``)."""
        self._advertise_external = advertise_external
        self.external_port = 0
        self._start_timeout_s = start_timeout_s
        self._version = version
        self._sasl_users = dict(sasl_users or {})
        self._fixed_port = port
        self._data_dir = data_dir
        self._proc: subprocess.Popen[bytes] | None = None
        self._root: Path | None = None
        self._ports: tuple[int, int] | None = None  # (listener, controller) once started
        self.port = 0
        self.sasl_port = 0

    @property
    def bootstrap(self) -> str:
        if self._proc is None:
            raise KafkaUnavailable("broker is not running")
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker's JVM process id while it runs (the bench reads its CPU time)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def sasl_bootstrap(self) -> str:
        if self._proc is None or not self.sasl_port:
            raise KafkaUnavailable("broker is not running with a SASL listener")
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def log(self) -> Path:
        assert self._root is not None
        return self._root / "broker.log"

    def start(self) -> ApacheKafka:
        java, classpath = find_java(), os.pathsep.join(str(p) for p in jars(self._version))
        if self._data_dir is not None:
            self._data_dir.mkdir(parents=True, exist_ok=True)
            self._root = self._data_dir
        elif self._root is None:  # a restart keeps the folder of the first start
            self._root = Path(tempfile.mkdtemp(prefix="callgate-kafka-"))
        again = self._ports is not None
        for _ in range(1 if self._fixed_port or again else 3):  # a free port may be taken
            if self._ports is not None:
                self.port, controller = self._ports
            elif self._fixed_port:
                self.port, controller = self._fixed_port, self._fixed_port + 1
                taken = [p for p in (self.port, controller) if not port_is_free(p)]
                if taken:
                    self.stop()
                    raise KafkaUnavailable(f"127.0.0.1:{taken[0]} is in use (another broker?)")
            else:
                self.port, controller = free_port(), free_port()
            kept = self._data_dir is not None
            self._ports = (self.port, controller)
            log_dir = self._root / ("data" if kept else f"data-{self.port}")
            config = self._root / "server.properties"
            self.sasl_port = free_port() if self._sasl_users else 0
            if self._advertise_external and not self.external_port:
                self.external_port = free_port()  # kept across restarts: the proxy's upstream
            external = (
                (self.external_port, self._advertise_external) if self._advertise_external else None
            )
            props = broker_properties(
                self.port, controller, log_dir, self.sasl_port, external=external
            )
            if self._sasl_users:
                props.update(sasl_accounts(self._sasl_users))
            config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            logging = self._root / "log4j2.properties"
            logging.write_text(LOG4J2.format(path=self.log))
            jvm = [java, HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true",
                   f"-Dlog4j2.configurationFile={logging}", "-cp", classpath]  # fmt: skip
            fmt = [
                *jvm,
                "kafka.tools.StorageTool",
                "format",
                f"--cluster-id={cluster_id()}",
                "-c",
                str(config),
            ]
            if (log_dir / "meta.properties").exists():
                fmt = []  # formatted by an earlier start: its data is kept
            done = (
                subprocess.run(fmt, capture_output=True, text=True, timeout=120, check=False)
                if fmt
                else subprocess.CompletedProcess(fmt, 0, "", "")
            )
            if done.returncode != 0:
                raise KafkaUnavailable(f"kafka-storage format failed: {done.stdout}{done.stderr}")
            with (self._root / "broker.out").open("ab") as out:
                self._proc = subprocess.Popen(
                    [*jvm, "kafka.Kafka", str(config)],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            if self._wait_ready():
                self._warm_up()
                return self
            self._terminate()
            if not again and not self._fixed_port:
                self._ports = None  # try other free ports
        detail = self._tail()
        self.stop()
        raise KafkaUnavailable(f"Apache Kafka did not start in {self._start_timeout_s}s: {detail}")

    def _tail(self) -> str:
        assert self._root is not None
        out = self._root / "broker.out"
        lines = out.read_text(errors="replace").splitlines() if out.exists() else []
        return " | ".join(lines[-5:])

    def _client(self, **settings: Any) -> dict[str, Any]:
        """A client of the plaintext listener: never this process's ``kafka_client``
        settings, which are for the deployment's cluster, not for this launcher's probes."""
        return {"bootstrap.servers": self.bootstrap, "logger": LIBRDKAFKA_LOG, **settings}

    def _wait_ready(self) -> bool:
        """Until the broker answers metadata naming itself (the controller has elected it)."""
        assert self._proc is not None
        deadline = time.monotonic() + self._start_timeout_s
        admin = AdminClient(self._client(log_level=0))
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            with contextlib.suppress(Exception):
                if admin.list_topics(timeout=2).brokers:
                    return True
            time.sleep(0.2)
        return False

    def _warm_up(self) -> None:
        warm_up(self._client(), self._start_timeout_s)

    def _terminate(self, grace_s: float = 20.0) -> None:
        proc, self._proc = self._proc, None
        end_process(proc, grace_s)

    def kill(self) -> None:
        """SIGKILL the broker's JVM, as a crash would; ``start`` brings it back on the same
        ports with the same data."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 20 s), then remove the temporary folder (a ``data_dir``
        is kept)."""
        self._terminate()
        self._ports = None
        root, self._root = self._root, None
        if root is not None and self._data_dir is None:
            shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> ApacheKafka:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def run(port: int = 0, data_dir: Path | None = None, pid_file: Path | None = None) -> int:
    """Run a broker in the foreground until SIGTERM or SIGINT, then stop it (its JVM and,
    without ``data_dir``, its temporary folder). Prints the bootstrap address once it
    answers; ``pid_file`` holds this process's id meanwhile. 1 when the broker exits by
    itself."""
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with ApacheKafka(port=port, data_dir=data_dir) as kafka:
            if pid_file is not None:
                pid_file.write_text(f"{os.getpid()}\n")
            print(kafka.bootstrap, flush=True)
            while not stopping.wait(0.5):
                if kafka._proc is None or kafka._proc.poll() is not None:
                    print(f"apache kafka exited by itself: {kafka._tail()}", file=sys.stderr)
                    return 1
        return 0
    finally:
        if pid_file is not None:
            pid_file.unlink(missing_ok=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def start(port: int, data_dir: Path, timeout_s: float = 180.0) -> int:
    """``run`` in the background (its own session, so a terminal's Ctrl-C does not reach
    it), its pid in ``data_dir/kafka.pid`` and its output in ``data_dir/launcher.log``;
    returns once the broker answers (0) or the launcher gave up (1)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    pid_file, log = data_dir / "kafka.pid", data_dir / "launcher.log"
    running = _running(pid_file)
    if running:
        print(f"apache kafka already runs (pid {running}) on 127.0.0.1:{port}")
        return 0
    argv = [sys.executable, "-m", "tools.apache_kafka", "run", "--port", str(port)]
    argv += ["--data-dir", str(data_dir), "--pid-file", str(pid_file)]
    with log.open("w") as out:
        launcher = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env=_env(),
        )  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not pid_file.exists():
        if launcher.poll() is not None or time.monotonic() > deadline:
            if launcher.poll() is None:
                launcher.terminate()
                launcher.wait(60)
            print(f"apache kafka did not start: {log.read_text().strip()}", file=sys.stderr)
            return 1
        time.sleep(0.2)
    print(f"apache kafka on 127.0.0.1:{port} (pid {launcher.pid}; data in {data_dir})")
    return 0


def stop(data_dir: Path, timeout_s: float = 60.0) -> int:
    """SIGTERM to the launcher ``start`` left running; returns once it, and so its JVM,
    has exited."""
    pid = _running(data_dir / "kafka.pid")
    if not pid:
        print("apache kafka is not running")
        return 0
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            print(f"apache kafka (pid {pid}) did not stop in {timeout_s:g}s", file=sys.stderr)
            return 1
        time.sleep(0.2)
    (data_dir / "kafka.pid").unlink(missing_ok=True)
    print(f"apache kafka stopped (data kept in {data_dir})")
    return 0


def _running(pid_file: Path) -> int:
    """The launcher's pid from ``pid_file`` if it still runs, else 0."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return 0
    return pid if _alive(pid) else 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")  # a zombie has exited (Linux)
    return not (stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z")


def _env() -> dict[str, str]:
    from tools import child_env

    return child_env()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Apache Kafka from Maven, on loopback.")
    parser.add_argument("action", choices=["fetch", "run", "start", "stop"])
    parser.add_argument("--port", type=int, default=0, help="default: a free port")
    parser.add_argument("--data-dir", type=Path, help="keep the data here (start, stop: needed)")
    parser.add_argument("--pid-file", type=Path, help="this process's id while it runs")
    ns = parser.parse_args(argv)
    try:
        if ns.action == "fetch":
            find_java()
            print(f"Apache Kafka {KAFKA_VERSION}: {len(jars())} jars in {cache_dir()}")
            return 0
        if ns.action in ("start", "stop") and ns.data_dir is None:
            parser.error(f"{ns.action} needs --data-dir")
        if ns.action == "start":
            return start(ns.port or DEFAULT_PORT, ns.data_dir)
        if ns.action == "stop":
            return stop(ns.data_dir)
        return run(ns.port, ns.data_dir, ns.pid_file)
    except KafkaUnavailable as exc:
        print(f"apache kafka: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
