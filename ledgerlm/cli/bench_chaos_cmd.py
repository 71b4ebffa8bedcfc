"""`ledgerlm bench chaos --json PATH`: faults under load on a 3-broker cluster; counts that must all be 0."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from pathlib import Path

from plumbing.settings import Settings

ZERO_KEYS = ("stuck", "audit_differences", "overbilled", "duplicate_seqs", "missing_seqs", "unreleased_reservations",
             "lost_events")


def register_chaos(bench: argparse._SubParsersAction) -> None:
    chaos = bench.add_parser("chaos", help="kill workers, a broker, the projector; restart PostgreSQL; rebuild the "
                                           "projections; inject usage reports; then count what went wrong")
    chaos.add_argument("--json", required=True, type=Path, help="where to write the report")
    chaos.add_argument("--model-dir", type=Path, help="model directory (default: the demo model of `up`)")
    chaos.add_argument("--rate", type=float, default=2.0, help="streaming clients started per second")
    chaos.add_argument("--generations", type=int, default=60, help="at least this many generations")
    chaos.add_argument("--output-tokens", type=int, default=48)
    chaos.add_argument("--gap-s", type=float, default=6.0, help="seconds between faults")
    chaos.add_argument("--broker-down-s", type=float, default=20.0, help="how long the killed broker stays down")
    chaos.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from bench.chaos_bench import ChaosConfig, run_chaos_bench
    from engine.demo_model import build_demo_model

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # a killed broker is the point of the run
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # SIGTERM unwinds like Ctrl-C, so the run's own cluster, database and roles are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    settings = Settings()
    model_dir = args.model_dir or settings.home / "models" / "demo-tiny"
    if not (model_dir / "manifest.json").is_file():
        build_demo_model(model_dir, size="tiny", progress=False)
    config = ChaosConfig(home=settings.home / "chaos-stack", model_dir=model_dir, rate=args.rate,
                         min_generations=args.generations, output_tokens=args.output_tokens, gap_s=args.gap_s,
                         broker_down_s=args.broker_down_s)
    report = asyncio.run(run_chaos_bench(config))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({key: report[key] for key in ZERO_KEYS}))
    print(f"wrote {args.json}")
    return 0 if all(report[key] == 0 for key in ZERO_KEYS) else 1
