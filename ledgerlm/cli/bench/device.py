"""`ledgerlm bench device [--quick] --json PATH`: the prepared run for a lent accelerator (bench/device/run.py)."""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from ledgerlm.cli.errors import CliError
from plumbing.compute_threads import passive_compute_threads
from plumbing.settings import Settings

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "smollm2-135m-instruct.json"


def register_device(bench: argparse._SubParsersAction) -> None:
    device = bench.add_parser("device", help="environment, parity, decode vs roofline, prefill, KV sizing and the "
                                             "platform on the device (CUDA when present)")
    device.add_argument("--json", required=True, type=Path, help="where to write the report (after every section)")
    device.add_argument("--quick", action="store_true",
                        help="the tiny demo model and a small 8B-proportioned shape on the CPU, within 3 minutes")
    device.add_argument("--sections", help="comma-separated subset of environment,parity,decode,prefill,kv,platform "
                                           "(default: all; platform needs Kafka and PostgreSQL)")
    device.add_argument("--budget-s", type=float,
                        help="seconds after which the sections left are skipped (default 480, quick 170)")
    device.add_argument("--device", help="cpu, cuda or auto (default: auto; quick: cpu)")
    device.add_argument("--model-dir", type=Path,
                        help="the real model (default: SmolLM2 if imported under <home>/models, else a demo model)")
    device.set_defaults(handler=run)


def config_of(args: argparse.Namespace):
    from bench.device.run import QUICK, SECTION_NAMES, DeviceConfig

    config = QUICK if args.quick else DeviceConfig()
    if args.sections:
        sections = tuple(s.strip() for s in args.sections.split(",") if s.strip())
        unknown = sorted(set(sections) - set(SECTION_NAMES))
        if unknown or not sections:
            raise CliError(f"--sections: unknown {', '.join(unknown) or '(none given)'}; known: "
                           f"{', '.join(SECTION_NAMES)}")
        config = replace(config, sections=sections)
    if args.budget_s is not None:
        if args.budget_s <= 0:
            raise CliError("--budget-s must be positive")
        config = replace(config, budget_s=args.budget_s)
    if args.device:
        config = replace(config, device=args.device)
    return config


def run(args: argparse.Namespace) -> int:
    passive_compute_threads()  # before torch loads, inherited by the roles
    from bench.device.run import run_device_bench

    config = config_of(args)
    report = run_device_bench(config, args.json, Settings().home, args.model_dir, GOLDEN)
    sections = report["sections"]
    print(json.dumps({"sections": {name: ("skipped" if "skipped" in s else "error" if "error" in s else "ok")
                                   for name, s in sections.items()},
                      "real_model": report["real_model"]["name"], "targets_met": report["targets_met"],
                      "wall_s": report["wall_s"]}))
    print(f"wrote {args.json}")
    return 0
