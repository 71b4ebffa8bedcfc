"""Bodies of `POST /v1/completions` and `POST /v1/chat/completions`, and their native translation.

Every OpenAI or vLLM field is either carried to the platform, accepted as a
label that changes nothing (`user`, `metadata`), or accepted only at the value
that changes nothing (`n=1`, `presence_penalty=0`, ...):
any other value is a 400 naming the field, never a silently different
generation. Unknown fields are a 400 too.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from engine.limits import MAX_STOP_TOKEN_IDS
from producers.gateway.errors import ApiError
from producers.gateway.requests import (
    STOP_DOC, STOP_TOKEN_IDS_DOC, TEMPERATURE_DOC, GenerationRequest, Message, bounded_stop,
)

# OpenAI's documented default for /v1/completions; chat defaults to the rest of the context.
COMPLETION_DEFAULT_MAX_TOKENS = 16
# OpenAI's default temperature (the native API's default is greedy, 0.0).
DEFAULT_TEMPERATURE = 1.0

# field -> (values that change nothing, why any other value is refused)
NEUTRAL: dict[str, tuple[tuple, str]] = {
    "n": ((None, 1), "one choice per request: send n requests"),
    "best_of": ((None, 1), "one candidate per request"),
    "presence_penalty": ((None, 0), "penalties are not implemented by the engine"),
    "frequency_penalty": ((None, 0), "penalties are not implemented by the engine"),
    "repetition_penalty": ((None, 1), "penalties are not implemented by the engine"),
    "logit_bias": ((None, {}), "logit bias is not implemented by the engine"),
    "logprobs": ((None, False), "log-probabilities are not returned"),
    "top_logprobs": ((None, 0), "log-probabilities are not returned"),
    "echo": ((None, False), "the prompt is not echoed"),
    "suffix": ((None, ""), "insertion (suffix) is not supported"),
    "tools": ((None, []), "tool calling is not supported"),
    "tool_choice": ((None, "none"), "tool calling is not supported"),
    "response_format": ((None, {"type": "text"}), "only plain text output is supported"),
}
# Native field names in errors from rendering, as an OpenAI client knows them.
OPENAI_FIELD = {"maxOutputTokens": "max_tokens", "requestId": "Idempotency-Key", "topP": "top_p", "topK": "top_k",
                "minTokens": "min_tokens", "stopTokenIds": "stop_token_ids", "ignoreEos": "ignore_eos"}


def is_same(value: Any, neutral: Any) -> bool:
    """Equal and both or neither a bool: `logprobs=0` (a count) is not `logprobs=False`."""
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def native(self) -> Message:
        content = self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content)
        return Message(role="system" if self.role == "developer" else self.role, content=content)


class OpenAIRequest(BaseModel):
    """Fields both endpoints share."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1, max_length=256)
    max_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=1_000_000)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description=TEMPERATURE_DOC)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)  # vLLM: -1 (or 0) disables
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = Field(default=None, description=STOP_DOC)
    stop_token_ids: list[int] | None = Field(default=None, max_length=MAX_STOP_TOKEN_IDS,
                                             description=STOP_TOKEN_IDS_DOC)
    stream: bool = False
    stream_options: StreamOptions | None = None
    # "flex" is OpenAI's slower, cheaper processing: the platform's batch tier.
    service_tier: Literal["auto", "default", "flex"] | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    n: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    logit_bias: Any = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)

    _bounded_stop = field_validator("stop")(bounded_stop)

    @field_validator("stop_token_ids")
    @classmethod
    def non_negative(cls, ids: list[int] | None) -> list[int] | None:
        if ids is not None and any(i < 0 for i in ids):
            raise ValueError("token ids are >= 0")
        return ids

    def check_supported(self) -> None:
        """ApiError 400 for a field set to a value the platform would not honour."""
        for name, (neutral, why) in NEUTRAL.items():
            value = getattr(self, name, None)
            if not any(is_same(value, v) for v in neutral):
                raise ApiError(400, "unsupported_parameter", f"{name}={value!r} is not supported: {why}",
                               {"field": name})
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "invalid_request", "stream_options is only allowed when stream is true",
                           {"field": "stream_options"})
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise ApiError(400, "invalid_request", "max_tokens and max_completion_tokens differ: send one",
                           {"field": "max_completion_tokens"})

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def native_input(self) -> dict:
        raise NotImplementedError

    def native(self, request_id: str, max_output_tokens: int) -> GenerationRequest:
        return GenerationRequest(
            request_id=request_id, model=self.model, max_output_tokens=max_output_tokens, stream=self.stream,
            temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=max(self.top_k or 0, 0), seed=self.seed,
            stop=self.stop, stop_token_ids=self.stop_token_ids or [], ignore_eos=self.ignore_eos,
            min_tokens=min(self.min_tokens, max_output_tokens),  # below the limit except in a 1-token probe
            tier="batch" if self.service_tier == "flex" else "interactive", **self.native_input())


class ChatCompletionRequest(OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    logprobs: Any = None
    top_logprobs: Any = None
    tools: Any = None
    tool_choice: Any = None
    response_format: Any = None

    def native_input(self) -> dict:
        return {"messages": [m.native() for m in self.messages]}


class CompletionRequest(OpenAIRequest):
    prompt: str
    logprobs: Any = None
    echo: Any = None
    suffix: Any = None
    best_of: Any = None

    @field_validator("prompt", mode="before")
    @classmethod
    def one_text_prompt(cls, prompt: Any) -> Any:
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ValueError("exactly one prompt per request")
            if not isinstance(prompt[0], str):
                raise ValueError("token-id prompts are not supported: send text")
            return prompt[0]
        return prompt

    def requested_max_tokens(self) -> int:
        return super().requested_max_tokens() or COMPLETION_DEFAULT_MAX_TOKENS

    def native_input(self) -> dict:
        return {"input": self.prompt}
