"""`ledgerlm bench batch --json PATH`: a burst of batch generations on the real model; none may expire."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from ledgerlm.cli.bench.capacity import MODEL, pulled_model
from ledgerlm.cli.errors import CliError
from plumbing.compute_threads import passive_compute_threads
from plumbing.settings import Settings


def register_batch(bench: argparse._SubParsersAction) -> None:
    batch = bench.add_parser("batch", help="N batch generations posted at once by one tenant (default settings, "
                                           "the real model): completed, expired, engine busy, attempts per worker")
    batch.add_argument("--json", required=True, type=Path, help="where to write the report")
    batch.add_argument("--count", type=int, default=1000, help="batch generations in the burst (default 1000)")
    batch.add_argument("--output-tokens", type=int, default=4, help="maxOutputTokens of each (default 4)")
    batch.add_argument("--interactive", type=int, default=0,
                       help="closed-loop streamed chats beside the burst (default 0: none)")
    batch.add_argument("--interactive-s", type=float, default=90.0, help="how long the chats send (default 90)")
    batch.add_argument("--timeout-s", type=float, default=1800.0, help="give up waiting for outcomes after this")
    batch.add_argument("--model-dir", type=Path, help=f"model directory (default: {MODEL}, pulled once)")
    batch.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    passive_compute_threads()  # before torch loads, inherited by the roles
    from bench.batch import BatchConfig, run_batch_bench

    if args.count < 1 or args.output_tokens < 1 or args.interactive < 0 or args.timeout_s <= 0:
        raise CliError("--count and --output-tokens must be at least 1, --interactive at least 0, "
                       "--timeout-s positive")
    config = BatchConfig(count=args.count, output_tokens=args.output_tokens, interactive=args.interactive,
                         interactive_s=args.interactive_s, timeout_s=args.timeout_s)
    settings = Settings()
    model_dir = args.model_dir or pulled_model(settings)
    report = asyncio.run(run_batch_bench(model_dir, config, settings.home / "bench" / "batch"))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({key: report[key] for key in ("accepted", "outcomes", "last_end_s", "output_tok_s",
                                                   "engine_busy_share", "worker_attempts_max", "targets")}))
    print(f"wrote {args.json}")
    return 0
