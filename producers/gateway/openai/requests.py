"""Bodies of `POST /v1/completions` and `POST /v1/chat/completions`, and their native translation.

Every field the OpenAI reference or vLLM documents for these endpoints is either carried to the platform,
accepted as a label that changes nothing (`user`, `metadata`, `prompt_cache_key`, ...), or accepted only at
the value that changes nothing (`NEUTRAL`: `n=1`, `best_of=1`, `use_beam_search=false`, ...): any other value is
a 400 naming the field, never a silently different generation. A field neither documents is a 400 too.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from engine.limits import MAX_LOGPROBS, MAX_PENALTY, MAX_REPETITION_PENALTY, MAX_STOP_TOKEN_IDS
from producers.gateway.admission.requests import (
    LOGIT_BIAS_DOC, MAX_CHOICES, STOP_DOC, STOP_TOKEN_IDS_DOC, TEMPERATURE_DOC, GenerationRequest, Message,
    bounded_logit_bias, bounded_stop,
)
from producers.gateway.errors import ApiError
from producers.gateway.openai.structured import OpenAIResponseFormat, StructuredOutputs, structured_format
from producers.gateway.openai.tools import NamedToolChoice, Tool, ToolCall, ToolMode, template_tools, tool_constraint, \
    tool_mode

# OpenAI's documented default for /v1/completions; chat defaults to the rest of the context.
COMPLETION_DEFAULT_MAX_TOKENS = 16
# OpenAI's default temperature (the native API's default is greedy, 0.0).
DEFAULT_TEMPERATURE = 1.0

_UNSUPPORTED = "is not supported"
# field -> (values that change nothing, why any other value is refused)
NEUTRAL: dict[str, tuple[tuple, str]] = {
    "best_of": ((None, 1), "no server-side ranking of candidates: use n and pick"),
    "use_beam_search": ((None, False), "beam search is not implemented"),
    "length_penalty": ((None, 1), "beam search is not implemented"),
    "min_p": ((None, 0), "min_p sampling is not implemented"),
    "suffix": ((None, ""), "insertion (suffix) is not supported"),
    "functions": ((None, []), "function calling is not supported"),
    "function_call": ((None, "none"), "function calling is not supported"),
    "audio": ((None,), "audio output is not supported"),
    "modalities": ((None, ["text"]), "only text output is supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "reasoning_effort": ((None,), "the served models do not reason"),
    "verbosity": ((None,), "the served models have no verbosity setting"),
    "web_search_options": ((None,), "web search is not supported"),
    "store": ((None, False), "completions are not stored for distillation or evals"),
    "include_stop_str_in_output": ((None, False), "stop strings are always removed from the output"),
    "skip_special_tokens": ((None, True), "special tokens are always left out of the text"),
    "spaces_between_special_tokens": ((None, True), "special tokens are always left out of the text"),
    "truncate_prompt_tokens": ((None,), "prompts are never truncated: a prompt too long is a 400"),
    "allowed_token_ids": ((None,), "use logit_bias (-100 bans a token)"),
    "bad_words": ((None, []), "use logit_bias (-100 bans a token)"),
    "continue_final_message": ((None, False), "the chat template always opens a new assistant turn"),
    "add_generation_prompt": ((None, True), "the chat template always opens a new assistant turn"),
    "documents": ((None,), "documents are not passed to chat templates"),
    "chat_template": ((None,), "the model version's own chat template is always used"),
    "chat_template_kwargs": ((None, {}), "the model version's own chat template is always used"),
    "mm_processor_kwargs": ((None,), "multimodal input is not supported"),
    "media_io_kwargs": ((None,), "multimodal input is not supported"),
    "structural_tag": ((None,), "structural tags are not supported: use response_format json_schema"),
    "guided_whitespace_pattern": ((None,), "JSON is generated compactly"),
    "priority": ((None, 0), "priority is the tenant's weight and tier (service_tier)"),
    "logits_processors": ((None, []), "custom logits processors are not supported"),
    "return_tokens_as_token_ids": ((None, False), "tokens in logprobs are always text"),
    "return_token_ids": ((None, False), "token ids are in the native stream (GET /v1/generations/{id}/events)"),
    "cache_salt": ((None,), "the prefix cache is already scoped to the tenant"),
    "kv_transfer_params": ((None,), "disaggregated prefill is not supported"),
    "vllm_xargs": ((None,), "extra vLLM arguments are not supported"),
    "prompt_embeds": ((None,), "embedding prompts are not supported: send text"),
}
CHAT_NEUTRAL = {"echo": ((None, False), "echoing the last chat message is not supported"),
                "add_special_tokens": ((None, False), "the chat template adds the special tokens it needs")}
COMPLETION_NEUTRAL = {"add_special_tokens": ((None, True), "a prompt is always tokenized as the tokenizer does by "
                                                           "default, with its special tokens")}
# Accepted with any value, changing nothing: labels and hints.
LABELS = ("user", "metadata", "prompt_cache_key", "safety_identifier", "guided_decoding_backend", "request_id",
          "parallel_tool_calls")
# Native field names in errors from rendering, as an OpenAI client knows them.
OPENAI_FIELD = {"maxOutputTokens": "max_tokens", "requestId": "Idempotency-Key", "topP": "top_p", "topK": "top_k",
                "minTokens": "min_tokens", "stopTokenIds": "stop_token_ids", "ignoreEos": "ignore_eos",
                "logitBias": "logit_bias", "responseFormat": "response_format", "presencePenalty": "presence_penalty",
                "frequencyPenalty": "frequency_penalty", "repetitionPenalty": "repetition_penalty",
                "promptLogprobs": "prompt_logprobs"}


def is_same(value: Any, neutral: Any) -> bool:
    """Equal and both or neither a bool: `n=True` is not `n=1`."""
    return value == neutral and isinstance(value, bool) == isinstance(neutral, bool)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    # vLLM: with include_usage, every chunk carries the usage so far
    continuous_usage_stats: bool = False


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None  # None only for an assistant message with tool_calls
    name: str | None = Field(default=None, max_length=256)  # accepted; chat templates ignore it
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=64)  # an assistant's earlier calls
    tool_call_id: str | None = Field(default=None, max_length=256)  # what a tool message answers
    refusal: str | None = None  # an assistant message as OpenAI returned it

    @model_validator(mode="after")
    def has_content(self) -> "ChatMessage":
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (null only for an assistant message with tool_calls)")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self

    def native(self) -> Message:
        content = self.content if isinstance(self.content, str) else "\n".join(p.text for p in self.content or [])
        calls = None if not self.tool_calls else [c.model_dump() for c in self.tool_calls]
        return Message(role="system" if self.role == "developer" else self.role, content=content,
                       tool_calls=calls, tool_call_id=self.tool_call_id)


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
    service_tier: Literal["auto", "default", "flex", "priority", "scale"] | None = None
    presence_penalty: float | None = Field(default=None, ge=-MAX_PENALTY, le=MAX_PENALTY)
    frequency_penalty: float | None = Field(default=None, ge=-MAX_PENALTY, le=MAX_PENALTY)
    repetition_penalty: float | None = Field(default=None, gt=0.0, le=MAX_REPETITION_PENALTY)
    logit_bias: dict[str, float] | None = Field(default=None, description=LOGIT_BIAS_DOC)
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    response_format: OpenAIResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    # Labels: any value, no effect.
    user: str | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    guided_decoding_backend: str | None = None
    request_id: str | None = None
    parallel_tool_calls: bool | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    # Documented elsewhere, accepted only at their neutral values (NEUTRAL).
    best_of: Any = None
    use_beam_search: Any = None
    length_penalty: Any = None
    min_p: Any = None
    include_stop_str_in_output: Any = None
    skip_special_tokens: Any = None
    spaces_between_special_tokens: Any = None
    truncate_prompt_tokens: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    structural_tag: Any = None
    guided_whitespace_pattern: Any = None
    priority: Any = None
    logits_processors: Any = None
    return_tokens_as_token_ids: Any = None
    return_token_ids: Any = None
    cache_salt: Any = None
    kv_transfer_params: Any = None
    vllm_xargs: Any = None

    _bounded_stop = field_validator("stop")(bounded_stop)
    _bounded_logit_bias = field_validator("logit_bias")(bounded_logit_bias)

    @field_validator("stop_token_ids")
    @classmethod
    def non_negative(cls, ids: list[int] | None) -> list[int] | None:
        if ids is not None and any(i < 0 for i in ids):
            raise ValueError("token ids are >= 0")
        return ids

    def check_supported(self) -> None:
        """ApiError 400 for a field set to a value the platform would not honour."""
        for field, (neutral, why) in self.neutral_fields().items():
            if field not in type(self).model_fields:
                continue
            value = getattr(self, field)
            if not any(is_same(value, v) for v in neutral):
                raise ApiError(400, "unsupported_parameter", f"{field}={value!r} {_UNSUPPORTED}: {why}",
                               {"field": field})
        if self.stream_options is not None and not self.stream:
            raise ApiError(400, "invalid_request", "stream_options is only allowed when stream is true",
                           {"field": "stream_options"})
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            raise ApiError(400, "invalid_request", "max_tokens and max_completion_tokens differ: send one",
                           {"field": "max_completion_tokens"})

    def neutral_fields(self) -> dict[str, tuple[tuple, str]]:
        return NEUTRAL

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """vLLM's continuous_usage_stats: usage on every chunk (with include_usage, as vLLM)."""
        return self.include_usage and self.stream_options.continuous_usage_stats

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def output_logprobs(self) -> int | None:
        """Alternatives per output token (0: the chosen one only); None: no logprobs."""
        raise NotImplementedError

    def scored_prompt_logprobs(self) -> int | None:
        """Alternatives per prompt token; None: the prompt is not scored."""
        return self.prompt_logprobs

    def native_input(self) -> dict:
        raise NotImplementedError

    def tool_constraint(self):
        return None

    def native(self, request_id: str, max_output_tokens: int) -> GenerationRequest:
        """The native request. Its field names are the native ones; errors map back through OPENAI_FIELD."""
        response_format = structured_format(self.response_format, self.structured_outputs, {
            "guided_json": self.guided_json, "guided_regex": self.guided_regex,
            "guided_choice": self.guided_choice, "guided_grammar": self.guided_grammar})
        tools = self.tool_constraint()
        if tools is not None:
            if response_format is not None:
                raise ApiError(400, "invalid_request", "tool_choice required or a named function constrains the "
                               "output already: drop the structured output", {"field": "tool_choice"})
            response_format = tools
        return GenerationRequest(
            request_id=request_id, model=self.model, max_output_tokens=max_output_tokens, stream=self.stream,
            temperature=DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p, top_k=max(self.top_k or 0, 0), seed=self.seed,
            stop=self.stop, stop_token_ids=self.stop_token_ids or [], ignore_eos=self.ignore_eos,
            min_tokens=min(self.min_tokens, max_output_tokens),  # below the limit except in a 1-token probe
            tier="batch" if self.service_tier == "flex" else "interactive",
            presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=self.logit_bias, logprobs=self.output_logprobs(),
            prompt_logprobs=self.scored_prompt_logprobs(), response_format=response_format, n=self.n or 1,
            **self.native_input())


