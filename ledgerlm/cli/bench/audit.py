"""`ledgerlm bench audit [--generations N] [--tokens T] --json PATH`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ledgerlm.cli.endpoints import database_url, kafka_access
from plumbing.settings import Settings


def register_audit(bench: argparse._SubParsersAction) -> None:
    audit = bench.add_parser("audit", help="audit replay speed: full, and since its checkpoint after 10%% more traffic")
    audit.add_argument("--json", required=True, type=Path, help="where to write the report")
    audit.add_argument("--generations", type=int, default=2000)
    audit.add_argument("--tokens", type=int, default=60, help="token events per generation")
    audit.set_defaults(handler=run_audit_bench)


def run_audit_bench(args: argparse.Namespace) -> int:
    from bench.audit.run import main

    settings = Settings()
    report = main(kafka_access(settings), database_url(settings), args.generations, args.tokens)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"full_records_per_s": report["full_replay"]["records_per_s"],
                      "full_s": report["full_replay"]["total_seconds"],
                      "incremental_s": report["incremental_replay"]["total_seconds"],
                      "incremental_share_of_full": report["incremental_share_of_full"], "clean": report["clean"]}))
    return 0
