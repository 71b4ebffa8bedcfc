"""What the platform wrote to Kafka in a window: records and bytes per topic.

    records  end offsets summed over a topic's partitions (ListOffsets); transaction markers take an offset
             too, so they count as records, as they do in the log
    bytes    the sizes of the topic's log segments (`*.log`) in the local brokers' log dirs: the record
             batches as stored, headers and batch overhead included, every replica counted. Segments are 1 GiB
             and no retention or compaction touches the active one in a run of minutes; a shrink (a deleted or
             compacted segment) would show as negative bytes, reported as it is.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bench.proc_cpu import PROC
from plumbing.kafka.clients import Kafka


@dataclass(frozen=True)
class TopicSnapshot:
    records: dict[str, int]
    bytes: dict[str, int]


def broker_log_dirs(broker_pids: list[int]) -> list[Path]:
    """`log.dirs` of each broker, read from the server.properties its command line names."""
    dirs: list[Path] = []
    for pid in broker_pids:
        try:
            argv = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for arg in argv:
            if arg.endswith(b".properties") and b"log4j" not in arg:
                dirs += log_dirs_of(Path(arg.decode()).read_text())
    return dirs


def log_dirs_of(properties: str) -> list[Path]:
    for line in properties.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("log.dirs", "log.dir"):
            return [Path(d.strip()) for d in value.split(",") if d.strip()]
    return []


def topic_of(partition_dir: str) -> str | None:
    """`llm.tokens-3` -> `llm.tokens`; None for what is not a partition directory."""
    topic, _, partition = partition_dir.rpartition("-")
    return topic if topic and partition.isdigit() else None


def segment_bytes(log_dirs: list[Path]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for log_dir in log_dirs:
        for partition_dir in log_dir.glob("*-*"):
            topic = topic_of(partition_dir.name)
            if topic is None or not partition_dir.is_dir():
                continue
            for segment in partition_dir.glob("*.log"):
                try:
                    sizes[topic] = sizes.get(topic, 0) + segment.stat().st_size
                except OSError:  # a segment deleted between listing and stat
                    pass
    return sizes


async def partition_end_offsets(kafka: Kafka, topics: list[str]) -> dict[tuple[str, int], int]:
    """End offset of every partition of `topics` (internal topics included when asked for)."""
    from aiokafka import TopicPartition

    from plumbing.kafka.clients import make_consumer

    consumer = make_consumer(kafka, client_id="bench-overhead", auto_offset_reset="latest")
    await consumer.start()
    try:
        await consumer._client.force_metadata_update()  # noqa: SLF001 - internal topics need fresh metadata
        partitions = [TopicPartition(topic, p) for topic in topics
                      for p in sorted(consumer._client.cluster.partitions_for_topic(topic) or ())]  # noqa: SLF001
        ends = await consumer.end_offsets(partitions) if partitions else {}
    finally:
        await consumer.stop()
    return {(tp.topic, tp.partition): offset for tp, offset in ends.items()}


async def end_offsets(bootstrap: str, topics: list[str]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for (topic, _), offset in (await partition_end_offsets(bootstrap, topics)).items():
        totals[topic] = totals.get(topic, 0) + offset
    return totals


async def snapshot(bootstrap: str, log_dirs: list[Path]) -> TopicSnapshot:
    sizes = segment_bytes(log_dirs)
    topics = sorted(t for t in sizes if t != "__cluster_metadata")
    return TopicSnapshot(await end_offsets(bootstrap, topics), sizes)


def topic_deltas(before: TopicSnapshot, after: TopicSnapshot) -> dict[str, dict[str, int | None]]:
    """Records and bytes each topic gained; topics that did not change are left out."""
    deltas = {}
    for topic in sorted(set(after.records) | set(after.bytes)):
        records = (after.records[topic] - before.records.get(topic, 0)) if topic in after.records else None
        size = after.bytes.get(topic, 0) - before.bytes.get(topic, 0)
        if records or size:
            deltas[topic] = {"records": records, "bytes": size}
    return deltas
