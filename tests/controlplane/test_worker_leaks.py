"""Reservations that could leak for good (issue 15, finding 3), on a real broker and controller: a worker
restarted under the same id within its lease, a stream event the broker never took, a release that an error
after the end could skip. Each test serves a version of its own on in-process workers."""
from __future__ import annotations

import asyncio
import time
import uuid

from aiokafka.errors import KafkaConnectionError, KafkaTimeoutError

from schemas.stream import TokensEmitted
from tests.controlplane.conftest import SESSION, pace_steps, read_topic, wait_until_found
from tests.controlplane.test_worker_failures import admit
from tests.waiting import wait_until


async def own_version(bootstrap: str, model_dir, role: str) -> str:
    from producers.model_registry import register_model

    name = f"cp-{role}-{SESSION}@1"
    await register_model(bootstrap, model_dir, name)
    return name


async def test_a_worker_restarted_under_its_id_within_the_lease_has_its_earlier_attempts_interrupted(
        gateway, start_worker, worker_tasks, controller, tenants, model_dir, bootstrap, cp_settings):
    since_ms = int(time.time() * 1000) - 1000
    version = await own_version(bootstrap, model_dir, "restarted")
    worker_id = f"cp-same-id-{uuid.uuid4().hex[:6]}"  # `ledgerlm up` always starts `local-worker-1`
    first = await start_worker(version, worker_id=worker_id)
    gen_id = await admit(gateway, tenants["main"].headers, model=version, maxOutputTokens=480)
    bridge = gateway.gateway.bridge
    await wait_until(lambda: (v := bridge.view(gen_id)) and len(v.tokens) >= 2, 20, what="first tokens")
    running_since = time.monotonic()
    await wait_until(lambda: first.last_heartbeat_ok >= running_since, 5, what="a heartbeat listing the attempt")

    async def gone(*args, **kwargs):  # fault injection: the process dies without a last word
        raise KafkaConnectionError("the process is gone")

    first.producer.send_and_wait = gone
    worker_tasks[worker_id].cancel()
    await wait_until(first.stopped.is_set, 10, what="the first process to stop")
    restarted_at = time.monotonic()
    await start_worker(version, worker_id=worker_id)  # its heartbeats keep the worker id's lease alive
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.status == "interrupted" and v,
                            cp_settings.lease_ms / 1000 + 3, what="the earlier attempt to end interrupted")
    assert time.monotonic() - restarted_at < cp_settings.lease_ms / 1000 + 3
    assert view.final.reason == "interrupted"
    interrupted = await read_topic(bootstrap, "llm.generations", since_ms,
                                   lambda e: e.generation_id == gen_id and e.type == "Interrupted")
    assert [(e.epoch, e.worker_id, e.reason) for e in interrupted] == [(1, worker_id, "worker-restarted")]

    served = await admit(gateway, tenants["main"].headers, model=version, maxOutputTokens=8)
    later = await wait_until(lambda: (v := bridge.view(served)) and v.final and v, 30, what="the new process's end")
    assert later.final.reason == "output-limit" and len(later.tokens) == 8


async def test_a_stream_event_the_broker_never_took_gives_the_attempt_up_and_it_ends_interrupted(
        gateway, start_worker, controller, tenants, model_dir, bootstrap, monkeypatch):
    since_ms = int(time.time() * 1000) - 1000
    version = await own_version(bootstrap, model_dir, "undelivered")
    worker = await start_worker(version)
    send = worker.send

    async def fifth_stream_event_lost(topic, event):  # fault injection: accepted, then never delivered
        if isinstance(event, TokensEmitted) and event.seq == 5:
            delivery = asyncio.get_running_loop().create_future()
            delivery.set_exception(KafkaTimeoutError())
            return delivery
        return await send(topic, event)

    monkeypatch.setattr(worker, "send", fifth_stream_event_lost)
    gen_id = await admit(gateway, tenants["main"].headers, model=version, maxOutputTokens=480)
    bridge = gateway.gateway.bridge
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 30, what="the end")
    assert (view.status, view.final.reason) == ("interrupted", "interrupted")
    events = await read_topic(bootstrap, "llm.generations", since_ms, lambda e: e.generation_id == gen_id)
    assert events[-1].type == "Interrupted" and events[-1].reason == "worker-gave-up"
    assert not {"Completed", "Canceled", "Failed"} & {e.type for e in events}
    await wait_until(lambda: not worker.attempts and gen_id not in worker.self_fenced, 10,
                     what="the attempt to leave the worker")
    assert worker.engine.stats().num_blocks_used == 0 and worker.free_blocks == worker.total_blocks


