"""The Kafka-native client API on the real broker: requests on `llm.requests.<tenant>`, results on
`llm.results.<tenant>`, through an `ledgerlm intake` process (intake + results publisher).

On the project's own broker each tenant publishes and reads as its own SCRAM principal over the SASL
listener, held to the ACLs `grant_kafka` set (PLAINTEXT's ANONYMOUS may not touch tenants' topics); on
another broker (testcontainers) the same tests run unauthenticated and the ACL tests are skipped."""
from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from aiokafka.errors import TopicAuthorizationFailedError

from plumbing.kafka.clients import make_admin, make_consumer, make_producer, partitions_of
from schemas.intake import intake_topic, results_topic
from schemas.values import TenantLimits
from tests.controlplane.conftest import SESSION, Process, read_topic
from tests.waiting import holds_for, wait_until


@pytest.fixture(scope="module")
async def intake_tenants(bootstrap, database_url, topics, cp_kafka):
    from producers.tenant_admin import create_tenant
    from producers.tenant_kafka import grant_kafka

    made = {}
    for role, limits in {"kafka": TenantLimits(), "paced": TenantLimits(max_concurrency=2)}.items():
        created = await create_tenant(bootstrap, database_url, f"cp-{role}-{SESSION}", limits)
        await grant_kafka(cp_kafka("admin"), created.tenant_id, password=f"pw-{role}-{SESSION}")
        made[role] = created.tenant_id
    return made


@pytest.fixture(scope="module")
def as_tenant(cp_kafka, intake_tenants):
    """tenant id -> how that tenant reaches Kafka: its own principal over SASL where the broker has one."""
    from producers.tenant_kafka import tenant_access

    passwords = {tenant: f"pw-{role}-{SESSION}" for role, tenant in intake_tenants.items()}
    admin = cp_kafka("admin")
    return lambda tenant: admin if isinstance(admin, str) else tenant_access(admin, tenant, passwords[tenant])


@pytest.fixture(scope="module")
async def intake(intake_tenants, cp_env, controller, worker, tmp_path_factory):
    proc = Process(["intake", "--instance-id", f"it-{SESSION}"], cp_env,
                   tmp_path_factory.mktemp("intake-logs") / "intake.log").start()
    await proc.wait_for_log("intake started", 60)
    yield proc
    proc.stop()


def request(version: str, request_id: str | None = None, **fields) -> dict:
    return {"requestId": request_id or f"k-{uuid.uuid4().hex[:10]}", "model": version, "input": "the water is",
            "maxOutputTokens": 4, **fields}


async def publish(kafka, tenant: str, records: list) -> None:
    producer = make_producer(kafka)
    await producer.start()
    try:
        for record in records:
            value = record if isinstance(record, bytes) else json.dumps(record).encode()
            key = record.get("requestId", "").encode() if isinstance(record, dict) else None
            await producer.send(intake_topic(tenant), value, key=key)
        await producer.flush()
    finally:
        await producer.stop()


async def results(kafka, tenant: str, want: set[str], timeout_s: float, settle_s: float = 0.0) -> list:
    """Every result record on the tenant's results topic, read until each of `want` has one (then `settle_s`
    more, so that a duplicate would be seen)."""
    consumer = make_consumer(kafka, client_id="test-results")
    await consumer.start()
    found: list[dict] = []
    try:
        consumer.assign(await partitions_of(consumer, results_topic(tenant)))

        async def read_more() -> bool:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                found.extend(json.loads(r.value) for r in records)
            return True

        async def every_one_answered() -> bool:
            await read_more()
            return want <= {r["requestId"] for r in found}

        await wait_until(every_one_answered, timeout_s, step_s=0,
                         what=lambda _: f"a result of each request ({len(want - {r['requestId'] for r in found})} "
                                        f"of {len(want)} have none)")
        if settle_s:
            await holds_for(read_more, settle_s, step_s=0)  # reading on: a duplicate would be seen
        return found
    finally:
        await consumer.stop()


async def admitted_per_request(bootstrap, tenant: str, since_ms: int) -> dict[str, int]:
    events = await read_topic(bootstrap, "llm.generations", since_ms,
                              lambda e: e.type == "Admitted" and e.tenant_id == tenant)
    counts: dict[str, int] = {}
    for event in events:
        counts[event.request_id] = counts.get(event.request_id, 0) + 1
    return counts


