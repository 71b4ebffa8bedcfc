"""`ledgerlm billing close --period P`, `ledgerlm billing statement --tenant T --period P [--json|--csv]` and
`ledgerlm billing reconcile --sink S [--json]`.

Closing writes a `PeriodClosed` marker into every partition of `llm.generations` and waits for the
projector (`ledgerlm project`, or `ledgerlm up`) to make the statements; a statement is read from the
projection, so it is what `audit replay` rebuilds.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

from ledgerlm.cli.endpoints import database_url, kafka_access
from ledgerlm.cli.errors import CliError
from ledgerlm.cli.export_cmd import SINK_NAMES
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    billing = subparsers.add_parser("billing", help="billing periods and tenants' statements").add_subparsers(
        dest="action", required=True)
    close = billing.add_parser("close", help="close a calendar month: every tenant's statement, fixed for good")
    close.add_argument("--period", required=True, help="YYYY-MM (UTC); the month must have ended")
    close.add_argument("--wait-s", type=float, default=60.0, help="how long to wait for the projector")
    close.add_argument("--json", action="store_true")
    close.set_defaults(handler=run_close)
    statement = billing.add_parser("statement", help="a tenant's statement of a closed period")
    statement.add_argument("--tenant", required=True, help="tenant id")
    statement.add_argument("--period", required=True, help="YYYY-MM")
    shape = statement.add_mutually_exclusive_group()
    shape.add_argument("--json", action="store_true", help="the statement with its line items as JSON")
    shape.add_argument("--csv", action="store_true", help="the line items as CSV")
    statement.set_defaults(handler=run_statement)
    reconcile = billing.add_parser("reconcile", help="a sink's export ledger against the sealed bills")
    reconcile.add_argument("--sink", required=True, choices=SINK_NAMES)
    reconcile.add_argument("--json", action="store_true")
    reconcile.set_defaults(handler=run_reconcile)


NOT_MIGRATED = "the database has no statements tables: run `ledgerlm db upgrade`"


def run_close(args: argparse.Namespace) -> int:
    import psycopg

    from producers.billing_close import PeriodNotClosable, close_period

    settings = Settings()
    try:
        closed, before = asyncio.run(close_period(kafka_access(settings), database_url(settings), args.period,
                                                  args.wait_s))
    except PeriodNotClosable as exc:
        raise CliError(str(exc)) from None
    except psycopg.errors.UndefinedTable:
        raise CliError(NOT_MIGRATED) from None
    if closed is None:
        print(f"billing close {args.period}: markers written; no statements after {args.wait_s:.0f}s: is the "
              "projector running (`ledgerlm project`)? Run this again to wait (nothing is written twice).",
              file=sys.stderr)
        return 1
    summary = {"period": closed.period, "closedAt": closed.closed_at.isoformat(), "alreadyClosed": before,
               "tenants": closed.tenants, "generations": closed.generations, "partitions": closed.partitions}
    if args.json:
        print(json.dumps(summary))
    else:
        how = "was already closed" if before else "closed"
        print(f"period {closed.period} {how} at {closed.closed_at.isoformat()}: {closed.tenants} tenant "
              f"statements, {closed.generations} generations ({closed.partitions} partitions)")
    return 0


def run_statement(args: argparse.Namespace) -> int:
    import psycopg

    from projections.periods import Period, PeriodError
    from projections.statement_lines import statement_csv
    from projections.statement_reads import read_statement

    try:
        period = str(Period.parse(args.period))
    except PeriodError as exc:
        raise CliError(str(exc)) from None
    with psycopg.connect(database_url(Settings()), autocommit=True) as conn:
        try:
            statement = read_statement(conn, args.tenant, period, with_items=args.json or args.csv)
        except psycopg.errors.UndefinedTable:
            raise CliError(NOT_MIGRATED) from None
    if statement is None:
        raise CliError(f"period {period} is not closed (`ledgerlm billing close --period {period}`)")
    if args.csv:
        sys.stdout.write(statement_csv(statement.items))
    elif args.json:
        print(json.dumps(statement.as_json()))
    else:
        print("\n".join(describe(statement.as_json())))
    return 0


def describe(doc: dict) -> list[str]:
    """The statement for a terminal: totals per model version, then the hash."""
    lines = [f"statement of {doc['tenantId']} for {doc['period']} (closed {doc['closedAt']})",
             f"generations {doc['generations']} (sealed after their own period closed: {doc['lateGenerations']})",
             f"{'model':<32} {'generations':>11} {'input':>12} {'cached input':>12} {'output':>12}"]
    lines += [f"{m['model']:<32} {m['generations']:>11} {m['inputTokens']:>12} {m['cachedInputTokens']:>12} "
              f"{m['outputTokens']:>12}" for m in doc["models"]]
    totals = doc["totals"]
    lines += [f"{'total':<32} {doc['generations']:>11} {totals['inputTokens']:>12} {totals['cachedInputTokens']:>12} "
              f"{totals['outputTokens']:>12}", f"line items sha256 {doc['lineItemsSha256']}"]
    return lines


def run_reconcile(args: argparse.Namespace) -> int:
    """Exit 0 when the sink's ledger holds every seal, acknowledged and as sealed; 1 with each difference."""
    import psycopg

    from projections.export.reconcile import reconcile

    with psycopg.connect(database_url(Settings()), autocommit=True) as conn:
        try:
            differences = reconcile(conn, args.sink)
        except psycopg.errors.UndefinedTable:
            raise CliError(NOT_MIGRATED) from None
    if args.json:
        print(json.dumps({"sink": args.sink, "differences": [d.as_json() for d in differences]}))
    else:
        for d in differences:
            print(f"{d.kind:<14} {d.generation_id}  {d.detail}")
        print(f"reconcile {args.sink}: {len(differences)} difference(s)")
    return 0 if not differences else 1
