"""Small values shared by commands and events."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import Value

Tier = Literal["interactive", "batch"]

# How a generation ended, as the client sees it (DESIGN.md §4, the stream's final event).
EndReason = Literal["completed", "output-limit", "canceled", "interrupted", "expired", "failed", "rejected"]


class SamplingParams(Value):
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)


class Usage(Value):
    """Cumulative counts for one (generation, epoch).

    `recompute_tokens` is physical work redone after a preemption: reported for
    the operator, never billed.
    """

    processed_input_tokens: int = Field(default=0, ge=0)
    cached_input_tokens: int = Field(default=0, ge=0)
    generated_output_tokens: int = Field(default=0, ge=0)
    recompute_tokens: int = Field(default=0, ge=0)


class TenantLimits(Value):
    weight: float = Field(default=1.0, gt=0.0)
    max_tokens_in_flight: int = Field(default=200_000, ge=1)
    tokens_per_minute: int = Field(default=1_000_000, ge=1)
    max_concurrency: int = Field(default=64, ge=1)
    max_queued_tokens: int = Field(default=400_000, ge=1)
