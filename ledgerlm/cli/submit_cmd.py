"""`ledgerlm submit --kafka FILE.jsonl --tenant T`: publish a batch onto the tenant's intake topic, wait for
every result, print a summary (and write the results as JSONL with --out)."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from ledgerlm.cli.endpoints import tenant_kafka_access
from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("submit", help="run a JSONL batch of requests through Kafka")
    parser.add_argument("--kafka", type=Path, required=True, metavar="FILE.jsonl",
                        help="one GenerationRequested per line (schemas/intake.py)")
    parser.add_argument("--tenant", required=True, help="the tenant whose llm.requests.<tenant> to publish to")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds to wait for every result")
    parser.add_argument("--out", type=Path, help="write every result as JSONL here")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(handler=run)


def progress(done: int, total: int) -> None:
    width = 30
    filled = width * done // max(total, 1)
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} results", end="", file=sys.stderr)


async def submit(kafka, tenant: str, path: Path, timeout_s: float) -> tuple[dict, dict]:
    from producers.intake.client import collect_results, publish_requests, read_jsonl, summarize

    try:
        requests = read_jsonl(path)
    except (OSError, ValueError) as exc:
        raise CliError(str(exc)) from None
    await publish_requests(kafka, tenant, requests)
    ids = {r["requestId"] for r in requests}
    results = await collect_results(kafka, tenant, ids, timeout_s, progress)
    print(file=sys.stderr)
    return results, summarize(results, len(ids))


def run(args: argparse.Namespace) -> int:
    settings = Settings()
    results, summary = asyncio.run(submit(tenant_kafka_access(settings, args.tenant), args.tenant, args.kafka, args.timeout))
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in results.values()))
    if args.json:
        print(json.dumps(summary))
    else:
        billed = summary["billed"]
        print(f"{summary['results']}/{summary['requests']} results: {summary['completed']} completed, "
              f"{summary['rejected']} rejected, {summary['interrupted']} interrupted; billed "
              f"{billed['inputTokens']} input + {billed['outputTokens']} output tokens")
    return 0 if summary["missing"] == 0 else 1
