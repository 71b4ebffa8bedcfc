"""A multi-broker KRaft cluster on this machine: N JVMs, each a broker and a voter of a static quorum.

    <home>/kafka-cluster/
        cluster.id     the cluster id every node's storage is formatted with
        node-1/ ...    one `KafkaNode` directory per broker (node ids 1..N)

Combined broker+controller nodes keep start-up to one JVM per broker; with
three voters the quorum and the replicated topics survive the loss of any one
node. Ports are chosen once and remembered in `services.json`, so a broker
killed by index restarts with the same identity and listeners.
"""
from __future__ import annotations

import base64
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from infra.errors import InfraError
from infra.kafka_node import KafkaNode, Quorum
from infra.ports import free_port
from infra.state import ServiceRecord

MAX_BROKERS = 9


class KafkaCluster:
    def __init__(self, home: Path, size: int, heap: str, jars: Path | None) -> None:
        if not 2 <= size <= MAX_BROKERS:
            raise InfraError(f"a local cluster has 2..{MAX_BROKERS} brokers, not {size}")
        self.dir = home / "kafka-cluster"
        self.nodes = [KafkaNode(home, heap, jars, node_id=i, directory=self.dir / f"node-{i}")
                      for i in range(1, size + 1)]

    @property
    def size(self) -> int:
        return len(self.nodes)

    def start(self, records: list[ServiceRecord], timeout_s: float) -> list[ServiceRecord]:
        """Start every node that is not running (idempotent) and wait until every broker port answers."""
        records = self._with_ports(records)
        quorum = self._quorum(records)

        def launch(node: KafkaNode, record: ServiceRecord) -> ServiceRecord:
            if node.is_ours_running(record):
                return record
            return node.launch(record.port, _controller_port(record), quorum)  # type: ignore[arg-type]

        # Formatting runs one JVM per node: side by side it costs one start-up instead of N.
        with ThreadPoolExecutor(self.size) as pool:
            started = list(pool.map(launch, self.nodes, records))
        deadline = time.monotonic() + timeout_s
        for node, record in zip(self.nodes, started):
            node.wait_listening(record, max(1.0, deadline - time.monotonic()))
        return started

    def start_broker(self, records: list[ServiceRecord], index: int, timeout_s: float) -> ServiceRecord:
        """(Re)start broker `index` (1-based) with its remembered ports; the others must be known."""
        node, record = self._node(index), records[index - 1]
        if node.is_ours_running(record):
            return record
        started = node.launch(record.port, _controller_port(record), self._quorum(records))  # type: ignore[arg-type]
        node.wait_listening(started, timeout_s)
        return started

    def kill_broker(self, records: list[ServiceRecord], index: int) -> bool:
        return self._node(index).kill(records[index - 1])

    def stop(self, records: list[ServiceRecord]) -> bool:
        with ThreadPoolExecutor(self.size) as pool:  # controlled shutdowns side by side
            return any(list(pool.map(lambda node, record: node.stop(record), self.nodes, records)))

    def running(self, records: list[ServiceRecord]) -> list[bool]:
        return [node.is_ours_running(record) for node, record in zip(self.nodes, records)]

    @staticmethod
    def bootstrap(records: list[ServiceRecord]) -> str:
        return ",".join(f"127.0.0.1:{record.port}" for record in records if record.port)

    # -- internals --------------------------------------------------------------------------
    def _node(self, index: int) -> KafkaNode:
        if not 1 <= index <= self.size:
            raise InfraError(f"no broker {index}: the cluster has brokers 1..{self.size}")
        return self.nodes[index - 1]

    def _with_ports(self, records: list[ServiceRecord]) -> list[ServiceRecord]:
        """Remembered ports where there are some, else fresh ones: every node's quorum port must be known
        before the first node starts."""
        if len(records) == self.size and all(r.port and r.extra.get("controller_port") for r in records):
            return records
        taken: set[int] = set()
        fresh = []
        for _ in self.nodes:
            port, controller_port = _fresh_port(taken), _fresh_port(taken)
            fresh.append(ServiceRecord(port=port, extra={"controller_port": controller_port}))
        return fresh

    def _quorum(self, records: list[ServiceRecord]) -> Quorum:
        id_file = self.dir / "cluster.id"
        if not id_file.is_file():
            self.dir.mkdir(parents=True, exist_ok=True)
            id_file.write_text(random_cluster_id() + "\n")
        return Quorum(id_file.read_text().strip(), tuple(_controller_port(r) for r in records))


def random_cluster_id() -> str:
    """What Kafka's `Uuid.randomUuid()` prints (URL-safe base64 of 16 random bytes, unpadded), without a JVM.

    Like Kafka's, never one starting with '-': the storage tool's argument parser would take it for an option
    (1 run in 64 failed to format so)."""
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()).startswith("-"):
        pass
    return cluster_id


def _controller_port(record: ServiceRecord) -> int:
    return int(record.extra["controller_port"])


def _fresh_port(taken: set[int]) -> int:
    while (port := free_port(0)) in taken:
        pass
    taken.add(port)
    return port
