"""`ledgerlm infra up [--brokers N]|down|status [--json]`, `infra kill-broker N`, `infra start-broker N`."""
from __future__ import annotations

import argparse
import json
import time

from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    infra = subparsers.add_parser("infra", help="local Kafka broker(s) and PostgreSQL").add_subparsers(
        dest="action", required=True)
    for action, helptext in (("up", "start (idempotent) and wait until healthy"),
                             ("down", "stop what `up` started"),
                             ("status", "probe both services")):
        parser = infra.add_parser(action, help=helptext)
        parser.add_argument("--json", action="store_true", help="print JSON")
        if action == "up":
            parser.add_argument("--brokers", type=int, default=None,
                                help="Kafka brokers: 1 (default) or a local KRaft cluster of 2..9")
        parser.set_defaults(handler=run, action=action)
    for action, helptext in (("kill-broker", "kill -9 broker N of the local cluster"),
                             ("start-broker", "(re)start broker N of the local cluster and wait for its port")):
        parser = infra.add_parser(action, help=helptext)
        parser.add_argument("index", type=int, help="broker number, 1-based")
        parser.set_defaults(handler=run_broker, action=action)


def run(args: argparse.Namespace) -> int:
    from infra.errors import InfraError
    from infra.services import LocalServices

    settings = Settings()
    if getattr(args, "brokers", None) is not None:
        settings = settings.model_copy(update={"kafka_brokers": args.brokers})
    services = LocalServices(settings)
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
            for broker in info.get("brokers", []):
                print(f"  broker {broker['id']} {'running' if broker['running'] else 'STOPPED'} :{broker['port']}")
        if args.action == "up":
            print(f"ready in {time.monotonic() - began:.1f}s")
    healthy = all(info["up"] for info in status.values())
    return 0 if healthy or args.action == "down" else 1


def run_broker(args: argparse.Namespace) -> int:
    from infra.errors import InfraError
    from infra.services import LocalServices

    services = LocalServices(Settings())
    try:
        if args.action == "kill-broker":
            killed = services.kill_broker(args.index)
            print(f"broker {args.index}: {'killed' if killed else 'not running'}")
        else:
            services.start_broker(args.index)
            print(f"broker {args.index}: running")
    except InfraError as exc:
        raise CliError(str(exc)) from exc
    return 0
