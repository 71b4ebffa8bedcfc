"""Issue 15, finding 2: no bill above what the client received when stream events are lost or late.

A worker's stream events (`llm.tokens`) and its usage watermarks (`llm.generations`) are different
partitions, usually on different brokers. One partition's batch can wait (its leader is dead or slow:
aiokafka sends one request per broker at a time) while the other's is written; a worker killed then, or a
batch that finally expires, leaves a watermark on the log counting tokens that never reached it, and the
Interrupted seal bills them. Here the stream events of one in-process worker after a seq are held back
(real Kafka, controller process, gateway bridge, projections into Postgres): what a watermark counts must
be on the log first.
"""
from __future__ import annotations

import asyncio
import time

import psycopg
from aiokafka.errors import KafkaTimeoutError

from migrations import runner
from schemas.topics import TOKENS
from tests.controlplane.conftest import own_version, read_topic
from tests.controlplane.test_projected_billing import project_all
from tests.controlplane.test_worker_failures import admit
from tests.waiting import wait_until

HELD_AFTER_SEQ = 6  # stream events 1-6 reach the log; later ones wait in the worker, then fail


class HeldStream:
    """Stream events after `after` seq are not sent: each send returns a delivery that has not happened,
    as for a batch queued behind a dead partition leader. `expire()` fails them all, as aiokafka does when
    such a batch times out (or as a kill -9 loses them)."""

    def __init__(self, worker, after: int) -> None:
        self.send, self.after = worker.send, after
        self.held: list[asyncio.Future] = []
        self.expired = False
        worker.send = self.intercept

    async def intercept(self, topic: str, event) -> asyncio.Future:
        if topic == TOKENS and event.seq > self.after:
            self.held.append(asyncio.get_running_loop().create_future())
            if self.expired:
                self.held[-1].set_exception(KafkaTimeoutError())
            return self.held[-1]
        return await self.send(topic, event)

    def expire(self) -> None:
        self.expired = True
        for delivery in self.held:
            if not delivery.done():
                delivery.set_exception(KafkaTimeoutError())


async def billed_and_delivered(bootstrap: str, database: str, gen_id: str, since_ms: int) -> dict:
    """The sealed bill from a projection of the log, next to what the log holds for the generation."""
    runner.upgrade(database)
    await project_all(bootstrap, database)
    with psycopg.connect(database) as conn:
        end_reason, label, billed_output = conn.execute(
            "SELECT end_reason, usage_label, billed_output_tokens FROM billing_ledger WHERE generation_id = %s",
            (gen_id,)).fetchone()
    tokens = await read_topic(bootstrap, TOKENS, since_ms, lambda e: e.generation_id == gen_id
                              and e.type == "TokensEmitted")
    lifecycle = await read_topic(bootstrap, "llm.generations", since_ms, lambda e: e.generation_id == gen_id)
    return {"end_reason": end_reason, "usage_label": label, "billed_output": billed_output,
            "delivered": sum(len(e.token_ids) for e in tokens),
            "highest_watermark": max((e.usage.generated_output_tokens for e in lifecycle
                                      if e.type == "UsageReported"), default=0),
            "terminals": [e.type for e in lifecycle if e.type in ("Completed", "Interrupted")]}


async def run_held(gateway, start_worker, tenants, bootstrap, model_dir, role: str, max_output: int,
                   until) -> tuple[str, object]:
    """A generation on a worker of its own whose stream events after HELD_AFTER_SEQ are held until `until(attempt)`
    holds and the first watermark (4 tokens, all delivered) is on the log, then fail; returns its id and the
    bridge's view once the stream has ended."""
    version = await own_version(bootstrap, model_dir, gateway, role)
    worker = await start_worker(version, usage_report_tokens=4, usage_report_ms=60_000, stream_flush_ms=0)
    held = HeldStream(worker, HELD_AFTER_SEQ)
    gen_id = await admit(gateway, tenants["main"].headers, model=version, maxOutputTokens=max_output)
    bridge = gateway.gateway.bridge
    await wait_until(lambda: (a := worker.find(gen_id)) and until(a) and (v := bridge.view(gen_id))
                     and v.usage.get(1) and v.usage[1].generated_output_tokens >= 4, 30,
                     what=f"{role}: the moment to fail")
    held.expire()
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 30, what="the stream's end")
    return gen_id, view


EXPECTED = {"end_reason": "interrupted", "usage_label": "interrupted", "billed_output": 4,
            "delivered": HELD_AFTER_SEQ, "highest_watermark": 4, "terminals": ["Interrupted"]}


async def test_a_watermark_waits_for_the_stream_events_it_counts_so_a_lost_batch_is_never_billed(
        gateway, start_worker, controller, tenants, bootstrap, model_dir, scratch_database):
    since_ms = int(time.time() * 1000) - 1000
    # Reports are due at 4, 8 and 12 tokens; the last two count tokens that are held.
    gen_id, view = await run_held(gateway, start_worker, tenants, bootstrap, model_dir, "held-stream", 480,
                                  lambda attempt: attempt.report_seq >= 3)
    assert (view.final.reason, len(view.tokens)) == ("interrupted", HELD_AFTER_SEQ)
    assert view.final.usage.generated_output_tokens == 4  # the one watermark whose tokens all reached the log
    assert await billed_and_delivered(bootstrap, scratch_database, gen_id, since_ms) == EXPECTED


async def test_an_attempt_ends_only_after_its_stream_events_are_on_the_log(
        gateway, start_worker, controller, tenants, bootstrap, model_dir, scratch_database):
    since_ms = int(time.time() * 1000) - 1000
    # The engine is done with all 10 tokens; 7-10 are held, so the attempt's end must wait for them.
    gen_id, view = await run_held(gateway, start_worker, tenants, bootstrap, model_dir, "held-end", 10,
                                  lambda attempt: attempt.finishing)
    assert (view.final.reason, len(view.tokens)) == ("interrupted", HELD_AFTER_SEQ)
    assert await billed_and_delivered(bootstrap, scratch_database, gen_id, since_ms) == EXPECTED
