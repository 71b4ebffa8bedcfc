"""`ledgerlm bench admission --json PATH`: admission latency and platform-vs-engine throughput."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from plumbing.settings import Settings


def register_admission(bench: argparse._SubParsersAction) -> None:
    admission = bench.add_parser("admission", help="POST -> decision latency at a fixed rate; Kafka vs engine tok/s")
    admission.add_argument("--json", required=True, type=Path, help="where to write the report")
    admission.add_argument("--model-dir", type=Path, help="model directory (default: the demo model of --size)")
    admission.add_argument("--size", choices=("tiny", "small"), default="small",
                           help="demo model built when --model-dir is not given (small: 30.9M parameters; on "
                                "tiny a generation is so cheap that fixed per-request costs are all one measures)")
    admission.add_argument("--rate", type=float, default=50.0, help="requests per second in the latency phase")
    admission.add_argument("--seconds", type=float, default=10.0)
    admission.add_argument("--requests", type=int, default=64, help="generations in the throughput phase")
    admission.add_argument("--output-tokens", type=int, default=128)
    admission.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from bench.admission import run_admission_bench
    from engine.artifacts.demo_model import build_demo_model

    settings = Settings()
    model_dir = args.model_dir or settings.home / "models" / ("demo-tiny" if args.size == "tiny" else args.size)
    if not (model_dir / "manifest.json").is_file():
        build_demo_model(model_dir, size=args.size, progress=False)
    report = asyncio.run(run_admission_bench(model_dir, args.rate, args.seconds, args.requests, args.output_tokens,
                                             settings.home / "bench" / "admission"))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"admission_latency_ms": report["admission"]["latency_ms"],
                      "throughput_ratio": report["throughput"]["ratio"]}))
    print(f"wrote {args.json}")
    return 0
