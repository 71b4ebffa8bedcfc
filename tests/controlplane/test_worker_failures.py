"""A tenant cannot kill a worker's engine (issue 15): failing steps, a dead engine thread, refusals that
cannot go back as they are. Real Kafka, controller process and gateway; the faults are test doubles of the
*engine* (or of one send) inside an in-process worker serving a version of its own.
"""
from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import torch
from aiokafka.errors import KafkaConnectionError
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from consumers.worker.engine_thread import EngineStopped
from plumbing.kafka.clients import publish
from schemas.codec import encode, record_headers, record_key
from schemas.commands import AttemptRefused, SubmitGeneration
from schemas.dispatch import StartAttempt
from schemas.values import SamplingParams
from tests.controlplane.conftest import body, read_topic, wait_until_found
from tests.waiting import wait_until

RECORD_LIMIT = 1024 * 1024  # aiokafka's default max_request_size, which the worker's producer keeps


async def admit(gateway, headers: dict, **fields) -> str:
    """POST until admitted: 503 while the controller has not yet seen the worker's heartbeat, 429 while a
    released reservation is still on its way to the controller."""
    request = body(**fields)
    response = await wait_until(lambda: gateway.post("/v1/generations", headers=headers, json=request), 20,
                                step_s=0.05, accept=lambda r: r.status_code not in (429, 503),
                                what=lambda r: f"admission: {r.status_code} {r.text}")
    assert response.status_code == 201, response.text
    return response.json()["id"]


async def test_a_failing_step_ends_the_generation_failed_billed_at_its_output_and_the_worker_serves_on(
        gateway, start_worker, controller, tenants, versions, bootstrap):
    since_ms = int(time.time() * 1000) - 1000
    worker = await start_worker("failing")
    forward = worker.engine.runner.model.forward
    calls = []

    def nan_on_the_seventh_step(batch, kv_pool):  # one step's numerics go bad, as an fp overflow would
        calls.append(1)
        logits = forward(batch, kv_pool)
        return torch.full_like(logits, float("nan")) if len(calls) == 7 else logits

    worker.engine.runner.model.forward = nan_on_the_seventh_step
    headers = tenants["single"].headers  # max_concurrency = 1: the next one is admitted only after the release
    gen_id = await admit(gateway, headers, model=versions["failing"], maxOutputTokens=50)
    bridge = gateway.gateway.bridge
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 30, what="the failed end")
    assert (view.status, view.final.reason, view.final.usage_label) == ("failed", "failed", "final")
    assert len(view.tokens) == 6 and view.final.usage.generated_output_tokens == 6  # steps 1-6 each gave a token

    events = await read_topic(bootstrap, "llm.generations", since_ms, lambda e: e.generation_id == gen_id)
    *_, watermark, failed = events
    assert (failed.type, failed.epoch, failed.usage) == ("Failed", 1, watermark.usage)
    assert (watermark.type, watermark.usage.generated_output_tokens) == ("UsageReported", 6)
    releases = await read_topic(bootstrap, "llm.commands", since_ms,
                                lambda e: e.type == "ReleaseReservation" and e.generation_id == gen_id)
    assert [(r.end_reason, r.used_tokens) for r in releases] == [("failed", failed.usage.processed_input_tokens + 6)]

    after = await admit(gateway, headers, model=versions["failing"], maxOutputTokens=8)
    later = await wait_until(lambda: (v := bridge.view(after)) and v.final and v, 30, what="the next end")
    assert (later.final.reason, len(later.tokens)) == ("output-limit", 8)
    assert worker.engine.stats().num_blocks_used == 0 and worker.readiness().ready


class EngineCrash(BaseException):
    """A failure outside the per-request path that no `except Exception` catches."""


async def test_a_dead_engine_thread_makes_the_worker_say_not_alive_exit_and_its_attempts_end_interrupted(
        gateway, start_worker, worker_tasks, controller, tenants, versions, bootstrap, cp_settings):
    since_ms = int(time.time() * 1000) - 1000
    worker = await start_worker("crashing")
    gen_id = await admit(gateway, tenants["main"].headers, model=versions["crashing"], maxOutputTokens=480)
    bridge = gateway.gateway.bridge
    await wait_until(lambda: (v := bridge.view(gen_id)) and len(v.tokens) >= 2, 20, what="first tokens")

    def crash():
        raise EngineCrash("simulated")

    worker.engine.step = crash  # test double: the engine thread's next step dies
    crashed_at = time.monotonic()
    task = worker_tasks[worker.worker_id]
    await wait_until(task.done, 10, what="the worker to exit")
    assert isinstance(task.exception(), EngineStopped)
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.status == "interrupted" and v,
                            cp_settings.lease_ms / 1000 + 2, what="interrupted")
    assert time.monotonic() - crashed_at <= cp_settings.lease_ms / 1000 + 2
    assert view.final.reason == "interrupted"
    heartbeats = await read_topic(bootstrap, "llm.workers", since_ms, lambda e: e.worker_id == worker.worker_id)
    assert heartbeats[0].alive and heartbeats[-1].alive is False


