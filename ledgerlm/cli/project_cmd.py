"""`ledgerlm project [--only NAME ...] [--once] [--json]` and `ledgerlm audit replay [--since-checkpoint] [--json]`."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from ledgerlm.cli.endpoints import database_url, kafka_access
from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    project = subparsers.add_parser("project", help="run the Kafka -> Postgres projections")
    project.add_argument("--only", action="append", metavar="NAME",
                         help="run only this projection (repeatable): tenants, models, generations, stream")
    project.add_argument("--once", action="store_true", help="catch up to the current end of the log and exit")
    project.add_argument("--json", action="store_true", help="with --once: print applied counts as JSON")
    project.set_defaults(handler=run_project)

    audit = subparsers.add_parser("audit", help="audit the projections against the log").add_subparsers(
        dest="action", required=True)
    replay = audit.add_parser("replay", help="rebuild every projection from offset 0 in a shadow schema and diff")
    replay.add_argument("--json", action="store_true", help="print the summary as JSON (progress stays on stderr)")
    replay.add_argument("--since-checkpoint", action="store_true",
                        help="replay only what was appended since the last audit's checkpoint")
    replay.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    replay.set_defaults(handler=run_audit)


def run_project(args: argparse.Namespace) -> int:
    from plumbing.kafka.clients import make_producer
    from plumbing.kafka.dead_letters import DeadLetterRouter
    from plumbing.telemetry.server import RoleServer
    from projections.registry import select
    from projections.runtime import Projector

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = Settings()
    try:
        projections = select(settings, args.only)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    kafka = kafka_access(settings)

    async def main() -> dict:
        producer = make_producer(kafka)
        await producer.start()
        router = DeadLetterRouter(producer)
        projector = Projector(kafka, database_url(settings), projections, reject=router.refused_by_projection,
                              divert=router.decode_or_divert, group_id=settings.projector_group,
                              crash_after_batches=settings.projector_crash_after_batches,
                              metrics_path=settings.home / "metrics" / "projector.prom",
                              ready_lag=settings.projector_ready_lag)
        try:
            if args.once:
                stats = await projector.catch_up()
            else:
                stop = asyncio.Event()
                loop = asyncio.get_running_loop()
                for sig in (signal.SIGINT, signal.SIGTERM):
                    loop.add_signal_handler(sig, stop.set)
                http = RoleServer("projector", projector.metrics.registry, projector.readiness,
                                  settings.metrics_host, settings.projector_metrics_port)
                await http.start()
                try:
                    stats = await projector.run(stop, lag_every_s=settings.projector_lag_interval_s)
                finally:
                    await http.stop()
            return {"applied": stats.applied, "deadLettered": stats.dead_lettered, "refused": stats.refused,
                    "staleRefusals": stats.stale_refusals}
        finally:
            projector.close()
            await producer.stop()

    result = asyncio.run(main())
    if args.json:
        print(json.dumps(result))
    return 0


def run_audit(args: argparse.Namespace) -> int:
    from projections.audit import audit_replay
    from projections.audit_checkpoint import CheckpointUnusable

    settings = Settings()
    try:
        report = asyncio.run(audit_replay(kafka_access(settings), database_url(settings), settings,
                                          since_checkpoint=args.since_checkpoint,
                                          progress=None if args.quiet else sys.stderr))
    except CheckpointUnusable as exc:
        raise CliError(f"audit: {exc}") from None
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(f"replayed ({report.mode}): {report.replayed} in {report.replay_seconds:.1f} s; "
              f"live lag behind the log end: {report.lag}")
        for table, diff in report.as_dict()["tables"].items():
            print(f"{table}: {diff['live_only_count']} row(s) only live, {diff['shadow_only_count']} only in replay")
            for row in diff["live_only"]:
                print(f"  live   {row}")
            for row in diff["shadow_only"]:
                print(f"  replay {row}")
        print("audit: no difference" if report.differences == 0 else f"audit: {report.differences} difference(s)")
    return 0 if report.differences == 0 else 1
