"""An expired identity stays expired across a controller restart (issue 15, finding 4), on the real broker.

A controller of its own plane runs in this process with a 2 s identity TTL; a simulated worker (its heartbeat
on `llm.workers`) gives it room, and the test plays the worker's release. After the TTL the controller
tombstones the identity in `llm.control-changelog`; a second controller rebuilt from that changelog does not
know it, so the request id is a new request there too.
"""
from __future__ import annotations

import asyncio
import uuid
from contextlib import asynccontextmanager


from consumers.controller.runtime import Controller
from plumbing.kafka.clients import make_consumer, make_producer, partitions_of, publish, read_to_end
from plumbing.kafka.groups import move_group_to_end
from producers.gateway.admission.client import AdmissionClient
from schemas.changelog import identity_key
from schemas.commands import ReleaseReservation, SubmitGeneration
from schemas.registry_events import WorkerHeartbeat
from schemas.topics import COMMANDS, CONTROL_CHANGELOG, WORKERS
from tests.waiting import wait_until


TTL_S = 2.0


@asynccontextmanager
async def running_controller(settings, kafka):
    controller = Controller(settings, kafka)
    task = asyncio.create_task(controller.run())
    try:
        await wait_until(lambda: controller.states or task.done(), 60, what="the controller to own partitions")
        assert not task.done(), task.exception()
        yield controller
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def changelog_tombstones(kafka, key: str) -> int:
    consumer = make_consumer(kafka, client_id="test-changelog")
    await consumer.start()
    try:
        tps = await partitions_of(consumer, CONTROL_CHANGELOG)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        found = 0
        async for _tp, records in read_to_end(consumer, tps):
            found += sum(1 for r in records if r.key == key.encode() and r.value is None)
        return found
    finally:
        await consumer.stop()


async def test_an_expired_identity_is_tombstoned_and_a_restarted_controller_does_not_resurrect_it(
        bootstrap, cp_kafka, cp_settings, tenants, versions):
    plane = f"ttl-{uuid.uuid4().hex[:8]}"
    settings = cp_settings.model_copy(update={"controller_group": plane, "identity_ttl_s": TTL_S,
                                              "lease_check_interval_ms": 100})
    tenant_id, version = tenants["other"].tenant_id, versions["idle"]
    await move_group_to_end(cp_kafka("controller"), plane, COMMANDS)
    controller_kafka = cp_kafka("controller")
    producer = make_producer(cp_kafka("worker"))
    await producer.start()
    admission = AdmissionClient(cp_kafka("gateway"), plane)
    await admission.start()

    def submit(request_id: str, payload: str) -> SubmitGeneration:
        return SubmitGeneration(tenant_id=tenant_id, request_id=request_id, gateway_id=admission.gateway_id,
                                correlation_id=admission.correlation_id(), model_version=version,
                                input_token_ids=(1, 2, 3, 4), max_output_tokens=8, payload_hash=payload * 32,
                                plane=plane)

    try:
        await publish(producer, WORKERS, WorkerHeartbeat(
            worker_id=f"{plane}-w", model_versions=(version,), total_blocks=256, free_blocks=256, block_size=16,
            running=0, queued_tokens=0, lease_ms=600_000, plane=plane))
        async with running_controller(settings, controller_kafka) as first:
            created = await admission.decide(submit("once", "ab"), 30)
            assert created.http_status == 201
            gen_id = created.generation_id
            await publish(producer, COMMANDS, ReleaseReservation(tenant_id=tenant_id, generation_id=gen_id, epoch=1,
                                                                 used_tokens=6, end_reason="completed", plane=plane))
            repeat = await admission.decide(submit("once", "ab"), 30)
            assert (repeat.http_status, repeat.generation_id, repeat.status) == (200, gen_id, "ended")
            key = identity_key(plane, tenant_id, "once")
            await wait_until(lambda: all(s.find(tenant_id, gen_id) is None for s in first.states.values()), 30,
                             what="the identity to expire")
            # The state forgets the identity before the transaction carrying its tombstone commits: poll the
            # log while this controller still runs (stopping it mid-transaction would abort the tombstone).
            tombstones = await wait_until(lambda: changelog_tombstones(controller_kafka, key), 30, step_s=0,
                                          what="the identity's tombstone on the changelog")
            assert tombstones == 1
        async with running_controller(settings, controller_kafka) as second:
            assert all(s.find(tenant_id, gen_id) is None for s in second.states.values())
            for state in second.states.values():
                for tenant in state.tenants.values():
                    assert tenant.budget() == tenant.recount()
            again = await admission.decide(submit("once", "cd"), 30)  # another payload: new, not a 409
            assert again.http_status == 201 and again.generation_id != gen_id
    finally:
        await admission.stop()
        await producer.stop()
