"""A batch generation's completion window as a request names it: seconds, the batch tier only, bounded."""
from __future__ import annotations

import pytest
from pydantic import ValidationError

from producers.gateway.admission.requests import GenerationRequest
from schemas.values import MAX_COMPLETION_WINDOW_S


def request(**fields) -> GenerationRequest:
    return GenerationRequest.model_validate({"requestId": "r1", "model": "m@1", "input": "hi", "maxOutputTokens": 4,
                                             **fields})


def test_a_batch_request_may_name_its_completion_window_in_seconds():
    assert request(tier="batch", completionWindowS=3600).completion_window_s == 3600
    assert request(tier="batch").completion_window_s is None  # the tenant's or the platform's window


@pytest.mark.parametrize("fields", [
    {"completionWindowS": 3600},  # interactive work has a TTFT allowance, not a window
    {"tier": "batch", "completionWindowS": 59},
    {"tier": "batch", "completionWindowS": MAX_COMPLETION_WINDOW_S + 1},
    {"tier": "batch", "completionWindowS": "24h"},
])
def test_a_window_outside_the_batch_tier_or_its_bounds_is_refused(fields):
    with pytest.raises(ValidationError) as error:
        request(**fields)
    assert "completionWindowS" in str(error.value)
