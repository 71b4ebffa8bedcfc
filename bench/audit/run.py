"""`ledgerlm bench audit`: how fast `audit replay` verifies a day of traffic, full and since its checkpoint.

  1. N generations (~60 token events each) written as the stand-in worker writes them (traffic.py);
  2. the live projections catch up in a scratch database (the projector's own speed, for comparison);
  3. a full replay (from offset 0 of every topic: whatever else the broker holds is replayed too);
  4. 10 % more traffic, projected, then an incremental replay from the full replay's checkpoint.
Targets: full replay >= 20k records/s; the incremental one <= 15 % of the full one's time.
"""
from __future__ import annotations

import asyncio
import io
import time
import uuid

from bench.audit.traffic import write_traffic
from bench.projector import ScratchDatabase, timed_catch_up
from plumbing.kafka.clients import Kafka
from plumbing.settings import Settings
from projections.audit import audit_replay
from projections.registry import all_projections
from projections.runtime import Projector

TARGET_RECORDS_PER_S = 20000
TARGET_INCREMENTAL_SHARE = 0.15


async def project_live(kafka: Kafka, url: str, settings: Settings) -> dict:
    stats, seconds = await timed_catch_up(Projector(kafka, url, all_projections(settings)))
    applied = sum(stats.applied.values())
    return {"records": applied, "seconds": round(seconds, 3), "records_per_s": round(applied / seconds, 1),
            "refused": stats.refused}


async def timed_audit(kafka: Kafka, url: str, settings: Settings, since_checkpoint: bool) -> dict:
    progress = io.StringIO()
    report = await audit_replay(kafka, url, settings, since_checkpoint=since_checkpoint, progress=progress)
    summary = report.as_dict()
    summary.pop("tables")
    summary["progress_lines"] = len(progress.getvalue().splitlines())
    return summary


async def run_bench(kafka: Kafka, database_url: str, generations: int, tokens: int) -> dict:
    settings = Settings()
    tenant = f"bench-audit-{uuid.uuid4().hex[:6]}"
    with ScratchDatabase(database_url) as url:
        began = time.perf_counter()
        written = await write_traffic(kafka, generations, tokens, tenant)
        write_s = time.perf_counter() - began
        live = await project_live(kafka, url, settings)
        full = await timed_audit(kafka, url, settings, since_checkpoint=False)
        more = max(1, generations // 10)
        written_more = await write_traffic(kafka, more, tokens, tenant)
        live_more = await project_live(kafka, url, settings)
        incremental = await timed_audit(kafka, url, settings, since_checkpoint=True)
    share = incremental["total_seconds"] / full["total_seconds"]
    return {
        "machine": "2-core CPU shared with other work, local Kafka 4 (1 broker) + PostgreSQL 15",
        "traffic": {"generations": generations, "token_events_per_generation": tokens, "records": written,
                    "write_s": round(write_s, 2), "more_generations": more, "more_records": written_more},
        "live_projection": live, "live_projection_more": live_more,
        "full_replay": full, "incremental_replay": incremental,
        "incremental_share_of_full": round(share, 3),
        "targets": {"full_records_per_s": TARGET_RECORDS_PER_S, "incremental_share": TARGET_INCREMENTAL_SHARE},
        "full_target_met": (full["records_per_s"] or 0) >= TARGET_RECORDS_PER_S,
        "incremental_target_met": share <= TARGET_INCREMENTAL_SHARE,
        "clean": full["differences"] == 0 and incremental["differences"] == 0,
    }


def main(kafka: Kafka, database_url: str, generations: int, tokens: int) -> dict:
    return asyncio.run(run_bench(kafka, database_url, generations, tokens))
