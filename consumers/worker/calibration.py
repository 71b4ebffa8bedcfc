"""How wrong the controller's wait predictions were on this worker, fed back through heartbeats.

    StartAttempt.predicted_wait_ms   the wait before its prefill starts, as routed (calibrated)
    StartAttempt.model_wait_ms       the same from the queue model alone (uncorrected)
    observed                         decided (occurred_at) ─▶ accepted here ─▶ first scheduled by the engine
    StartAttempt.predicted_ttft_ms   the promise as a client sees it, decided ─▶ first token (calibrated)
    StartAttempt.model_ttft_ms       the model's wait plus its own prefill steps (uncorrected)

The worker keeps the recent errors `observed - model` of interactive attempts and reports their median as
`WorkerHeartbeat.wait_error_ms`, and the same of the TTFT as `ttft_error_ms`, faded by the time since the newest;
the controller adds each to the model's prediction. Of the TTFT it also reports a high quantile
(`ttft_error_high_ms`): the median makes the promise, the high quantile decides whether it is made at all.
The error is measured against the uncorrected model, so the correction never feeds on itself. What the model
misses is what it does not see: the dispatch through the broker, the controller's own transaction, and the
decode steps that run between queued prefill chunks at the current batch size.
"""
from __future__ import annotations

from collections import deque

from schemas.dispatch import StartAttempt

# Errors remembered: enough for a stable median, few enough to follow a change of load within a minute.
WINDOW = 64
MAX_AGE_S = 120.0
# An error nothing has confirmed lately fades: halved for every HALF_LIFE_S since the newest observation. A refused
# request is never observed, so an error measured in a cold start or a burst would otherwise keep the prediction
# high, and the controller refusing, until it aged out of the window. Faded, it lets an attempt through within
# seconds, and that attempt measures the load as it is now (decision 0018).
HALF_LIFE_S = 10.0
# The controller promises the median TTFT but admits only where this quantile of the error fits the allowance:
# admitting by the median, a quarter of the admitted requests at 16 guidellm streams waited past the 2 s
# allowance (TTFT p95 2.33 s) while their median promise held (decision 0022).
ADMIT_QUANTILE = 0.95


class ErrorWindow:
    """The recent errors (observed - model, seconds) of one prediction, and their median."""

    def __init__(self) -> None:
        self.errors: deque[tuple[float, float]] = deque(maxlen=WINDOW)  # (monotonic at, observed - model, s)

    def add(self, now: float, error_s: float) -> None:
        self.errors.append((now, error_s))

    def median_ms(self, now: float) -> float | None:
        """Median of the recent errors (`quantile_ms` at 0.5)."""
        return self.quantile_ms(now, 0.5)

    def quantile_ms(self, now: float, q: float) -> float | None:
        """The `q` quantile of the recent errors, each weighed by its age (halved every HALF_LIFE_S, so one new
        error outweighs older ones), faded by the time since the newest (None: none within MAX_AGE_S)."""
        recent = sorted((error, 0.5 ** (max(0.0, now - at) / HALF_LIFE_S))
                        for at, error in self.errors if now - at <= MAX_AGE_S)
        if not recent:
            return None
        share, seen = sum(weight for _, weight in recent) * q, 0.0
        for error, weight in recent:
            seen += weight
            if seen >= share:
                break
        fade = 0.5 ** (max(0.0, now - self.errors[-1][0]) / HALF_LIFE_S)
        return round(error * fade * 1000, 1)


class WaitCalibration:
    """The errors of the wait before the first scheduling and of the TTFT, for interactive attempts."""

    def __init__(self) -> None:
        self.waits = ErrorWindow()
        self.ttfts = ErrorWindow()

    def observe(self, order: StartAttempt, observed_s: float, now: float) -> None:
        if order.tier == "interactive" and order.model_wait_ms is not None:
            self.waits.add(now, observed_s - order.model_wait_ms / 1000)

    def observe_ttft(self, order: StartAttempt, observed_s: float, now: float) -> None:
        if order.tier == "interactive" and order.model_ttft_ms is not None:
            self.ttfts.add(now, observed_s - order.model_ttft_ms / 1000)

    def error_ms(self, now: float) -> float | None:
        """Median wait error of the recent interactive attempts (None: none within MAX_AGE_S)."""
        return self.waits.median_ms(now)

    def ttft_error_ms(self, now: float) -> float | None:
        """Median TTFT error of the recent interactive attempts (None: none within MAX_AGE_S)."""
        return self.ttfts.median_ms(now)

    def ttft_error_high_ms(self, now: float) -> float | None:
        """The ADMIT_QUANTILE of the recent interactive attempts' TTFT errors (None: none within MAX_AGE_S)."""
        return self.ttfts.quantile_ms(now, ADMIT_QUANTILE)


def promise_ratio(order: StartAttempt, observed_s: float) -> float | None:
    """observed / promised wait; a promise under 10 ms counts as 10 ms (an idle worker promises 0)."""
    return ratio(observed_s, order.predicted_wait_ms)


def ttft_promise_ratio(order: StartAttempt, observed_s: float) -> float | None:
    """observed / promised time from the decision to the first token."""
    return ratio(observed_s, order.predicted_ttft_ms)


def ratio(observed_s: float, promised_ms: int | None) -> float | None:
    return None if promised_ms is None else observed_s / max(promised_ms / 1000, 0.01)
