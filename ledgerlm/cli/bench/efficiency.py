"""`ledgerlm bench efficiency [--quick] --json PATH`: the platform beside its own engine, CPU per role per token."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from ledgerlm.cli.bench.capacity import MODEL, pulled_model
from ledgerlm.cli.errors import CliError
from plumbing.compute_threads import passive_compute_threads
from plumbing.settings import Settings


def register_efficiency(bench: argparse._SubParsersAction) -> None:
    efficiency = bench.add_parser("efficiency", help="streamed chats at 1, 4, 8, 16 through the platform (default "
                                                     "settings, the real model) vs the engine alone; CPU per role")
    efficiency.add_argument("--json", required=True, type=Path, help="where to write the report")
    efficiency.add_argument("--quick", action="store_true", help="levels 1,4 of 15 s, 5 s idle phases")
    efficiency.add_argument("--levels", help="concurrencies, e.g. 1,4,8,16 (the default)")
    efficiency.add_argument("--duration-s", type=float, help="seconds of load per level (default 45, quick 15)")
    efficiency.add_argument("--model-dir", type=Path,
                            help=f"model directory (default: {MODEL}, pulled once; a demo model hides per-second "
                                 "costs)")
    efficiency.add_argument("--markdown", type=Path, help="also write a dated Markdown page of the report here")
    efficiency.add_argument("--from-json", type=Path,
                            help="with --markdown: render the page of an earlier report instead of running")
    efficiency.set_defaults(handler=run)


def config_of(args: argparse.Namespace):
    from dataclasses import replace

    from bench.efficiency.run import QUICK, EfficiencyConfig

    config = QUICK if args.quick else EfficiencyConfig()
    if args.levels:
        try:
            levels = tuple(int(x) for x in args.levels.split(","))
        except ValueError:
            raise CliError(f"--levels: comma-separated integers, not {args.levels!r}") from None
        if not levels or min(levels) < 1:
            raise CliError("--levels: every concurrency must be at least 1")
        config = replace(config, levels=levels)
    if args.duration_s is not None:
        if args.duration_s <= 0:
            raise CliError("--duration-s must be positive")
        config = replace(config, duration_s=args.duration_s)
    return config


def run(args: argparse.Namespace) -> int:
    passive_compute_threads()  # before torch loads, inherited by the roles
    from bench.efficiency.page import efficiency_page
    from bench.efficiency.run import run_efficiency_bench

    if args.from_json is not None:
        if args.markdown is None:
            raise CliError("--from-json renders a page: give --markdown PATH too")
        args.markdown.write_text(efficiency_page(json.loads(args.from_json.read_text())))
        print(f"wrote {args.markdown}")
        return 0
    config = config_of(args)
    settings = Settings()
    model_dir = args.model_dir or pulled_model(settings)
    report = asyncio.run(run_efficiency_bench(model_dir, config, settings.home / "bench" / "efficiency"))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"comparison": [{k: row[k] for k in ("concurrency", "tok_s_ratio", "itl_p95_ratio",
                                                          "outside_engine_ms_per_output_token")}
                                     for row in report["comparison"]],
                      "idle_cores_before": report["idle_cores_before"], "idle_cores_after": report["idle_cores_after"],
                      "targets_met": report["targets_met"]}))
    print(f"wrote {args.json}")
    if args.markdown is not None:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(efficiency_page(report))
        print(f"wrote {args.markdown}")
    return 0
