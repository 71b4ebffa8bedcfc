"""`ledgerlm bench intake --json PATH [--quick]`: a batch published at once onto one tenant's intake topic."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from plumbing.settings import Settings


def register_intake(bench: argparse._SubParsersAction) -> None:
    intake = bench.add_parser("intake", help="N small requests at once on llm.requests.<tenant>: time to the last "
                                             "result, results/s, intake CPU per request, one result each")
    intake.add_argument("--json", required=True, type=Path, help="where to write the report")
    intake.add_argument("--requests", type=int, default=10_000)
    intake.add_argument("--quick", action="store_true", help="1,000 requests")
    intake.add_argument("--output-tokens", type=int, default=8)
    intake.add_argument("--budget", choices=("ample", "tight"), default="ample",
                        help="ample: the tenant's budget holds the whole batch; tight: 8 concurrent, paced by "
                             "Retry-After")
    intake.add_argument("--workers", type=int, default=1)
    intake.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for every result")
    intake.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from bench.intake import run_intake_bench
    from engine.artifacts.demo_model import build_demo_model

    settings = Settings()
    model_dir = settings.home / "models" / "demo-tiny"
    if not (model_dir / "manifest.json").is_file():
        build_demo_model(model_dir, size="tiny", progress=False)
    count = 1_000 if args.quick else args.requests
    report = asyncio.run(run_intake_bench(model_dir, count, args.output_tokens, args.budget, args.workers,
                                          settings.home / "bench" / "intake", args.timeout))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("requests", "time_to_last_result_s", "results_per_s",
                                             "exactly_one_result_each", "cpu_ms_per_request")}))
    print(f"wrote {args.json}")
    return 0 if report["exactly_one_result_each"] else 1
