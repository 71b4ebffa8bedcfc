"""`ledgerlm bench projector [--quick] --json PATH`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ledgerlm.cli.endpoints import database_url, kafka_access
from plumbing.settings import Settings


def register_projector(bench: argparse._SubParsersAction) -> None:
    projector = bench.add_parser("projector", help="projection throughput (stream, billing) and lag under load")
    projector.add_argument("--json", required=True, type=Path, help="where to write the report")
    projector.add_argument("--quick", action="store_true", help="smaller volumes (about half a minute)")
    projector.set_defaults(handler=run_projector_bench)


def run_projector_bench(args: argparse.Namespace) -> int:
    from bench.projector import main

    settings = Settings()
    report = main(settings, kafka_access(settings), database_url(settings), args.quick)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"stream_events_per_s": report["stream_projection"]["events_per_s"],
                      "billing_events_per_s": report["billing_projection"]["events_per_s"],
                      "lag_p95_ms": report["lag_under_load"]["lag_p95_ms"]}))
    return 0
