"""Read-your-writes on every gateway (issue 19): an admitted generation is never "not found" to its own tenant.

Gateways run as real processes (so one can be killed with -9 and another started on its port) against the
session's controller and worker; the projector is either stopped, having applied the log only up to before
the admission (the projections lag by the whole test), or running.
"""
from __future__ import annotations

import asyncio
import json
import time

import httpx

from plumbing.settings import Settings
from projections.registry import all_projections
from projections.runtime import Projector
from schemas.generation_ids import mint_generation_id
from tests.controlplane.conftest import body, free_port, start_gateway_process
from tests.controlplane.test_projected_billing import project_all

TOKENS = 40
WAIT_S = 30  # read_your_writes_wait_s of these gateways: a 404 that waited for it would show


async def read_events(client: httpx.AsyncClient, url: str, headers: dict, stop_after_seq: int | None = None):
    """The SSE events of one GET as (id, event, data), stopping (hanging up) after `stop_after_seq`."""
    events, block = [], {}
    async with client.stream("GET", url, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if line:
                key, _, value = line.partition(": ")
                block[key] = value
                continue
            if block:
                events.append((int(block["id"]) if "id" in block else None, block["event"], json.loads(block["data"])))
                block = {}
                if stop_after_seq is not None and events[-1][0] == stop_after_seq:
                    break
    return events


async def timed(call) -> tuple[httpx.Response, float]:
    started = time.monotonic()
    response = await call
    return response, time.monotonic() - started


async def restart_and_resume(cp_env, tmp_path, tenant, model: str) -> dict:
    """Admit on gateway A, read its stream to seq 5, kill -9 A, start B on the same port, resume there."""
    env = {**cp_env, "LEDGERLM_READ_YOUR_WRITES_WAIT_S": str(WAIT_S)}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    first = await start_gateway_process(env, tmp_path / "gateway-a.log", port)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            created = await client.post("/v1/generations", headers=tenant.headers,
                                        json=body(model=model, maxOutputTokens=TOKENS))
            assert created.status_code == 201, created.text
            gen_id = created.json()["id"]
            head = await read_events(client, f"/v1/generations/{gen_id}/events", tenant.headers, stop_after_seq=5)
            assert [event_id for event_id, kind, _ in head if kind == "token"] == [1, 2, 3, 4, 5]
    finally:
        first.kill9()
    second = await start_gateway_process(env, tmp_path / "gateway-b.log", port)
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            ready = await client.get("/readyz")
            resumed = await read_events(client, f"/v1/generations/{gen_id}/events",
                                        {**tenant.headers, "Last-Event-ID": "5"})
            status = await client.get(f"/v1/generations/{gen_id}", headers=tenant.headers)
            return {"gen_id": gen_id, "request_id": created.json()["requestId"], "ready": ready.json(),
                    "resumed": resumed, "status": status, "url": url, "process": second}
    except BaseException:
        second.stop()
        raise


def assert_resumed_whole(outcome: dict) -> None:
    resumed = outcome["resumed"]
    assert resumed[0][1] == "generation" and resumed[0][2]["id"] == outcome["gen_id"]
    seqs = [event_id for event_id, kind, _ in resumed if kind == "token"]
    assert seqs == list(range(6, TOKENS + 1))  # every later seq, once, in order
    final_id, kind, final = resumed[-1]
    assert (kind, final_id, final["seq"], final["reason"]) == ("final", TOKENS + 1, TOKENS + 1, "output-limit")
    assert final["usage"]["outputTokens"] == TOKENS
    assert outcome["ready"]["checks"]["bridge_caught_up"] is True
    status = outcome["status"]
    assert status.status_code == 200, status.text
    assert (status.json()["id"], status.json()["requestId"]) == (outcome["gen_id"], outcome["request_id"])
    assert status.json()["status"] in ("running", "completed")


async def test_a_resume_after_kill9_on_a_new_gateway_with_the_projector_stopped_gets_every_later_seq(
        cp_env, controller, worker, tenants, versions, bootstrap, database_url, tmp_path):
    tenant, other = tenants["main"], tenants["other"]
    await project_all(bootstrap, database_url)  # then stopped: it never sees this generation
    outcome = await restart_and_resume(cp_env, tmp_path, tenant, versions["served"])
    try:
        assert_resumed_whole(outcome)
        gen_id = outcome["gen_id"]
        async with httpx.AsyncClient(base_url=outcome["url"], timeout=60) as client:
            canceled = await client.post(f"/v1/generations/{gen_id}/cancel", headers=tenant.headers)
            assert canceled.status_code in (200, 202), canceled.text
            assert canceled.json()["id"] == gen_id
            await assert_not_found_at_once(client, gen_id, other.headers, tenant.headers)
    finally:
        outcome["process"].stop()
    assert await row_missing(database_url, gen_id), "the projector ran: this test no longer tests a lag"


async def assert_not_found_at_once(client: httpx.AsyncClient, gen_id: str, other: dict, own: dict) -> None:
    """Another tenant's id, an id never issued and a forged tag: 404 without waiting for anything."""
    never = mint_generation_id("some other secret", "anyone")
    forged = mint_generation_id("not the server's secret", "x")
    cases = [(f"/v1/generations/{gen_id}", other), (f"/v1/generations/{gen_id}/events", other),
             (f"/v1/generations/{never}", own), (f"/v1/generations/{never}/events", own),
             (f"/v1/generations/gen_{'ab' * 16}", own), (f"/v1/generations/{forged}", own)]
    for path, headers in cases:
        response, elapsed_s = await timed(client.get(path, headers=headers))
        assert (response.status_code, response.json()["code"]) == (404, "not_found"), path
        assert elapsed_s < WAIT_S / 10, f"{path}: a 404 after {elapsed_s:.1f}s waited"
    canceled = await client.post(f"/v1/generations/{gen_id}/cancel", headers=other)
    assert canceled.status_code == 404


async def row_missing(database_url: str, gen_id: str) -> bool:
    import psycopg

    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        cur = await conn.execute("SELECT 1 FROM generations WHERE generation_id = %s", (gen_id,))
        return await cur.fetchone() is None


async def test_a_resume_after_kill9_on_a_new_gateway_with_the_projector_running_gets_every_later_seq(
        cp_env, controller, worker, tenants, versions, bootstrap, database_url, tmp_path):
    stop = asyncio.Event()
    projector = Projector(bootstrap, database_url, all_projections(Settings()),
                          group_id=f"ryw-projector-{time.monotonic_ns()}")
    running = asyncio.create_task(projector.run(stop, lag_every_s=60))
    try:
        outcome = await restart_and_resume(cp_env, tmp_path, tenants["main"], versions["served"])
        outcome["process"].stop()
        assert_resumed_whole(outcome)
    finally:
        stop.set()
        await asyncio.wait_for(running, 30)
        projector.close()


async def test_status_and_events_of_a_generation_admitted_elsewhere_are_served_right_after_the_201(
        cp_env, controller, worker, gateway, tenants, versions, bootstrap, database_url, tmp_path):
    """Admitted on the in-process gateway; read at once on a gateway process that was already running, before
    its bridge can have read the `Admitted` (the projector is not running)."""
    tenant = tenants["main"]
    port = free_port()
    env = {**cp_env, "LEDGERLM_READ_YOUR_WRITES_WAIT_S": str(WAIT_S)}
    elsewhere = await start_gateway_process(env, tmp_path / "gateway-c.log", port)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            for _ in range(3):
                created = await gateway.post("/v1/generations", headers=tenant.headers,
                                             json=body(model=versions["served"], maxOutputTokens=6))
                assert created.status_code == 201
                gen_id = created.json()["id"]
                status = await client.get(f"/v1/generations/{gen_id}", headers=tenant.headers)
                assert status.status_code == 200, status.text
                assert status.json()["requestId"] == created.json()["requestId"]
                events = await read_events(client, f"/v1/generations/{gen_id}/events", tenant.headers)
                assert [e[0] for e in events if e[1] == "token"] == [1, 2, 3, 4, 5, 6]
                assert events[-1][1] == "final" and events[-1][2]["usage"]["outputTokens"] == 6
    finally:
        elsewhere.stop()


async def test_an_owned_id_in_neither_source_is_503_after_the_bounded_wait_never_404(gateway, tenants):
    """A tagged id the caller owns that no source holds (a replay window shorter than the projection's lag):
    503 generation_unavailable with Retry-After once read_your_writes_wait_s has passed."""
    app_gateway = gateway.gateway
    settings = app_gateway.settings
    app_gateway.settings = settings.model_copy(update={"read_your_writes_wait_s": 0.5})
    try:
        gen_id = mint_generation_id(settings.generation_id_key(), tenants["main"].tenant_id)
        response, elapsed_s = await timed(gateway.get(f"/v1/generations/{gen_id}", headers=tenants["main"].headers))
    finally:
        app_gateway.settings = settings
    assert response.status_code == 503 and response.json()["code"] == "generation_unavailable"
    assert response.headers["Retry-After"] and elapsed_s >= 0.5
