"""The body of `POST /v1/generations` (camelCase on the wire).

Sampling values are held to the engine's documented bounds (engine/limits.py, README "Bad input") here, with
a 400 naming the field; stop token ids are checked against the pinned version's vocabulary when the prompt is
rendered (prompts.py). A temperature below `MIN_TEMPERATURE` is served greedily, and a tiny topP keeps the
most likely token: neither is an error.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from engine.limits import (
    MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_ENTRIES, MAX_LOGPROBS, MAX_PENALTY, MAX_REPETITION_PENALTY, MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, MAX_STRUCTURED_CHARS, MIN_TEMPERATURE,
)
from schemas.values import MAX_COMPLETION_WINDOW_S, StructuredSpec

MAX_CHOICES = 16  # n: choices of one prompt, each up to maxOutputTokens
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


LOGIT_BIAS_DOC = (f"token id (as a string) -> bias in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], at most "
                  f"{MAX_LOGIT_BIAS_ENTRIES} entries, ids inside the model version's vocabulary")


def bounded_logit_bias(bias: dict[str, float] | None) -> dict[str, float] | None:
    """ValueError unless token-id keys and values within the documented bounds (ids vs vocabulary: prompts.py)."""
    if not bias:
        return bias
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise ValueError(f"at most {MAX_LOGIT_BIAS_ENTRIES} entries, not {len(bias)}")
    for key, value in bias.items():
        if not key.isdigit():
            raise ValueError(f"keys are token ids, not {key[:32]!r}")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise ValueError(f"values are in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], not {value}")
    return bias


def logit_bias_pairs(bias: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    return tuple(sorted((int(k), float(v)) for k, v in (bias or {}).items() if v != 0))


class ResponseFormat(BaseModel):
    """Structured output of the native API (OpenAI's `response_format` and vLLM's guided fields map onto it):
    `text` (none), `json_object` (any JSON object), `json_schema` (`schema`, with `strict`: a keyword the
    grammar engine does not support is a 400 rather than ignored), `regex` (`pattern`), `choice` (`choices`,
    exactly one of them), `grammar` (a Lark `grammar`)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["text", "json_object", "json_schema", "regex", "choice", "grammar"]
    json_schema: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool = True
    pattern: str | None = Field(default=None, max_length=MAX_STRUCTURED_CHARS)
    choices: list[Annotated[str, Field(min_length=1)]] | None = Field(default=None, min_length=1, max_length=1024)
    grammar: str | None = Field(default=None, max_length=MAX_STRUCTURED_CHARS)

    @model_validator(mode="after")
    def its_own_field(self) -> "ResponseFormat":
        needs = {"json_schema": "json_schema", "regex": "pattern", "choice": "choices", "grammar": "grammar"}
        for kind, name in needs.items():
            given = getattr(self, name) is not None
            if given != (self.type == kind):
                label = "schema" if name == "json_schema" else name
                raise ValueError(f"{label} goes with type {kind!r} only" if given else f"type {kind!r} needs {label}")
        if len(json.dumps(self.json_schema)) > MAX_STRUCTURED_CHARS:
            raise ValueError(f"the schema is at most {MAX_STRUCTURED_CHARS} characters of JSON")
        if self.choices is not None and len(json.dumps(self.choices)) > MAX_STRUCTURED_CHARS:
            raise ValueError(f"the choices are at most {MAX_STRUCTURED_CHARS} characters of JSON")
        return self

    def spec(self) -> StructuredSpec | None:
        if self.type == "text":
            return None
        if self.type == "json_object":
            return StructuredSpec(kind="json_object")
        if self.type == "json_schema":
            schema = {} if self.json_schema is True else self.json_schema
            return StructuredSpec(kind="json_schema", spec=json.dumps(schema, separators=(",", ":")),
                                  strict=self.strict)
        if self.type == "choice":
            return StructuredSpec(kind="choice", spec=json.dumps(self.choices))
        return StructuredSpec(kind=self.type, spec=self.pattern if self.type == "regex" else self.grammar)


class Message(BaseModel):
    """A chat message; `tool` messages answer an assistant's `toolCalls` (OpenAI's tool_calls shape)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(max_length=200_000)
    tool_calls: list[dict[str, Any]] | None = Field(default=None, alias="toolCalls", max_length=64)
    tool_call_id: str | None = Field(default=None, alias="toolCallId", max_length=256)


class GenerationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    request_id: str = Field(alias="requestId", min_length=1, max_length=256, pattern=r"^[\x21-\x7e]+$")
    model: str = Field(min_length=1, max_length=256)
    input: str | None = Field(default=None, max_length=200_000)
    messages: list[Message] | None = Field(default=None, min_length=1, max_length=256)
    # Logprobs of each prompt token after the first, with this many alternatives; null: none. (Declared before
    # maxOutputTokens, whose check reads it.)
    prompt_logprobs: int | None = Field(default=None, alias="promptLogprobs", ge=0, le=MAX_LOGPROBS, strict=True)
    # Choices of the same prompt, one generation: its usage and bill count every choice's output.
    n: int = Field(default=1, ge=1, le=MAX_CHOICES, strict=True)
    # Strict: a limit sent as "8", 8.0 or true is a mistake to name, not to guess at. 0: score the prompt only
    # (with promptLogprobs, n = 1), generate nothing.
    max_output_tokens: int = Field(alias="maxOutputTokens", ge=0, le=1_000_000, strict=True)
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
    # Batch only: how long the generation may wait for capacity before it expires (default: the tenant's
    # window, else the platform's, 24 h); it can only shorten the tenant's window.
    completion_window_s: int | None = Field(default=None, alias="completionWindowS", ge=60,
                                            le=MAX_COMPLETION_WINDOW_S, strict=True)
    presence_penalty: float = Field(default=0.0, alias="presencePenalty", ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float = Field(default=0.0, alias="frequencyPenalty", ge=-MAX_PENALTY, le=MAX_PENALTY)
    repetition_penalty: float = Field(default=1.0, alias="repetitionPenalty", gt=0.0, le=MAX_REPETITION_PENALTY)
    logit_bias: dict[str, float] | None = Field(default=None, alias="logitBias", description=LOGIT_BIAS_DOC)
    # Logprobs of each output token with this many alternatives (0: the token's own only); null: none.
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS, strict=True)
    response_format: ResponseFormat | None = Field(default=None, alias="responseFormat")
    # Tools shown to the model through its chat template (OpenAI's shape: {"type": "function", "function": ...}).
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=128)

    _bounded_stop = field_validator("stop")(bounded_stop)
    _bounded_logit_bias = field_validator("logit_bias")(bounded_logit_bias)

    @field_validator("max_output_tokens")
    @classmethod
    def zero_only_to_score(cls, value: int, info: ValidationInfo) -> int:
        if value == 0 and (info.data.get("prompt_logprobs") is None or info.data.get("n", 1) > 1):
            raise ValueError("0 only scores the prompt: it needs promptLogprobs, and n = 1")
        return value

    @model_validator(mode="after")
    def one_input(self) -> "GenerationRequest":
        if (self.input is None) == (self.messages is None):
            raise ValueError("exactly one of 'input' or 'messages' is required")
        if self.min_tokens > self.max_output_tokens:
            raise ValueError("minTokens must not exceed maxOutputTokens")
        if self.completion_window_s is not None and self.tier != "batch":
            raise ValueError("completionWindowS applies to the batch tier only")
        return self

    @property
    def prompt_only(self) -> bool:
        return self.max_output_tokens == 0

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)