async def test_100_requests_one_result_each_and_a_duplicate_runs_nothing(bootstrap, as_tenant, intake, intake_tenants,
                                                                        versions):
    tenant, since = intake_tenants["kafka"], int(time.time() * 1000)
    batch = [request(versions["served"]) for _ in range(100)]
    await publish(as_tenant(tenant), tenant, batch + [batch[0]])  # the first once more: same requestId, same payload
    got = await results(as_tenant(tenant), tenant, {r["requestId"] for r in batch}, 240, settle_s=2.0)
    by_id = {}
    for result in got:
        by_id.setdefault(result["requestId"], []).append(result)
    assert sorted(map(len, by_id.values())) == [1] * 100
    first = by_id[batch[0]["requestId"]][0]
    assert (first["status"], first["endReason"], first["usage"]["outputTokens"]) == ("completed", "output-limit", 4)
    assert first["generationId"].startswith("gen_") and first["text"]
    assert set((await admitted_per_request(bootstrap, tenant, since)).values()) == {1}


async def test_changed_payload_under_the_same_request_id_is_a_conflict_result(bootstrap, as_tenant, intake, intake_tenants,
                                                                             versions):
    tenant, first = intake_tenants["kafka"], request(versions["served"])
    await publish(as_tenant(tenant), tenant, [first])
    await results(as_tenant(tenant), tenant, {first["requestId"]}, 60)
    await publish(as_tenant(tenant), tenant, [{**first, "maxOutputTokens": 5}])

    async def results_of_first() -> list:
        return [r for r in await results(as_tenant(tenant), tenant, {first["requestId"]}, 30, settle_s=0.5)
                if r["requestId"] == first["requestId"]]

    got = await wait_until(results_of_first, 60, step_s=0, accept=lambda got: len(got) == 2,
                           what=lambda got: f"the second result of one requestId: {got}")
    assert [r["status"] for r in got] == ["completed", "rejected"]
    assert got[1]["errorCode"] == "request_id_conflict" and got[1]["generationId"] == got[0]["generationId"]


async def test_invalid_records_get_a_result_naming_the_field_or_a_dead_letter(bootstrap, as_tenant, intake, intake_tenants,
                                                                            versions):
    tenant = intake_tenants["kafka"]
    bad = request(versions["served"], maxOutputTokens="8")
    unknown = request("no-such-model@1")
    await publish(as_tenant(tenant), tenant, [bad, unknown, b"not json"])
    got = {r["requestId"]: r for r in await results(as_tenant(tenant), tenant, {bad["requestId"], unknown["requestId"]}, 60)}
    assert (got[bad["requestId"]]["status"], got[bad["requestId"]]["errorCode"],
            got[bad["requestId"]]["field"]) == ("rejected", "invalid_request", "maxOutputTokens")
    assert got[unknown["requestId"]]["errorCode"] == "unknown_model"


async def test_intake_killed_mid_batch_loses_and_duplicates_nothing(bootstrap, as_tenant, intake, intake_tenants, versions):
    tenant, since = intake_tenants["kafka"], int(time.time() * 1000)
    batch = [request(versions["served"], maxOutputTokens=8) for _ in range(60)]
    await publish(as_tenant(tenant), tenant, batch)
    await asyncio.sleep(0)  # the batch is on the log; kill once part of it has results
    await results(as_tenant(tenant), tenant, {r["requestId"] for r in batch[:5]}, 120)
    intake.kill9()
    restarted_at = intake.log_size()
    intake.start()
    await intake.wait_for_log("results publisher owns partitions", 60, after=restarted_at)
    got = await results(as_tenant(tenant), tenant, {r["requestId"] for r in batch}, 240, settle_s=3.0)
    mine = [r["requestId"] for r in got if r["requestId"] in {b["requestId"] for b in batch}]
    assert sorted(mine) == sorted(r["requestId"] for r in batch)  # each exactly once
    counts = await admitted_per_request(bootstrap, tenant, since)
    assert {r["requestId"]: counts.get(r["requestId"]) for r in batch} == {r["requestId"]: 1 for r in batch}


async def test_a_request_with_include_tokens_gets_its_token_events_in_the_result(as_tenant, intake, intake_tenants,
                                                                                  versions):
    tenant = intake_tenants["kafka"]
    asked, plain = request(versions["served"], maxOutputTokens=6, includeTokens=True), request(versions["served"])
    await publish(as_tenant(tenant), tenant, [asked, plain])
    got = {r["requestId"]: r for r in await results(as_tenant(tenant), tenant,
                                                     {asked["requestId"], plain["requestId"]}, 60)}
    events = got[asked["requestId"]]["tokens"]
    assert [e["seq"] for e in events] == sorted({e["seq"] for e in events})  # in order, none twice
    assert sum(len(e["tokenIds"]) for e in events) == got[asked["requestId"]]["usage"]["outputTokens"] == 6
    assert "".join(e["text"] for e in events) == got[asked["requestId"]]["text"]
    assert "tokens" not in got[plain["requestId"]]


