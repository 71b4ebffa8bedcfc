"""`ledgerlm bench stream [--quick] [--gateways N] --json PATH`: SSE fan-out throughput and worker-append ->
client latency; with `--gateways N`, gateway CPU with one gateway, N sharing the stream, and N reading all of it."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from plumbing.settings import Settings


def register_stream(bench: argparse._SubParsersAction) -> None:
    stream = bench.add_parser("stream", help="100 SSE clients: token events/s delivered, append->receive latency")
    stream.add_argument("--json", required=True, type=Path, help="where to write the report")
    stream.add_argument("--quick", action="store_true", help="a 5 s load (about 20 s in all)")
    stream.add_argument("--clients", type=int, default=100, help="concurrent SSE clients (one generation each)")
    stream.add_argument("--rate", type=int, default=20000, help="token events per second published in total")
    stream.add_argument("--seconds", type=float, help="length of the load (default 20, --quick 5)")
    stream.add_argument("--gateways", type=int, default=1,
                        help="N > 1: compare one gateway, N sharing the partitions and N reading everything")
    stream.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from bench.stream.run import run_stream_bench

    seconds = args.seconds or (5.0 if args.quick else 20.0)
    if args.gateways > 1:
        return run_gateways(args, seconds)
    report = asyncio.run(run_stream_bench(args.clients, args.rate, seconds, Settings().home / "bench" / "stream"))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"delivered_events_per_s": report["delivered"]["events_per_s"],
                      "latency_ms": report["latency_ms"], "targets": report["targets"]}))
    print(f"wrote {args.json}")
    return 0


def run_gateways(args: argparse.Namespace, seconds: float) -> int:
    from bench.stream.gateways import run_gateways_bench

    report = asyncio.run(run_gateways_bench(args.clients, args.rate, seconds, args.gateways,
                                            Settings().home / "bench" / "stream-gateways"))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"summary": report["summary"], "skip_cost": report["skip_cost"], "targets": report["targets"]}))
    print(f"wrote {args.json}")
    return 0