async def test_the_release_is_written_even_when_starting_waiting_attempts_fails_after_an_end(
        gateway, start_worker, controller, tenants, model_dir, bootstrap):
    since_ms = int(time.time() * 1000) - 1000
    version = await own_version(bootstrap, model_dir, "release")
    worker = await start_worker(version)

    async def broken() -> None:  # fault injection: whatever goes wrong after an attempt's end
        raise RuntimeError("simulated")

    worker.start_waiting = broken
    gen_id = await admit(gateway, tenants["main"].headers, model=version, maxOutputTokens=4)
    releases = await wait_until_found(bootstrap, "llm.commands", since_ms,
                                      lambda e: e.type == "ReleaseReservation" and e.generation_id == gen_id)
    assert [(r.epoch, r.end_reason, r.used_tokens > 4) for r in releases] == [(1, "output-limit", True)]


async def test_a_worker_aborts_an_attempt_past_the_maximum_run_time_and_the_controller_ends_it(
        gateway, start_worker, controller, tenants, model_dir, bootstrap, cp_settings):
    since_ms = int(time.time() * 1000) - 1000
    version = await own_version(bootstrap, model_dir, "overdue")
    worker = await start_worker(version)
    gen_id = await admit(gateway, tenants["main"].headers, model=version, maxOutputTokens=480)
    bridge = gateway.gateway.bridge
    await wait_until(lambda: (v := bridge.view(gen_id)) and len(v.tokens) >= 2, 20, what="first tokens")
    # As the heartbeat loop would see it once max_attempt_s and a lease have passed (should the controller's
    # own interruption not have reached the worker).
    worker.abort_overdue(time.monotonic() + cp_settings.max_attempt_s + cp_settings.lease_ms / 1000 + 1)
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 10, what="the end")
    assert (view.status, view.final.reason) == ("interrupted", "interrupted")
    (interrupted,) = await read_topic(bootstrap, "llm.generations", since_ms,
                                      lambda e: e.generation_id == gen_id and e.type == "Interrupted")
    assert (interrupted.reason, interrupted.worker_id) == ("worker-gave-up", worker.worker_id)
    await wait_until(lambda: not worker.attempts, 10, what="the attempt to leave the worker")
    assert worker.engine.stats().num_blocks_used == 0


async def test_heartbeats_go_on_while_the_upkeep_of_waiting_attempts_is_stuck(
        start_worker, controller, model_dir, bootstrap, cp_settings):
    """Ending or starting waiting attempts can take long (thousands queued, a slow broker): the heartbeats,
    and so the lease, must not wait behind it, or a healthy worker fences itself."""
    from datetime import UTC, datetime, timedelta

    from schemas.dispatch import StartAttempt

    version = await own_version(bootstrap, model_dir, "upkeep")
    worker = await start_worker(version)
    stuck = asyncio.Event()

    async def stuck_upkeep() -> None:  # fault injection: the waiting attempts' upkeep never returns
        stuck.set()
        await asyncio.Event().wait()

    worker.start_waiting = stuck_upkeep
    order = StartAttempt(tenant_id="t-upkeep", generation_id=f"gen-upkeep-{uuid.uuid4().hex[:8]}", epoch=1,
                         worker_id=worker.worker_id, model_version=version, input_token_ids=(1, 2, 3),
                         max_output_tokens=4, deadline_at=datetime.now(UTC) + timedelta(hours=1), tier="batch")
    worker.waiting.add(order)  # something waits: the upkeep runs (and sticks)
    try:
        await wait_until(stuck.is_set, 10, what="the upkeep to run")
        stuck_at = time.monotonic()
        lease_s = cp_settings.lease_ms / 1000
        await wait_until(lambda: worker.last_heartbeat_ok > stuck_at + lease_s, lease_s * 4,
                         what="heartbeats acknowledged for a lease past the stuck upkeep")
        assert not worker.self_fenced and worker.readiness().checks["heartbeating"]
    finally:
        worker.waiting.clear()


