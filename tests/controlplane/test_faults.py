"""Real process faults: a worker killed mid-stream, a controller killed and restarted mid-stream."""
from __future__ import annotations

import asyncio
import time
import uuid

from plumbing.kafka.clients import publish
from schemas.stream import TokensEmitted
from tests.controlplane.conftest import Process, body, post_until_admitted, read_topic
from tests.controlplane.test_stream_resume import AsgiClient
from tests.waiting import holds_for, wait_until


async def test_worker_kill9_interrupts_within_lease_releases_and_ignores_late_tokens(
        gateway, worker, controller, tenants, versions, cp_env, cp_settings, producer, bootstrap, tmp_path):
    since_ms = int(time.time() * 1000) - 1000
    worker_id = f"cp-doomed-{uuid.uuid4().hex[:6]}"
    proc = Process(["worker", "--model-version", versions["killable"], "--worker-id", worker_id], cp_env,
                   tmp_path / "worker.log").start()
    try:
        await proc.wait_for_log("worker ready", 90)
        board = gateway.gateway.board  # reads llm.workers as the controller does
        await wait_until(lambda: worker_id in board.latest, 30, what="the worker's heartbeats read")
        headers = tenants["kill"].headers  # max_concurrency = 1
        created = await gateway.post("/v1/generations", headers=headers,
                                     json=body(model=versions["killable"], maxOutputTokens=480))
        assert created.status_code == 201
        gen_id = created.json()["id"]
        bridge = gateway.gateway.bridge
        # A client streaming when the worker dies: it gets what was delivered, then the interrupted end.
        # (No projector runs here: the stream is found through the bridge's view, so wait for that.)
        await wait_until(lambda: bridge.view(gen_id), 10, what="the bridge's view")
        watcher = AsgiClient(gateway._transport.app, f"/v1/generations/{gen_id}/events", headers)
        watching = asyncio.create_task(watcher.run(timeout_s=30))
        # A watermark goes out once the stream events it covers are acknowledged: wait until one is on the log.
        await wait_until(lambda: (v := bridge.view(gen_id)) and len(v.tokens) >= 8
                         and v.usage.get(1) is not None and v.usage[1].generated_output_tokens >= 4, 30,
                         what="tokens and a watermark")
        proc.kill9()
        killed_at = time.monotonic()
    finally:
        proc.stop()
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.status == "interrupted" and v, 10,
                            what="interrupted")
    elapsed = time.monotonic() - killed_at
    assert elapsed <= cp_settings.lease_ms / 1000 + 2, f"Interrupted after {elapsed:.1f}s"
    assert view.final.reason == "interrupted" and view.final.usage_label == "interrupted"
    assert view.final.usage == view.usage[1]  # the last recorded watermark, nothing invented
    assert view.final.usage.generated_output_tokens >= 4
    streamed = len(view.tokens)
    seen = await watching
    assert [data["seq"] for _, kind, data in seen if kind == "token"] == list(range(1, streamed + 1))
    last_id, kind, final = seen[-1]
    assert (kind, final["reason"], final["usageLabel"]) == ("final", "interrupted", "interrupted")
    assert final["usage"]["outputTokens"] == view.final.usage.generated_output_tokens and last_id == streamed + 1

    # A token of the interrupted epoch that arrives late is not accepted.
    await publish(producer, "llm.tokens", TokensEmitted(tenant_id=tenants["kill"].tenant_id, generation_id=gen_id,
                                                        epoch=1, seq=streamed + 1, token_ids=(5,), text_delta="x",
                                                        token_count=streamed + 1))
    await holds_for(lambda: len(bridge.view(gen_id).tokens) == streamed, 0.5, what="the late token refused")

    # The reservation is back: the tenant's single slot admits a new generation.
    again = await gateway.post("/v1/generations", headers=headers, json=body(model=versions["served"]))
    assert again.status_code == 201
    interrupted = await read_topic(bootstrap, "llm.generations", since_ms,
                                   lambda e: e.generation_id == gen_id and e.type == "Interrupted")
    assert [(e.epoch, e.worker_id) for e in interrupted] == [(1, worker_id)]


