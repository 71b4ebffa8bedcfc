"""`ledgerlm bench projector`: how fast the projections apply the log, and the lag under load.

Three measurements, each into a fresh database so nothing else is applied:
  1. stream: N TokensEmitted events (many generations) -> resume buffer, catch-up rate;
  2. billing: whole lifecycles (admit, start, reports, complete) -> status, watermarks, sealed bills;
  3. lag: a producer publishes stream events at a fixed rate while the projector runs as a group
     member; lag = commit time - event time, per event.
The events are real records on the real broker; the projector reads the topics from offset 0, so
events already in the log are applied too and counted.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime

import psycopg

from bench.common import percentile
from plumbing.kafka.clients import make_producer
from plumbing.settings import Settings
from migrations import runner
from projections.lifecycle import LifecycleProjection
from projections.runtime import Projector
from projections.stream_buffer import StreamBufferProjection
from schemas.codec import encode, record_headers, record_key
from schemas.lifecycle import Admitted, AttemptStarted, Completed, UsageReported
from schemas.stream import StreamFinished, TokensEmitted
from schemas.topics import GENERATIONS, TOKENS
from schemas.values import Usage

HASH = "ef" * 32


class ScratchDatabase:
    def __init__(self, database_url: str) -> None:
        self.base, _ = database_url.rsplit("/", 1)
        self.name = f"bench_{uuid.uuid4().hex[:10]}"
        self.url = f"{self.base}/{self.name}"

    def __enter__(self) -> str:
        with psycopg.connect(f"{self.base}/postgres", autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.name}"')
        runner.upgrade(self.url)
        return self.url

    def __exit__(self, *exc: object) -> None:
        with psycopg.connect(f"{self.base}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{self.name}" WITH (FORCE)')


def stream_events(generations: int, per_generation: int, tenant: str) -> list[TokensEmitted | StreamFinished]:
    events: list = []
    for g in range(generations):
        gid = f"bench-{uuid.uuid4().hex[:12]}"
        for seq in range(1, per_generation):
            events.append(TokensEmitted(tenant_id=tenant, generation_id=gid, epoch=1, seq=seq, token_ids=(seq % 500,),
                                        text_delta="tok ", token_count=seq))
        events.append(StreamFinished(tenant_id=tenant, generation_id=gid, epoch=1, seq=per_generation,
                                     reason="completed", usage=Usage(generated_output_tokens=per_generation - 1)))
    return events


def lifecycle_events(generations: int, reports: int, tenant: str) -> list:
    events: list = []
    for g in range(generations):
        gid = f"bench-{uuid.uuid4().hex[:12]}"
        scope = {"tenant_id": tenant, "generation_id": gid}
        events.append(Admitted(**scope, epoch=1, request_id=gid, model_version="bench@1", input_tokens=100,
                               max_output_tokens=200, reserved_tokens=300, payload_hash=HASH))
        events.append(AttemptStarted(**scope, epoch=1, worker_id="bench-worker"))
        for r in range(1, reports + 1):
            events.append(UsageReported(**scope, epoch=1, report_seq=r,
                                        usage=Usage(processed_input_tokens=100, generated_output_tokens=16 * r)))
        events.append(Completed(**scope, epoch=1, finish_reason="stop",
                                usage=Usage(processed_input_tokens=100, generated_output_tokens=16 * reports)))
    return events


async def publish_all(bootstrap: str, topic: str, events: list) -> float:
    producer = make_producer(bootstrap)
    await producer.start()
    began = time.perf_counter()
    try:
        pending = [await producer.send(topic, value=encode(e), key=record_key(topic, e), headers=record_headers(e))
                   for e in events]
        await asyncio.gather(*pending)
    finally:
        await producer.stop()
    return time.perf_counter() - began


async def timed_catch_up(projector: Projector):
    """(catch-up stats, seconds) of one catch-up of `projector`, which is closed afterwards."""
    began = time.perf_counter()
    try:
        stats = await projector.catch_up()
    finally:
        projector.close()
    return stats, time.perf_counter() - began


async def catch_up_rate(bootstrap: str, database_url: str, projection) -> dict:
    with ScratchDatabase(database_url) as url:
        stats, seconds = await timed_catch_up(Projector(bootstrap, url, [projection], max_records=10000))
    applied = stats.applied.get(projection.name, 0)
    return {"events_applied": applied, "seconds": round(seconds, 3), "events_per_s": round(applied / seconds, 1)}


async def lag_under_load(bootstrap: str, database_url: str, rate: int, seconds: float, tenant: str) -> dict:
    lags: list[float] = []
    started_at = datetime.now(UTC)

    def observe(name: str, events: list) -> None:
        now = datetime.now(UTC)
        lags.extend((now - e.occurred_at).total_seconds() for e in events if e.occurred_at >= started_at)

    with ScratchDatabase(database_url) as url:
        # Start at the end of the log: only this phase's events are measured.
        warm = Projector(bootstrap, url, [StreamBufferProjection()])
        try:
            await warm.catch_up()
        finally:
            warm.close()
        projector = Projector(bootstrap, url, [StreamBufferProjection()], group_id=f"bench-{uuid.uuid4().hex[:8]}",
                              on_commit=observe)
        stop = asyncio.Event()
        runner_task = asyncio.create_task(projector.run(stop, lag_every_s=3600))
        await asyncio.sleep(2.0)  # join the group and get the assignment
        producer = make_producer(bootstrap)
        await producer.start()
        sent = 0
        try:
            began = time.perf_counter()
            gid = f"bench-lag-{uuid.uuid4().hex[:8]}"
            tick = 0.02
            while time.perf_counter() - began < seconds:
                due = int((time.perf_counter() - began) * rate)
                while sent < due:
                    sent += 1
                    event = TokensEmitted(tenant_id=tenant, generation_id=f"{gid}-{sent // 200}", epoch=1,
                                          seq=sent % 200 + 1, token_ids=(1,), text_delta="t", token_count=sent % 200 + 1)
                    await producer.send(TOKENS, value=encode(event), key=record_key(TOKENS, event))
                await asyncio.sleep(tick)
            await producer.flush()
            deadline = time.perf_counter() + 30
            while len(lags) < sent and time.perf_counter() < deadline:
                await asyncio.sleep(0.1)
        finally:
            await producer.stop()
            stop.set()
            await runner_task
            projector.close()
    return {"target_rate_per_s": rate, "seconds": seconds, "events": sent, "observed": len(lags),
            "lag_p50_ms": round(percentile(lags, 0.5) * 1000, 1), "lag_p95_ms": round(percentile(lags, 0.95) * 1000, 1),
            "lag_max_ms": round(max(lags, default=0) * 1000, 1)}


async def run_bench(bootstrap: str, database_url: str, quick: bool) -> dict:
    tenant = f"bench-{uuid.uuid4().hex[:6]}"
    stream_n = (200, 100) if quick else (500, 200)
    life_n = (500, 4) if quick else (2000, 8)
    stream = stream_events(*stream_n, tenant)
    lifecycle = lifecycle_events(*life_n, tenant)
    publish_stream_s = await publish_all(bootstrap, TOKENS, stream)
    publish_life_s = await publish_all(bootstrap, GENERATIONS, lifecycle)
    report = {
        "machine": "2-core CPU, local Kafka 4 (KRaft, 1 broker) + PostgreSQL 15, fsync off",
        "published": {"stream_events": len(stream), "stream_publish_s": round(publish_stream_s, 2),
                      "lifecycle_events": len(lifecycle), "lifecycle_publish_s": round(publish_life_s, 2)},
        "stream_projection": await catch_up_rate(bootstrap, database_url, StreamBufferProjection()),
        "billing_projection": await catch_up_rate(bootstrap, database_url, LifecycleProjection()),
        "lag_under_load": await lag_under_load(bootstrap, database_url, rate=5000 if quick else 10000,
                                               seconds=5 if quick else 10, tenant=tenant),
    }
    report["target_stream_events_per_s"] = 20000
    report["stream_target_met"] = report["stream_projection"]["events_per_s"] >= 20000
    return report


def main(settings: Settings, bootstrap: str, database_url: str, quick: bool) -> dict:
    return asyncio.run(run_bench(bootstrap, database_url, quick))
