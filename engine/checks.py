"""The engine's own check of a request against the bounds in `engine.limits`.

`Engine.add_request` raises `RequestError` naming the field, although the gateway already refused such
values with a 400: a worker is also reachable through Kafka, and a value that slips through must never
reach the sampler (an id outside the vocabulary is an IndexError there, a denormal temperature turns the
logits into inf).
"""
from __future__ import annotations

from engine.errors import RequestError
from engine.limits import (
    MAX_LOGIT_BIAS, MAX_LOGIT_BIAS_ENTRIES, MAX_LOGPROBS, MAX_PENALTY, MAX_REPETITION_PENALTY, MAX_SEED,
    MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, MAX_STRUCTURED_CHARS,
)
from engine.request import SamplingParams


def check_sampling(params: SamplingParams, vocab_size: int) -> None:
    """RequestError (naming the field) unless `params` is within those bounds for this vocabulary.

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
