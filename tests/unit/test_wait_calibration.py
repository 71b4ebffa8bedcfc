"""The wait a route promised, what the worker observed, and the error fed back into the next prediction."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from consumers.controller.registry import Demand, WorkerRegistry
from consumers.worker.calibration import HALF_LIFE_S, MAX_AGE_S, WINDOW, WaitCalibration, promise_ratio
from schemas.dispatch import StartAttempt
from schemas.registry_events import WorkerHeartbeat

NOW = datetime(2026, 12, 2, 9, 0, 0, tzinfo=UTC)


def order(tier: str = "interactive", predicted_ms: int | None = 400, model_ms: int | None = 300,
          ttft_ms: int | None = None, model_ttft_ms: int | None = None) -> StartAttempt:
    return StartAttempt(tenant_id="acme", generation_id="g1", epoch=1, worker_id="w1", model_version="m@1",
                        input_token_ids=(1, 2), max_output_tokens=4, deadline_at=NOW + timedelta(seconds=10),
                        tier=tier, predicted_wait_ms=predicted_ms, model_wait_ms=model_ms, predicted_ttft_ms=ttft_ms,
                        model_ttft_ms=model_ttft_ms)


def test_the_error_is_the_median_of_recent_interactive_waits_against_the_uncorrected_model():
    waits = WaitCalibration()
    assert waits.error_ms(0.0) is None
    for observed in (0.5, 0.9, 1.3):  # the model said 0.3 s each time
        waits.observe(order(), observed, now=10.0)
    waits.observe(order(tier="batch"), 30.0, now=10.0)  # batch waits behind everything: not a promise
    waits.observe(order(model_ms=None), 30.0, now=10.0)  # routed without a prediction
    assert waits.error_ms(10.0) == 600.0
    assert waits.error_ms(10.0 + MAX_AGE_S + 1) is None  # old errors say nothing of the load now


def test_an_error_nothing_confirms_fades_so_a_refusing_controller_lets_an_attempt_through_again():
    waits = WaitCalibration()
    for observed in (3.3, 3.3, 3.3):  # a cold start: 3 s late, and then nothing admitted to say otherwise
        waits.observe(order(), observed, now=10.0)
    assert waits.error_ms(10.0) == 3000.0
    assert waits.error_ms(10.0 + HALF_LIFE_S) == 1500.0
    assert waits.error_ms(10.0 + 3 * HALF_LIFE_S) == 375.0
    # One attempt let through measures 0.1 s: it weighs 1, the three old errors 1/8 each, so it is the median
    # (a plain median of the four would be 3 s again, and refuse for another half-life per admission).
    waits.observe(order(), 0.4, now=10.0 + 3 * HALF_LIFE_S)
    assert waits.error_ms(10.0 + 3 * HALF_LIFE_S) == 100.0
    waits.observe_ttft(order(model_ttft_ms=500), 2.5, now=5.0)  # the TTFT's error fades alike
    assert waits.ttft_error_ms(5.0 + HALF_LIFE_S) == 1000.0


def test_the_window_follows_a_change_of_load():
    waits = WaitCalibration()
    for _ in range(WINDOW):
        waits.observe(order(), 2.3, now=1.0)  # 2 s late
    for _ in range(WINDOW // 2 + 1):
        waits.observe(order(), 0.3, now=2.0)  # on time again
    assert waits.error_ms(2.0) == 0.0


def test_the_promise_ratio_is_observed_over_promised_with_a_floor_for_an_idle_worker():
    assert promise_ratio(order(predicted_ms=400), 0.5) == 1.25
    assert promise_ratio(order(predicted_ms=0), 0.05) == 5.0  # 0 promised counts as 10 ms
    assert promise_ratio(order(predicted_ms=None), 0.5) is None


def heartbeat(**fields) -> WorkerHeartbeat:
    fields = {"queued_tokens": 400, "running": 0, "total_blocks": 64, "free_blocks": 64, **fields}
    return WorkerHeartbeat(worker_id="w1", model_versions=("m@1",), block_size=16,
                           lease_ms=5000, occurred_at=NOW, tokens_per_s=200.0, **fields)


def test_the_controller_adds_the_reported_error_to_interactive_predictions_and_sends_both():
    registry = WorkerRegistry()
    registry.observe(heartbeat(wait_error_ms=1500.0))
    now = NOW.timestamp()
    chat = registry.choose("m@1", Demand(4, 12), 5.0, 200.0, now)
    assert (chat.model_queue_s, chat.queue_s) == (2.0, 3.5)  # 400 queued tokens at 200/s, plus 1.5 s missed
    # the TTFT adds its own 4-token prompt at 200/s (no prefill step measured yet)
    assert chat.promise == {"predicted_wait_ms": 3500, "model_wait_ms": 2000, "predicted_ttft_ms": 3520,
                            "model_ttft_ms": 2020}
    assert registry.choose("m@1", Demand(4, 12), 3.0, 200.0, now) is None  # 3.5 s no longer fits 3 s
    batch = registry.choose("m@1", Demand(4, 12, batch=True), 3.0, 200.0, now)
    assert batch.queue_s == 2.0  # batch work is not promised a latency: no correction
    registry.observe(heartbeat(wait_error_ms=-5000.0))
    assert registry.choose("m@1", Demand(4, 12), 5.0, 200.0, now).queue_s == 0.0  # never below nothing


def test_the_high_quantile_of_the_ttft_error_is_its_tail_weighed_and_faded_like_the_median():
    waits = WaitCalibration()
    assert waits.ttft_error_high_ms(0.0) is None
    for tenth in range(20):  # errors 0.0 .. 1.9 s over a model of 0.5 s
        waits.observe_ttft(order(model_ttft_ms=500), 0.5 + tenth / 10, now=10.0)
    assert waits.ttft_error_ms(10.0) == 900.0
    assert waits.ttft_error_high_ms(10.0) == 1800.0  # the 19th of 20: 95 % of them at or below it
    assert waits.ttft_error_high_ms(10.0 + HALF_LIFE_S) == 900.0


def test_interactive_work_is_admitted_by_the_high_quantile_and_promised_the_median():
    registry = WorkerRegistry()
    registry.observe(heartbeat(ttft_error_ms=300.0, ttft_error_high_ms=1500.0))
    now = NOW.timestamp()
    # 400 queued tokens and its own 4 at 200/s: the model says 2.02 s to the first token
    chat = registry.choose("m@1", Demand(4, 12), 4.0, 200.0, now)
    assert chat.promise["predicted_ttft_ms"] == 2320 and chat.promise["model_ttft_ms"] == 2020
    assert registry.choose("m@1", Demand(4, 12), 3.0, 200.0, now) is None  # the median fits 3 s, the tail does not
    best = registry.shortest_wait("m@1", Demand(4, 12), 200.0, now)
    assert round(best.ttft_s, 2) == 3.52 and "95th percentile" in best.describe()
    batch = registry.choose("m@1", Demand(4, 12, batch=True), 3.0, 200.0, now)
    assert batch is not None  # batch work is routed by its wait, never by a latency promise
    registry.observe(heartbeat(ttft_error_ms=300.0))  # a worker that reports no tail: judged by the median
    assert registry.choose("m@1", Demand(4, 12), 3.0, 200.0, now).promise["predicted_ttft_ms"] == 2320


def test_the_worker_records_the_promise_ratio_per_tier_and_feeds_the_error_back():
    from consumers.worker.attempts import Attempt
    from consumers.worker.measure import observe_wait
    from engine.reservations import Reservation
    from plumbing.telemetry.metrics import WorkerMetrics

    metrics, waits = WorkerMetrics(lambda: None, lambda: 0), WaitCalibration()
    observe_wait(metrics, Attempt(order(predicted_ms=400, model_ms=300), Reservation("g1#1", 1)), 0.5, 7.0, waits)
    ratio = metrics.registry.get_sample_value("ledgerlm:queue_wait_promise_ratio_sum", {"tier": "interactive"})
    assert ratio == 1.25 and waits.error_ms(7.0) == 200.0


def test_the_predicted_ttft_adds_the_prefill_steps_of_its_own_prompt_to_the_wait():
    registry = WorkerRegistry()
    registry.observe(heartbeat(prefill_step_ms=300.0, max_batched_tokens=512, queued_tokens=1100))
    now = NOW.timestamp()
    short = registry.choose("m@1", Demand(128, 64), 5.0, 200.0, now)
    assert short.promise == {"predicted_wait_ms": 600, "model_wait_ms": 600, "predicted_ttft_ms": 900,
                             "model_ttft_ms": 900}
    long = registry.choose("m@1", Demand(1000, 16), 5.0, 200.0, now)  # two steps of its own
    # 1,100 queued and 1,000 of its own make 2,100 tokens: 5 steps, the first token with the last
    assert long.promise["predicted_ttft_ms"] == 600 + 3 * 300
    registry.observe(heartbeat(prefill_step_ms=300.0, max_batched_tokens=512, queued_tokens=1100,
                               wait_error_ms=100.0, ttft_error_ms=450.0))
    corrected = registry.choose("m@1", Demand(128, 64), 5.0, 200.0, now)
    assert corrected.promise == {"predicted_wait_ms": 700, "model_wait_ms": 600, "predicted_ttft_ms": 1350,
                                 "model_ttft_ms": 900}  # the TTFT's own error, not the wait's, corrects it
    batch = registry.choose("m@1", Demand(128, 64, batch=True), 5.0, 200.0, now)
    assert batch.promise["predicted_ttft_ms"] == 900  # batch work is promised nothing: uncorrected


def test_the_worker_records_observed_over_predicted_ttft_at_the_first_token_only():
    from consumers.worker.attempts import Attempt
    from consumers.worker.measure import observe_output
    from engine.request import RequestOutput
    from engine.reservations import Reservation
    from plumbing.telemetry.metrics import WorkerMetrics

    metrics, waits = WorkerMetrics(lambda: None, lambda: 0), WaitCalibration()
    attempt = Attempt(order(ttft_ms=800, model_ttft_ms=700), Reservation("g1#1", 1), admitted_at=10.0,
                      accepted_at=10.1)
    first = RequestOutput("g1#1", (5,), "a", None, 2, 1, 0, queue_time_s=0.2)
    observe_output(metrics, attempt, first, now=11.0, waits=waits)
    observe_output(metrics, attempt, RequestOutput("g1#1", (6,), "b", None, 2, 2, 0), now=11.5, waits=waits)
    assert waits.ttft_error_ms(11.0) == 300.0  # 1.0 s observed against the model's 0.7 s, once, at 11.0
    assert waits.error_ms(11.5) == 0.0  # the wait, 0.1 s accepted + 0.2 s queued, against its model's 0.3 s
    sample = metrics.registry.get_sample_value
    assert sample("ledgerlm:ttft_promise_ratio_sum", {"tier": "interactive"}) == 1.25  # 1.0 s observed / 0.8 s
    assert sample("ledgerlm:ttft_promise_ratio_count", {"tier": "interactive"}) == 1
    unpromised = Attempt(order(ttft_ms=None, tier="batch"), Reservation("g1#1", 1), admitted_at=10.0)
    observe_output(metrics, unpromised, first, now=11.0)
    assert sample("ledgerlm:ttft_promise_ratio_count", {"tier": "batch"}) is None


def test_a_busy_worker_predicts_half_the_step_in_flight_before_the_queue():
    registry = WorkerRegistry()
    registry.observe(heartbeat(queued_tokens=0, step_ms=240.0, prefill_step_ms=400.0, max_batched_tokens=512,
                               running=3))
    now = NOW.timestamp()
    assert registry.choose("m@1", Demand(4, 12), 5.0, 200.0, now).model_queue_s == 0.12
    registry.observe(heartbeat(queued_tokens=1100, step_ms=240.0, prefill_step_ms=400.0, max_batched_tokens=512,
                               running=3))
    assert registry.choose("m@1", Demand(4, 12), 5.0, 200.0, now).model_queue_s == 0.12 + 0.8  # 2 whole steps
    idle = WorkerRegistry()
    idle.observe(heartbeat(queued_tokens=0, step_ms=240.0, running=0))
    assert idle.choose("m@1", Demand(4, 12), 5.0, 200.0, now).model_queue_s == 0.0  # nothing in flight


def test_whole_queued_steps_cost_a_decode_step_plus_the_budget_at_the_measured_cost_of_a_prefill_token():
    registry = WorkerRegistry()
    # A mean prefill step of 250 ms (one short prompt beside the decodes) would predict 2 x 0.25 = 0.5 s for
    # 1,100 queued tokens; a full step is 100 ms + 512 x 1 ms = 0.612 s, so 1.224 s, plus half a step in flight.
    registry.observe(heartbeat(queued_tokens=1100, step_ms=200.0, prefill_step_ms=250.0, max_batched_tokens=512,
                               decode_step_ms=100.0, prefill_token_ms=1.0, running=4))
    choice = registry.choose("m@1", Demand(128, 12), 5.0, 200.0, NOW.timestamp())
    assert abs(choice.model_queue_s - (0.1 + 1.224)) < 1e-9
    # its first token comes with the third step: the decodes, the queue's last 76 tokens and its own 128
    assert abs(choice.model_ttft_s - (0.1 + 1.224 + 0.1 + 0.204)) < 1e-9


def test_a_prompt_that_spills_into_the_next_step_waits_for_that_whole_step():
    """The 4th of 8 prompts of 158 tokens sent at once has 474 tokens ahead: the first step takes them and 38
    of its own, its first token comes with the second step (counting only its own prompt promised 0.43 s)."""
    registry = WorkerRegistry()
    registry.observe(heartbeat(queued_tokens=474, max_batched_tokens=512, decode_step_ms=100.0,
                               prefill_token_ms=2.0, running=8, step_ms=100.0))
    choice = registry.choose("m@1", Demand(158, 64), 5.0, 200.0, NOW.timestamp())
    full_step = 0.1 + 512 * 0.002
    assert choice.model_queue_s == 0.05  # its prefill starts in the step after the one in flight
    assert abs(choice.model_ttft_s - (0.05 + full_step + 0.1 + 120 * 0.002)) < 1e-9
    # a 2 s allowance holds it (1.51 s), and refuses the 6th: 948 tokens ahead, two whole steps and a third, 2.56 s
    sixth = WorkerRegistry()
    sixth.observe(heartbeat(queued_tokens=948, max_batched_tokens=512, decode_step_ms=100.0,
                            prefill_token_ms=2.0, running=8, step_ms=100.0))
    assert registry.choose("m@1", Demand(158, 64), 2.0, 200.0, NOW.timestamp()) is not None
    assert sixth.choose("m@1", Demand(158, 64), 2.0, 200.0, NOW.timestamp()) is None


def test_an_interactive_first_token_step_carries_the_batch_share_while_batch_prompts_are_queued():
    """Beside a batch backlog the engine gives batch prompts up to `batch_step_tokens` of every step, so the
    step an interactive prompt lands in computes those too; a batch attempt is not promised a TTFT."""
    registry = WorkerRegistry()
    registry.observe(heartbeat(queued_tokens=2000, batch_queued_tokens=2000, batch_step_tokens=128,
                               max_batched_tokens=512, decode_step_ms=100.0, prefill_token_ms=1.0, running=64,
                               step_ms=200.0))
    choice = registry.choose("m@1", Demand(130, 64), 5.0, 200.0, NOW.timestamp())
    assert choice.model_queue_s == 0.1  # no interactive prompt ahead: half the step in flight
    assert abs(choice.model_ttft_s - (0.1 + 0.1 + (130 + 128) * 0.001)) < 1e-9
    few = WorkerRegistry()
    few.observe(heartbeat(queued_tokens=40, batch_queued_tokens=40, batch_step_tokens=128, max_batched_tokens=512,
                          decode_step_ms=100.0, prefill_token_ms=1.0, running=64, step_ms=200.0))
    assert abs(few.choose("m@1", Demand(130, 64), 5.0, 200.0, NOW.timestamp()).model_ttft_s
               - (0.1 + 0.1 + 170 * 0.001)) < 1e-9


def test_dispatches_since_the_heartbeat_drain_at_the_prefill_rate():
    """A prompt dispatched a while ago has been prefilled meanwhile: at 8 guidellm streams, 4 dispatches of
    158 tokens within the last second counted 632 tokens ahead and refused the next request."""
    registry = WorkerRegistry()
    registry.observe(heartbeat(queued_tokens=0, max_batched_tokens=512, decode_step_ms=100.0,
                               prefill_token_ms=2.0, running=4, step_ms=100.0, total_blocks=1024, free_blocks=1024))
    now = NOW.timestamp()
    for n in range(4):
        registry.hold("w1", f"g{n}", Demand(158, 64), now)
    view = registry.workers["w1"]
    rate = 512 / (0.1 + 512 * 0.002)  # tokens a second through whole steps: ~455
    assert WorkerRegistry.ahead_tokens(view, Demand(158, 64), now, rate) == 632
    assert WorkerRegistry.ahead_tokens(view, Demand(158, 64), now + 0.5, rate) == round(632 - 0.5 * rate)
    assert WorkerRegistry.ahead_tokens(view, Demand(158, 64), now + 2.0, rate) == 0
    assert registry.choose("m@1", Demand(158, 64), 5.0, 200.0, now).model_queue_s == 0.05 + 1.124  # a whole step
    assert registry.choose("m@1", Demand(158, 64), 5.0, 200.0, now + 1.0).model_queue_s == 0.05  # drained
    # two dispatches apart in time: the first drains before the second arrives, not after
    later = WorkerRegistry()
    later.observe(heartbeat(queued_tokens=0, max_batched_tokens=512, decode_step_ms=100.0,
                            prefill_token_ms=2.0, running=4, step_ms=100.0))
    later.hold("w1", "a", Demand(400, 64), now)
    later.hold("w1", "b", Demand(400, 64), now + 1.0)
    assert WorkerRegistry.ahead_tokens(later.workers["w1"], Demand(158, 64), now + 1.0, rate) == 400
    # batch prompts are not ahead of interactive work (the engine admits interactive prompts first)
    later.hold("w1", "c", Demand(300, 64, batch=True), now + 1.0)
    assert WorkerRegistry.ahead_tokens(later.workers["w1"], Demand(158, 64), now + 1.0, rate) == 400
    assert WorkerRegistry.ahead_tokens(later.workers["w1"], Demand(158, 64, batch=True), now + 1.0, rate) == 700


def test_the_engine_thread_splits_a_steps_cost_into_a_decode_step_and_a_prefill_tokens_share():
    from types import SimpleNamespace

    from consumers.worker.engine_thread import EngineThread

    thread = EngineThread(SimpleNamespace(stats=lambda: None), print, print, {})
    thread._measure_cost(0, 0.1)  # noqa: SLF001 (a decode-only step: 100 ms)
    thread._measure_cost(200, 0.5)  # a step with 200 prefill tokens: 400 ms more, 2 ms a token
    assert (thread.decode_step_s, thread.prefill_token_s) == (0.1, 0.002)
    thread._measure_cost(0, 0.2)  # a bigger batch: the decode step grows, smoothed
    assert abs(thread.decode_step_s - 0.12) < 1e-12 and thread.prefill_token_s == 0.002


def test_a_prompt_mostly_from_the_prefix_cache_does_not_reprice_every_prefill_token():
    """A step that prefills 14 tokens (144 of 158 cached) costs 50 ms beyond the decodes, 3.6 ms a token: it
    must not move the price of a full step the way a whole prompt's step does."""
    from types import SimpleNamespace

    from consumers.worker.engine_thread import EngineThread

    thread = EngineThread(SimpleNamespace(stats=lambda: None), print, print, {})
    thread._measure_cost(0, 0.1)  # noqa: SLF001
    for _ in range(4):
        thread._measure_cost(158, 0.1 + 158 * 0.002)  # noqa: SLF001 (whole prompts: 2 ms a token)
    thread._measure_cost(14, 0.15)  # noqa: SLF001 (one cached prompt)
    assert 0.002 < thread.prefill_token_s < 0.0021  # per step, 3.6 ms would weigh a fifth: 2.3 ms
    for _ in range(10):
        thread._measure_cost(14, 0.15)  # noqa: SLF001
    assert thread.prefill_token_s < 0.0026  # ten of them, 140 tokens, still less than a third of the way
    for _ in range(200):
        thread._measure_cost(14, 0.15)  # noqa: SLF001
    assert 0.0033 < thread.prefill_token_s < 0.05 / 14  # only cached prompts for a long while: their price