async def test_a_batch_beyond_the_budget_completes_paced_by_retry_after(bootstrap, as_tenant, intake, intake_tenants, versions):
    tenant = intake_tenants["paced"]  # at most 2 generations at once
    batch = [request(versions["served"], maxOutputTokens=16) for _ in range(12)]
    log_at = intake.log_size()
    await publish(as_tenant(tenant), tenant, batch)
    got = await results(as_tenant(tenant), tenant, {r["requestId"] for r in batch}, 240, settle_s=1.0)
    assert sorted(r["requestId"] for r in got) == sorted(r["requestId"] for r in batch)
    assert {r["status"] for r in got} == {"completed"}
    assert "intake held" in intake.log.read_text()[log_at:]  # the budget said 429 and the record waited


async def test_submit_helper_runs_a_jsonl_file_and_summarizes(bootstrap, as_tenant, intake, intake_tenants, versions, tmp_path):
    from ledgerlm.cli.submit_cmd import submit

    tenant = intake_tenants["kafka"]
    lines = [request(versions["served"]) for _ in range(5)] + [request("no-such-model@1")]
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    results, summary = await submit(as_tenant(tenant), tenant, path, 120)
    assert set(results) == {line["requestId"] for line in lines}
    assert (summary["completed"], summary["rejected"], summary["missing"]) == (5, 1, 0)
    assert summary["billed"]["outputTokens"] == 5 * 4


@pytest.fixture(scope="module")
def sasl_only(cp_kafka):
    if isinstance(cp_kafka("admin"), str):
        pytest.skip("the session's Kafka is not the project's own local node: no SASL listener, no authorizer")


async def describe_error(kafka, topic: str) -> str | None:
    """Kafka's error class for `kafka` asking the metadata of `topic` (None: it may see the topic)."""
    from aiokafka.errors import for_code

    admin = make_admin(kafka, request_timeout_ms=10000)
    await admin.start()
    try:
        code = (await admin.describe_topics([topic]))[0]["error_code"]
    finally:
        await admin.close()
    return for_code(code).__name__ if code else None


async def test_a_tenant_principal_reaches_its_own_topics_and_no_other_tenants(sasl_only, as_tenant, intake,
                                                                              intake_tenants, versions):
    mine, theirs = intake_tenants["kafka"], intake_tenants["paced"]
    with pytest.raises(TopicAuthorizationFailedError):
        await publish(as_tenant(mine), theirs, [request(versions["served"])])
    assert await describe_error(as_tenant(mine), results_topic(theirs)) == "TopicAuthorizationFailedError"
    assert await describe_error(as_tenant(mine), "llm.generations") == "TopicAuthorizationFailedError"
    assert await describe_error(as_tenant(mine), results_topic(mine)) is None
    own = request(versions["served"])
    await publish(as_tenant(mine), mine, [own])
    got = await results(as_tenant(mine), mine, {own["requestId"]}, 60)
    assert [r["status"] for r in got if r["requestId"] == own["requestId"]] == ["completed"]


async def test_plaintext_anonymous_may_not_write_a_tenant_intake_topic_nor_read_its_results(
        sasl_only, bootstrap, intake_tenants, versions):
    tenant = intake_tenants["kafka"]
    with pytest.raises(TopicAuthorizationFailedError):
        await publish(bootstrap, tenant, [request(versions["served"])])
    assert await describe_error(bootstrap, results_topic(tenant)) == "TopicAuthorizationFailedError"
    assert await describe_error(bootstrap, "llm.commands") is None  # the platform's own topics stay open


async def test_the_intake_serves_readiness_and_its_counts(as_tenant, intake, intake_tenants, versions):
    import httpx

    tenant, one = intake_tenants["kafka"], request(versions["served"])
    await publish(as_tenant(tenant), tenant, [one])
    await results(as_tenant(tenant), tenant, {one["requestId"]}, 60)
    async with httpx.AsyncClient(base_url=await intake.metrics_url(), timeout=10) as http:
        ready = (await http.get("/readyz")).json()
        metrics = (await http.get("/metrics")).text
    assert ready == {"ready": True, "checks": {"intake_consuming": True, "results_consuming": True}}
    admitted = [line for line in metrics.splitlines() if line.startswith('ledgerlm:intake_requests_total{outcome="admitted"}')]
    assert admitted and float(admitted[0].split()[-1]) >= 1
    assert any(line.startswith("ledgerlm:results_published_total ") and float(line.split()[-1]) >= 1
               for line in metrics.splitlines())
