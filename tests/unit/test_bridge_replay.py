"""The stream bridge while it replays the log (a starting gateway): ends no worker writes wait for llm.tokens."""
from __future__ import annotations

from producers.gateway.streams.bridge import FINAL_GRACE_S, StreamBridge
from tests.factories import make_event


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def tokens(gen_id: str, tenant_id: str, seqs):
    """Stream events of two tokens each; `token_count` is cumulative, as the worker writes it."""
    for seq in seqs:
        yield make_event("TokensEmitted", tenant_id, gen_id).model_copy(update={"seq": seq, "token_count": 2 * seq})


def watermark(gen_id: str, tenant_id: str, output_tokens: int):
    from schemas.values import Usage

    event = make_event("UsageReported", tenant_id, gen_id)
    return event.model_copy(update={"usage": Usage(generated_output_tokens=output_tokens)})


def live_bridge(clock: Clock) -> StreamBridge:
    """A bridge past its replay (never started: events are fed by hand)."""
    bridge = StreamBridge("unused:9092", clock=clock)
    bridge.tail.owned.caught_up.set()
    return bridge


def test_an_interrupt_replayed_ahead_of_its_tokens_ends_the_stream_after_them_once_caught_up():
    clock = Clock()
    bridge = StreamBridge("unused:9092", clock=clock)  # never started: events are fed by hand
    gen_id, tenant = "gen_replayed", "tenant-r"
    bridge.on_event("llm.generations", make_event("Admitted", tenant, gen_id))
    bridge.on_event("llm.generations", make_event("Interrupted", tenant, gen_id))  # its partition read first
    for event in tokens(gen_id, tenant, (1, 2, 3)):
        bridge.on_event("llm.tokens", event)
    view = bridge.view(gen_id)
    assert view.final is None and [t.seq for t in view.tokens] == [1, 2, 3]
    clock.now += FINAL_GRACE_S + 1
    bridge.sweep_once()
    assert view.final is None  # still replaying: more of llm.tokens may be unread
    bridge.tail.owned.caught_up.set()
    bridge.sweep_once()
    assert (view.final.reason, view.final.usage_label, view.final.seq) == ("interrupted", "interrupted", 4)
    assert view.status == "interrupted" and 1 in view.dead_epochs


def test_a_live_interrupt_ends_at_once_and_later_tokens_of_its_epoch_are_ignored():
    bridge = live_bridge(Clock())
    gen_id, tenant = "gen_live", "tenant-l"
    bridge.on_event("llm.generations", make_event("Admitted", tenant, gen_id))
    for event in tokens(gen_id, tenant, (1, 2)):
        bridge.on_event("llm.tokens", event)
    bridge.on_event("llm.generations", make_event("Interrupted", tenant, gen_id))
    for event in tokens(gen_id, tenant, (3,)):
        bridge.on_event("llm.tokens", event)
    view = bridge.view(gen_id)
    assert (view.final.reason, view.final.seq) == ("interrupted", 3)
    assert [t.seq for t in view.tokens] == [1, 2]


def test_a_live_interrupt_read_before_the_tokens_its_watermark_counts_waits_for_them():
    """The worker sends a watermark only once its tokens are on the log, but this bridge may read llm.tokens
    behind llm.generations: ending at the Interrupted would bill the client for tokens it never got."""
    clock = Clock()
    bridge = live_bridge(clock)
    gen_id, tenant = "gen_lagging", "tenant-w"
    bridge.on_event("llm.generations", make_event("Admitted", tenant, gen_id))
    bridge.on_event("llm.generations", watermark(gen_id, tenant, 4))
    bridge.on_event("llm.generations", make_event("Interrupted", tenant, gen_id))
    view = bridge.view(gen_id)
    assert view.final is None  # 0 of the 4 billed tokens read
    bridge.on_event("llm.tokens", next(tokens(gen_id, tenant, (1,))))  # two tokens per event
    clock.now += FINAL_GRACE_S + 1
    bridge.sweep_once()
    assert view.final is None
    bridge.on_event("llm.tokens", next(tokens(gen_id, tenant, (2,))))
    assert (view.final.reason, view.final.seq, view.final.usage.generated_output_tokens) == ("interrupted", 3, 4)
    assert [t.seq for t in view.tokens] == [1, 2]


