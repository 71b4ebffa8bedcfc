"""What one client or tenant can make a gateway hold (issue 15, finding 4): a flood of random API keys from one
address is rate-limited with bounded memory while other tenants keep working; a tenant's open streams are
bounded (429 with Retry-After) and a stream's slot comes back when its client hangs up."""
from __future__ import annotations

import asyncio
import secrets

import httpx

from producers.gateway.admission.slots import STREAMS, WAITING, TenantSlots
from producers.gateway.auth.authenticator import Authenticator

from tests.controlplane.test_stream_resume import AsgiClient, start_generation
from tests.waiting import wait_until


async def test_a_random_key_flood_is_rate_limited_and_bounded_while_another_tenants_requests_succeed(
        gateway, tenants):
    app, app_gateway = gateway._transport.app, gateway.gateway
    settings = app_gateway.settings.model_copy(update={"gateway_auth_cache_entries": 8,
                                                       "gateway_auth_failures_per_minute": 10})
    await wait_until(lambda: app_gateway.keys.caught_up, 30, what="the key directory to read llm.tenants")
    saved, app_gateway.auth = app_gateway.auth, Authenticator(app_gateway.db, app_gateway.keys, settings)
    flooder = httpx.AsyncClient(transport=httpx.ASGITransport(app=app, client=("203.0.113.9", 40000)),
                                base_url="http://gateway", timeout=60)
    try:
        async def random_key():
            return await flooder.get("/v1/models", headers={"Authorization": f"Bearer llm_{secrets.token_hex(20)}"})

        async def tenant_reads():
            return [await gateway.get("/v1/models", headers=tenants["other"].headers) for _ in range(5)]

        flood, reads = await asyncio.gather(asyncio.gather(*(random_key() for _ in range(300))), tenant_reads())
        assert [r.status_code for r in reads] == [200] * 5
        codes = [r.status_code for r in flood]
        assert (codes.count(401), codes.count(429)) == (10, 290)
        limited = next(r for r in flood if r.status_code == 429)
        assert int(limited.headers["Retry-After"]) >= 1
        assert limited.json()["error"]["code"] == "auth_rate_limited"
        auth = app_gateway.auth
        assert auth.lookups == 10  # the flood's ten; the tenants' keys are the key directory's to answer
        assert len(auth.cache) <= 8
        # The address stays limited for any key the gateway does not know; one it knows works from anywhere.
        assert (await random_key()).status_code == 429
        assert (await flooder.get("/v1/models", headers=tenants["main"].headers)).status_code == 200
    finally:
        app_gateway.auth = saved
        await flooder.aclose()


async def test_a_tenants_streams_are_bounded_with_429_and_a_stream_gives_its_slot_back_when_its_client_leaves(
        gateway, worker, tenants, versions):
    tenant = tenants["other"]
    app, app_gateway = gateway._transport.app, gateway.gateway
    saved, app_gateway.slots = app_gateway.slots, TenantSlots({STREAMS: 1, WAITING: 1}, 1000)
    try:
        gen_id = await start_generation(gateway, tenant, versions["served"], 24)
        paused = asyncio.Event()
        first = AsgiClient(app, f"/v1/generations/{gen_id}/events", tenant.headers, slow_send=paused.wait)
        connection = asyncio.create_task(first.run())
        await wait_until(lambda: app_gateway.slots.held(tenant.tenant_id, STREAMS) == 1, 10, what="the open stream")
        second = await gateway.get(f"/v1/generations/{gen_id}/events", headers=tenant.headers)
        assert second.status_code == 429 and int(second.headers["Retry-After"]) >= 1
        assert (second.json()["code"], second.json()["details"]["reason"]) == ("too_many_streams", "too_many_streams")
        chat = await gateway.post("/v1/chat/completions", headers=tenant.headers, json={
            "model": versions["served"], "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "stream": True})
        assert chat.status_code == 429 and chat.json()["error"]["code"] == "too_many_streams"
        first.hung_up.set()  # the client leaves mid-stream
        paused.set()
        await asyncio.wait_for(connection, 30)
        await wait_until(lambda: app_gateway.slots.held(tenant.tenant_id, STREAMS) == 0, 10,
                         what="the slot given back")
        again = await gateway.get(f"/v1/generations/{gen_id}/events", headers=tenant.headers)
        assert again.status_code == 200
        assert app_gateway.slots.held(tenant.tenant_id, STREAMS) == 0
    finally:
        app_gateway.slots = saved
