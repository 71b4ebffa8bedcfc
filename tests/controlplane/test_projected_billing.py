"""Projections over a real workload: the bills are the watermarks, the gateway serves them, a replay agrees.

Runs after the fault tests of this session (file order), so the log also holds a worker killed
mid-stream; the rules below hold for every generation in the log, whoever created it.
"""
from __future__ import annotations

import psycopg

from migrations import runner
from plumbing.kafka.clients import Kafka
from plumbing.settings import Settings
from projections.audit import audit_replay
from projections.registry import all_projections
from projections.runtime import Projector
from tests.controlplane.conftest import body, post_until_admitted
from tests.waiting import wait_until


async def project_all(kafka: Kafka, database_url: str) -> None:
    """Apply the log up to now and stop: the projections then lag by whatever is written next."""
    projector = Projector(kafka, database_url, all_projections(Settings()))
    try:
        await projector.catch_up()
    finally:
        projector.close()


async def test_a_real_workload_is_billed_from_watermarks_and_replays_exactly(
        gateway, worker, paced_worker, tenants, versions, bootstrap, database_url, scratch_database):
    headers = tenants["main"].headers
    done = (await gateway.post("/v1/generations?wait=true", headers=headers,
                               json=body(model=versions["served"], maxOutputTokens=6))).json()
    created = await post_until_admitted(gateway, "/v1/generations", headers=headers,
                                        json=body(model=versions["paced"], maxOutputTokens=400))
    canceled_id = created.json()["id"]
    bridge = gateway.gateway.bridge
    await wait_until(lambda: (v := bridge.view(canceled_id)) and len(v.tokens) >= 2, 20, what="first tokens")
    await gateway.post(f"/v1/generations/{canceled_id}/cancel", headers=headers)
    canceled_view = await wait_until(lambda: (v := bridge.view(canceled_id)) and v.final and v, 20, what="end")

    # A database of its own: other tests write rows straight into the session database,
    # which a replay of the log could never reproduce.
    runner.upgrade(scratch_database)
    await project_all(bootstrap, scratch_database)
    with psycopg.connect(scratch_database) as conn:
        bills = {row[0]: row[1:] for row in conn.execute(
            "SELECT b.generation_id, b.end_reason, b.usage_label, b.billed_input_tokens, b.billed_output_tokens, "
            "w.processed_input_tokens, w.generated_output_tokens, COALESCE(sp.token_count, 0) "
            "FROM billing_ledger b LEFT JOIN usage_watermarks w ON w.generation_id = b.generation_id "
            "AND w.epoch = b.epoch LEFT JOIN stream_progress sp ON sp.generation_id = b.generation_id")}
        stuck = conn.execute("SELECT count(*) FROM generations WHERE status IN ('admitted', 'running') "
                             "AND generation_id = ANY(%s)", ([done["id"], canceled_id],)).fetchone()[0]
    assert stuck == 0
    assert bills[done["id"]] == ("output-limit", "final", done["usage"]["inputTokens"], 6,
                                 done["usage"]["inputTokens"], 6, 6)
    streamed = len(canceled_view.tokens)
    assert bills[canceled_id][:2] == ("canceled", "final") and bills[canceled_id][3] == streamed
    for gen_id, (end_reason, label, billed_in, billed_out, mark_in, mark_out, stream_count) in bills.items():
        assert (billed_in, billed_out) == (mark_in or 0, mark_out or 0), f"{gen_id} billed off its watermark"
        assert (label == "interrupted") == (end_reason == "interrupted"), gen_id
        if stream_count:  # billed never exceeds what the worker computed and streamed
            assert billed_out <= stream_count, gen_id

    audit = await audit_replay(bootstrap, scratch_database, Settings())
    assert audit.differences == 0, audit.as_dict()
    assert audit.replayed["generations"] > 0 and audit.replayed["stream"] > 0

    # The gateway reads the same projections from the session database.
    await project_all(bootstrap, database_url)
    status = (await gateway.get(f"/v1/generations/{done['id']}", headers=headers)).json()
    assert status["status"] == "completed"
    usage = await gateway.get("/v1/usage", headers=headers)
    assert usage.status_code == 200
    with psycopg.connect(database_url) as conn:
        sealed = conn.execute("SELECT count(*), sum(billed_output_tokens) FROM billing_ledger WHERE tenant_id = %s "
                              "AND sealed_at > now() - interval '24 hours'", (tenants["main"].tenant_id,)).fetchone()
    assert usage.json()["totals"]["generations"] == sealed[0] >= 2
    assert usage.json()["totals"]["outputTokens"] == sealed[1]
    other = await gateway.get("/v1/usage?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z", headers=headers)
    assert other.status_code == 400 and other.json()["code"] == "invalid_request"
    assert (await gateway.get("/v1/usage")).status_code == 401
