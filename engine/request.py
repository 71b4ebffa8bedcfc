"""Values crossing the engine boundary: what callers submit and what `step()` returns."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from engine.limits import MIN_TEMPERATURE


class FinishReason(str, Enum):
    """Why a request left the engine."""

    STOP = "stop"  # stop token id or stop string
    LENGTH = "length"  # max_tokens or the model's context length
    CANCELLED = "cancelled"  # abort() took effect at a step boundary
    EXPIRED = "expired"  # queue deadline passed before the request ever started
    FAILED = "failed"  # its step failed (non-finite logits, an engine fault); the output so far stands


StructuredKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on the output text (engine/structured.py applies it as a token mask per step).

    `spec`: the JSON schema as JSON text (`json_schema`), nothing (`json_object`: any JSON object), a regular
    expression (`regex`), a JSON list of strings (`choice`: exactly one of them), or a Lark grammar (`grammar`).
    `strict`: a JSON schema keyword the grammar engine does not support is an error rather than ignored.
    """

    kind: StructuredKind
    spec: str = ""
    strict: bool = True


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one token under the model's distribution (before penalties, bias, grammar,
    temperature and top-k/top-p), with the `top` most likely (id, logprob) pairs of that position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings for one request. A temperature below `MIN_TEMPERATURE` (0 included) means greedy.

    `seed` makes sampling reproducible per request regardless of batch mates.
    Stop strings are removed from the returned text; stop token ids are not
    emitted as text either but are reported in the token ids.

    Logits processing, in order (as vLLM): `logit_bias` added, min_tokens bans, `repetition_penalty` over prompt
    and output tokens (positive logits divided, negative multiplied), `frequency_penalty` x count and
    `presence_penalty` once per token already in the output subtracted, the grammar's mask, then temperature,
    top-k, top-p. `logprobs` (alternatives per output token, 0: the chosen one only) and `prompt_logprobs`
    (per prompt token after the first) are read from the raw distribution, before all of that.
    `max_tokens=0` generates nothing: only for scoring a prompt, with `prompt_logprobs`.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0  # 0 = disabled
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    # Until this many tokens are out, EOS and stop token ids cannot be sampled and stop strings do not stop.
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured: StructuredOutput | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 0 or (self.max_tokens == 0 and self.prompt_logprobs is None):
            raise ValueError("max_tokens must be >= 1 (0 only to score the prompt, with prompt_logprobs)")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError("min_tokens must be in [0, max_tokens]")
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError("temperature must be finite and >= 0")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1]")
        if any(s == "" for s in self.stop):
            raise ValueError("stop strings must be non-empty")
        if not math.isfinite(self.presence_penalty) or not math.isfinite(self.frequency_penalty):
            raise ValueError("penalties must be finite")
        if not (math.isfinite(self.repetition_penalty) and self.repetition_penalty > 0):
            raise ValueError("repetition_penalty must be finite and > 0")
        if any(not math.isfinite(b) for _, b in self.logit_bias):
            raise ValueError("logit_bias values must be finite")
        if (self.logprobs or 0) < 0 or (self.prompt_logprobs or 0) < 0:
            raise ValueError("logprobs and prompt_logprobs must be >= 0")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE

    @property
    def penalized(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1


@dataclass(frozen=True)
class EngineRequest:
    """One generation to run.

    `scope_key` partitions the prefix cache: the platform derives it from the
    tenant, never from client input, so tenants cannot probe each other's
    prompts through cache timing. `deadline` is a `time.monotonic()` instant
    by which the request must have started; otherwise it finishes `expired`.
    `batch` marks offline work: it is admitted after interactive work and
    preempted before it.
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    tenant_id: str = "default"
    scope_key: str = ""
    deadline: float | None = None
    batch: bool = False


@dataclass(frozen=True)
class RequestOutput:
    """What one step produced for one request (a delta plus running totals)."""

    request_id: str
    new_token_ids: tuple[int, ...]
    text_delta: str
    finish_reason: FinishReason | None
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    # Seconds between add_request and the first step that scheduled it (None while it has waited only).
    queue_time_s: float | None = None
    # Tokens computed again after preemptions (physical work, never billed).
    num_recomputed_tokens: int = 0
    # One per new token when the request asked for logprobs.
    logprobs: tuple[TokenLogprob, ...] = ()
    # Prompt tokens 1.. (the first has no context), once, with the first output (or the end, for max_tokens=0).
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class EngineStats:
    """A snapshot of the engine's capacity and counters."""

    num_blocks_total: int
    num_blocks_used: int
    num_blocks_free: int
    num_blocks_cached_free: int
    num_running: int
    num_waiting: int
    prefix_hit_tokens: int
    num_preemptions: int
    kv_bytes_per_token: int
    num_recomputed_tokens: int = 0
    started_prompt_tokens: int = 0  # prompt tokens of every sequence started: prefix_hit_tokens is a share of it