def test_the_engine_thread_reports_the_share_of_started_prompt_tokens_the_prefix_cache_served():
    from types import SimpleNamespace

    from consumers.worker.engine_thread import PREFIX_MEMORY_TOKENS, EngineThread

    thread = EngineThread(SimpleNamespace(stats=lambda: None), print, print, {})
    assert thread.prefix_hit_share is None
    thread._measure_hits(0, 158)  # noqa: SLF001 (a first prompt: nothing cached)
    thread._measure_hits(0, 0)  # noqa: SLF001 (decode steps start no prompt)
    assert thread.prefix_hit_share == 0.0
    for _ in range(40):
        thread._measure_hits(144, 158)  # noqa: SLF001 (the same prompt again: 144 of its 158 tokens served)
    assert 0.85 < thread.prefix_hit_share < 144 / 158
    thread._measure_hits(0, 2 * PREFIX_MEMORY_TOKENS)  # noqa: SLF001 (new prompts, twice the memory's worth)
    assert thread.prefix_hit_share < 0.25 * 144 / 158 + 0.01


def test_prompts_ahead_count_net_of_the_workers_prefix_hit_share():
    """At 8 guidellm streams 6 prompts of 158 tokens just dispatched made 1,350 tokens ahead and a predicted
    3.5 s: the refusals. The worker's cache served 144 of each 158 tokens, which the heartbeat now says."""
    def registry(share):
        r = WorkerRegistry()
        r.observe(heartbeat(queued_tokens=400, max_batched_tokens=512, decode_step_ms=100.0, prefill_token_ms=2.0,
                            running=8, step_ms=100.0, prefix_hit_share=share, total_blocks=1024, free_blocks=1024))
        return r

    now = NOW.timestamp()
    full, cached = registry(None), registry(0.9)
    for r in (full, cached):
        for i in range(6):
            r.hold("w1", f"g{i}", Demand(158, 64), now)
    assert WorkerRegistry.ahead_tokens(full.workers["w1"], Demand(158, 64), now, 1.0) == 400 + 6 * 158
    assert WorkerRegistry.ahead_tokens(cached.workers["w1"], Demand(158, 64), now, 1.0) == \
        round(0.1 * (400 + 6 * 158))
    assert full.choose("m@1", Demand(158, 64), 2.0, 200.0, now) is None
    choice = cached.choose("m@1", Demand(158, 64), 2.0, 200.0, now)
    assert abs(choice.model_ttft_s - (0.05 + 0.1 + (135 + 16) * 0.002)) < 1e-9  # 135 ahead + 16 of its own
