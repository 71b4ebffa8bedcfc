"""Small values shared by commands and events."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.envelope import Value

Tier = Literal["interactive", "batch"]

# How a generation ended, as the client sees it (docs/streams.md, the stream's final event).
EndReason = Literal["completed", "output-limit", "canceled", "interrupted", "expired", "failed", "rejected"]


# The longest completion window a batch generation may be given: a week.
MAX_COMPLETION_WINDOW_S = 7 * 86400


def added(default: Any, **constraints: Any) -> Any:
    """A field added after the first release: left out of records while at its default, so records stay as
    small as before for requests that do not use it (and older readers' records replay unchanged)."""
    return Field(default=default, exclude_if=lambda value: value == default, **constraints)


StructuredKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]


class StructuredSpec(Value):
    """A constraint on the output (engine.request.StructuredOutput): a JSON schema as JSON text, any JSON object,
    a regex, a JSON list of choices, or a Lark grammar. `strict`: unsupported schema keywords are errors."""

    kind: StructuredKind
    spec: str = Field(default="", max_length=64 * 1024)
    strict: bool = True


class SamplingParams(Value):
    """Sampling of one generation. Fields added after the first release have neutral defaults, so records
    written before them replay unchanged (and `payload_hash` leaves defaults out)."""

    temperature: float = Field(default=0.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    presence_penalty: float = added(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = added(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = added(1.0, gt=0.0, le=10.0)
    # (token id, bias) pairs, ids ascending
    logit_bias: tuple[tuple[int, float], ...] = added(())
    # Alternatives per output token (0: the chosen token's logprob only); None: no logprobs.
    logprobs: int | None = added(None, ge=0, le=20)
    # Alternatives per prompt token; None: the prompt is not scored.
    prompt_logprobs: int | None = added(None, ge=0, le=20)
    # Score the prompt and generate nothing (OpenAI's max_tokens=0 with echo): max_output_tokens stays 1,
    # a reservation only.
    prompt_only: bool = added(False)
    structured: StructuredSpec | None = added(None)
    # Choices of the same prompt: one engine sequence each, under this one generation (usage sums them).
    n: int = added(1, ge=1, le=16)


class Usage(Value):
    """Cumulative counts for one (generation, epoch).

    `recompute_tokens` is physical work redone after a preemption: reported for
    the operator, never billed.
    """

    processed_input_tokens: int = Field(default=0, ge=0)
    cached_input_tokens: int = Field(default=0, ge=0)
    generated_output_tokens: int = Field(default=0, ge=0)
    recompute_tokens: int = Field(default=0, ge=0)


class BillingIds(Value):
    """Who the tenant is in the operator's billing systems (`ledgerlm export`): the Stripe customer its meter
    events name, and the Lago subscription its events are billed on (unset: the tenant id)."""

    stripe_customer_id: str | None = added(None, min_length=1, max_length=255)
    lago_subscription_id: str | None = added(None, min_length=1, max_length=255)


class TenantLimits(Value):
    weight: float = Field(default=1.0, gt=0.0)
    max_tokens_in_flight: int = Field(default=200_000, ge=1)
    tokens_per_minute: int = Field(default=1_000_000, ge=1)
    max_concurrency: int = Field(default=64, ge=1)
    max_queued_tokens: int = Field(default=400_000, ge=1)
    # How long an accepted batch generation may wait for capacity before it expires; None: the platform's
    # default (`batch_completion_window_s`). A request may ask for a shorter window, never a longer one.
    batch_completion_window_s: int | None = added(None, ge=60, le=MAX_COMPLETION_WINDOW_S)
