"""Streaming clients of the chaos run: submit one generation, follow its SSE stream, resume when cut.

Each client submits with a fixed `requestId` (a retry after a refused or lost
answer is the same generation, or a fresh admission when the first was never
made), then reads `GET /v1/generations/{id}/events`. When the connection drops,
the gateway answers 5xx, or the stream ends without its final event, it resumes
with `Last-Event-ID: <last seq>`, and counts every seq it sees twice or never.
After the final event it reads the generation's status once. Every request
goes through a GatewayRoute (bench/chaos/gateways.py): to another gateway
when one is down, each request tallied for availability.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field

import httpx

from bench.chaos.gateways import Availability, GatewayRoute

RETRYABLE = {401, 404, 408, 425, 429, 500, 502, 503, 504}


@dataclass
class ClientResult:
    request_id: str
    generation_id: str | None = None
    admitted_status: int | None = None
    last_seq: int = 0
    seen_seqs: set[int] = field(default_factory=set)
    duplicated: set[int] = field(default_factory=set)  # seqs seen more than once
    duplicate_seqs: int = 0
    tokens: int = 0
    final: dict | None = None
    resumes: int = 0
    errors: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)  # monotonic, like the fault log's instants
    ended_at: float | None = None

    @property
    def missing(self) -> list[int]:
        """Seqs before the final one this client never saw (all of them if it never got the final)."""
        end = self.final["seq"] if self.final else self.last_seq + 1
        return [seq for seq in range(1, end) if seq not in self.seen_seqs]

    @property
    def missing_seqs(self) -> int:
        return len(self.missing)


class StreamingClient:
    def __init__(self, route: GatewayRoute, model: str, prompt: str, output_tokens: int, deadline: float) -> None:
        self.route, self.model, self.prompt, self.output_tokens = route, model, prompt, output_tokens
        self.deadline = deadline
        self.result = ClientResult(request_id=f"chaos-{uuid.uuid4().hex[:12]}")

    async def run(self) -> ClientResult:
        try:
            if await self._submit():
                await self._follow()
                if self.result.final is not None:
                    await self._read_status()
        except Exception as exc:  # one broken client is reported, it must not end the run
            self.result.errors.append(type(exc).__name__)
        self.result.ended_at = time.monotonic()
        return self.result

    async def _submit(self) -> bool:
        body = {"requestId": self.result.request_id, "model": self.model, "input": self.prompt,
                "maxOutputTokens": self.output_tokens}
        while time.monotonic() < self.deadline:
            try:
                response = await self.route.request("admission", "POST", "/v1/generations", json=body)
            except httpx.HTTPError as exc:
                self.result.errors.append(f"submit {type(exc).__name__}")
                await asyncio.sleep(0.5)
                continue
            if response.status_code in (200, 201):
                self.result.generation_id = response.json()["id"]
                self.result.admitted_status = response.status_code
                return True
            if response.status_code not in RETRYABLE:
                self.result.errors.append(f"submit HTTP {response.status_code}")
                return False
            await asyncio.sleep(min(2.0, float(response.headers.get("retry-after", "0.5"))))
        self.result.errors.append("submit deadline")
        return False

    async def _follow(self) -> None:
        url = f"/v1/generations/{self.result.generation_id}/events"
        while self.result.final is None and time.monotonic() < self.deadline:
            headers = {"Last-Event-ID": str(self.result.last_seq)} if self.result.last_seq else {}
            try:
                async with self.route.stream(url, headers=headers) as response:
                    if response.status_code == 200:
                        await self._read(response)
                    elif response.status_code not in RETRYABLE:
                        self.result.errors.append(f"stream HTTP {response.status_code}")
                        return
            except httpx.HTTPError as exc:
                self.result.errors.append(f"stream {type(exc).__name__}")
            if self.result.final is None:
                self.result.resumes += 1
                await asyncio.sleep(0.3)
        if self.result.final is None:
            self.result.errors.append("stream deadline")

    async def _read_status(self) -> None:
        """The generation's status, as a client checks it after its stream; retried while the answer is 503
        (a projection behind the log) up to the deadline."""
        while time.monotonic() < self.deadline:
            try:
                response = await self.route.request("status", "GET", f"/v1/generations/{self.result.generation_id}")
            except httpx.HTTPError as exc:
                self.result.errors.append(f"status {type(exc).__name__}")
            else:
                if response.status_code == 200:
                    return
                if response.status_code not in RETRYABLE:
                    self.result.errors.append(f"status HTTP {response.status_code}")
                    return
            await asyncio.sleep(0.5)
        self.result.errors.append("status deadline")

    async def _read(self, response: httpx.Response) -> None:
        buffer = ""
        async for chunk in response.aiter_text():
            buffer += chunk
            *blocks, buffer = buffer.split("\n\n")
            for block in blocks:
                self._on_block(block)
            if self.result.final is not None or time.monotonic() > self.deadline:
                return

    def _on_block(self, block: str) -> None:
        kind, data = "message", ""
        for line in block.split("\n"):
            if line.startswith("event: "):
                kind = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if kind == "token":
            self._on_token(json.loads(data))
        elif kind == "final":
            self.result.final = json.loads(data)
        elif kind == "error":
            self.result.errors.append(f"stream error {json.loads(data).get('code')}")

    def _on_token(self, event: dict) -> None:
        seq = event["seq"]
        if seq in self.result.seen_seqs:
            self.result.duplicate_seqs += 1
            self.result.duplicated.add(seq)
            return
        self.result.seen_seqs.add(seq)
        self.result.last_seq = max(self.result.last_seq, seq)
        self.result.tokens += len(event["tokenIds"])


class SteadyLoad:
    """Starts a client every 1/rate s, round robin over the tenants and, within a tenant, over the gateways it
    first tries, until told to stop. `tenants[t][g]`: tenant t's HTTP client of gateway g."""

    def __init__(self, tenants: list[list[httpx.AsyncClient]], model: str, prompts: list[str], output_tokens: int,
                 rate: float, client_deadline_s: float, tally: Availability) -> None:
        self.tenants, self.model, self.prompts, self.output_tokens = tenants, model, prompts, output_tokens
        self.rate, self.client_deadline_s, self.tally = rate, client_deadline_s, tally
        self.clients: list[StreamingClient] = []
        self.keep_going = asyncio.Event()

    def ended_generation_ids(self) -> set[str]:
        return {c.result.generation_id for c in self.clients if c.result.final and c.result.generation_id}

    async def run(self, min_generations: int) -> list[ClientResult]:
        """Until `keep_going` is cleared and at least `min_generations` clients started; then every result."""
        self.keep_going.set()
        tasks: list[asyncio.Task] = []
        while self.keep_going.is_set() or len(tasks) < min_generations:
            n = len(self.clients)
            route = GatewayRoute(self.tenants[n % len(self.tenants)], n // len(self.tenants), self.tally)
            client = StreamingClient(route, self.model, self.prompts[n % len(self.prompts)], self.output_tokens,
                                     time.monotonic() + self.client_deadline_s)
            self.clients.append(client)
            tasks.append(asyncio.create_task(client.run()))
            await asyncio.sleep(1 / self.rate)
        return list(await asyncio.gather(*tasks))
