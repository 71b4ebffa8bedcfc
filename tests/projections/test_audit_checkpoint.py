"""Incremental audits: `audit replay --since-checkpoint` continues the last audit's replay from its checkpoint."""
import json
import uuid

import psycopg

from tests.projections.conftest import Gen, one
from tests.projections.test_faults_and_audit import run_projector, workload

WATERMARK = "UPDATE usage_watermarks SET generated_output_tokens = 999 WHERE generation_id = %s"


def audit(bootstrap: str, url: str, *args: str):
    done = run_projector(bootstrap, url, "audit", "replay", "--json", *args)
    return done.returncode, (json.loads(done.stdout) if done.stdout.strip() else None), done.stderr


async def more_traffic(emit, tenant: str) -> list[Gen]:
    gens = [Gen(tenant_id=tenant, generation_id=f"gen-{uuid.uuid4().hex[:12]}") for _ in range(2)]
    for g in gens:
        await emit(g.admitted(), g.started(), g.report(1, 7), *[g.tokens(s, s) for s in range(1, 8)],
                   g.completed(7), g.finished(8, output=7))
    return gens


async def test_a_checkpointed_audit_replays_only_what_was_appended_and_finds_tampering(
        emit, bootstrap, scratch_database_url):
    url = scratch_database_url
    early, _, _ = await workload(emit)
    assert run_projector(bootstrap, url, "project", "--once").returncode == 0
    code, _, stderr = audit(bootstrap, url, "--since-checkpoint")
    assert code == 2 and "no checkpoint yet" in stderr
    code, full, stderr = audit(bootstrap, url)
    assert code == 0 and full["differences"] == 0 and full["mode"] == "full", stderr[-2000:]
    assert "audit replay: " in stderr and "records/s" in stderr  # progress, on stderr only
    assert set(full["projections"]["stream"]) == {"records", "seconds", "rows_compared"}

    late = await more_traffic(emit, early.tenant_id)
    assert run_projector(bootstrap, url, "project", "--once").returncode == 0
    code, clean, stderr = audit(bootstrap, url, "--since-checkpoint")
    assert code == 0 and clean["differences"] == 0 and clean["mode"] == "since-checkpoint", stderr[-2000:]
    # Only the appended records: 2 x 4 lifecycle events and 2 x 8 stream events (nothing else writes here).
    assert clean["replayed"]["generations"] == 8 and clean["replayed"]["stream"] == 16, clean["replayed"]
    assert full["replayed"]["generations"] > clean["replayed"]["generations"]

    with psycopg.connect(url, autocommit=True) as conn:  # a row written after the checkpoint
        conn.execute(WATERMARK, (late[0].generation_id,))
    code, found, _ = audit(bootstrap, url, "--since-checkpoint")
    assert code == 1 and found["replayed"] == {"tenants": 0, "models": 0, "generations": 0, "stream": 0}
    assert found["tables"]["usage_watermarks"]["live_only_count"] == 1
    assert late[0].generation_id in found["tables"]["usage_watermarks"]["live_only"][0]

    with psycopg.connect(url, autocommit=True) as conn:  # and one written before it
        conn.execute(WATERMARK, (early.generation_id,))
    code, found, _ = audit(bootstrap, url)
    assert code == 1 and found["mode"] == "full"
    live_only = found["tables"]["usage_watermarks"]["live_only"]
    assert len(live_only) == 2
    assert all(any(g in row for row in live_only) for g in (early.generation_id, late[0].generation_id))


async def test_a_checkpoint_changed_since_it_was_stored_is_refused(emit, bootstrap, scratch_database_url):
    await workload(emit)
    assert run_projector(bootstrap, scratch_database_url, "project", "--once").returncode == 0
    assert audit(bootstrap, scratch_database_url)[0] == 0
    with psycopg.connect(scratch_database_url, autocommit=True) as conn:
        conn.execute("UPDATE audit_checkpoint.usage_watermarks SET generated_output_tokens = 0")
        assert one(conn, "SELECT count(*) > 0 FROM audit_checkpoint.usage_watermarks") == (True,)
    code, _, stderr = audit(bootstrap, scratch_database_url, "--since-checkpoint")
    assert code == 2 and "the checkpoint changed since it was stored (usage_watermarks)" in stderr
    assert audit(bootstrap, scratch_database_url)[0] == 0  # a full replay replaces it
    assert audit(bootstrap, scratch_database_url, "--since-checkpoint")[0] == 0