def test_an_interrupt_read_ahead_of_tokens_by_a_view_begun_mid_stream_waits_for_the_sweep():
    """A view that did not read the admission (a guest's backfill, a partition a rebalance assigned, both read
    from where the projections stand) may lack the watermark the seal bills, so an empty or stale watermark
    proves nothing: tokens read just after the Interrupted (the rest of the same poll) still belong to the
    stream, and the end is written by the sweep after the grace."""
    clock = Clock()
    bridge = live_bridge(clock)
    gen_id, tenant = "gen_mid_stream", "tenant-m"
    for event in tokens(gen_id, tenant, (1, 2)):
        bridge.on_event("llm.tokens", event)
    bridge.on_event("llm.generations", make_event("Interrupted", tenant, gen_id))  # its watermark was projected
    view = bridge.view(gen_id)
    assert view.final is None
    for event in tokens(gen_id, tenant, (3, 4)):
        bridge.on_event("llm.tokens", event)
    bridge.sweep_once()
    assert view.final is None  # within the grace
    clock.now += FINAL_GRACE_S + 1
    bridge.sweep_once()
    assert (view.final.reason, view.final.usage_label, view.final.seq) == ("interrupted", "interrupted", 5)
    assert [t.seq for t in view.tokens] == [1, 2, 3, 4]


def test_a_view_holding_the_end_of_a_stream_covers_a_watermark_by_the_cumulative_count():
    """Tokens 1-2 reached the client from the resume buffer; the view holds 3-4, which end at 8 tokens: a
    watermark of 8 is covered, so the interruption ends the stream at once, not after WATERMARK_WAIT_S."""
    bridge = live_bridge(Clock())
    gen_id, tenant = "gen_suffix", "tenant-s"
    bridge.on_event("llm.generations", make_event("Admitted", tenant, gen_id))
    for event in tokens(gen_id, tenant, (3, 4)):
        bridge.on_event("llm.tokens", event)
    bridge.on_event("llm.generations", watermark(gen_id, tenant, 8))
    bridge.on_event("llm.generations", make_event("Interrupted", tenant, gen_id))
    view = bridge.view(gen_id)
    assert (view.final.reason, view.final.seq, view.final.usage.generated_output_tokens) == ("interrupted", 5, 8)


def test_a_billing_period_marker_on_the_lifecycle_topic_is_no_generation_to_the_bridge():
    bridge = live_bridge(Clock())
    bridge.on_event("llm.generations", make_event("PeriodClosed"))
    bridge.notify_changed()
    assert bridge.views == {}


def test_the_sweep_drops_views_ended_longer_ago_than_kept_walks_only_ended_ones_and_keeps_the_rest():
    from producers.gateway.streams.generation_view import KEEP_ENDED_S

    clock = Clock()
    bridge = live_bridge(clock)
    tenant = "tenant-s"
    for gen_id in ("gen_old", "gen_running"):
        bridge.on_event("llm.generations", make_event("Admitted", tenant, gen_id))
    bridge.on_event("llm.generations", make_event("Completed", tenant, "gen_old"))
    clock.now += KEEP_ENDED_S / 2
    bridge.on_event("llm.generations", make_event("Admitted", tenant, "gen_new"))
    bridge.on_event("llm.generations", make_event("Completed", tenant, "gen_new"))
    assert list(bridge._ended) == ["gen_old", "gen_new"]  # the running one is not walked at all
    clock.now += KEEP_ENDED_S / 2 + 1
    bridge.sweep_once()
    assert bridge.view("gen_old") is None and bridge.view("gen_new") is not None
    assert bridge.view("gen_running") is not None and list(bridge._ended) == ["gen_new"]
    clock.now += KEEP_ENDED_S
    bridge.sweep_once()
    assert bridge.view("gen_new") is None and not bridge._ended and not bridge._final_due
