"""Gateways authenticate API keys from `llm.tenants` itself, so the projections database can be dropped and rebuilt
under them (issue 16's chaos run): valid keys keep working, revoked ones stop, and a read that needs the database
while it is gone answers 503 database_unavailable with Retry-After, never 500, without spending the caller's
failed-authentication budget."""
from __future__ import annotations

import secrets
from contextlib import asynccontextmanager

import httpx
import psycopg

from plumbing.kafka.clients import publish
from producers.api_keys import issue_api_key
from producers.tenant_admin import create_tenant, project_tenants
from schemas.registry_events import TenantRegistered
from schemas.topics import TENANTS
from schemas.values import TenantLimits
from tests.controlplane.conftest import SESSION, Tenant, body, post_until_admitted
from tests.waiting import wait_until

RANDOM_KEY = {"Authorization": f"Bearer llm_{secrets.token_hex(20)}"}


@asynccontextmanager
async def gateway_on(database_url: str, cp_kafka, cp_settings, **overrides):
    """A gateway of this test's own on `database_url` (its bridge replays a second of log, not the session's)."""
    from producers.gateway.http.app import create_app

    settings = cp_settings.model_copy(update={"gateway_share_stream": False, "bridge_replay_max_s": 1.0, **overrides})
    app = create_app(settings, cp_kafka("gateway"), database_url)
    await app.state.gateway.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=60)
    client.gateway = app.state.gateway
    try:
        yield client
    finally:
        await client.aclose()
        await app.state.gateway.stop()


async def answered(client: httpx.AsyncClient, path: str, headers: dict, status: int, timeout_s: float = 30):
    """GET `path` until it answers `status`; that answer."""
    return await wait_until(lambda: client.get(path, headers=headers), timeout_s, step_s=0.1,
                            accept=lambda r: r.status_code == status,
                            what=lambda r: f"{path} to answer {status}, not {r.status_code} {r.text}")


def migrated(database_url: str) -> str:
    from migrations import runner

    runner.upgrade(database_url)
    return database_url


async def test_keys_authenticate_from_the_log_while_the_projection_holds_no_tenant(
        scratch_database, cp_kafka, cp_settings, tenants, versions, worker):
    """The scratch database is the projections right after a rebuild, before the projector replayed `llm.tenants`:
    no tenant, no key. Stopping the directory shows what the gateway answered before it: 401."""
    main = tenants["main"]
    async with gateway_on(migrated(scratch_database), cp_kafka, cp_settings) as client:
        ready = await answered(client, "/readyz", {}, 200)
        assert ready.json()["checks"]["keys"] is True
        assert (await client.get("/v1/models", headers=main.headers)).status_code == 200
        admitted = await post_until_admitted(client, "/v1/generations?wait=true", headers=main.headers,
                                             json=body(model=versions["served"]))
        assert admitted.status_code == 201 and admitted.json()["status"] == "completed"
        assert (await client.get("/v1/models", headers=RANDOM_KEY)).status_code == 401
        assert client.gateway.auth.lookups == 1  # the random key only: the tenant's key never reached Postgres

        await client.gateway.keys.stop()
        assert (await client.get("/readyz")).json()["checks"]["keys"] is False
        other = tenants["other"]  # not cached by this gateway yet
        assert (await client.get("/v1/models", headers=other.headers)).status_code == 401


async def test_registering_a_tenant_again_with_a_new_key_revokes_the_old_one_on_a_running_gateway(
        gateway, bootstrap, database_url, producer):
    """Only `llm.tenants` has the new registration (the projection applies it at the end): the gateway follows
    the log, so the old key stops at once, though Postgres and the gateway's cache still hold it as valid."""
    created = await create_tenant(bootstrap, database_url, f"cp-rotate-{SESSION}", TenantLimits(max_concurrency=3))
    old = Tenant(created.tenant_id, created.api_key)
    await answered(gateway, "/v1/models", old.headers, 200)
    key = issue_api_key()
    await publish(producer, TENANTS, TenantRegistered(tenant_id=old.tenant_id, name=old.tenant_id,
                                                      limits=TenantLimits(max_concurrency=3), api_key_hash=key.hash,
                                                      api_key_prefix=key.prefix))
    try:
        refused = await answered(gateway, "/v1/models", old.headers, 401, timeout_s=10)
        assert refused.json()["error"]["code"] == "unauthorized"
        assert (await gateway.get("/v1/models", headers=Tenant(old.tenant_id, key.plain).headers)).status_code == 200
    finally:
        await project_tenants(bootstrap, database_url)


async def test_reads_answer_503_with_retry_after_while_the_database_is_dropped_and_rebuilt(
        scratch_database, cp_kafka, cp_settings, tenants):
    """As the chaos run's rebuild: DROP DATABASE ... WITH (FORCE), CREATE DATABASE, migrations. Keys from the
    directory keep working throughout; a key only Postgres could judge gets 503 too, and never spends the
    address's two failures a minute (three in a row would be a 429)."""
    main = tenants["main"]
    status_path = "/v1/generations/gen-not-there"
    base, name = scratch_database.rsplit("/", 1)
    async with gateway_on(migrated(scratch_database), cp_kafka, cp_settings, gateway_db_timeout_s=1.0,
                          gateway_auth_failures_per_minute=2) as client:
        await answered(client, "/readyz", {}, 200)
        with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
            unavailable = await client.get(status_path, headers=main.headers)
            assert unavailable.status_code == 503 and int(unavailable.headers["Retry-After"]) >= 1
            assert unavailable.json()["code"] == "database_unavailable"
            assert unavailable.json()["details"]["retryAfterMs"] == cp_settings.retry_after_ms
            assert (await client.get("/v1/models", headers=main.headers)).status_code == 200
            # Still in a balancer's rotation: what does not need the database goes on.
            assert (await client.get("/readyz")).status_code == 200
            for _ in range(3):
                unknown = await client.get("/v1/models", headers=RANDOM_KEY)
                assert unknown.status_code == 503 and unknown.headers["Retry-After"]
                assert unknown.json()["error"]["code"] == "database_unavailable"

            admin.execute(f'CREATE DATABASE "{name}"')  # no tables until the migrations ran
            assert (await client.get(status_path, headers=main.headers)).status_code == 503
        migrated(scratch_database)
        missing = await answered(client, status_path, main.headers, 404)
        assert missing.json()["code"] == "not_found"
        assert (await client.get("/v1/models", headers=RANDOM_KEY)).status_code == 401
