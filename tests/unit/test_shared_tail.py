"""The bridge's shared tail without a broker: which records it decodes, and how a first subscriber reads back
what was skipped (records are fed as a reader would hand them over)."""
from __future__ import annotations

from aiokafka import ConsumerRecord, TopicPartition

from producers.gateway.streams.bridge import StreamBridge
from schemas.codec import encode, record_headers, record_key
from schemas.topics import GENERATIONS, TOKENS
from tests.factories import make_event

TENANT = "tenant-s"


def record(topic: str, event, offset: int, partition: int = 0) -> ConsumerRecord:
    value = encode(event)
    key = record_key(topic, event)
    return ConsumerRecord(topic, partition, offset, 0, 0, key, value, None, len(key), len(value),
                          record_headers(event))


def token(gen_id: str, seq: int):
    return make_event("TokensEmitted", TENANT, gen_id).model_copy(update={"seq": seq, "token_count": seq})


def final(gen_id: str, seq: int):
    return make_event("StreamFinished", TENANT, gen_id).model_copy(update={"seq": seq, "reason": "completed",
                                                                           "usage_label": "final"})


def tail_reading(*tps: TopicPartition):
    """A bridge whose tail owns partition 0 of both topics from offset 0 (where the projections stood)."""
    bridge = StreamBridge("unused:9092")
    tail = bridge.tail
    for tp in tps:
        tail.owned.next_offsets[tp] = 0
        tail.recent.start(tp, 0, True)
    return bridge, tail


def test_tokens_of_a_generation_nobody_here_watches_are_skipped_undecoded_but_its_lifecycle_and_final_are_not():
    bridge, tail = tail_reading(TopicPartition(TOKENS, 0), TopicPartition(GENERATIONS, 0))
    tokens = [record(TOKENS, token("gen_a", seq), seq - 1) for seq in (1, 2, 3)]
    garbage = ConsumerRecord(TOKENS, 0, 3, 0, 0, b"gen_a", b"{not json", None, 5, 9, [("type", b"TokensEmitted")])
    tail.take([*tokens, garbage, record(TOKENS, final("gen_a", 4), 4)], owned=True)
    tail.take([record(GENERATIONS, make_event("Admitted", TENANT, "gen_a"), 0)], owned=True)
    view = bridge.view("gen_a")
    assert (tail.skipped, tail.decoded) == (4, 2)  # the malformed record was never parsed: no warning, no DLQ
    assert view.tokens == [] and view.final.seq == 4 and view.request_id is not None and view.partial


def test_a_guest_reader_decodes_only_the_generations_watched_here():
    bridge, tail = tail_reading()
    tail.interest.add("gen_w")
    tail.take([record(GENERATIONS, make_event("Admitted", TENANT, "gen_x"), 0),
               record(GENERATIONS, make_event("Admitted", TENANT, "gen_w"), 1)], owned=False)
    assert bridge.view("gen_x") is None and bridge.view("gen_w") is not None and tail.skipped == 1


async def test_the_first_subscriber_reads_back_what_was_skipped_and_the_view_stays_in_seq_order():
    tps = (TopicPartition(GENERATIONS, 0), TopicPartition(TOKENS, 0))
    bridge, tail = tail_reading(*tps)
    tail.interest.partitions = 1
    tail.take([record(TOKENS, token("gen_b", seq), seq - 1) for seq in (1, 2, 3)], owned=True)
    tail.take([record(TOKENS, token("gen_other", 1), 3)], owned=True)
    tail.owned.next_offsets[TopicPartition(TOKENS, 0)] = 4
    await tail.attend("gen_b")
    tail.take([record(TOKENS, token("gen_b", 4), 4), record(TOKENS, final("gen_b", 5), 5)], owned=True)
    view = bridge.view("gen_b")
    assert [t.seq for t in view.tokens] == [1, 2, 3, 4] and view.final.seq == 5 and not view.partial
    assert bridge.view("gen_other") is None
    tail.leave("gen_b")
    assert view.partial and not tail.interest.keys


async def test_a_second_subscriber_does_not_read_back_again():
    bridge, tail = tail_reading(TopicPartition(GENERATIONS, 0), TopicPartition(TOKENS, 0))
    await tail.attend("gen_c")
    tail.take([record(TOKENS, token("gen_c", 1), 0)], owned=True)
    await tail.attend("gen_c")
    tail.leave("gen_c")
    assert tail.interest.wanted("gen_c") and [t.seq for t in bridge.view("gen_c").tokens] == [1]
