"""The worker's latency and token metrics, observed from each engine output of an attempt.

    admitted (StartAttempt.occurred_at) ─ queue ─▶ first scheduled ─▶ first token: TTFT
    the queue wait vs the controller's prediction: the promise ratio per tier, the error fed back (calibration)
    the TTFT vs the controller's prediction of it: the TTFT promise ratio per tier
    first token ─ ITL ─▶ next token ─ ITL ─▶ … ─▶ end: e2e (from admitted)
    CancelAttempt.occurred_at ─ cancellation lag ─▶ removed at a step boundary
"""
from __future__ import annotations

from consumers.worker.attempts import FINISHES, Attempt
from consumers.worker.calibration import WaitCalibration, promise_ratio, ttft_promise_ratio
from engine.request import FinishReason, RequestOutput
from plumbing.telemetry.metrics import WorkerMetrics


def observe_output(metrics: WorkerMetrics, attempt: Attempt, output: RequestOutput, now: float,
                   waits: WaitCalibration | None = None) -> None:
    """Record what this output tells: call once per output, before the attempt's state moves on."""
    if output.new_token_ids:
        if attempt.last_token_at is None:
            metrics.ttft.observe(now - attempt.admitted_at)
            kept = ttft_promise_ratio(attempt.start, now - attempt.admitted_at)
            if kept is not None:
                metrics.ttft_promise_ratio.labels(tier=attempt.start.tier).observe(kept)
            if waits is not None:
                waits.observe_ttft(attempt.start, now - attempt.admitted_at, now)
            if output.queue_time_s is not None:
                observe_wait(metrics, attempt, attempt.accepted_at - attempt.admitted_at + output.queue_time_s,
                             now, waits)
            metrics.served(attempt.start.tenant_id, output.num_prompt_tokens, 0)
        else:
            metrics.itl.observe(now - attempt.last_token_at)
        attempt.last_token_at = now
        metrics.served(attempt.start.tenant_id, 0, len(output.new_token_ids))
    if output.finished:
        metrics.e2e.observe(now - attempt.admitted_at)
        metrics.finished.labels(finished_reason=FINISHES[output.finish_reason][2]).inc()
        if output.finish_reason == FinishReason.CANCELLED and attempt.cancel_ordered_at is not None:
            metrics.cancellation_lag.observe(now - attempt.cancel_ordered_at)


def observe_wait(metrics: WorkerMetrics, attempt: Attempt, observed_s: float, now: float,
                 waits: WaitCalibration | None) -> None:
    """The wait from the controller's decision to the first scheduling: its metric, how it kept the promise
    routed with, and the error fed back to the controller."""
    metrics.queue_time.observe(observed_s)
    ratio = promise_ratio(attempt.start, observed_s)
    if ratio is not None:
        metrics.wait_promise_ratio.labels(tier=attempt.start.tier).observe(ratio)
    if waits is not None:
        waits.observe(attempt.start, observed_s, now)
