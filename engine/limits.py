"""Bounds on what one request may ask of the engine (README, "Bad input").

The gateway refuses values outside them with a 400 naming the field; `Engine.add_request` checks them
again and raises `RequestError`, because a worker is also reachable through Kafka, and a value that
slips through must never reach the sampler: an id outside the vocabulary is an IndexError there, a
denormal temperature turns the logits into inf.

Torch-free, so the gateway can import the numbers.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.errors import RequestError

if TYPE_CHECKING:
    from engine.request import SamplingParams

# Below this temperature a request is greedy, not an error: dividing float32 logits by less can overflow
# them to inf, and the distribution is one-hot to float32 precision long before (vLLM draws the same line).
MIN_TEMPERATURE = 1e-5
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 256
MAX_SEED = 2**64 - 1  # torch.Generator.manual_seed takes [0, 2**64)
MAX_LOGPROBS = 20  # alternatives per position (OpenAI's top_logprobs, vLLM's max_logprobs)
MAX_PENALTY = 2.0  # |presence_penalty|, |frequency_penalty| (OpenAI's range)
MAX_REPETITION_PENALTY = 10.0  # (0, 10]: 1 is neutral; beyond this every seen token is as good as banned
MAX_LOGIT_BIAS_ENTRIES = 300
MAX_LOGIT_BIAS = 100.0  # |bias|, OpenAI's range: +-100 bans or forces a token
MAX_STRUCTURED_CHARS = 64 * 1024  # a JSON schema, regex, grammar or choice list travels in every StartAttempt


def check_sampling(params: "SamplingParams", vocab_size: int) -> None:
    """RequestError (naming the field) unless `params` is within the bounds above for this vocabulary.

    top_p needs no bound beyond (0, 1]: the sampler always keeps the most likely token, so a tiny top_p
    samples greedily.
    """
    if len(params.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise RequestError(f"at most {MAX_STOP_TOKEN_IDS} stop token ids", field="stop_token_ids")
    outside = next((t for t in params.stop_token_ids if not 0 <= t < vocab_size), None)
    if outside is not None:
        raise RequestError(f"stop token id {outside} is outside the vocabulary [0, {vocab_size})",
                           field="stop_token_ids")
    if len(params.stop) > MAX_STOP_STRINGS:
        raise RequestError(f"at most {MAX_STOP_STRINGS} stop strings", field="stop")
    if any(len(s) > MAX_STOP_STRING_CHARS for s in params.stop):
        raise RequestError(f"stop strings are at most {MAX_STOP_STRING_CHARS} characters", field="stop")
    if params.seed is not None and not 0 <= params.seed <= MAX_SEED:
        raise RequestError(f"seed must be in [0, {MAX_SEED}]", field="seed")
    for name in ("presence_penalty", "frequency_penalty"):
        if not -MAX_PENALTY <= getattr(params, name) <= MAX_PENALTY:
            raise RequestError(f"{name} must be in [-{MAX_PENALTY}, {MAX_PENALTY}]", field=name)
    if not 0 < params.repetition_penalty <= MAX_REPETITION_PENALTY:
        raise RequestError(f"repetition_penalty must be in (0, {MAX_REPETITION_PENALTY}]", field="repetition_penalty")
    check_logit_bias(params.logit_bias, vocab_size)
    for name in ("logprobs", "prompt_logprobs"):
        value = getattr(params, name)
        if value is not None and not 0 <= value <= MAX_LOGPROBS:
            raise RequestError(f"{name} must be in [0, {MAX_LOGPROBS}]", field=name)
    if params.structured is not None and len(params.structured.spec) > MAX_STRUCTURED_CHARS:
        raise RequestError(f"a structured output spec is at most {MAX_STRUCTURED_CHARS} characters",
                           field="structured")


def check_logit_bias(bias: tuple[tuple[int, float], ...], vocab_size: int) -> None:
    """RequestError (field logit_bias) unless at most 300 ids inside the vocabulary, each biased by at most 100."""
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise RequestError(f"at most {MAX_LOGIT_BIAS_ENTRIES} logit_bias entries", field="logit_bias")
    for token, value in bias:
        if not 0 <= token < vocab_size:
            raise RequestError(f"logit_bias token id {token} is outside the vocabulary [0, {vocab_size})",
                               field="logit_bias")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise RequestError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]",
                               field="logit_bias")
