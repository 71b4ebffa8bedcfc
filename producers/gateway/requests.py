"""The body of `POST /v1/generations` (camelCase on the wire)."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=200_000)


class GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    request_id: str = Field(alias="requestId", min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$")
    model: str = Field(min_length=1, max_length=256)
    input: str | None = Field(default=None, max_length=200_000)
    messages: list[Message] | None = Field(default=None, min_length=1, max_length=256)
    # Strict: a limit sent as "8", 8.0 or true is a mistake to name, not to guess at.
    max_output_tokens: int = Field(alias="maxOutputTokens", ge=1, le=1_000_000, strict=True)
    stream: bool = False
    temperature: float = Field(default=0.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, alias="topP", gt=0.0, le=1.0)
    top_k: int = Field(default=0, alias="topK", ge=0, strict=True)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1, strict=True)
    stop: list[str] | str | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0, strict=True)]] = Field(default_factory=list, alias="stopTokenIds",
                                                              max_length=256)
    # Load-testing conveniences (vLLM's names): run to maxOutputTokens whatever the model says, or at least
    # minTokens before EOS, a stop token id or a stop string may end the generation.
    ignore_eos: bool = Field(default=False, alias="ignoreEos")
    min_tokens: int = Field(default=0, alias="minTokens", ge=0, strict=True)
    tier: Literal["interactive", "batch"] = "interactive"

    @model_validator(mode="after")
    def one_input(self) -> "GenerationRequest":
        if (self.input is None) == (self.messages is None):
            raise ValueError("exactly one of 'input' or 'messages' is required")
        if self.min_tokens > self.max_output_tokens:
            raise ValueError("minTokens must not exceed maxOutputTokens")
        return self

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)
