"""An attempt's states move one way (consumers/worker/attempts.py): each arrow the worker uses works, and a
move with no arrow is refused by name instead of leaving a flag set that no code path expects."""
from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from consumers.worker.attempts import Attempt, AttemptState, IllegalMove
from engine.request import FinishReason, RequestOutput
from engine.reservations import Reservation
from schemas.dispatch import StartAttempt
from schemas.values import SamplingParams


def make_attempt(n: int = 1) -> Attempt:
    order = StartAttempt(tenant_id="acme", generation_id="g1", epoch=2, worker_id="w1", model_version="m@1",
                         input_token_ids=(1, 2, 3), max_output_tokens=4, sampling=SamplingParams(n=n),
                         deadline_at=datetime.now(UTC) + timedelta(seconds=10))
    return Attempt(order, Reservation("g1#2", 1))


def ended_output(request_id: str = "g1#2") -> RequestOutput:
    return RequestOutput(request_id, (5,), "x", FinishReason.STOP, num_prompt_tokens=3, num_output_tokens=1,
                         num_cached_tokens=0)


def test_an_attempt_runs_finishes_and_ends():
    attempt = make_attempt()
    assert (attempt.state, attempt.fenced, attempt.finishing, attempt.reserved_blocks) == (
        AttemptState.RUNNING, False, False, 1)
    attempt.observe(ended_output())
    attempt.begin_finishing()
    assert attempt.finishing and not attempt.fenced
    attempt.end()
    assert attempt.state is AttemptState.ENDED


def test_it_cannot_finish_while_a_choice_runs():
    attempt = make_attempt(n=2)
    attempt.observe(ended_output())  # choice 0 ended, choice 1 has not
    with pytest.raises(IllegalMove, match="g1#2 cannot finish while a choice runs"):
        attempt.begin_finishing()
    assert attempt.state is AttemptState.RUNNING


def test_a_finishing_attempt_can_still_be_fenced_but_a_fenced_one_never_finishes():
    attempt = make_attempt()
    attempt.observe(ended_output())
    attempt.begin_finishing()
    attempt.fence()  # the lease lost while its end is being written
    assert attempt.fenced and not attempt.finishing
    with pytest.raises(IllegalMove, match="g1#2 cannot go from fenced to finishing"):
        attempt.begin_finishing()
    with pytest.raises(IllegalMove, match="from fenced to fenced"):
        attempt.fence()
    attempt.end()
    with pytest.raises(IllegalMove, match="from ended to ended"):
        attempt.end()
