"""An Apache Kafka cluster of several KRaft nodes on loopback, for the cluster tier and chaos.

Each node is a broker and a controller (combined mode) from the same jars as
``tools.apache_kafka``, in a folder of its own; the nodes form one controller quorum, and the
internal topics have a replica on every node up to three, with ``min.insync.replicas`` 2.
Topics callgate creates get three replicas by default (``replication_factor``), so a
partition keeps a leader while one node is down.

``kill()`` SIGKILLs the node that leads the most partitions (the busiest one), or the node
given; ``start()`` brings the killed nodes back on their ports and data, and returns once the
cluster lists them again. ``stop()`` stops every node and removes the folder.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka.admin import AdminClient

from callgate.adapters.kafka.client import LIBRDKAFKA_LOG
from tools.apache_kafka import (
    HEAP,
    LOG4J2,
    KafkaUnavailable,
    broker_properties,
    cluster_id,
    find_java,
    jars,
    warm_up,
)
from tools.ports import free_port

# A lost node is fenced (its partitions led by another replica) 3 s after its last heartbeat
# instead of 9 s: the failover a test waits for, within the bounds the brokers allow.
FAILOVER = {"broker.session.timeout.ms": "3000", "broker.heartbeat.interval.ms": "500"}
# The quorum's leader changes, in each node's log: how ``controller`` finds the active one.
RAFT_LOG = """logger.raft.name = org.apache.kafka.raft.QuorumState
logger.raft.level = INFO
"""
_LEADER = re.compile(r"\[RaftManager id=(\d+)\] Completed transition to Leader\(.*?\bepoch=(\d+)")


@dataclass
class _Node:
    node_id: int
    port: int
    controller_port: int
    root: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.root / "broker.log"


class KafkaCluster:
    """Context manager: ``size`` Apache Kafka nodes on free loopback ports; ``.bootstrap``."""

    def __init__(self, size: int = 3, start_timeout_s: float = 120.0) -> None:
        if size < 1:
            raise ValueError("a cluster needs at least one node")
        self.size = size
        self._start_timeout_s = start_timeout_s
        self._root: Path | None = None
        self._nodes: list[_Node] = []
        self._cluster_id = cluster_id()
        self.killed: list[int] = []  # node ids down since their kill

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self._nodes)

    def start(self) -> KafkaCluster:
        """Start every node (the first call), or the nodes ``kill`` took down."""
        if self._nodes:
            back, self.killed = [self._node(i) for i in self.killed], []
            for node in back:
                self._spawn(node)
            for node in back:
                self._wait_node(node)
            return self
        self._root = Path(tempfile.mkdtemp(prefix="callgate-kafka-cluster-"))
        for i in range(1, self.size + 1):
            root = self._root / f"node-{i}"
            root.mkdir()
            self._nodes.append(_Node(i, free_port(), free_port(), root))
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self._nodes)
        java, classpath = find_java(), os.pathsep.join(str(p) for p in jars())
        for node in self._nodes:
            props = broker_properties(
                node.port,
                node.controller_port,
                node.root / "data",
                node_id=node.node_id,
                voters=voters,
                replicas=min(3, self.size),
            )
            props.update(FAILOVER)
            (node.root / "server.properties").write_text(
                "".join(f"{k}={v}\n" for k, v in props.items())
            )
            (node.root / "log4j2.properties").write_text(LOG4J2.format(path=node.log) + RAFT_LOG)
            fmt = [*self._jvm(java, classpath, node), "kafka.tools.StorageTool", "format"]
            fmt += [f"--cluster-id={self._cluster_id}", "-c", str(node.root / "server.properties")]
            done = subprocess.run(fmt, capture_output=True, text=True, timeout=120, check=False)
            if done.returncode != 0:
                self.stop()
                raise KafkaUnavailable(f"kafka-storage format failed: {done.stdout}{done.stderr}")
        for node in self._nodes:
            self._spawn(node)
        try:
            self._wait_brokers(self.size)
            warm_up(self._client(), self._start_timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, node_id: int | None = None) -> int:
        """SIGKILL one node (default: the one leading the most partitions); its id."""
        target = self._node(node_id if node_id is not None else self.busiest())
        if target.proc is not None and target.proc.poll() is None:
            target.proc.kill()
            target.proc.wait(timeout=10)
        target.proc = None
        self.killed.append(target.node_id)
        return target.node_id

    def busiest(self) -> int:
        """The live node that leads the most partitions (of every topic)."""
        admin = AdminClient(self._client(log_level=0))
        metadata = admin.list_topics(timeout=10)
        leaders = Counter(p.leader for t in metadata.topics.values() for p in t.partitions.values())
        live = [n.node_id for n in self._nodes if n.proc is not None]
        return max(live, key=lambda n: (leaders.get(n, 0), -n))

    def controller(self) -> int:
        """The active controller: the quorum leader of the highest epoch in the nodes' logs."""
        best: tuple[int, int] | None = None
        for node in self._nodes:
            text = node.log.read_text(errors="replace") if node.log.exists() else ""
            for m in _LEADER.finditer(text):
                epoch, leader = int(m[2]), int(m[1])
                if best is None or epoch > best[0]:
                    best = (epoch, leader)
        if best is None:
            raise KafkaUnavailable("no node's log names a quorum leader")
        return best[1]

    def stop(self) -> None:
        """SIGTERM every node (SIGKILL after 20 s), then remove the folder."""
        procs = [n.proc for n in self._nodes if n.proc is not None]
        for node in self._nodes:
            node.proc = None
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()  # a controlled shutdown
        deadline = time.monotonic() + 20
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        root, self._root = self._root, None
        self._nodes = []
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def _spawn(self, node: _Node) -> None:
        java, classpath = find_java(), os.pathsep.join(str(p) for p in jars())
        with (node.root / "broker.out").open("ab") as out:
            argv = [*self._jvm(java, classpath, node), "kafka.Kafka"]
            node.proc = subprocess.Popen(
                [*argv, str(node.root / "server.properties")],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @staticmethod
    def _jvm(java: str, classpath: str, node: _Node) -> list[str]:
        return [java, HEAP, "-XX:+UseG1GC", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={node.root / 'log4j2.properties'}",
                "-cp", classpath]  # fmt: skip

    def _node(self, node_id: int) -> _Node:
        for node in self._nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no node {node_id}")

    def _client(self, **settings: Any) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap, "logger": LIBRDKAFKA_LOG, **settings}

    def _wait_brokers(self, count: int) -> None:
        """Until the cluster's metadata lists ``count`` brokers (a node that exits fails)."""
        deadline = time.monotonic() + self._start_timeout_s
        admin = AdminClient(self._client(log_level=0))
        while time.monotonic() < deadline:
            dead = [n for n in self._nodes if n.proc is not None and n.proc.poll() is not None]
            if dead:
                tail = (dead[0].root / "broker.out").read_text(errors="replace")[-800:]
                raise KafkaUnavailable(f"node {dead[0].node_id} exited: {tail}")
            with contextlib.suppress(Exception):
                if len(admin.list_topics(timeout=2).brokers) >= count:
                    return
            time.sleep(0.2)
        raise KafkaUnavailable(f"the cluster did not list {count} brokers in time")

    def _wait_node(self, node: _Node) -> None:
        """Until ``node`` itself answers metadata that lists it (its listener is up once it
        has caught up with the quorum; the others listed it all along until its session
        expired)."""
        deadline = time.monotonic() + self._start_timeout_s
        own: dict[str, Any] = {
            "bootstrap.servers": f"127.0.0.1:{node.port}",
            "logger": LIBRDKAFKA_LOG,
        }
        admin = AdminClient({**own, "log_level": 0})
        while time.monotonic() < deadline:
            if node.proc is not None and node.proc.poll() is not None:
                tail = (node.root / "broker.out").read_text(errors="replace")[-800:]
                raise KafkaUnavailable(f"node {node.node_id} exited: {tail}")
            with contextlib.suppress(Exception):
                if node.node_id in admin.list_topics(timeout=2).brokers:
                    return
            time.sleep(0.2)
        raise KafkaUnavailable(f"node {node.node_id} did not come back in time")

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
