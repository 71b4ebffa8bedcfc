"""The audit's checkpoint: the replayed (shadow) state of the last audit, kept for the next incremental one.

    schema audit_checkpoint
      <every projected table>   the replay of the log up to its own projection_offsets (rows and offsets
                                 committed together, as any projection's)
      audit_checkpoint_hashes    per table: its row count, the hash of its compared rows, and the
                                 transaction that stored it

The replayed state is a function of the log alone, never of what live holds, so it is kept whether or not
that audit found differences (a tampered live row differs again at the next audit). Before an incremental
audit continues the replay from these offsets, the checkpoint is checked untouched since it was stored
(row counts, and no row written by a later transaction): one changed by hand, or by an audit killed
mid-replay, is refused and a full replay is needed.
"""
from __future__ import annotations

import psycopg

from projections.audit_compare import TableHash

SCHEMA = "audit_checkpoint"


class CheckpointUnusable(Exception):
    """There is no checkpoint to continue from, or it cannot be trusted: run a full `audit replay`."""


def exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (SCHEMA,)).fetchone() is not None


def verify(conn: psycopg.Connection, tables: list[str]) -> None:
    """Raise CheckpointUnusable unless no row of the checkpoint was written after it was stored.

    Every write leaves its transaction id on the row (`xmin`), a delete changes the count: a count and
    the youngest row's age per table prove the checkpoint untouched without hashing it again (the hash
    pass is the costly part of an incremental audit). Freezing makes a row older, never younger."""
    revision = f'SELECT version_num FROM "{SCHEMA}".alembic_version'
    if conn.execute(revision).fetchall() != conn.execute("SELECT version_num FROM public.alembic_version").fetchall():
        raise CheckpointUnusable("the checkpoint is of another schema revision; run a full `audit replay`")
    stored = {table: (rows, by) for table, rows, by in conn.execute(
        f'SELECT table_name, rows, age(stored_by::xid) FROM "{SCHEMA}".audit_checkpoint_hashes').fetchall()}
    changed = []
    for table in tables:
        rows, youngest = conn.execute(f'SELECT count(*), min(age(xmin)) FROM "{SCHEMA}".{table}').fetchone()
        if table not in stored or rows != stored[table][0] or (youngest is not None and youngest < stored[table][1]):
            changed.append(table)
    if changed:
        raise CheckpointUnusable(f"the checkpoint changed since it was stored ({', '.join(sorted(changed))}); "
                                 "run a full `audit replay`")


def store(conn: psycopg.Connection, shadow: str, hashes: dict[str, TableHash]) -> None:
    """Make `shadow` the checkpoint (replacing the previous one) with its hashes and row counts; commits."""
    with conn.transaction():
        if shadow != SCHEMA:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
            conn.execute(f'ALTER SCHEMA "{shadow}" RENAME TO "{SCHEMA}"')
        conn.execute(f'DROP TABLE IF EXISTS "{SCHEMA}".audit_checkpoint_hashes')
        conn.execute(f'CREATE TABLE "{SCHEMA}".audit_checkpoint_hashes (table_name text PRIMARY KEY, '
                     "rows bigint NOT NULL, digest numeric NOT NULL, stored_by xid8 NOT NULL)")
        counts = {t: conn.execute(f'SELECT count(*) FROM "{SCHEMA}".{t}').fetchone()[0] for t in hashes}
        with conn.cursor() as cur:
            cur.executemany(f'INSERT INTO "{SCHEMA}".audit_checkpoint_hashes '
                            "VALUES (%s, %s, %s, pg_current_xact_id())",
                            [(table, counts[table], h.digest) for table, h in hashes.items()])