async def test_a_heartbeat_acknowledged_late_within_the_lease_still_renews_it(
        start_worker, controller, model_dir, bootstrap, cp_settings):
    """A busy broker or producer may acknowledge a heartbeat after more than two intervals: the lease runs from
    its sending (as the controller counts it), so the worker must not fence itself for the slowness."""
    version = await own_version(bootstrap, model_dir, "late-acks")
    worker = await start_worker(version)
    interval_s, lease_s = cp_settings.heartbeat_interval_ms / 1000, cp_settings.lease_ms / 1000
    delay_s = min(interval_s * 2.5, lease_s - interval_s * 2)  # past two intervals, well inside the lease
    real_send = worker.send_heartbeat

    async def late_send() -> asyncio.Future:  # fault injection: heartbeats acknowledged late (on their thread)
        delivery = await real_send()
        late = asyncio.get_running_loop().create_future()

        def forward(_: asyncio.Future) -> None:
            asyncio.get_running_loop().call_later(delay_s, lambda: late.done() or late.set_result(None))

        delivery.add_done_callback(forward)
        return late

    worker.send_heartbeat = late_send
    try:
        slowed_at = time.monotonic()
        await wait_until(lambda: worker.last_heartbeat_ok > slowed_at + lease_s, lease_s * 4,
                         what="late heartbeats renewing the lease for more than a lease")
        assert not worker.self_fenced and worker.readiness().checks["heartbeating"]
    finally:
        worker.send_heartbeat = real_send


async def test_a_worker_whose_event_loop_is_stuck_past_its_lease_keeps_its_lease_and_its_attempt(
        gateway, start_worker, controller, tenants, model_dir, bootstrap, cp_settings):
    """The heartbeats have a thread and a producer of their own: a worker loop busy (or starved of CPU) for
    longer than a lease still heartbeats, with the description its loop last gave, so the controller (another
    process here) interrupts nothing. With the heartbeat on the loop, its lease ran out and the attempt ended
    `worker-lease-expired`."""
    since_ms = int(time.time() * 1000) - 1000
    version = await own_version(bootstrap, model_dir, "stuck-loop")
    worker = await start_worker(version)
    pace_steps(worker.engine, 0.01)  # 480 tokens outlast the stuck loop
    gen_id = await admit(gateway, tenants["main"].headers, model=version, maxOutputTokens=480)
    bridge = gateway.gateway.bridge
    await wait_until(lambda: (v := bridge.view(gen_id)) and len(v.tokens) >= 2, 20, what="first tokens")
    lease_s = cp_settings.lease_ms / 1000
    stuck_at = time.time()
    time.sleep(lease_s * 2)  # fault injection: the worker's event loop (this test's) does nothing for two leases
    unstuck_at = time.time()
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 60, what="the generation's end")
    beats = await read_topic(bootstrap, "llm.workers", since_ms, lambda e: e.worker_id == worker.worker_id)
    during = sorted(e.occurred_at.timestamp() for e in beats if stuck_at <= e.occurred_at.timestamp() <= unstuck_at)
    gaps = [b - a for a, b in zip([stuck_at, *during], [*during, unstuck_at])]
    assert (view.status, view.final.reason) == ("completed", "output-limit")
    assert max(gaps) < lease_s, f"heartbeats while the loop was stuck: {len(during)}, gaps {gaps}"
    assert not worker.self_fenced
