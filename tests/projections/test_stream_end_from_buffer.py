"""An ended stream a gateway's bridge does not hold is ended from the resume buffer only once the buffer holds
every token the status counts (real PostgreSQL).

The projector applies llm.tokens apart from llm.generations, so the status can say `interrupted` (billed at the
watermark) while the buffer still lacks tokens that watermark counts: a final event sent then would end the
client's stream with fewer tokens than it is billed for (chaos `overbilled`).
"""
from datetime import UTC, datetime
from types import SimpleNamespace

import psycopg

from producers.gateway.database import GatewayDatabase
from producers.gateway.native import streams
from producers.gateway.native.api import NativeApi
from producers.gateway.native.status import read_status
from producers.gateway.native.streams import open_source
from producers.gateway.openai.api import OpenAIApi
from producers.gateway.streams.bridge import StreamBridge
from producers.gateway.streams.generation_view import WATERMARK_WAIT_S
from projections.lifecycle import LifecycleProjection
from projections.stream_buffer import StreamBufferProjection
from tests.projections.conftest import Gen

T0 = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def project(database_url: str, projection, events: list) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn, conn.transaction():
        projection.apply(conn, events)


async def collect(source) -> list[tuple[str, int | None, int]]:
    """(kind, seq, tokens) of every event the client would get."""
    return [(e.kind, e.seq, len(e.data.get("tokenIds", ()))) async for e in source]


async def test_an_interrupted_stream_is_not_ended_from_a_buffer_short_of_its_bill(scratch_database_url,
                                                                                    monkeypatch):
    gen = Gen("buffer-tenant", "gen-buffer-behind", T0)
    project(scratch_database_url, LifecycleProjection(),
            [gen.admitted(), gen.started(), gen.report(1, 8), gen.interrupted()])
    tokens = [gen.tokens(seq, token_count=2 * seq, n=2) for seq in (1, 2, 3, 4)]
    project(scratch_database_url, StreamBufferProjection(), tokens[:2])  # the rest not applied yet
    monkeypatch.setattr(streams, "GAP_WAIT_S", 0.2)
    bridge = StreamBridge("unused:9092")  # never started: no view, as on a gateway that does not read this partition
    db = GatewayDatabase(scratch_database_url)
    await db.start()
    try:
        status = await read_status(db, bridge, gen.tenant_id, gen.generation_id)
        assert (status["status"], status["usage"]["outputTokens"]) == ("interrupted", 8)
        assert await collect(await open_source(bridge, db, gen.generation_id, status, 0)) == [("error", None, 0)]
        assert await collect(await open_source(bridge, db, gen.generation_id, status, 3)) == [("error", None, 0)]
        project(scratch_database_url, StreamBufferProjection(), tokens[2:])
        whole = await collect(await open_source(bridge, db, gen.generation_id, status, 0))
        assert whole == [("token", 1, 2), ("token", 2, 2), ("token", 3, 2), ("token", 4, 2), ("final", 5, 0)]
        assert await collect(await open_source(bridge, db, gen.generation_id, status, 3)) == [
            ("token", 4, 2), ("final", 5, 0)]
        assert await open_source(bridge, db, gen.generation_id, status, 5) is None  # holds the final: 204
    finally:
        await db.stop()


async def test_a_view_that_read_the_admission_but_not_the_tokens_fills_them_before_the_final(scratch_database_url,
                                                                                              monkeypatch):
    """A gateway that starts a partition where the projections stand (a restart, a rebalance) may read a
    generation's admission, whose lifecycle was not projected yet, but not its tokens, which were: its view
    holds the final event and none of the tokens. The client must get the tokens from the buffer first
    (chaos `missing_seqs` 3 and `overbilled` 1: a final event at seq 4 after no token)."""
    gen = Gen("buffer-tenant", "gen-view-after-tokens", T0)
    tokens = [gen.tokens(seq, token_count=2 * seq, n=2) for seq in (1, 2, 3)]
    project(scratch_database_url, StreamBufferProjection(), tokens)
    bridge = StreamBridge("unused:9092")  # never started: the view is fed as its readers would
    monkeypatch.setattr(bridge.tail, "attend", _nothing_to_read_back)
    for event in (gen.admitted(), gen.started(), gen.completed(6), gen.finished(4, output=6)):
        bridge.on_event("", event)
    db = GatewayDatabase(scratch_database_url)
    await db.start()
    try:
        status = bridge.view(gen.generation_id).as_status()
        assert await collect(await open_source(bridge, db, gen.generation_id, status, 0)) == [
            ("token", 1, 2), ("token", 2, 2), ("token", 3, 2), ("final", 4, 0)]
        assert await collect(await open_source(bridge, db, gen.generation_id, status, 2)) == [
            ("token", 3, 2), ("final", 4, 0)]
        # The OpenAI routes follow the same view for a repeat of the request (its Idempotency-Key).
        api = OpenAIApi(SimpleNamespace(bridge=bridge, db=db))
        pieces = [piece async for piece in api.pieces(gen.tenant_id, gen.generation_id, fresh=False)]
        assert [(p.token_count, len(p.token_ids)) for p in pieces[:-1]] == [(2, 2), (4, 2), (6, 2)]
        assert (pieces[-1].reason, pieces[-1].completion_tokens) == ("completed", 6)
        # And a native `wait` answer to such a repeat holds the whole text.
        done = await NativeApi(SimpleNamespace(bridge=bridge, db=db)).wait_for_end(gen.generation_id)
        assert (done["status"], done["seq"], done["text"]) == ("completed", 4, "x" * 6)
    finally:
        await db.stop()


async def _nothing_to_read_back(generation_id: str) -> None:
    return None


async def test_an_interruption_ended_by_a_view_that_holds_none_of_its_tokens_is_ended_after_the_buffered_ones(
        scratch_database_url):
    """The bridge writes the final event of an interruption itself, one seq after the last token it holds: in a
    view begun after the tokens were projected that was seq 1, ahead of the three tokens the buffer holds."""
    gen = Gen("buffer-tenant", "gen-interrupted-view-after-tokens", T0)
    project(scratch_database_url, StreamBufferProjection(), [gen.tokens(seq, token_count=2 * seq, n=2)
                                                             for seq in (1, 2, 3)])
    now = [1000.0]
    bridge = StreamBridge("unused:9092", clock=lambda: now[0])
    bridge.tail.attend = _nothing_to_read_back
    bridge.tail.owned.caught_up.set()
    for event in (gen.admitted(), gen.started(), gen.report(1, 6), gen.interrupted()):
        bridge.on_event("", event)
    now[0] += WATERMARK_WAIT_S + 1
    bridge.sweep_once()
    view = bridge.view(gen.generation_id)
    assert (view.final.reason, view.final.seq) == ("interrupted", 1)  # what the bridge can tell by itself
    db = GatewayDatabase(scratch_database_url)
    await db.start()
    try:
        assert await collect(await open_source(bridge, db, gen.generation_id, view.as_status(), 0)) == [
            ("token", 1, 2), ("token", 2, 2), ("token", 3, 2), ("final", 4, 0)]
        pieces = [p async for p in OpenAIApi(SimpleNamespace(bridge=bridge, db=db)).pieces(
            gen.tenant_id, gen.generation_id, fresh=False)]
        assert [p.token_count for p in pieces[:-1]] == [2, 4, 6] and pieces[-1].reason == "interrupted"
    finally:
        await db.stop()
