"""`ledgerlm models qualify NAME@V` and `ledgerlm models alias NAME VERSION=WEIGHT...`: controlled rollouts."""
from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from ledgerlm.cli.endpoints import kafka_access
from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


def add_rollout_parsers(models: argparse._SubParsersAction) -> None:
    qualify = models.add_parser("qualify", help="run a version's golden prompts (golden.json) and publish the "
                                                "outcome; exit 1 when one fails")
    qualify.add_argument("version", help="registered version, e.g. demo-tiny@1")
    qualify.add_argument("--model-dir", type=Path, help="where the files are, if not at the registered location")
    qualify.add_argument("--json", action="store_true")
    qualify.set_defaults(handler=run_qualify)

    alias = models.add_parser("alias", help="route a name to versions by weight (latest weights win; 0 drains)")
    alias.add_argument("alias", help="alias name (no '@')")
    alias.add_argument("weights", nargs="+", metavar="VERSION=WEIGHT", help="e.g. demo@1=90 demo@2=10")
    alias.add_argument("--json", action="store_true")
    alias.set_defaults(handler=run_alias)


def parse_weights(items: list[str]) -> dict[str, int]:
    weights: dict[str, int] = {}
    for item in items:
        version, sep, weight = item.rpartition("=")
        if not sep or not version or not weight.isdigit():
            raise CliError(f"{item!r}: expected VERSION=WEIGHT with a whole-number weight >= 0")
        if version in weights:
            raise CliError(f"{version!r} is named twice")
        weights[version] = int(weight)
    return weights


def run_qualify(args: argparse.Namespace) -> int:
    from engine.errors import EngineError
    from producers.model_rollout import RolloutError, qualify

    settings = Settings()
    try:
        result = asyncio.run(qualify(kafka_access(settings), args.version, settings, args.model_dir))
    except (RolloutError, EngineError) as exc:
        raise CliError(str(exc)) from None
    event, results = result.event, result.report.results
    if args.json:
        print(json.dumps({"modelVersion": event.model_version, "passed": event.passed, "prompts": event.prompts,
                          "failures": list(event.failures), "contentSha256": event.content_sha256,
                          "results": [{"name": r.name, "passed": r.passed, "expect": r.expect_kind,
                                       "outputChars": r.output_chars} for r in results]}))
    else:
        for r in results:
            print(f"{'pass' if r.passed else 'FAIL'}  {r.name} ({r.expect_kind}, {r.output_chars} chars out)")
        verdict = "qualified" if event.passed else f"NOT qualified ({len(event.failures)} failed)"
        print(f"{event.model_version} {verdict}: {event.prompts} golden prompts, content {event.content_sha256[:12]}")
    return 0 if event.passed else 1


def run_alias(args: argparse.Namespace) -> int:
    from producers.model_rollout import RolloutError, set_alias

    weights = parse_weights(args.weights)
    try:
        event = asyncio.run(set_alias(kafka_access(Settings()), args.alias, weights))
    except RolloutError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps({"alias": event.alias, "weights": event.weights, "setAt": event.set_at.isoformat()}))
    else:
        print(f"{event.alias} -> " + ", ".join(f"{v}={w}" for v, w in event.weights.items()))
    return 0
