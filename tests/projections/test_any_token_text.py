"""Token text the database's text type cannot hold (NUL, control characters, split bytes, astral characters)
is projected whole, byte for byte, and replays clean; a refused event costs a bisection, not a row each."""
import uuid

import psycopg

from projections.audit import audit_replay
from projections.lifecycle import LifecycleProjection
from projections.registry import all_projections
from projections.runtime import Projector
from projections.stream_buffer import StreamBufferProjection
from projections.stream_text import decode_text, encode_text
from schemas.codec import encode
from schemas.stream import TokensEmitted
from tests.projections.conftest import Gen, all_rows, one

# What a byte-level BPE model can emit: NUL, the rest of C0 and DEL, U+FFFD from a split UTF-8 sequence,
# astral-plane characters, and ordinary text between them.
DELTAS = ("\u0000", "a\u0000b", "".join(map(chr, range(1, 32))) + "\u007f", "\ufffd", "caf\u00e9 ",
          "\U0001f600\U00010348", "\\u0000 is not NUL", "\r\n\t", "\u2028\u2029", "end\u0000")


def weird_stream(gen: Gen) -> list[TokensEmitted]:
    return [gen.tokens(seq, seq).model_copy(update={"text_delta": text}) for seq, text in enumerate(DELTAS, 1)]


def test_any_python_string_round_trips_through_the_stored_form():
    for text in (*DELTAS, "\ud800 lone surrogate", "\udfff", ""):
        assert decode_text(memoryview(encode_text(text))) == text


async def test_a_stream_of_nul_and_control_characters_is_projected_whole_and_replays_clean(
        emit, bootstrap, scratch_database_url, settings):
    gen = Gen(tenant_id=f"t-{uuid.uuid4().hex[:8]}", generation_id=f"gen-{uuid.uuid4().hex[:12]}")
    tokens = weird_stream(gen)
    await emit(gen.admitted(), gen.started(), *tokens, gen.completed(len(tokens)),
               gen.finished(len(tokens) + 1, output=len(tokens)))
    projector = Projector(bootstrap, scratch_database_url, all_projections(settings))
    try:
        stats = await projector.catch_up()
    finally:
        projector.close()
    assert stats.refused == {}
    with psycopg.connect(scratch_database_url) as conn:
        rows = all_rows(conn, "SELECT seq, text_delta FROM stream_events WHERE generation_id = %s AND NOT is_final "
                              "ORDER BY seq", gen.generation_id)
        assert [(seq, decode_text(text)) for seq, text in rows] == list(enumerate(DELTAS, 1))
        assert one(conn, "SELECT last_seq, token_count FROM stream_progress WHERE generation_id = %s",
                   gen.generation_id) == (len(DELTAS) + 1, len(DELTAS))
        assert one(conn, "SELECT count(*) FROM refused_events") == (0,)
    report = await audit_replay(bootstrap, scratch_database_url, settings)
    assert report.differences == 0 and report.replayed["stream"] >= len(DELTAS) + 1, report.as_dict()


class CountingProjection:
    """The lifecycle projection, counting how often the projector calls `apply`."""

    def __init__(self) -> None:
        self.inner = LifecycleProjection()
        self.name, self.topic, self.calls = self.inner.name, self.inner.topic, 0

    def tables(self):
        return self.inner.tables()

    def apply(self, conn, events):
        self.calls += 1
        self.inner.apply(conn, events)


async def test_a_refused_event_in_a_large_batch_is_found_by_bisection_not_row_by_row(
        producer, bootstrap, scratch_database_url):
    from schemas.topics import GENERATIONS
    from tests.projections.test_faults_and_audit import start_at_log_end

    await start_at_log_end(bootstrap, scratch_database_url, LifecycleProjection())
    tenant = f"bisect-{uuid.uuid4().hex[:8]}"
    gens = [Gen(tenant_id=tenant, generation_id=f"gen-{uuid.uuid4().hex[:12]}") for _ in range(200)]
    bad = gens[77].admitted().model_copy(update={"input_tokens": 2**40})  # beyond the integer column
    for g in gens:
        for event in ((bad,) if g is gens[77] else (g.admitted(),)) + (g.started(),):
            await producer.send(GENERATIONS, value=encode(event),
                                key=g.generation_id.encode())
    await producer.flush()
    counting = CountingProjection()
    projector = Projector(bootstrap, scratch_database_url, [counting], max_records=10000)
    try:
        stats = await projector.catch_up()
    finally:
        projector.close()
    assert stats.refused == {"generations": 1} and stats.applied["generations"] == 399
    # 400 events over 6 partitions, in one or a few polls: a bisection per poll, about 2·log2(400) applies
    # for the refused event; event by event would be one apply per event of its poll.
    assert counting.calls <= 40, counting.calls
    with psycopg.connect(scratch_database_url) as conn:
        assert one(conn, "SELECT count(*) FROM generations WHERE tenant_id = %s", tenant) == (199,)
