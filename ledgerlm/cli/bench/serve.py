"""`ledgerlm bench serve [--quick] --json PATH [--plots DIR]`: mixed multi-tenant load vs transformers serve."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from plumbing.compute_threads import passive_compute_threads
from plumbing.settings import Settings

MODEL_SIZE = "mini"  # 4.9M parameters, an 8,192-token context: long documents are 4,000 + 600 tokens


def register_serve(bench: argparse._SubParsersAction) -> None:
    serve = bench.add_parser("serve", help="interactive SLOs under mixed multi-tenant load, vs transformers serve")
    serve.add_argument("--json", required=True, type=Path, help="where to write the report")
    serve.add_argument("--quick", action="store_true", help="short phases: ends within 3 minutes")
    serve.add_argument("--plots", type=Path, help="directory for PNGs (latency CDFs, KV/queue, token shares)")
    serve.add_argument("--model-dir", type=Path,
                       help=f"model directory (default: <home>/models/{MODEL_SIZE}, the {MODEL_SIZE} demo model, "
                            "built if missing)")
    serve.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    passive_compute_threads()  # before torch loads, inherited by the roles
    from bench.serve.run import run_serve_bench
    from engine.artifacts.demo_model import build_demo_model

    settings = Settings()
    model_dir = args.model_dir or settings.home / "models" / MODEL_SIZE
    if not (model_dir / "manifest.json").is_file():
        build_demo_model(model_dir, size=MODEL_SIZE, progress=False)
    report = asyncio.run(run_serve_bench(model_dir, args.quick, settings.home / "bench" / "serve", args.plots))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("goodput_ratio_vs_transformers_serve",
                                             "capacity_ratio_vs_transformers_serve", "ratio_note", "wall_s")}))
    print(f"wrote {args.json}")
    return 0
