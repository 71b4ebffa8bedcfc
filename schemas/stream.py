"""Stream events on `llm.tokens` (key: generation id); (generation, epoch, seq) names one."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.envelope import GenerationScoped
from schemas.values import EndReason, Usage


class TokensEmitted(GenerationScoped):
    """New output tokens; `token_count` is the cumulative output of this epoch after this event."""

    type: Literal["TokensEmitted"] = "TokensEmitted"
    epoch: int = Field(ge=1)
    seq: int = Field(ge=1)
    token_ids: tuple[int, ...]
    text_delta: str
    token_count: int = Field(ge=0)


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
