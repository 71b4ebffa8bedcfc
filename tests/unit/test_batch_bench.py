"""The batch bench's bookkeeping: outcomes that arrive before the burst's ids are known, and the busy share."""
from __future__ import annotations

from types import SimpleNamespace

from bench.batch import Outcomes, batch_input, busy_share, chat_ttfts, self_fenced_lines, timeline


def outcomes() -> Outcomes:
    tracker = Outcomes.__new__(Outcomes)  # no follower: events are fed by hand
    tracker.wanted, tracker.ended, tracker.repeats = set(), {}, 0
    return tracker


def event(kind: str, gen_id: str, tokens: int = 4):
    return SimpleNamespace(type=kind, generation_id=gen_id, usage=SimpleNamespace(generated_output_tokens=tokens))


def test_an_end_read_before_the_burst_ids_are_known_still_counts_and_a_repeat_is_counted_apart():
    tracker = outcomes()
    tracker.on_event("llm.generations", event("Completed", "g1"))  # before the POSTs have all returned
    tracker.on_event("llm.generations", event("TokensEmitted", "g2"))
    tracker.wanted = {"g1", "g2"}
    assert not tracker.done()
    tracker.on_event("llm.generations", event("Expired", "g2", tokens=0))
    tracker.on_event("llm.generations", event("Completed", "g1"))
    tracker.on_event("llm.generations", event("Completed", "other"))  # not ours
    assert tracker.done() and tracker.repeats == 1 and tracker.output_tokens == 4
    assert (tracker.counts()["completed"], tracker.counts()["expired"]) == (1, 1)


def test_the_busy_share_starts_at_the_first_heartbeat_showing_work():
    samples = [{"running": 0}, {"running": 0}, {"running": 5}, {"running": 0}, {"running": 2}, {"running": 1}]
    assert busy_share(samples) == 0.75
    assert busy_share([{"running": 0}]) is None


def test_burst_inputs_differ_so_the_prefix_cache_does_not_serve_them():
    assert len({batch_input(i) for i in range(100)}) == 100


def test_self_fencing_is_counted_from_the_worker_log_and_a_missing_log_reads_as_unknown_not_zero(tmp_path):
    log = tmp_path / "worker.log"
    assert self_fenced_lines(log) is None
    log.write_text("worker ready\nself-fenced worker=w1 attempts=3 stopped=3\nheartbeat ok\n"
                   "self-fenced worker=w1 attempts=0 stopped=0\n")
    assert self_fenced_lines(log) == 2


def test_the_timeline_keeps_one_heartbeat_per_interval_with_the_step_it_measured():
    samples = [{"t": t, "running": int(t), "queued_tokens": 0, "step_ms": 100.04, "decode_step_ms": None,
                "prefill_token_ms": 1.0, "ttft_error_ms": None, "free_blocks": 9} for t in (0.2, 1.0, 5.1, 5.3, 11.0)]
    assert [(s["t"], s["running"], s["step_ms"]) for s in timeline(samples)] == [(0.2, 0, 100.0), (5.3, 5, 100.0),
                                                                                 (11.0, 11, 100.0)]
    assert "free_blocks" not in timeline(samples)[0]


def test_chat_ttfts_are_listed_in_sending_order_for_completed_chats_only():
    def chat(sent, ttft, status=200, error=None):
        return SimpleNamespace(sent_at=sent, ttft=ttft, status=status, error=error)

    records = [chat(3.0, 0.5), chat(1.0, 4.2), chat(2.0, None, 503), chat(2.5, 0.9, 200, "cut_at_end")]
    assert chat_ttfts(records) == [[1.0, 4.2], [3.0, 0.5]]
