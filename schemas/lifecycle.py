"""Lifecycle events and usage watermarks on `llm.generations` (key: generation id).

This topic has infinite retention: it is the billing source of truth. Usage
watermarks share it with the lifecycle so "a report after the seal" is a
matter of log order, which a replay reproduces exactly.
"""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import GenerationScoped
from schemas.values import SamplingParams, Tier, Usage, added


class Admitted(GenerationScoped):
    """`model_version` is always the concrete version; `alias` the name it was drawn through, if any."""

    type: Literal["Admitted"] = "Admitted"
    request_id: str = Field(min_length=1)
    model_version: str = Field(min_length=1)
    input_tokens: int = Field(ge=0)
    max_output_tokens: int = Field(ge=1)
    reserved_tokens: int = Field(ge=0)
    payload_hash: str = Field(min_length=64, max_length=64)
    sampling: SamplingParams = SamplingParams()
    tier: Tier = "interactive"
    alias: str | None = None
    result_tokens: bool = added(False)  # the results record carries the token events (SubmitGeneration)


class AttemptStarted(GenerationScoped):
    type: Literal["AttemptStarted"] = "AttemptStarted"
    epoch: int = Field(ge=1)
    worker_id: str = Field(min_length=1)


class CancelRequested(GenerationScoped):
    type: Literal["CancelRequested"] = "CancelRequested"


class UsageReported(GenerationScoped):
    """A cumulative watermark; (generation_id, epoch, report_seq) identifies it."""

    type: Literal["UsageReported"] = "UsageReported"
    epoch: int = Field(ge=1)
    report_seq: int = Field(ge=1)
    usage: Usage


class Completed(GenerationScoped):
    type: Literal["Completed"] = "Completed"
    epoch: int = Field(ge=1)
    finish_reason: Literal["stop", "length", "stop-string"]
    usage: Usage


class Canceled(GenerationScoped):
    type: Literal["Canceled"] = "Canceled"
    usage: Usage = Usage()


class Interrupted(GenerationScoped):
    """The attempt's worker was lost; billing seals at the last recorded watermark."""

    type: Literal["Interrupted"] = "Interrupted"
    epoch: int = Field(ge=1)
    worker_id: str = Field(min_length=1)
    # worker-lease-expired | worker-gave-up | worker-restarted | attempt-not-listed | max-attempt-time
    # (consumers/controller/leases.py)
    reason: str = "worker-lease-expired"


class Expired(GenerationScoped):
    type: Literal["Expired"] = "Expired"
    usage: Usage = Usage()


class Failed(GenerationScoped):
    """The engine could not go on with this attempt (its step failed); billing seals at the output so far.

    `reason` is an error class or kind, never prompt or output text.
    """

    type: Literal["Failed"] = "Failed"
    epoch: int = Field(ge=1)
    usage: Usage
    reason: str = Field(default="engine-step-failed", min_length=1, max_length=256)


class Rejected(GenerationScoped):
    type: Literal["Rejected"] = "Rejected"
    error_code: str = Field(min_length=1)
    reason: str = Field(min_length=1)


TERMINAL_TYPES = frozenset({"Completed", "Canceled", "Interrupted", "Expired", "Failed", "Rejected"})
