"""Tenants are events projected into Postgres; API keys authenticate by hash and are stored nowhere in plain."""
import hashlib
import uuid

import psycopg
from aiokafka import TopicPartition

from plumbing.kafka.clients import make_consumer
from producers.api_keys import authenticate
from producers.tenant_admin import TenantExists, create_tenant
from schemas.topics import TENANTS
from schemas.values import TenantLimits


def tenant_name() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def test_created_key_authenticates_by_hash(bootstrap, database_url, topics):
    name = tenant_name()
    created = await create_tenant(bootstrap, database_url, name, TenantLimits(weight=2.5, max_concurrency=7))
    with psycopg.connect(database_url) as conn:
        assert authenticate(conn, created.api_key) == name
        assert authenticate(conn, created.api_key[:-1] + ("A" if created.api_key[-1] != "A" else "B")) is None
        assert authenticate(conn, "") is None
        assert authenticate(conn, None) is None
        stored = conn.execute("SELECT key_hash FROM api_keys WHERE tenant_id = %s", (name,)).fetchall()
        limits = conn.execute("SELECT weight, max_concurrency FROM tenants WHERE tenant_id = %s", (name,)).fetchone()
    assert stored == [(hashlib.sha256(created.api_key.encode()).hexdigest(),)]
    assert limits == (2.5, 7)


