"""`ledgerlm infra up|down|status [--json]`."""
from __future__ import annotations

import argparse
import json
import time

from ledgerlm.cli.errors import CliError
from ledgerlm.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    infra = subparsers.add_parser("infra", help="local Kafka broker and PostgreSQL").add_subparsers(
        dest="action", required=True)
    for action, helptext in (("up", "start (idempotent) and wait until healthy"),
                             ("down", "stop what `up` started"),
                             ("status", "probe both services")):
        parser = infra.add_parser(action, help=helptext)
        parser.add_argument("--json", action="store_true", help="print JSON")
        parser.set_defaults(handler=run, action=action)


def run(args: argparse.Namespace) -> int:
    from infra.errors import InfraError
    from infra.services import LocalServices

    services = LocalServices(Settings())
    began = time.monotonic()
    try:
        if args.action == "up":
            services.up()
        elif args.action == "down":
            stopped = services.down()
            if not args.json:
                print(", ".join(f"{name}: {'stopped' if did else 'not running (or not ours)'}"
                                for name, did in stopped.items()))
                return 0
    except InfraError as exc:
        raise CliError(str(exc)) from exc
    status = services.status()
    if args.json:
        print(json.dumps(status))
    else:
        for name, info in status.items():
            where = info.get("bootstrap") or info.get("url")
            print(f"{name:9} {'up' if info['up'] else 'DOWN':5} {where}")
        if args.action == "up":
            print(f"ready in {time.monotonic() - began:.1f}s")
    healthy = all(info["up"] for info in status.values())
    return 0 if healthy or args.action == "down" else 1
