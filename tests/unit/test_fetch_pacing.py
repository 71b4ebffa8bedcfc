"""A bridge reader paces its fetches by how many records each brings in how long: a real-model stream (a token
every ~100 ms, a step's tokens of every stream at once) is read with long polls, one fetch per step; only a
flow of several records per fetch, arriving faster than fetches are answered, is batched."""
from __future__ import annotations

from types import SimpleNamespace

from aiokafka import ConsumerRecord, TopicPartition

from plumbing.kafka.clients import LONG_POLL_MS
from producers.gateway.streams.readers import BUSY_POLL_MS, BUSY_RECORDS, FLOW_WAIT_MS, FetchPacing, PartitionReader

TP = TopicPartition("llm.tokens", 0)


def make_record(offset: int) -> ConsumerRecord:
    return ConsumerRecord("llm.tokens", 0, offset, 0, 0, None, b"{}", None, 2, 0, [])


class FakeConsumer:
    """getmany answers the batches given, one per call, each after its wait in ms (none by default) on `now`,
    and records the timeouts it was asked for."""

    def __init__(self, batches: list[int], waits_ms: list[float] | None = None) -> None:
        self.sizes, self.offset, self.timeouts = list(batches), 0, []
        self.waits_ms, self.now = list(waits_ms or [0.0] * len(batches)), 0.0
        self._fetcher = SimpleNamespace(_fetch_min_bytes=1, _fetch_max_wait_ms=LONG_POLL_MS)

    async def getmany(self, timeout_ms: int):
        self.timeouts.append(timeout_ms)
        self.now += self.waits_ms.pop(0) / 1000
        size = self.sizes.pop(0)
        records = [make_record(self.offset + i) for i in range(size)]
        self.offset += size
        return {TP: records} if records else {}


def make_reader(batches: list[int], waits_ms: list[float] | None = None) -> tuple[PartitionReader, list[int]]:
    delivered: list[int] = []
    reader = PartitionReader(lambda records, _owned: delivered.extend(r.offset for r in records), lambda: None,
                             lambda *_: None)
    reader.consumer = FakeConsumer(batches, waits_ms)
    reader.clock = lambda: reader.consumer.now
    reader.next_offsets[TP] = 0
    return reader, delivered


async def test_one_record_per_fetch_stays_on_long_polls():
    reader, delivered = make_reader([1, 1, 0, 1])
    for _ in range(4):
        await reader.poll_once(timeout_ms=1000)
        assert reader.pacing.mode == "live"
        assert reader.consumer._fetcher._fetch_max_wait_ms == LONG_POLL_MS and reader.consumer._fetcher._fetch_min_bytes == 1
    assert delivered == [0, 1, 2] and reader.consumer.timeouts == [1000] * 4


async def test_a_flow_is_batched_and_goes_back_to_long_polls_at_its_first_thin_fetch():
    reader, delivered = make_reader([BUSY_RECORDS, BUSY_RECORDS + 3, 1, 0])
    await reader.poll_once(timeout_ms=1000)
    assert reader.pacing.mode == "busy"
    assert (reader.consumer._fetcher._fetch_min_bytes, reader.consumer._fetcher._fetch_max_wait_ms) == \
        FetchPacing.MODES["busy"]
    await reader.poll_once(timeout_ms=1000)
    assert reader.pacing.mode == "busy"
    await reader.poll_once(timeout_ms=1000)
    assert reader.pacing.mode == "live" and reader.consumer._fetcher._fetch_max_wait_ms == LONG_POLL_MS
    await reader.poll_once(timeout_ms=1000)
    assert reader.consumer.timeouts == [1000, BUSY_POLL_MS, BUSY_POLL_MS, 1000]
    assert delivered == list(range(2 * BUSY_RECORDS + 4))


async def test_a_step_of_many_streams_waited_for_stays_on_long_polls():
    """A worker publishes one step's tokens of 16 streams at once, ~100 ms apart: each poll waited for them."""
    reader, delivered = make_reader([16, 16, 16], waits_ms=[100.0, 95.0, 120.0])
    for _ in range(3):
        await reader.poll_once(timeout_ms=1000)
        assert reader.pacing.mode == "live"
        assert reader.consumer._fetcher._fetch_max_wait_ms == LONG_POLL_MS
    assert delivered == list(range(48)) and reader.consumer.timeouts == [1000] * 3


async def test_a_flow_is_told_by_records_per_wait():
    """BUSY_RECORDS for every FLOW_WAIT_MS waited is a flow, fewer is not; so is a poll of records already there."""
    reader, _ = make_reader([BUSY_RECORDS * 4, BUSY_RECORDS * 4, BUSY_RECORDS],
                            waits_ms=[4 * FLOW_WAIT_MS, 4 * FLOW_WAIT_MS + 1, 0.0])
    await reader.poll_once(timeout_ms=1000)
    assert reader.pacing.mode == "busy"
    await reader.poll_once(timeout_ms=1000)
    assert reader.pacing.mode == "live"
    await reader.poll_once(timeout_ms=1000)
    assert reader.pacing.mode == "busy"


async def test_records_nobody_wants_are_fetched_in_large_batches():
    reader, _ = make_reader([1, 0])
    reader.wanted = lambda: False
    await reader.poll_once(timeout_ms=1000)
    assert reader.pacing.mode == "idle" and reader.consumer._fetcher._fetch_max_wait_ms == FetchPacing.MODES["idle"][1]
    await reader.poll_once(timeout_ms=1000)  # the records stopped: long polls, not 20 empty fetches a second
    assert reader.pacing.mode == "quiet"
    assert (reader.consumer._fetcher._fetch_min_bytes, reader.consumer._fetcher._fetch_max_wait_ms) == (1, LONG_POLL_MS)


async def test_a_party_that_subscribes_to_a_busy_unwanted_reader_is_paced_as_a_flow_at_once():
    reader, _ = make_reader([BUSY_RECORDS + 1])
    reader.wanted = lambda: False
    await reader.poll_once(timeout_ms=1000)
    assert reader.pacing.mode == "idle"
    reader.wanted = lambda: True
    reader.pace()
    assert reader.pacing.mode == "busy" and reader.consumer._fetcher._fetch_max_wait_ms == 2