class ChatCompletionRequest(OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    store: Any = None
    echo: Any = None
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    add_special_tokens: Any = None
    documents: Any = None
    chat_template: Any = None
    chat_template_kwargs: Any = None
    mm_processor_kwargs: Any = None
    media_io_kwargs: Any = None

    def neutral_fields(self) -> dict[str, tuple[tuple, str]]:
        return {**NEUTRAL, **CHAT_NEUTRAL}

    def check_supported(self) -> None:
        super().check_supported()
        if self.top_logprobs is not None and not self.logprobs:
            raise ApiError(400, "invalid_request", "top_logprobs needs logprobs: true", {"field": "top_logprobs"})

    def output_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def tool_mode(self) -> ToolMode | None:
        return tool_mode(self.tools, self.tool_choice)

    def tool_constraint(self):
        return tool_constraint(self.tools or [], self.tool_mode())

    def native_input(self) -> dict:
        return {"messages": [m.native() for m in self.messages],
                "tools": template_tools(self.tools) if self.tools else None}


class CompletionRequest(OpenAIRequest):
    prompt: str
    # 0 with echo: score the prompt and generate nothing (what evaluation harnesses send).
    max_tokens: int | None = Field(default=None, ge=0, le=1_000_000)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool = False
    suffix: Any = None
    add_special_tokens: Any = None

    def neutral_fields(self) -> dict[str, tuple[tuple, str]]:
        return {**NEUTRAL, **COMPLETION_NEUTRAL}

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

    def check_supported(self) -> None:
        super().check_supported()
        if self.max_tokens == 0 and not self.echo:
            raise ApiError(400, "invalid_request", "max_tokens 0 generates nothing: only with echo (to score the "
                           "prompt)", {"field": "max_tokens"})

    @property
    def scores_only(self) -> bool:
        return self.max_tokens == 0

    def requested_max_tokens(self) -> int:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return COMPLETION_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    def output_logprobs(self) -> int | None:
        return self.logprobs

    def scored_prompt_logprobs(self) -> int | None:
        if self.echo and self.logprobs is not None:
            return max(self.logprobs, self.prompt_logprobs or 0)
        if self.scores_only:
            return self.prompt_logprobs or 0  # the engine must run the prompt; its scores are the answer
        return self.prompt_logprobs

    def native_input(self) -> dict:
        return {"input": self.prompt}
