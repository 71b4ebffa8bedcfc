"""The wait a route promised, what the worker observed, and the error fed back into the next prediction."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

from consumers.controller.registry import Demand, WorkerRegistry
from consumers.worker.calibration import MAX_AGE_S, WINDOW, WaitCalibration, promise_ratio
from schemas.dispatch import StartAttempt
from schemas.registry_events import WorkerHeartbeat

NOW = datetime(2026, 12, 2, 9, 0, 0, tzinfo=UTC)


def order(tier: str = "interactive", predicted_ms: int | None = 400, model_ms: int | None = 300) -> StartAttempt:
    return StartAttempt(tenant_id="acme", generation_id="g1", epoch=1, worker_id="w1", model_version="m@1",
                        input_token_ids=(1, 2), max_output_tokens=4, deadline_at=NOW + timedelta(seconds=10),
                        tier=tier, predicted_wait_ms=predicted_ms, model_wait_ms=model_ms)


def test_the_error_is_the_median_of_recent_interactive_waits_against_the_uncorrected_model():
    waits = WaitCalibration()
    assert waits.error_ms(0.0) is None
    for observed in (0.5, 0.9, 1.3):  # the model said 0.3 s each time
        waits.observe(order(), observed, now=10.0)
    waits.observe(order(tier="batch"), 30.0, now=10.0)  # batch waits behind everything: not a promise
    waits.observe(order(model_ms=None), 30.0, now=10.0)  # routed without a prediction
    assert waits.error_ms(10.0) == 600.0
    assert waits.error_ms(10.0 + MAX_AGE_S + 1) is None  # old errors say nothing of the load now


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
    return WorkerHeartbeat(worker_id="w1", model_versions=("m@1",), total_blocks=64, free_blocks=64, block_size=16,
                           running=0, queued_tokens=400, lease_ms=5000, occurred_at=NOW, tokens_per_s=200.0,
                           **fields)


def test_the_controller_adds_the_reported_error_to_interactive_predictions_and_sends_both():
    registry = WorkerRegistry()
    registry.observe(heartbeat(wait_error_ms=1500.0))
    now = NOW.timestamp()
    chat = registry.choose("m@1", Demand(4, 12), 5.0, 200.0, now)
    assert (chat.model_queue_s, chat.queue_s) == (2.0, 3.5)  # 400 queued tokens at 200/s, plus 1.5 s missed
    assert chat.promise == {"predicted_wait_ms": 3500, "model_wait_ms": 2000}
    assert registry.choose("m@1", Demand(4, 12), 3.0, 200.0, now) is None  # 3.5 s no longer fits 3 s
    batch = registry.choose("m@1", Demand(4, 12, batch=True), 3.0, 200.0, now)
    assert batch.queue_s == 2.0  # batch work is not promised a latency: no correction
    registry.observe(heartbeat(wait_error_ms=-5000.0))
    assert registry.choose("m@1", Demand(4, 12), 5.0, 200.0, now).queue_s == 0.0  # never below nothing


def test_the_worker_records_the_promise_ratio_per_tier_and_feeds_the_error_back():
    from consumers.worker.attempts import Attempt
    from consumers.worker.measure import observe_wait
    from engine.reservations import Reservation
    from plumbing.telemetry.metrics import WorkerMetrics

    metrics, waits = WorkerMetrics(lambda: None, lambda: 0), WaitCalibration()
    observe_wait(metrics, Attempt(order(predicted_ms=400, model_ms=300), Reservation("g1#1", 1)), 0.5, 7.0, waits)
    ratio = metrics.registry.get_sample_value("ledgerlm:queue_wait_promise_ratio_sum", {"tier": "interactive"})
    assert ratio == 1.25 and waits.error_ms(7.0) == 200.0