@pytest.fixture(scope="module")
async def refusing(start_worker):
    return await start_worker("refusing")


def record_size(topic: str, event) -> int:
    return DefaultRecordBatchBuilder.estimate_size_in_bytes(record_key(topic, event), encode(event),
                                                            record_headers(event))


async def test_a_refusal_too_large_for_one_record_goes_back_as_ids_and_the_dispatch_loop_lives_on(
        gateway, refusing, worker_tasks, controller, tenants, versions, producer, bootstrap):
    since_ms = int(time.time() * 1000) - 1000
    gen_id = f"gen-huge-{uuid.uuid4().hex[:8]}"

    def order(stop_chars: int) -> StartAttempt:  # an order that fits one record, reaching the worker over Kafka
        return StartAttempt(tenant_id=tenants["main"].tenant_id, generation_id=gen_id, epoch=1,
                            worker_id=refusing.worker_id, model_version=versions["refusing"],
                            input_token_ids=(5, 6, 7), max_output_tokens=1_000_000,  # kv-full: refused
                            sampling=SamplingParams(stop=("x" * stop_chars,)),
                            deadline_at=datetime.now(UTC) + timedelta(seconds=30))

    huge = order(RECORD_LIMIT - record_size("llm.dispatch", order(0)) - 64)
    whole = AttemptRefused(tenant_id=huge.tenant_id, generation_id=gen_id, epoch=1, worker_id=refusing.worker_id,
                           reason="kv-full", attempt=huge)
    # The order fits one record; the refusal carrying it would not.
    assert record_size("llm.dispatch", huge) <= RECORD_LIMIT < record_size("llm.commands", whole)
    await publish(producer, "llm.dispatch", huge)
    refusals = await wait_until_found(bootstrap, "llm.commands", since_ms,
                                      lambda e: e.type == "AttemptRefused" and e.generation_id == gen_id)
    assert [(r.reason, r.attempt, r.worker_id) for r in refusals] == [("kv-full", None, refusing.worker_id)]

    served = await admit(gateway, tenants["main"].headers, model=versions["refusing"], maxOutputTokens=8)
    bridge = gateway.gateway.bridge
    view = await wait_until(lambda: (v := bridge.view(served)) and v.final and v, 30, what="a served end")
    assert view.final.reason == "output-limit" and not worker_tasks[refusing.worker_id].done()


async def test_sampling_values_the_engine_cannot_take_are_refused_and_a_refusal_that_cannot_be_sent_is_given_up(
        gateway, refusing, worker_tasks, controller, tenants, versions, producer, bootstrap, cp_settings,
        monkeypatch):
    """Through Kafka, past the gateway: min_tokens over the limit, which the engine's SamplingParams refuses."""

    async def submit() -> str:
        since_ms = int(time.time() * 1000) - 1000
        request_id = f"req-kafka-{uuid.uuid4().hex[:8]}"
        await publish(producer, "llm.commands", SubmitGeneration(
            tenant_id=tenants["main"].tenant_id, request_id=request_id, gateway_id="test-no-gateway",
            correlation_id=request_id, model_version=versions["refusing"], input_token_ids=(5, 6, 7),
            max_output_tokens=4, sampling=SamplingParams(min_tokens=9), payload_hash="ab" * 32,
            plane=cp_settings.controller_group))
        (admitted,) = await wait_until_found(bootstrap, "llm.generations", since_ms,
                                             lambda e: e.type == "Admitted" and e.request_id == request_id)
        return admitted.generation_id

    async def end_of(gen_id: str):
        since_ms = int(time.time() * 1000) - 30_000
        found = await wait_until_found(bootstrap, "llm.generations", since_ms,
                                       lambda e: getattr(e, "generation_id", None) == gen_id and e.type in ("Rejected", "Interrupted"))
        return found[-1]

    rejected = await end_of(await submit())
    assert (rejected.type, rejected.error_code) == ("Rejected", "no_capacity")
    assert rejected.reason.startswith("worker refused the attempt (invalid-sampling)")

    send = refusing.send

    async def broker_refuses_refusals(topic, event):  # fault injection: this one send fails
        if isinstance(event, AttemptRefused):
            raise KafkaConnectionError("simulated")
        return await send(topic, event)

    monkeypatch.setattr(refusing, "send", broker_refuses_refusals)
    gen_id = await submit()
    interrupted = await end_of(gen_id)
    assert (interrupted.type, interrupted.worker_id) == ("Interrupted", refusing.worker_id)
    await wait_until(lambda: gen_id not in refusing.self_fenced, 5, what="the controller's cancel to clear it")
    monkeypatch.undo()

    served = await admit(gateway, tenants["main"].headers, model=versions["refusing"], maxOutputTokens=8)
    bridge = gateway.gateway.bridge
    view = await wait_until(lambda: (v := bridge.view(served)) and v.final and v, 30, what="a served end")
    assert view.final.reason == "output-limit" and not worker_tasks[refusing.worker_id].done()

