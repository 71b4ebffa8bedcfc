"""`ledgerlm controller`: the single writer of identity, budgets, epochs, routing and leases."""
from __future__ import annotations

import argparse

from ledgerlm.cli.endpoints import kafka_access
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("controller", help="run the controller (consumes llm.commands)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from consumers.controller.runtime import Controller
    from ledgerlm.cli.roles import configure_logging, serve

    configure_logging("controller")
    settings = Settings()
    return serve(Controller(settings, kafka_access(settings)).run())
