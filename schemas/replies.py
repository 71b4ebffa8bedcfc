"""Admission decisions on `llm.replies` (key: gateway instance)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import TenantScoped


class AdmissionDecision(TenantScoped):
    """The controller's answer to one SubmitGeneration / CancelGeneration.

    `http_status` is what the waiting HTTP call returns: 201 created, 200
    existing, 409 conflicting payload, 429 budget, 503 no capacity;
    for cancels 202 canceling, 200 already finished, 404 unknown.
    """

    type: Literal["AdmissionDecision"] = "AdmissionDecision"
    gateway_id: str = Field(min_length=1)
    correlation_id: str = Field(min_length=1)
    request_id: str | None = None
    generation_id: str | None = None
    outcome: Literal["created", "existing", "conflict", "rejected", "canceling", "finished"]
    http_status: int = Field(ge=200, le=599)
    error_code: str | None = None
    reason: str | None = None
    retry_after_ms: int | None = Field(default=None, ge=0)
    status: str | None = None  # the generation's control status for 200/202 answers
    # The concrete version a 201/200 answer runs on: an alias resolved at admission, kept for retries.
    model_version: str | None = None
    # The controller group that decided: a gateway accepts only its own group's answers, so a second
    # control plane on the same broker (a test session next to `ledgerlm up`) cannot answer for it.
    decided_by: str | None = None
