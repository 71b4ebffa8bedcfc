"""`ledgerlm bench capacity [--quick] --json PATH [--plots DIR]`: closed-loop chat at rising concurrency."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from ledgerlm.cli.errors import CliError
from plumbing.compute_threads import passive_compute_threads
from plumbing.settings import Settings

MODEL = "smollm2-135m-instruct"


def register_capacity(bench: argparse._SubParsersAction) -> None:
    capacity = bench.add_parser("capacity", help="closed-loop streamed chat at rising concurrency (default settings) "
                                                 "vs transformers serve and the engine alone")
    capacity.add_argument("--json", required=True, type=Path, help="where to write the report")
    capacity.add_argument("--quick", action="store_true", help="levels 1,4,16 of 15 s, mix a: about 3.5 minutes")
    capacity.add_argument("--plots", type=Path, help="directory for PNGs (tok/s and p95 TTFT vs concurrency)")
    capacity.add_argument("--levels", help="concurrencies, e.g. 1,2,4,8,16,32 (the default)")
    capacity.add_argument("--duration-s", type=float, help="seconds per level (default 60, --quick 15)")
    capacity.add_argument("--servers", help="ledgerlm,transformers,engine (the default: all three)")
    capacity.add_argument("--mixes", help="a (max_tokens 64, ignore_eos), b (to EOS); default a,b (--quick: a)")
    capacity.add_argument("--engine-levels", choices=("saturation", "all"),
                          help="run the engine alone at ledgerlm's saturation only (the default) or every level")
    capacity.add_argument("--model-dir", type=Path, help=f"model directory (default: {MODEL}, pulled once)")
    capacity.add_argument("--client", choices=("builtin", "guidellm"), default="builtin",
                          help="who drives ledgerlm's levels: the bench's own closed loop, or guidellm unmodified "
                               "(levels 1,2,4,8,16, 128-token prompts, 64 output tokens, the engine alone at each)")
    capacity.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    passive_compute_threads()  # before torch loads, inherited by the roles
    from bench.capacity.run import configure, run_capacity_bench

    try:
        config = configure(args.quick, args.levels, args.duration_s, args.servers, args.mixes, args.engine_levels,
                           args.client)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    settings = Settings()
    model_dir = args.model_dir or pulled_model(settings)
    report = asyncio.run(run_capacity_bench(model_dir, config, settings.home / "bench" / "capacity", args.plots))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    shown = ("saturation", "ratios", "targets_met", "wall_s", "guidellm")
    print(json.dumps({k: report[k] for k in shown if k in report}))
    print(f"wrote {args.json}")
    return 0


def pulled_model(settings: Settings) -> Path:
    from engine.errors import ArtifactError
    from ledgerlm.model_pull import PullError, pull

    try:
        return pull(MODEL, settings.home, lambda msg: print(msg, flush=True))[1].model_dir
    except (PullError, ArtifactError) as exc:
        raise CliError(f"{MODEL}: {exc}") from None
