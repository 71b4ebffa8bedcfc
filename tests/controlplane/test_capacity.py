"""Capacity on the real broker: optimistic attempts grow, queued work past its deadline expires unbilled,
and a request whose predicted wait does not fit is refused with a Retry-After from that prediction."""
from __future__ import annotations

import asyncio
import math
import time
import uuid
from datetime import UTC, datetime, timedelta

from plumbing.kafka.clients import publish
from schemas.dispatch import StartAttempt
from schemas.registry_events import WorkerHeartbeat
from schemas.values import SamplingParams
from tests.controlplane.conftest import SESSION, body, own_version, read_topic, scrape, value, wait_until_found
from tests.waiting import wait_until


async def test_optimistic_attempt_reserves_prompt_plus_headroom_then_grows_and_finishes(
        gateway, start_worker, controller, tenants, bootstrap, model_dir):
    version = await own_version(bootstrap, model_dir, gateway, "optimistic")
    worker = await routed(controller, gateway, start_worker, version, blocks=64, reservation="optimistic",
                          worker_headroom_tokens=16)
    assert worker.heartbeat().reservation == "optimistic" and worker.heartbeat().headroom_tokens == 16
    created = await gateway.post("/v1/generations", headers=tenants["main"].headers,
                                 json=body(model=version, maxOutputTokens=300))
    assert created.status_code == 201, created.text
    gen_id, bridge = created.json()["id"], gateway.gateway.bridge
    attempt = await wait_until(lambda: next(iter(worker.attempts.values()), None), 10, what="the attempt")
    prompt = created.json()["inputTokens"]
    assert attempt.reserved_blocks == math.ceil((prompt + 16) / 16) < math.ceil((prompt + 300) / 16)
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 30, what="end")
    assert view.final.reason == "output-limit" and len(view.tokens) == 300  # grew past what it reserved
    assert view.final.usage.generated_output_tokens == 300 and view.final.usage.recompute_tokens == 0


async def test_queued_attempt_past_its_deadline_ends_expired_and_unbilled(gateway, start_worker, controller,
                                                                          tenants, producer, bootstrap, model_dir):
    version = await own_version(bootstrap, model_dir, gateway, "deadline")
    small = await routed(controller, gateway, start_worker, version, blocks=32)  # full reservation: 512 tokens of KV
    busy = await gateway.post("/v1/generations", headers=tenants["main"].headers,
                              json=body(model=version, maxOutputTokens=400))  # 26 of 32 blocks
    assert busy.status_code == 201, busy.text
    await wait_until(lambda: small.attempts, 10, what="the busy attempt")
    since_ms = int(time.time() * 1000)
    gen_id = f"gen_cap_{SESSION}"
    order = StartAttempt(tenant_id=tenants["main"].tenant_id, generation_id=gen_id, epoch=1,
                         worker_id=small.worker_id, model_version=version,
                         input_token_ids=tuple(range(10, 30)), max_output_tokens=100, sampling=SamplingParams(),
                         weight=1.0, deadline_at=datetime.now(UTC) + timedelta(seconds=0.2), tier="interactive")
    # 8 blocks needed, 6 free: it waits, then expires (or, delivered late, expires on arrival) long before
    # the 400-token attempt ahead of it frees its blocks.
    await publish(producer, "llm.dispatch", order)
    (terminal, *_) = await wait_until_found(bootstrap, "llm.generations", since_ms,
                                            lambda e: e.type == "Expired" and e.generation_id == gen_id, 15)
    assert terminal.usage.generated_output_tokens == 0 and terminal.usage.processed_input_tokens == 0
    (final, *_) = await wait_until_found(bootstrap, "llm.tokens", since_ms,
                                         lambda e: e.type == "StreamFinished" and e.generation_id == gen_id, 15)
    assert (final.seq, final.reason) == (1, "expired")
    (release, *_) = await wait_until_found(bootstrap, "llm.commands", since_ms,
                                           lambda e: e.type == "ReleaseReservation" and e.generation_id == gen_id, 15)
    assert (release.used_tokens, release.end_reason) == (0, "expired")
    started = await read_topic(bootstrap, "llm.generations", since_ms,
                               lambda e: e.type == "AttemptStarted" and e.generation_id == gen_id)
    assert started == [] and not small.waiting


async def test_interactive_request_beyond_the_predicted_wait_gets_503_with_retry_after_from_it(
        gateway, controller, tenants, bootstrap, producer, model_dir, cp_settings):
    version = await own_version(bootstrap, model_dir, gateway, "predicted")
    # A worker whose heartbeat says 12,000 prefill tokens are queued and it computes 1,000 tokens/s:
    # a 12 s wait before the first token, where the session's TTFT allowance is 10 s.
    fake = WorkerHeartbeat(worker_id=f"busy-{SESSION}", model_versions=(version,), total_blocks=1000,
                           free_blocks=1000, block_size=16, running=8, queued_tokens=12_000, lease_ms=60_000,
                           plane=cp_settings.controller_group, reservation="optimistic", headroom_tokens=32,
                           tokens_per_s=1000.0)

    def stamped(**update) -> WorkerHeartbeat:
        """The fake heartbeat sent now, as a new event."""
        return fake.model_copy(update={**update, "event_id": uuid.uuid4(), "occurred_at": datetime.now(UTC)})

    await publish(producer, "llm.workers", fake)
    try:
        def predicted_wait(refused) -> bool:
            return refused.status_code == 503 and "predicted time to the first token" in refused.json()["message"] \
                and refused.json().get("details", {}).get("retryAfterMs", 0) >= 2000

        async def attempt():
            # The controller drains a heartbeat's queue at its rate from the time it was sent (decision 0020):
            # a heartbeat read 2 s late already predicts under 12 s. Each try sends a fresh one (a CI run's
            # controller read the first one late, and every refusal after it said less than 2 s).
            await publish(producer, "llm.workers", stamped())
            return await gateway.post("/v1/generations", headers=tenants["main"].headers,
                                      json=body(model=version, maxOutputTokens=8))

        # until the controller has the heartbeat (404/503 for the idle version before)
        refused = await wait_until(attempt, 15, step_s=0.1, accept=predicted_wait,
                                   what=lambda r: f"a refusal for the predicted wait: {r.text}")
        assert refused.status_code == 503 and refused.json()["code"] == "no_capacity", refused.text
        # (12 s and its own prompt - 10 s) jittered by up to +50%: 2-3.1 s, as whole seconds in the header.
        assert 2 <= int(refused.headers["retry-after"]) <= 4, refused.headers
    finally:
        await publish(producer, "llm.workers", stamped(alive=False))


