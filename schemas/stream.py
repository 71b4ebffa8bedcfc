"""Stream events on `llm.tokens` (key: generation id); (generation, epoch, seq) names one."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import GenerationScoped, Value
from schemas.values import EndReason, Usage, added


class TokenLogprob(Value):
    """log p(token) under the model's raw distribution, and the `top` most likely (token id, logprob) pairs."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class TokensEmitted(GenerationScoped):
    """New output tokens; `token_count` is the cumulative output of this epoch after this event.

    `logprobs`: one per token in `token_ids` when the generation asked for them. `prompt_logprobs`: scores of
    prompt tokens 1.. (the first has no context), split over as many events as keep each record small, all
    before the first output token; such an event may carry no token at all.
    """

    type: Literal["TokensEmitted"] = "TokensEmitted"
    epoch: int = Field(ge=1)
    seq: int = Field(ge=1)
    token_ids: tuple[int, ...]
    text_delta: str
    token_count: int = Field(ge=0)
    logprobs: tuple[TokenLogprob, ...] | None = added(None)
    prompt_logprobs: tuple[TokenLogprob, ...] | None = added(None)
    # With n > 1 choices: which choice these tokens belong to (`token_count` then sums all choices), and the
    # choice's end, on the event that carries its last tokens (StreamFinished ends the whole generation).
    choice: int = added(0, ge=0)
    choice_end: EndReason | None = added(None)


class StreamFinished(GenerationScoped):
    """The last event of a stream, written after the terminal lifecycle event is acknowledged.

    `usage_label` is "interrupted" when the recorded watermark is all that was billed.
    """

    type: Literal["StreamFinished"] = "StreamFinished"
    epoch: int = Field(ge=1)
    seq: int = Field(ge=1)
    reason: EndReason
    usage: Usage
    usage_label: Literal["final", "interrupted"] = "final"
