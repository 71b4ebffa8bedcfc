"""The overhead bench's load: N closed-loop clients, each streaming OpenAI chat completions one after another.

Every request asks for exactly `output_tokens` (`ignore_eos`) after a user message whose rendered prompt (the
model's chat template, as the gateway renders it) is `prompt_tokens` long, cut from the demo corpus at a random
offset so the prefix cache cannot serve one prompt from another. Completed requests and tokens are counted
from each stream's usage chunk.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import percentile


@dataclass(frozen=True)
class Mix:
    name: str
    prompt_tokens: int
    output_tokens: int


MIXES = {"default": Mix("default", 256, 64), "shorter": Mix("shorter", 64, 16), "longer": Mix("longer", 1024, 256)}
# The longer mix where 1,024 + 256 exceeds the model's context (the tiny demo model has 512).
LONGER_IN_SMALL_CONTEXT = Mix("longer", 384, 128)


def fitted(mix: Mix, max_context: int) -> tuple[Mix, str | None]:
    """The mix as run on a model of `max_context` tokens, and a note when it had to change."""
    if mix.prompt_tokens + mix.output_tokens <= max_context:
        return mix, None
    small = LONGER_IN_SMALL_CONTEXT if mix.name == "longer" else None
    if small is None or small.prompt_tokens + small.output_tokens > max_context:
        raise ValueError(f"mix {mix.name} ({mix.prompt_tokens} + {mix.output_tokens}) exceeds the model's "
                         f"context of {max_context}")
    return small, (f"{mix.prompt_tokens} + {mix.output_tokens} tokens exceed the model's context of "
                   f"{max_context}: run as {small.prompt_tokens} + {small.output_tokens}")


class PromptMaker:
    """User messages whose chat-templated prompt has an exact token count (at most the count asked for)."""

    def __init__(self, model_dir: Path, seed: int = 7) -> None:
        from transformers import AutoTokenizer

        from engine.artifacts.demo_model import generate_corpus

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.ids = self.tokenizer("\n".join(generate_corpus(200_000, seed=seed)))["input_ids"]
        self.overhead = self.count("")

    def count(self, text: str) -> int:
        rendered = self.tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True, tokenize=True)
        return len(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)

    def make(self, prompt_tokens: int, rng: random.Random) -> tuple[str, int]:
        want = max(1, prompt_tokens - self.overhead)
        start = rng.randrange(0, len(self.ids) - 2 * want)
        best: tuple[str, int] = ("", self.overhead)
        size = want
        for _ in range(12):  # decode -> re-encode may merge or split a token at the edges
            text = self.tokenizer.decode(self.ids[start:start + size], skip_special_tokens=True)
            total = self.count(text)
            if best[1] < total <= prompt_tokens:
                best = (text, total)
            if total == prompt_tokens:
                break
            size = max(1, size + prompt_tokens - total)
        return best

    def pool(self, prompt_tokens: int, size: int, seed: int = 0) -> list[tuple[str, int]]:
        rng = random.Random(seed)
        return [self.make(prompt_tokens, rng) for _ in range(size)]


@dataclass
class LoadResult:
    completed: int = 0
    output_tokens: int = 0
    prompt_tokens: int = 0
    errors: Counter = field(default_factory=Counter)
    e2e_s: list[float] = field(default_factory=list)

    def summary(self) -> dict:
        return {"completed": self.completed, "output_tokens": self.output_tokens,
                "mean_prompt_tokens": round(self.prompt_tokens / self.completed, 1) if self.completed else None,
                "errors": dict(self.errors),
                "e2e_s": {"p50": round(percentile(self.e2e_s, 0.5), 3), "p95": round(percentile(self.e2e_s, 0.95), 3)}}


def chat_body(model: str, text: str, output_tokens: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": output_tokens,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0.0}


def usage_of(lines: list[str]) -> tuple[dict | None, str | None]:
    """(the usage chunk's usage, an error code) of one streamed chat completion's SSE lines."""
    usage = error = None
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            continue
        payload = json.loads(data)
        if "error" in payload:
            error = (payload["error"] or {}).get("code") or "stream_error"
        if payload.get("usage"):
            usage = payload["usage"]
    return usage, error


async def one_chat(http, model: str, text: str, output_tokens: int, result: LoadResult) -> None:
    import httpx

    started = time.monotonic()
    try:
        async with http.stream("POST", "/v1/chat/completions", json=chat_body(model, text, output_tokens)) as response:
            if response.status_code != 200:
                await response.aread()
                result.errors[f"http_{response.status_code}"] += 1
                await asyncio.sleep(0.2)  # a refused client backs off instead of spinning
                return
            usage, error = usage_of([line async for line in response.aiter_lines()])
    except httpx.HTTPError as exc:
        result.errors[type(exc).__name__] += 1
        return
    if error or usage is None:
        result.errors[error or "no_usage"] += 1
        return
    result.completed += 1
    result.output_tokens += usage["completion_tokens"]
    result.prompt_tokens += usage["prompt_tokens"]
    result.e2e_s.append(time.monotonic() - started)


async def closed_loop(base_url: str, api_key: str, model: str, prompts: list[tuple[str, int]], output_tokens: int,
                      clients: int, duration_s: float) -> LoadResult:
    """`clients` loops, each starting its next request when its last one ended, until `duration_s` has passed;
    requests in flight then run to their end (so every request counted was served whole)."""
    import httpx

    result, pool = LoadResult(), itertools.cycle(prompts)
    deadline = time.monotonic() + duration_s

    async def client() -> None:
        while time.monotonic() < deadline:
            await one_chat(http, model, next(pool)[0], output_tokens, result)

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=300,
                                 limits=limits) as http:
        await asyncio.gather(*(client() for _ in range(clients)))
    return result
