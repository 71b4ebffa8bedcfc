"""Chaos: `ledgerlm export` killed with SIGKILL while a batch is at the sink, restarted, then replayed from offset
0: every sealed attempt is in the sink once, and `billing reconcile` finds nothing."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

from plumbing.settings import REPO_ROOT
from tests.projections.billing_doubles import BillingDouble
from projections.export import ledger
from tests.projections.export_helpers import caught_up, rewind, seal_generations, start_sinks_at_end
from tests.waiting import wait_until

SEALS = 60


def exporter_env(bootstrap: str, database_url: str, meter: BillingDouble, group: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO_ROOT), "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap,
            "LEDGERLM_DATABASE_URL": database_url, "LEDGERLM_OPENMETER_URL": meter.url,
            "LEDGERLM_EXPORT_GROUP": group, "LEDGERLM_EXPORT_BATCH_RECORDS": "40",
            "LEDGERLM_EXPORT_LAG_INTERVAL_S": "1"}


def start_exporter(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ledgerlm", "export", "--sink", "openmeter"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def reconcile_cli(env: dict[str, str]) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "ledgerlm", "billing", "reconcile", "--sink", "openmeter", "--json"],
                          env=env, capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout)


async def run_until_caught_up(env, conn) -> None:
    ends = ledger.projected_through(conn)  # what the exporter may pass (the log may grow meanwhile)
    process = start_exporter(env)
    try:
        def running_and_done():
            assert process.poll() is None, f"exporter exited: {process.stderr.read().decode()[-800:]}"
            return caught_up(conn, "openmeter", ends)

        # A restarted member first waits for the killed one's session to end (a group rebalance), then reads
        # what the suite's other roles wrote meanwhile: minutes on a loaded 2-core machine.
        await wait_until(running_and_done, 240, lambda _: f"the restarted exporter at "
                         f"{ledger.positions(conn, 'openmeter')}, the log's projected end {ends}", step_s=0.1)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(30)


async def test_exporter_killed_mid_batch_exports_every_seal_once(bootstrap, producer, project, projection_db,
                                                                 conn):
    await start_sinks_at_end(bootstrap, projection_db)
    began = ledger.positions(conn, "openmeter")
    _, ids = await seal_generations(producer, project, SEALS)
    expected = sorted(f"usage:{gid}:1" for gid in ids)
    meter = BillingDouble("openmeter").start()
    meter.hold_request = 3  # stored by the sink, never answered: the exporter dies between answer and commit
    env = exporter_env(bootstrap, projection_db, meter, f"test-export-chaos-{uuid.uuid4().hex[:8]}")
    try:
        victim = start_exporter(env)
        try:
            await wait_until(lambda: meter.held.is_set() or victim.poll() is not None, 180,
                             "the exporter's third batch at the sink", step_s=0.05)
            assert victim.poll() is None, victim.stderr.read().decode()[-800:]
            in_flight = set(meter.batches[-1])
            recorded_before = conn.execute("SELECT count(*) FROM export_ledger WHERE sink = 'openmeter'").fetchone()[0]
            victim.send_signal(signal.SIGKILL)
            victim.wait(10)
        finally:
            meter.release.set()
        assert 0 < recorded_before < SEALS and not in_flight & set(
            r[0] for r in conn.execute("SELECT record_id FROM export_ledger WHERE sink = 'openmeter'").fetchall())

        rc, report = reconcile_cli(env)
        assert (rc, {d["kind"] for d in report["differences"]}) == (1, {"missing"})
        assert len(report["differences"]) == SEALS - recorded_before

        await run_until_caught_up(env, conn)  # restart after the kill
        rewind(conn, "openmeter", began)
        deliveries = len(meter.deliveries)
        await run_until_caught_up(env, conn)  # every record again, from where the first run began

        assert meter.accepted_ids() == expected  # every seal is at the sink once
        assert len(meter.deliveries) == deliveries  # the replay sent nothing
        again = [i for i in meter.deliveries if meter.deliveries.count(i) > 1]
        assert set(again) <= in_flight  # only the unanswered batch went twice (same ids: deduplicated)
        assert sorted(set(meter.deliveries)) == expected
        assert reconcile_cli(env) == (0, {"sink": "openmeter", "differences": []})
    finally:
        meter.stop()
