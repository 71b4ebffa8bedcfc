"""Which records of a poll the exporter takes, and how far each partition moves (projections/export/runtime.take).

The consumer's position is where it has read up to: past transaction markers and aborted batches, which no
record comes back for. The exporter moves there, never past what the lifecycle projection has committed."""
from __future__ import annotations

from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord

from projections.export.runtime import take
from schemas.topics import GENERATIONS

P0, P1 = TopicPartition(GENERATIONS, 0), TopicPartition(GENERATIONS, 1)


def record(tp: TopicPartition, offset: int, kind: str = "UsageReported", key: str = "gen-a") -> ConsumerRecord:
    return ConsumerRecord(topic=tp.topic, partition=tp.partition, offset=offset, timestamp=0, timestamp_type=0,
                          key=key.encode(), value=b"{}", checksum=None, serialized_key_size=len(key),
                          serialized_value_size=2, headers=[("type", kind.encode())])


def moved(taken) -> dict[TopicPartition, int]:
    return {item.tp: item.next_offset for item in taken}


def test_records_before_the_projectors_offset_are_taken_and_the_partition_moves_past_them():
    batches = {P0: [record(P0, 10), record(P0, 11, "Completed")]}
    taken, seeks, held = take({P0: 10}, batches, {P0: 12}, {0: 50})
    assert moved(taken) == {P0: 12} and seeks == {} and not held
    assert list(taken[0].terminal) == ["gen-a"]


def test_a_partition_moves_over_what_the_consumer_skipped_up_to_the_projectors_offset():
    # records 10..11 come back; 12..29 were an aborted transaction and its marker: the position is 30
    batches = {P0: [record(P0, 10), record(P0, 11)]}
    assert moved(take({P0: 10}, batches, {P0: 30}, {0: 30})[0]) == {P0: 30}
    # never past the projector: it has committed up to 20 only
    assert moved(take({P0: 10}, batches, {P0: 30}, {0: 20})[0]) == {P0: 20}


def test_a_partition_with_no_records_in_the_poll_moves_to_its_position_too():
    taken, seeks, held = take({P0: 10, P1: 5}, {P1: [record(P1, 5)]}, {P0: 40, P1: 6}, {0: 35, 1: 6})
    assert moved(taken) == {P0: 35, P1: 6} and not held
    assert taken[[t.tp for t in taken].index(P0)].terminal == {}


def test_records_the_projector_has_not_committed_are_held_and_what_lies_before_them_is_passed():
    # nothing comes back between 10 and 58, then 58.. (not projected yet: the projector stands at 40)
    batches = {P0: [record(P0, 58), record(P0, 59)]}
    taken, seeks, held = take({P0: 10}, batches, {P0: 60}, {0: 40})
    assert held and seeks == {P0: 58}
    assert moved(taken) == {P0: 40}
    # the same poll with the projector at 59: record 58 is taken, 59 is held
    taken, seeks, held = take({P0: 10}, batches, {P0: 60}, {0: 59})
    assert held and seeks == {P0: 59} and moved(taken) == {P0: 59}


def test_records_before_the_stored_offset_send_the_consumer_back_and_move_nothing():
    taken, seeks, held = take({P0: 20}, {P0: [record(P0, 8), record(P0, 9)]}, {P0: 10}, {0: 50})
    assert taken == [] and seeks == {P0: 20} and not held


def test_nothing_moves_when_the_position_is_not_past_the_stored_offset_or_the_projector_is_behind():
    assert take({P0: 30}, {}, {P0: 30}, {0: 50})[0] == []
    assert take({P0: 30}, {}, {P0: 45}, {0: 25})[0] == []
    assert take({}, {}, {}, {0: 25})[0] == []


def test_each_partition_is_committed_against_the_stored_offset_it_was_taken_from():
    # the listener may load a newer stored offset before the commit: the commit must expect this one
    stored = {P0: 10, P1: None}
    taken, _, _ = take(stored, {P0: [record(P0, 10)], P1: [record(P1, 0)]}, {P0: 11, P1: 1}, {0: 50, 1: 50})
    stored[P0] = 30
    assert {item.tp: (item.expected, item.next_offset) for item in taken} == {P0: (10, 11), P1: (None, 1)}
