"""The body of `POST /v1/generations` (camelCase on the wire).

Sampling values are held to the engine's documented bounds (engine/limits.py, README "Bad input") here, with
a 400 naming the field; stop token ids are checked against the pinned version's vocabulary when the prompt is
rendered (prompts.py). A temperature below `MIN_TEMPERATURE` is served greedily, and a tiny topP keeps the
most likely token: neither is an error.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.limits import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, MIN_TEMPERATURE

STOP_DOC = f"one string or a list of at most {MAX_STOP_STRINGS}, each at most {MAX_STOP_STRING_CHARS} characters"
TEMPERATURE_DOC = f"0 (or anything below {MIN_TEMPERATURE}) is greedy"
STOP_TOKEN_IDS_DOC = f"at most {MAX_STOP_TOKEN_IDS} token ids, each inside the model version's vocabulary"


def bounded_stop(stop: list[str] | str | None) -> list[str] | str | None:
    """ValueError unless `stop` is within the documented bounds (the message names them)."""
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > MAX_STOP_STRINGS:
        raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, not {len(stops)}")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_STRING_CHARS:
        raise ValueError(f"stop strings are at most {MAX_STOP_STRING_CHARS} characters, not {longest}")
    return stop


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
    temperature: float = Field(default=0.0, ge=0.0, le=10.0, description=TEMPERATURE_DOC)
    top_p: float = Field(default=1.0, alias="topP", gt=0.0, le=1.0)
    top_k: int = Field(default=0, alias="topK", ge=0, strict=True)
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1, strict=True)
    stop: list[str] | str | None = Field(default=None, description=STOP_DOC)
    stop_token_ids: list[Annotated[int, Field(ge=0, strict=True)]] = Field(
        default_factory=list, alias="stopTokenIds", max_length=MAX_STOP_TOKEN_IDS, description=STOP_TOKEN_IDS_DOC)
    # Load-testing conveniences (vLLM's names): run to maxOutputTokens whatever the model says, or at least
    # minTokens before EOS, a stop token id or a stop string may end the generation.
    ignore_eos: bool = Field(default=False, alias="ignoreEos")
    min_tokens: int = Field(default=0, alias="minTokens", ge=0, strict=True)
    tier: Literal["interactive", "batch"] = "interactive"

    _bounded_stop = field_validator("stop")(bounded_stop)

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
