"""`ledgerlm db upgrade [REV] | downgrade [REV]` (alembic, psycopg 3)."""
from __future__ import annotations

import argparse

from ledgerlm.cli.endpoints import database_url
from ledgerlm.cli.errors import CliError
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    db = subparsers.add_parser("db", help="database migrations").add_subparsers(dest="action", required=True)
    up = db.add_parser("upgrade", help="migrate to REV (default head)")
    up.add_argument("revision", nargs="?", default="head")
    up.set_defaults(handler=run)
    down = db.add_parser("downgrade", help="migrate down to REV (default: one step, -1)")
    down.add_argument("revision", nargs="?", default="-1")
    down.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import SQLAlchemyError

    from migrations import runner

    url = database_url(Settings())
    try:
        if args.action == "upgrade":
            runner.upgrade(url, args.revision)
        else:
            runner.downgrade(url, args.revision)
    except SQLAlchemyError as exc:
        raise CliError(f"db {args.action} {args.revision} failed: {type(exc.orig or exc).__name__}: "
                       f"{str(exc.orig or exc).splitlines()[0]}") from None
    print(f"db {args.action} {args.revision}: done")
    return 0
