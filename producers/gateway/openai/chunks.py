"""OpenAI response bodies and stream chunks (chat and legacy completions), logprobs in both of their shapes.

    chat        choices[].logprobs = {"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}
    completions choices[].logprobs = {tokens, token_logprobs, top_logprobs: [{token: logprob}], text_offset}
    vLLM        prompt_logprobs    = [null, {"<id>": {logprob, decoded_token}}, ...]  (top level for chat, per
                                     choice for completions)

A token's text is its bytes (llguidance's decoder: exact for byte-level and sentencepiece vocabularies) as UTF-8,
a partial character shown as U+FFFD, as vLLM shows it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from schemas.stream import TokenLogprob

FINISH_REASONS = {"completed": "stop", "output-limit": "length"}


@dataclass(frozen=True)
class Piece:
    """One stream event of a generation: its text and tokens, with logprobs where asked for."""

    text: str
    token_ids: tuple[int, ...]
    token_count: int
    logprobs: tuple[TokenLogprob, ...] | None = None
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None
    choice: int = 0
    choice_end: str | None = None  # n > 1: this choice's native end reason, on its last piece


@dataclass(frozen=True)
class End:
    reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def finish_reason(self) -> str:
        return FINISH_REASONS.get(self.reason, self.reason)

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def end_of(reason: str, usage: dict) -> End:
    return End(reason, usage["inputTokens"], usage["cachedInputTokens"], usage["outputTokens"])


class TokenTexts:
    """Token id -> bytes and text, through the version's llguidance tokenizer (built when logprobs are asked)."""

    def __init__(self, grammar_tokenizer: Any) -> None:
        self._tokenizer = grammar_tokenizer
        self._bytes: dict[int, bytes] = {}

    def bytes(self, token_id: int) -> bytes:
        found = self._bytes.get(token_id)
        if found is None:
            found = self._bytes[token_id] = bytes(self._tokenizer.decode_bytes([token_id]))
        return found

    def text(self, token_id: int) -> str:
        return self.bytes(token_id).decode("utf-8", errors="replace")


def chat_logprobs(entries: tuple[TokenLogprob, ...], texts: TokenTexts) -> dict:
    def one(token_id: int, logprob: float) -> dict:
        return {"token": texts.text(token_id), "logprob": logprob, "bytes": list(texts.bytes(token_id))}

    return {"content": [{**one(e.token_id, e.logprob), "top_logprobs": [one(t, lp) for t, lp in e.top]}
                        for e in entries], "refusal": None}


def prompt_logprobs_vllm(first_token: int, entries: tuple[TokenLogprob, ...], texts: TokenTexts) -> list:
    """vLLM's `prompt_logprobs`: None for the first token, then {id: {logprob, decoded_token}} per position."""
    out: list[dict | None] = [None] if first_token is not None else []
    for e in entries:
        position = {str(t): {"logprob": lp, "decoded_token": texts.text(t)} for t, lp in e.top}
        position[str(e.token_id)] = {"logprob": e.logprob, "decoded_token": texts.text(e.token_id)}
        out.append(position)
    return out


class CompletionLogprobs:
    """The legacy completions shape, built chunk by chunk: `text_offset` runs on across chunks."""

    def __init__(self, texts: TokenTexts) -> None:
        self.texts = texts
        self.offset = 0

    def format(self, entries: list[tuple[int, float | None, tuple[tuple[int, float], ...] | None]]) -> dict:
        """`entries`: (token id, logprob or None for the prompt's first token, alternatives or None)."""
        out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, logprob, top in entries:
            text = self.texts.text(token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(logprob)
            out["top_logprobs"].append(None if top is None else {self.texts.text(t): lp for t, lp in top})
            out["text_offset"].append(self.offset)
            self.offset += len(text)
        return out

    @staticmethod
    def merge(parts: list[dict]) -> dict | None:
        if not parts:
            return None
        return {key: [v for part in parts for v in part[key]] for key in parts[0]}


def output_entries(entries: tuple[TokenLogprob, ...]) -> list:
    return [(e.token_id, e.logprob, e.top) for e in entries]


def echo_entries(first_token: int, entries: tuple[TokenLogprob, ...]) -> list:
    return [(first_token, None, None), *output_entries(entries)]


def sse_chunk(data: dict) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()
