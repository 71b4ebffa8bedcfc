"""Work orders on `llm.dispatch` (key: worker id)."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from schemas.envelope import Envelope, GenerationScoped
from schemas.values import SamplingParams, Tier, added


class StartAttempt(GenerationScoped):
    """Run one attempt (epoch) of a generation on `worker_id` with these exact token ids."""

    type: Literal["StartAttempt"] = "StartAttempt"
    epoch: int = Field(ge=1)
    worker_id: str = Field(min_length=1)
    model_version: str = Field(min_length=1)
    input_token_ids: tuple[int, ...]
    max_output_tokens: int = Field(ge=1)
    sampling: SamplingParams = SamplingParams()
    weight: float = Field(default=1.0, gt=0.0)
    deadline_at: datetime
    # batch attempts may wait on the worker for KV room until deadline_at; interactive ones reserve or refuse
    tier: Tier = "interactive"
    # The wait before its prefill starts the controller predicted when it routed the attempt, and what its
    # queue model alone said (before the worker's reported error was added); the same for the TTFT, decision
    # to first token (the promise: the model's wait plus its own prefill steps, then the TTFT error added).
    # None: not predicted.
    predicted_wait_ms: int | None = added(None, ge=0)
    model_wait_ms: int | None = added(None, ge=0)
    predicted_ttft_ms: int | None = added(None, ge=0)
    model_ttft_ms: int | None = added(None, ge=0)

    @property
    def output_tokens(self) -> int:
        """The most output it may produce: `max_output_tokens` for each of its n choices."""
        return self.max_output_tokens * self.sampling.n


# CancelAttempt reasons that say the controller has already ended the epoch `Interrupted`: its worker stops
# the attempt and publishes nothing more for it (no terminal event, no release).
INTERRUPTIONS = ("lease-expired", "worker-restarted", "attempt-not-listed", "max-attempt-time")


class CancelAttempt(GenerationScoped):
    type: Literal["CancelAttempt"] = "CancelAttempt"
    epoch: int = Field(ge=1)
    worker_id: str = Field(min_length=1)
    reason: str = "canceled"

    @property
    def after_interruption(self) -> bool:
        return self.reason in INTERRUPTIONS


class DrainWorker(Envelope):
    """Take no new attempts, finish the running ones, then exit (`ledgerlm workers drain ID`)."""

    type: Literal["DrainWorker"] = "DrainWorker"
    worker_id: str = Field(min_length=1)
