"""`ledgerlm bench chaos --json PATH [--instances N] [--repeat N]`: faults under load on a 3-broker cluster; counts
that must all be 0, in every run, and the share of requests that failed (availability_error_fraction)."""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
from pathlib import Path

from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


def register_chaos(bench: argparse._SubParsersAction) -> None:
    chaos = bench.add_parser("chaos", help="kill workers, a broker, the projector, the exporter; restart "
                                           "PostgreSQL; rebuild the projections; inject usage reports; then "
                                           "count what went wrong")
    chaos.add_argument("--json", required=True, type=Path, help="where to write the report")
    chaos.add_argument("--model-dir", type=Path, help="model directory (default: the demo model of `up`)")
    chaos.add_argument("--rate", type=float, default=2.0, help="streaming clients started per second")
    chaos.add_argument("--generations", type=int, default=60, help="at least this many generations")
    chaos.add_argument("--output-tokens", type=int, default=48)
    chaos.add_argument("--gap-s", type=float, default=6.0, help="seconds between faults")
    chaos.add_argument("--broker-down-s", type=float, default=20.0, help="how long the killed broker stays down")
    chaos.add_argument("--instances", type=positive, default=1,
                       help="processes of each role; 2 or more also kills -9 one gateway and one controller")
    chaos.add_argument("--role-down-s", type=float, default=5.0,
                       help="how long a killed gateway or controller stays down (its replica serves)")
    chaos.add_argument("--faults", type=lambda text: tuple(text.split(",")),
                       help="comma-separated faults to run, in order (default: every fault the instances allow; the "
                            "load faults cpu_hog, worker_freeze, controller_freeze, broker_freeze only when named)")
    chaos.add_argument("--hog-s", type=float, default=20.0, help="cpu_hog: how long 2 busy processes per core run")
    chaos.add_argument("--worker-freeze-s", type=float, default=3.0,
                       help="worker_freeze: how long a worker stays SIGSTOPped (keep it under lease - heartbeat)")
    chaos.add_argument("--role-freeze-s", type=float, default=7.0,
                       help="controller_freeze, broker_freeze: how long the process stays SIGSTOPped")
    chaos.add_argument("--repeat", type=positive, default=1,
                       help="run the whole scenario this many times, each on a fresh stack; exit 1 if any run has a "
                            "non-zero count")
    chaos.set_defaults(handler=run)


def positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def run(args: argparse.Namespace) -> int:
    from bench.chaos.fleet import LoadFaultTimes
    from bench.chaos.repeat import failed, run_repeated
    from bench.chaos.run import ChaosConfig
    from engine.artifacts.demo_model import build_demo_model

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # a killed broker is the point of the run
    logging.getLogger("httpx").setLevel(logging.WARNING)
    # SIGTERM unwinds like Ctrl-C, so the run's own cluster, database and roles are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    settings = Settings()
    model_dir = args.model_dir or settings.home / "models" / "demo-tiny"
    if not (model_dir / "manifest.json").is_file():
        build_demo_model(model_dir, size="tiny", progress=False)
    try:
        config = ChaosConfig(home=settings.home / "chaos-stack", model_dir=model_dir, rate=args.rate,
                             min_generations=args.generations, output_tokens=args.output_tokens, gap_s=args.gap_s,
                             broker_down_s=args.broker_down_s, instances=args.instances, faults=args.faults,
                             role_down_s=args.role_down_s,
                             load_faults=LoadFaultTimes(args.hog_s, args.worker_freeze_s, args.role_freeze_s))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    result = asyncio.run(run_repeated(config, args.repeat))
    # One run: its report at the top level as before (plus the summary); several: {"summary", "runs"}.
    report = {**result["runs"][0], "summary": result["summary"]} if args.repeat == 1 else result
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(result["summary"]["totals"] | {
        "runs": args.repeat, "failed_runs": result["summary"]["failed_runs"],
        "availability_error_fraction": result["summary"]["availability_error_fraction"]}))
    print(f"wrote {args.json}")
    return 1 if any(failed(r) for r in result["runs"]) else 0