async def routed(controller, gateway, start_worker, *args, **overrides):
    """A worker started, once the controller counts it live: the gateway's board (the same heartbeats) sees
    it, and the controller counts at least as many live workers as that board does."""
    worker = await start_worker(*args, **overrides)
    board, url = gateway.gateway.board, await controller.metrics_url()

    def live_on_board() -> int:
        return sum(board.is_live(hb, time.time()) for hb in board.latest.values())

    await wait_until(lambda: (hb := board.latest.get(worker.worker_id)) and board.is_live(hb, time.time()), 15,
                     what="the worker's heartbeat")
    await wait_until(lambda: scrape(url), 15, step_s=0.05,
                     accept=lambda samples: value(samples, "ledgerlm:workers_live") >= live_on_board(),
                     what="the controller to count the worker live")
    return worker


async def test_pool_running_dry_preempts_and_the_stream_resumes_without_gap_or_repeat(
        gateway, start_worker, controller, tenants, versions, worker, bootstrap, model_dir):
    # 32 blocks (512 tokens), optimistic: both attempts are accepted with 2 blocks each, then each grows
    # to 26 blocks, so the pool runs dry and the newer one is preempted and recomputed.
    version = await own_version(bootstrap, model_dir, gateway, "preempt")
    small = await routed(controller, gateway, start_worker, version, blocks=32, reservation="optimistic",
                         worker_headroom_tokens=16)
    headers, bridge = tenants["main"].headers, gateway.gateway.bridge
    inputs = ("the water is", "people made the words")
    created = await asyncio.gather(*(gateway.post("/v1/generations", headers=headers,
                                                  json=body(model=version, input=text, maxOutputTokens=400))
                                     for text in inputs))
    assert [c.status_code for c in created] == [201, 201], [c.text for c in created]
    views = [await wait_until(lambda: (v := bridge.view(c.json()["id"])) and v.final and v, 60, what="end")
             for c in created]
    assert small.engine.stats().num_preemptions >= 1
    for text, view in zip(inputs, views):
        assert view.final.reason == "output-limit" and view.worker_id == small.worker_id
        assert [t.seq for t in view.tokens] == list(range(1, len(view.tokens) + 1))  # no gap, no repeat
        assert sum(len(t.token_ids) for t in view.tokens) == 400
        # The same request on a worker that never preempts gives the same greedy text.
        alone = await gateway.post("/v1/generations?wait=true", headers=headers,
                                   json=body(model=versions["served"], input=text, maxOutputTokens=400))
        assert view.text == alone.json()["text"]
    usages = [v.final.usage for v in views]
    assert max(u.recompute_tokens for u in usages) > 0  # physical work, reported apart
    assert [u.generated_output_tokens for u in usages] == [400, 400]
    assert [u.processed_input_tokens for u in usages] == [c.json()["inputTokens"] for c in created]


async def test_gateway_refuses_at_once_what_no_live_worker_serves_but_never_a_repeat(
        gateway, start_worker, controller, tenants, bootstrap, model_dir, producer):
    from schemas.dispatch import DrainWorker

    version = await own_version(bootstrap, model_dir, gateway, "early")
    headers, since_ms = tenants["main"].headers, int(time.time() * 1000)
    nobody = await gateway.post("/v1/generations", headers=headers, json=body("early-1", model=version))
    assert nobody.status_code == 503 and nobody.json()["code"] == "no_capacity", nobody.text
    assert "no live worker serves" in nobody.json()["message"]
    worker = await start_worker(version, blocks=32)
    board = gateway.gateway.board
    await wait_until(lambda: board.could_serve([version], 8, time.time()), 10, what="the gateway to see the worker")
    served = await gateway.post("/v1/generations?wait=true", headers=headers, json=body("early-2", model=version))
    assert served.status_code == 201, served.text
    await publish(producer, "llm.dispatch", DrainWorker(worker_id=worker.worker_id))
    await wait_until(lambda: not board.could_serve([version], 8, time.time()), 15, what="the worker to leave")
    repeat = await gateway.post("/v1/generations", headers=headers, json=body("early-2", model=version))
    assert repeat.status_code == 200 and repeat.json()["id"] == served.json()["id"]  # the controller answered
    commands = await read_topic(bootstrap, "llm.commands", since_ms,
                                lambda e: e.type == "SubmitGeneration" and e.request_id in ("early-1", "early-2"))
    assert [c.request_id for c in commands] == ["early-2", "early-2"]  # early-1 never cost a transaction