async def test_plain_key_is_stored_nowhere(bootstrap, database_url, topics):
    name = tenant_name()
    created = await create_tenant(bootstrap, database_url, name, TenantLimits())
    secret = created.api_key.encode()
    with psycopg.connect(database_url) as conn:
        tables = [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        for table in tables:
            hits = conn.execute(f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s",
                                (f"%{created.api_key}%",)).fetchone()[0]
            assert hits == 0, f"plain key found in table {table}"
    consumer = make_consumer(bootstrap)
    await consumer.start()
    try:
        partitions = [TopicPartition(TENANTS, p) for p in range(6)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        seen = 0
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    seen += 1
                    assert secret not in record.value
    finally:
        await consumer.stop()
    assert seen >= 1


async def test_duplicate_tenant_is_refused(bootstrap, database_url, topics):
    name = tenant_name()
    await create_tenant(bootstrap, database_url, name, TenantLimits())
    try:
        await create_tenant(bootstrap, database_url, name, TenantLimits())
    except TenantExists as exc:
        assert name in str(exc)
    else:
        raise AssertionError("a second tenant with the same name was created")


def admin_env(services, home) -> dict[str, str]:
    """The CLI's environment: on the project's own broker, its SASL listener as `admin` (PLAINTEXT's ANONYMOUS
    may not create a tenant's topics there); tenants' passwords land under `home`."""
    import os

    from plumbing.settings import Settings
    from tests.services import sasl_access

    env = {**os.environ, "LEDGERLM_HOME": str(home)}
    access = sasl_access(services, Settings(), "admin")
    if access is not None:
        env.update({"LEDGERLM_KAFKA_BOOTSTRAP": access.bootstrap, "LEDGERLM_KAFKA_SECURITY_PROTOCOL": access.protocol,
                    "LEDGERLM_KAFKA_SASL_USERNAME": "admin",
                    "LEDGERLM_KAFKA_SASL_PASSWORD": access.principal.password.get_secret_value()})
    return env


def test_cli_prints_tenant_id_and_key_once_as_json(services, topics, database_url, tmp_path):
    import json
    import subprocess
    import sys

    name = tenant_name()
    result = subprocess.run([sys.executable, "-m", "ledgerlm.cli.main", "tenants", "create", name, "--weight", "3",
                             "--max-concurrency", "5", "--json"], capture_output=True, text=True, timeout=120,
                            env=admin_env(services, tmp_path))
    assert result.returncode == 0, result.stderr
    printed = json.loads(result.stdout)
    assert printed["tenantId"] == name and printed["apiKey"].startswith("llm_")
    if services.kafka_sasl_bootstrap is not None:  # a principal of its own, its password kept 0600
        kafka = printed["kafka"]
        assert kafka["principal"] == f"User:tenant-{name}"
        assert f"ALLOW User:tenant-{name} WRITE topic llm.requests.{name}" in kafka["acls"]
        stored = tmp_path / "credentials" / f"kafka-tenant-{name}.json"
        assert kafka["credentialsFile"] == str(stored) and stored.stat().st_mode & 0o777 == 0o600
    with psycopg.connect(database_url) as conn:
        assert authenticate(conn, printed["apiKey"]) == name
    refused = subprocess.run([sys.executable, "-m", "ledgerlm.cli.main", "tenants", "create", "Not A Slug"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "must match" in refused.stderr


def test_a_key_hash_claimed_by_two_tenants_authenticates_nobody(conn):
    from producers.api_keys import hash_api_key, issue_api_key

    key = issue_api_key()
    names = [tenant_name(), tenant_name()]
    for name in names:
        conn.execute("INSERT INTO tenants VALUES (%s, %s, 1, 1, 1, 1, 1, now())", (name, name))
        conn.execute("INSERT INTO api_keys (tenant_id, key_hash, key_prefix, issued_at) VALUES (%s, %s, 'x', now())",
                     (name, hash_api_key(key.plain)))
    assert authenticate(conn, key.plain) is None
    conn.execute("UPDATE api_keys SET revoked_at = now() WHERE tenant_id = %s", (names[0],))
    assert authenticate(conn, key.plain) == names[1]


async def test_the_gateways_key_index_answers_as_the_projection_after_every_registration(scratch_database):
    """Random registrations of three tenants over four key hashes, applied by the projection and by the gateway's
    in-memory index: after each one, every hash authenticates the same tenant (or nobody) in both, and the index
    knows exactly the hashes the projection has rows for."""
    import random

    from migrations import runner
    from producers.gateway.auth.key_directory import ApiKeyIndex, Refused
    from producers.gateway.database import GatewayDatabase
    from projections.tenants import apply
    from tests.unit.test_key_directory import make_registration

    runner.upgrade(scratch_database)
    rng = random.Random(16)
    hashes = [f"{digit}" * 64 for digit in "1234"]
    index = ApiKeyIndex()
    db = GatewayDatabase(scratch_database, pool_size=1)
    await db.start()
    try:
        with psycopg.connect(scratch_database, autocommit=True) as conn:
            for step in range(60):
                registration = make_registration(rng.choice(["t1", "t2", "t3"]), rng.choice(hashes),
                                                 max_tokens_in_flight=step + 1)
                apply(conn, registration)
                index.observe(registration)
                for key_hash in hashes:
                    answer = index.lookup(key_hash)
                    projected = await db.principal_of_key(key_hash)
                    assert (None if isinstance(answer, Refused) else answer) == projected, (step, key_hash)
                    rows = conn.execute("SELECT 1 FROM api_keys WHERE key_hash = %s", (key_hash,)).fetchone()
                    assert (answer is not None) == (rows is not None), (step, key_hash)
    finally:
        await db.stop()


async def test_set_billing_republishes_the_latest_registration_with_only_the_given_ids_changed(
        bootstrap, database_url, topics):
    from producers.tenant_admin import latest_registration, set_billing
    from projections.export.records import read_billing_ids
    from schemas.values import BillingIds

    name = tenant_name()
    created = await create_tenant(bootstrap, database_url, name, TenantLimits(weight=2.0, max_concurrency=3),
                                  BillingIds(stripe_customer_id="cus_first"))
    before = await latest_registration(bootstrap, name)
    billing = await set_billing(bootstrap, database_url, name, lago_subscription_id="sub-7")
    assert billing == BillingIds(stripe_customer_id="cus_first", lago_subscription_id="sub-7")
    after = await latest_registration(bootstrap, name)
    assert after.event_id != before.event_id and after.occurred_at > before.occurred_at
    assert after.model_dump(exclude={"event_id", "occurred_at", "billing"}) == before.model_dump(
        exclude={"event_id", "occurred_at", "billing"})
    await set_billing(bootstrap, database_url, name, stripe_customer_id="cus_second")
    with psycopg.connect(database_url) as conn:
        assert read_billing_ids(conn, [name])[name] == BillingIds(stripe_customer_id="cus_second",
                                                                  lago_subscription_id="sub-7")
        assert authenticate(conn, created.api_key) == name  # the same key, not revoked by the new record
        assert conn.execute("SELECT weight, max_concurrency FROM tenants WHERE tenant_id = %s",
                            (name,)).fetchone() == (2.0, 3)


def test_cli_set_billing_prints_the_ids_and_names_an_unknown_tenant(services, topics, database_url, tmp_path):
    import json
    import subprocess
    import sys

    def set_billing(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ledgerlm.cli.main", "tenants", "set-billing", *args],
                              capture_output=True, text=True, timeout=120, env=admin_env(services, tmp_path))

    name = tenant_name()
    created = subprocess.run([sys.executable, "-m", "ledgerlm.cli.main", "tenants", "create", name, "--no-kafka"],
                             capture_output=True, text=True, timeout=120, env=admin_env(services, tmp_path))
    assert created.returncode == 0, created.stderr
    done = set_billing("--tenant", name, "--stripe-customer", "cus_cli", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"tenantId": name, "billing": {"stripe_customer_id": "cus_cli"}}
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT billing FROM tenants WHERE tenant_id = %s", (name,)).fetchone()[0] == {
            "stripe_customer_id": "cus_cli"}
    unknown = set_billing("--tenant", f"{name}-nobody", "--lago-subscription", "sub-1")
    assert unknown.returncode == 2 and f"no tenant '{name}-nobody'" in unknown.stderr
    nothing = set_billing("--tenant", name)
    assert nothing.returncode == 2 and "--stripe-customer" in nothing.stderr
    empty = set_billing("--tenant", name, "--stripe-customer", "")
    assert empty.returncode == 2 and "invalid billing ids" in empty.stderr
