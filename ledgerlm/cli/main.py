"""`ledgerlm` console script: one entry point, one module per subcommand group.

Each module in COMMAND_MODULES exposes `register(subparsers)`, adding its
parser with `set_defaults(handler=fn)`; `fn(args) -> int` is the exit code.
Modules are imported lazily by name so `ledgerlm infra status` does not pay
for importing torch.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from ledgerlm.cli.errors import CliError

COMMAND_MODULES = (
    "ledgerlm.cli.infra_cmd",
    "ledgerlm.cli.topics_cmd",
    "ledgerlm.cli.db_cmd",
    "ledgerlm.cli.tenants_cmd",
    "ledgerlm.cli.docs_cmd",
    "ledgerlm.cli.models_cmd",
    "ledgerlm.cli.bench",
    "ledgerlm.cli.project_cmd",
    "ledgerlm.cli.billing_cmd",
    "ledgerlm.cli.export_cmd",
    "ledgerlm.cli.controller_cmd",
    "ledgerlm.cli.worker_cmd",
    "ledgerlm.cli.gateway_cmd",
    "ledgerlm.cli.intake_cmd",
    "ledgerlm.cli.submit_cmd",
    "ledgerlm.cli.up_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ledgerlm", description="Event-sourced LLM inference platform.")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except CliError as exc:
        print(f"ledgerlm: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
