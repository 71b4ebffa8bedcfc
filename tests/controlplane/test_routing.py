"""Routing over the worker registry: load shared by room, draining workers get nothing, refusals."""
from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

from plumbing.kafka.clients import publish
from schemas.dispatch import DrainWorker, StartAttempt
from tests.controlplane.conftest import body, own_version, scrape, value, wait_until_found
from tests.controlplane.test_capacity import routed
from tests.waiting import wait_until


async def test_two_workers_share_load_and_a_draining_one_gets_no_new_work(
        gateway, start_worker, controller, tenants, producer, bootstrap, model_dir):
    live_url = await controller.metrics_url()
    live_before = value(await scrape(live_url), "ledgerlm:workers_live")
    version = await own_version(bootstrap, model_dir, gateway, "shared")
    first, second = await start_worker(version), await start_worker(version)
    # Both must be in the controller's registry before the first decision, or one gets all the work.
    await wait_until(lambda: scrape(live_url), 15, step_s=0.1,
                     accept=lambda samples: value(samples, "ledgerlm:workers_live") >= live_before + 2,
                     what="the controller to see both workers")
    headers, bridge = tenants["drain"].headers, gateway.gateway.bridge

    async def run(n: int, tokens: int) -> list[str]:
        responses = await asyncio.gather(*[
            gateway.post("/v1/generations", headers=headers, json=body(model=version,
                                                                       maxOutputTokens=tokens))
            for _ in range(n)])
        assert [r.status_code for r in responses] == [201] * n
        ids = [r.json()["id"] for r in responses]
        await wait_until(lambda: all((v := bridge.view(i)) and v.worker_id for i in ids), 20, what="started")
        return [bridge.view(i).worker_id for i in ids]

    shared = await run(4, 64)
    assert sorted(shared) == sorted([first.worker_id, second.worker_id] * 2)

    await publish(producer, "llm.dispatch", DrainWorker(worker_id=first.worker_id))
    await wait_until(lambda: first.draining, 5, what="drain order")
    board = gateway.gateway.board  # reads llm.workers as the controller does
    await wait_until(lambda: (hb := board.latest.get(first.worker_id)) and hb.draining, 10,
                     what="the draining heartbeat read")
    assert await run(3, 4) == [second.worker_id] * 3
    await asyncio.wait_for(first.stopped.wait(), 20)  # finished its attempts, then left
    assert not first.attempts


async def test_worker_refuses_an_attempt_it_cannot_reserve(start_worker, controller, versions, tenants, producer,
                                                           bootstrap):
    since_ms = int(time.time() * 1000) - 1000
    small = await start_worker("drained", blocks=4)  # 64 tokens of KV
    order = StartAttempt(tenant_id=tenants["drain"].tenant_id, generation_id="gen-refusal-probe", epoch=3,
                         worker_id=small.worker_id, model_version=versions["drained"], input_token_ids=(1, 2, 3),
                         max_output_tokens=100, deadline_at=datetime.now(UTC) + timedelta(seconds=30))
    await publish(producer, "llm.dispatch", order)
    refusals = await wait_until_found(bootstrap, "llm.commands", since_ms,
                                      lambda e: e.type == "AttemptRefused" and e.generation_id == order.generation_id,
                                      10)
    assert [(r.epoch, r.worker_id, r.reason, r.attempt) for r in refusals] == [(3, small.worker_id, "kv-full", order)]
    assert small.free_blocks == 4 and not small.attempts


async def test_work_waits_on_a_full_worker_and_interactive_starts_before_batch(gateway, start_worker, controller,
                                                                             tenants, versions):
    small = await routed(controller, gateway, start_worker, "batch", blocks=8)  # 128 tokens of KV, full reservation
    headers, bridge = tenants["main"].headers, gateway.gateway.bridge
    running = await gateway.post("/v1/generations", headers=headers,
                                 json=body(model=versions["batch"], maxOutputTokens=100))  # 7 of 8 blocks
    batch = await gateway.post("/v1/generations", headers=headers,
                               json=body(model=versions["batch"], maxOutputTokens=100, tier="batch"))
    chat = await gateway.post("/v1/generations", headers=headers,
                              json=body(model=versions["batch"], maxOutputTokens=100))
    # The worker's measured rate predicts a wait well within the allowance: both queue there.
    assert (running.status_code, batch.status_code, chat.status_code) == (201, 201, 201)
    views = {}
    for name, created in (("running", running), ("chat", chat), ("batch", batch)):
        gen_id = created.json()["id"]
        # The end comes on llm.tokens, the start (with its worker) on llm.generations: wait for both.
        views[name] = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v.worker_id and v, 30,
                                       what=f"{name} end")
    assert all(v.final.reason == "output-limit" and len(v.tokens) == 100 for v in views.values())
    assert {v.worker_id for v in views.values()} == {small.worker_id}
    # One attempt at a time fits: the interactive one, queued after the batch one, ran first.
    assert views["chat"].tokens[-1].occurred_at <= views["batch"].tokens[0].occurred_at
    # The blocks come back once the final stream event is acknowledged, just after the client reads it.
    await wait_until(lambda: not small.waiting and small.free_blocks == 8, 10, what="every block free")


async def test_commands_for_a_stale_epoch_are_ignored_and_counted(gateway, worker, tenants, versions, producer):
    from schemas.dispatch import CancelAttempt

    created = await gateway.post("/v1/generations", headers=tenants["main"].headers,
                                 json=body(model=versions["served"], maxOutputTokens=300))
    gen_id, bridge = created.json()["id"], gateway.gateway.bridge
    await wait_until(lambda: (v := bridge.view(gen_id)) and v.tokens, 20, what="tokens")
    before = worker.stale_commands
    await publish(producer, "llm.dispatch", CancelAttempt(tenant_id=tenants["main"].tenant_id, generation_id=gen_id,
                                                          epoch=2, worker_id=worker.worker_id))
    await wait_until(lambda: worker.stale_commands == before + 1, 5, what="stale command counted")
    assert worker.heartbeat().stale_commands == before + 1
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 20, what="end")
    assert view.final.reason == "output-limit" and len(view.tokens) == 300  # epoch 1 ran on untouched
