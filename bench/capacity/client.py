"""Closed-loop chat load: N clients, each sending one streamed `POST /v1/chat/completions` and, when it ends, the next.

A refusal (429 or 503) is retried, the same request, after the response's `Retry-After` (1 s without one); each
refusal is its own record. Every HTTP attempt becomes one `RequestRecord` (`index` is the logical request, so
retries share it), times on one monotonic clock in seconds since the level started.

    ledgerlm            {model, messages, stream, stream_options: {include_usage}, temperature: 0,
                         mix a: max_tokens, ignore_eos}
    transformers serve  the same without stream_options (it refuses the field and sends usage unasked), and
                        mix a's ignore_eos as its `generation_config` extension (eos_token_id -1: nothing stops it
                        before max_new_tokens), since it refuses unknown fields
"""
from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

import httpx

from bench.capacity.prompts import ChatPrompt
from bench.serve.client import Target, on_openai_chunk, sse_events, spread_usage
from bench.serve.metrics import RequestRecord

REFUSALS = (429, 503)
DEFAULT_RETRY_AFTER_S = 1.0
CUT = "cut_at_end"  # a stream still open when the level's drain ended: not the server's failure
TENANT = "chat"  # the one tenant of the run (transformers serve ignores keys)


@dataclass(frozen=True)
class Mix:
    """A request shape: `max_tokens` None lets the answer run to EOS (or the rest of the context). `temperature`
    is the engine alone's (the HTTP clients send their own): 0 is greedy."""

    name: str
    max_tokens: int | None
    ignore_eos: bool
    temperature: float = 0.0


MIXES = {"a": Mix("a", 64, True), "b": Mix("b", None, False)}


@dataclass
class ChatAttempt(RequestRecord):
    """One attempt; `code` is the error code of a refusal's body (OpenAI shape `{"error": {"code"}}`), if any."""

    code: str | None = None


def error_code(body: bytes) -> str | None:
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):
        return None
    return str(error.get("code")) if isinstance(error, dict) and error.get("code") is not None else None


def retry_after_s(value: str | None, now: datetime | None = None) -> float:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date; absent or unreadable: 1 s."""
    if value is None or not value.strip():
        return DEFAULT_RETRY_AFTER_S
    try:
        seconds = float(value)
    except ValueError:
        try:
            at = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return DEFAULT_RETRY_AFTER_S
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        return max(0.0, (at - (now or datetime.now(UTC))).total_seconds())
    return seconds if seconds >= 0 else DEFAULT_RETRY_AFTER_S


def chat_body(target: Target, prompt: ChatPrompt, mix: Mix) -> dict:
    body = {"model": target.model, "messages": list(prompt.messages), "stream": True, "temperature": 0.0}
    if mix.max_tokens is not None:
        body["max_tokens"] = mix.max_tokens
    if target.native:  # ledgerlm: the standard shape, with vLLM's ignore_eos
        body["stream_options"] = {"include_usage": True}
        if mix.ignore_eos:
            body["ignore_eos"] = True
    elif mix.ignore_eos:
        body["generation_config"] = json.dumps({"max_new_tokens": mix.max_tokens, "eos_token_id": -1,
                                                "do_sample": False})
    return body


def finish_record(record: RequestRecord) -> None:
    """Without a usage chunk, each content chunk counts one token; with one, its count is spread over them."""
    if record.output_tokens == 0:
        record.output_tokens = len(record.token_chunks)
    spread_usage(record)


async def send_chat(client: httpx.AsyncClient, target: Target, body: dict, record: ChatAttempt,
                    t0: float) -> float | None:
    """One attempt; returns the seconds to wait before retrying when refused (429/503), else None."""
    record.sent_at = time.monotonic() - t0
    headers = {"Authorization": f"Bearer {target.keys.get(TENANT, 'none')}"}
    wait = None
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
            record.status = response.status_code
            if response.status_code >= 300:
                record.code = error_code(await response.aread())
                if response.status_code in REFUSALS:
                    wait = retry_after_s(response.headers.get("retry-after"))
            else:
                await read_chat_stream(response, record, t0)
    except httpx.HTTPError as exc:
        record.error = type(exc).__name__
    record.done_at = time.monotonic() - t0
    finish_record(record)
    return wait


async def read_chat_stream(response: httpx.Response, record: RequestRecord, t0: float) -> None:
    block: list[str] = []
    async for line in response.aiter_lines():
        if line:
            block.append(line)
            continue
        _, data = sse_events(block)
        block = []
        on_openai_chunk(record, data, time.monotonic() - t0)


async def closed_loop(target: Target, prompts: Sequence[ChatPrompt], mix: Mix, concurrency: int,
                      duration_s: float, drain_s: float, transport: httpx.AsyncBaseTransport | None = None
                      ) -> tuple[float, list[ChatAttempt]]:
    """`concurrency` clients for `duration_s`; returns (the start on the monotonic clock, every attempt).

    No request is sent (nor retried) after `duration_s`; requests still streaming then may finish within
    `drain_s`, and whatever is open after that is cut (error `cut_at_end`). `transport`: for tests.
    """
    records: list[ChatAttempt] = []
    numbers = itertools.count()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=max(64, concurrency))
    timeout = httpx.Timeout(duration_s + drain_s + 30)
    async with httpx.AsyncClient(base_url=target.base_url, timeout=timeout, limits=limits,
                                 transport=transport) as client:
        t0 = time.monotonic()
        stop_at = t0 + duration_s

        async def user() -> None:
            while time.monotonic() < stop_at:
                index = next(numbers)
                body = chat_body(target, prompts[index % len(prompts)], mix)
                while True:
                    record = ChatAttempt(index=index, tenant=target.name, mix=mix.name, api="chat", sent_at=0.0)
                    records.append(record)
                    wait = await send_chat(client, target, body, record, t0)
                    if wait is None:
                        break
                    if time.monotonic() + wait >= stop_at:
                        return  # the retry would land after the window: the request is left refused
                    await asyncio.sleep(wait)

        tasks = [asyncio.create_task(user()) for _ in range(concurrency)]
        _, pending = await asyncio.wait(tasks, timeout=duration_s + drain_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for record in records:
        if record.done_at is None:
            record.error, record.done_at = CUT, time.monotonic() - t0
    return t0, records