async def test_controller_kill9_and_restart_loses_and_repeats_no_decision(
        gateway, worker, controller, tenants, versions, bootstrap):
    since_ms = int(time.time() * 1000) - 1000
    tenant = tenants["restart"]  # max_concurrency = 1: B is admitted only if A's release was applied
    bridge = gateway.gateway.bridge
    first = await gateway.post("/v1/generations", headers=tenant.headers,
                               json=body(model=versions["served"], maxOutputTokens=300))
    gen_a = first.json()["id"]
    await wait_until(lambda: (v := bridge.view(gen_a)) and len(v.tokens) >= 2, 20, what="A's first tokens")
    controller.kill9()
    view = await wait_until(lambda: (v := bridge.view(gen_a)) and v.final and v, 30, what="A's end")
    assert view.final.reason == "output-limit" and len(view.tokens) == 300  # the worker carries on alone

    request_b = body(model=versions["served"], maxOutputTokens=4)
    pending_b = asyncio.create_task(gateway.post("/v1/generations", headers=tenant.headers, json=request_b))
    # B's command is out, its decision awaited, before the controller starts again
    await wait_until(lambda: awaiting_decision(gateway), 10, step_s=0.01, what="B's command awaiting a decision")
    mark = controller.log_size()
    controller.start()
    await controller.wait_for_log("controller owns partitions", 60, after=mark)
    second = await asyncio.wait_for(pending_b, 30)
    assert second.status_code == 201
    repeat = await gateway.post("/v1/generations", headers=tenant.headers, json=request_b)
    assert (repeat.status_code, repeat.json()["id"]) == (200, second.json()["id"])

    admitted = await read_topic(bootstrap, "llm.generations", since_ms,
                                lambda e: e.tenant_id == tenant.tenant_id and e.type == "Admitted")
    assert sorted(e.generation_id for e in admitted) == sorted([gen_a, second.json()["id"]])
    replies = await read_topic(bootstrap, "llm.replies", since_ms,
                               lambda e: e.tenant_id == tenant.tenant_id and e.request_id == request_b["requestId"])
    assert sorted(r.http_status for r in replies) == [200, 201]


async def test_worker_that_cannot_heartbeat_fences_itself_and_writes_nothing_more(
        gateway, start_worker, worker_tasks, controller, tenants, versions, bootstrap):
    since_ms = int(time.time() * 1000) - 1000
    lease_s = 1.0  # this worker's own lease (its heartbeats carry it), so generations outlast it
    isolated = await start_worker("killable", lease_ms=int(lease_s * 1000), heartbeat_interval_ms=200)
    created = await asyncio.gather(*[post_until_admitted(gateway, "/v1/generations", headers=tenants["main"].headers,
                                                         json=body(model=versions["killable"], maxOutputTokens=480))
                                     for _ in range(4)])
    ids = [c.json()["id"] for c in created]
    bridge = gateway.gateway.bridge
    await wait_until(lambda: all((v := bridge.view(i)) and v.tokens for i in ids), 20, what="tokens")

    async def unreachable() -> None:  # fault injection: the broker is out of reach for heartbeats
        raise ConnectionError("partitioned from the broker")

    isolated.send_heartbeat = unreachable
    cut_at = time.monotonic()
    try:
        running = {a.start.generation_id for a in isolated.attempts.values()}
        await wait_until(lambda: not isolated.attempts, lease_s + 8, what="self-fencing")  # generous on a loaded box
        fenced_after = time.monotonic() - cut_at
        assert isolated.engine.stats().num_blocks_used == 0 and isolated.free_blocks == isolated.total_blocks
        await wait_until(lambda: all(bridge.view(i).final for i in ids), 15, what="every stream's end")
    finally:  # a worker that can never heartbeat again would fence itself every 200 ms for the rest of the session
        worker_tasks[isolated.worker_id].cancel()

    async def lifecycles() -> dict[str, list[str]] | None:
        events = await read_topic(bootstrap, "llm.generations", since_ms, lambda e: e.generation_id in ids)
        types = {gen_id: [e.type for e in events if e.generation_id == gen_id] for gen_id in ids}
        return types if all({"Completed", "Interrupted"} & set(t) for t in types.values()) else None

    interrupted = 0
    for types in (await wait_until(lifecycles, 15, what="every generation's end on the log", step_s=0.2)).values():
        if "Completed" in types:  # finished before the lease ran out
            assert "Interrupted" not in types
        else:
            interrupted += 1
            assert types[-1] == "Interrupted" and not {"Canceled", "Expired"} & set(types)
    assert interrupted >= 1 and running
    assert fenced_after >= lease_s - 0.5  # it kept serving until its lease was really gone


def awaiting_decision(gateway) -> bool:
    """The gateway's admission client has published a command and waits for its decision."""
    return bool(gateway.gateway.admission.waiting)
