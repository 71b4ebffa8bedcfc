"""Open-loop HTTP load: replays a plan at its send times, streaming every answer (native SSE or OpenAI chunks).

A `Target` says where requests go and how each tenant authenticates. The dispatcher never waits for an answer
before the next send (open loop); every request records its chunk arrival times on one monotonic clock.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from bench.serve.metrics import RequestRecord
from bench.serve.workload import PlannedRequest


@dataclass(frozen=True)
class Target:
    """A server under test. `keys` maps tenant -> API key; `native` False sends every request as an OpenAI
    completion (transformers serve has no native API and no tenants)."""

    name: str
    base_url: str
    model: str
    keys: dict[str, str] = field(default_factory=dict)
    native: bool = True


def native_body(request: PlannedRequest, model: str) -> dict:
    return {"requestId": uuid.uuid4().hex, "model": model, "input": request.prompt,
            "maxOutputTokens": request.max_output_tokens, "stream": True, "temperature": 0.0, "tier": request.tier}


def openai_body(request: PlannedRequest, model: str, ledgerlm: bool) -> dict:
    """transformers serve refuses (422) the fields it does not know (`service_tier`) and sends the usage chunk
    unasked (it ignores `stream_options`); ledgerlm needs `stream_options` for it and maps "flex" to batch."""
    body = {"model": model, "prompt": request.prompt, "max_tokens": request.max_output_tokens, "stream": True,
            "temperature": 0.0}
    if ledgerlm:
        body["stream_options"] = {"include_usage": True}
        if request.tier == "batch":
            body["service_tier"] = "flex"
    return body


def sse_events(lines: Sequence[str]) -> tuple[str | None, str | None]:
    """(event name, data) of one SSE block's lines."""
    event = data = None
    for line in lines:
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data = line[5:].strip()
    return event, data


def on_native_event(record: RequestRecord, event: str | None, data: str | None, now: float) -> None:
    if data is None:
        return
    payload = json.loads(data)
    if event == "token" and payload.get("tokenCount", 0) > 0:
        record.token_chunks.append((now, payload["tokenCount"]))
        record.output_tokens += payload["tokenCount"]
    elif event == "final":
        record.end_reason = payload.get("reason")
        usage = payload.get("usage") or {}
        record.prompt_tokens = usage.get("inputTokens")
        record.output_tokens = usage.get("outputTokens", record.output_tokens)
    elif event == "error":
        record.error = payload.get("code", "stream_error")


def on_openai_chunk(record: RequestRecord, data: str | None, now: float) -> None:
    """One chunk with text (a completion's `text`, a chat's `delta.content`) is one token event; the final usage
    fixes the token count (a chunk may carry several)."""
    if data is None or data == "[DONE]":
        return
    payload = json.loads(data)
    if "error" in payload:
        record.error = "stream_error"
        return
    for choice in payload.get("choices") or []:
        if choice.get("text") or (choice.get("delta") or {}).get("content"):
            record.token_chunks.append((now, 1))
        if choice.get("finish_reason"):
            record.end_reason = choice["finish_reason"]
    if usage := payload.get("usage"):
        record.prompt_tokens = usage.get("prompt_tokens")
        record.output_tokens = usage.get("completion_tokens", 0)


def spread_usage(record: RequestRecord) -> None:
    """Spread the usage's token count over the OpenAI chunks, so token shares over time add up to it."""
    chunks = record.token_chunks
    if not chunks or record.output_tokens == len(chunks):
        return
    base, extra = divmod(record.output_tokens, len(chunks))
    record.token_chunks = [(at, base + (1 if i < extra else 0)) for i, (at, _) in enumerate(chunks)]


async def send(client: httpx.AsyncClient, target: Target, request: PlannedRequest, record: RequestRecord,
               t0: float) -> None:
    native = target.native and request.api == "native"
    record.sent_at = time.monotonic() - t0
    headers = {"Authorization": f"Bearer {target.keys.get(request.tenant, 'none')}"}
    path, body = (("/v1/generations", native_body(request, target.model)) if native else
                  ("/v1/completions", openai_body(request, target.model, ledgerlm=target.native)))
    try:
        async with client.stream("POST", path, json=body, headers=headers) as response:
            record.status = response.status_code
            if response.status_code >= 300:
                await response.aread()
            else:
                await read_stream(response, record, native, t0)
    except httpx.HTTPError as exc:
        record.error = type(exc).__name__
    record.done_at = time.monotonic() - t0
    if not native:
        spread_usage(record)


async def read_stream(response: httpx.Response, record: RequestRecord, native: bool, t0: float) -> None:
    block: list[str] = []
    async for line in response.aiter_lines():
        if line:
            block.append(line)
            continue
        event, data = sse_events(block)
        block = []
        now = time.monotonic() - t0
        if native:
            on_native_event(record, event, data, now)
        else:
            on_openai_chunk(record, data, now)


async def replay(target: Target, requests: Sequence[PlannedRequest],
                 drain_s: float) -> tuple[float, list[RequestRecord]]:
    """Send each request at its offset from now; returns (the start on the monotonic clock, every record).

    Streams still open `drain_s` after the last send are cut and recorded with error "deadline", so an
    overloaded server ends the phase in bounded time (those requests count as not completed).
    """
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    records = [RequestRecord(index=r.index, tenant=r.tenant, mix=r.mix, api=r.api if target.native else "openai",
                             sent_at=r.at_s) for r in requests]
    async with httpx.AsyncClient(base_url=target.base_url, timeout=drain_s, limits=limits) as client:
        t0 = time.monotonic()
        tasks = []
        for request, record in zip(requests, records):
            delay = t0 + request.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(client, target, request, record, t0)))
        _, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    for record in records:
        if record.done_at is None:
            record.error, record.done_at = "deadline", time.monotonic() - t0
    return t0, records
