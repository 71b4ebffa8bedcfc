"""`ledgerlm export --sink kafka|openmeter|stripe|lago`: one exporter of sealed usage (run N: a consumer group)."""
from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from ledgerlm.cli.endpoints import database_url, kafka_access
from plumbing.settings import Settings

SINK_NAMES = ("kafka", "openmeter", "stripe", "lago")  # projections/export/sinks/factory.py builds each


def register(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser("export", help="export sealed usage to a billing system, each seal once")
    export.add_argument("--sink", required=True, choices=SINK_NAMES)
    export.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    from ledgerlm.cli.roles import configure_logging
    from plumbing.telemetry.metrics import ExporterMetrics
    from plumbing.telemetry.server import RoleServer
    from projections.export.runtime import Exporter
    from projections.export.sinks.factory import make_sink

    configure_logging(f"export-{args.sink}")
    settings = Settings()
    kafka = kafka_access(settings)

    async def main() -> None:
        metrics = ExporterMetrics(args.sink)
        sink = make_sink(args.sink, settings, kafka, lambda _reason: metrics.retries.inc())
        exporter = Exporter(kafka, database_url(settings), sink, group_id=f"{settings.export_group}-{args.sink}",
                            source=settings.export_source, max_records=settings.export_batch_records,
                            metrics=metrics)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        http = RoleServer(f"export-{args.sink}", exporter.metrics.registry, exporter.readiness,
                          settings.metrics_host, settings.export_metrics_port)
        await http.start()
        try:
            stats = await exporter.run(stop, lag_every_s=settings.export_lag_interval_s)
        finally:
            await http.stop()
        logging.getLogger(__name__).info("exporter stopped sink=%s exported=%d dead_lettered=%d", args.sink,
                                         stats.exported, stats.dead_lettered)

    asyncio.run(main())
    return 0
