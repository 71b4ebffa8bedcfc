"""The audit's checkpoint: the replayed (shadow) state of the last audit, kept for the next incremental one.

    schema audit_checkpoint
      <every projected table>   the replay of the log up to its own projection_offsets (rows and offsets
                                 committed together, as any projection's)
      audit_checkpoint_hashes    per table: rows and hash of the compared rows when the audit stored it

The replayed state is a function of the log alone, never of what live holds, so it is kept whether or not
that audit found differences (a tampered live row differs again at the next audit). Before an incremental
audit continues the replay from these offsets, the stored hashes are checked: a checkpoint changed since
it was stored (by hand, or by an audit killed mid-replay) is refused and a full replay is needed.
"""
from __future__ import annotations

import psycopg

from projections.audit_compare import TableHash

SCHEMA = "audit_checkpoint"


class CheckpointUnusable(Exception):
    """There is no checkpoint to continue from, or it cannot be trusted: run a full `audit replay`."""


def exists(conn: psycopg.Connection) -> bool:
    return conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (SCHEMA,)).fetchone() is not None


def verify(conn: psycopg.Connection, hashes: dict[str, TableHash]) -> None:
    """Raise CheckpointUnusable unless the checkpoint's tables still hash as stored, at live's schema revision."""
    revision = f'SELECT version_num FROM "{SCHEMA}".alembic_version'
    if conn.execute(revision).fetchall() != conn.execute("SELECT version_num FROM public.alembic_version").fetchall():
        raise CheckpointUnusable("the checkpoint is of another schema revision; run a full `audit replay`")
    stored = {table: TableHash(rows, int(digest)) for table, rows, digest in
              conn.execute(f'SELECT table_name, rows, digest FROM "{SCHEMA}".audit_checkpoint_hashes').fetchall()}
    changed = sorted(t for t in hashes if stored.get(t) != hashes[t])
    if changed:
        raise CheckpointUnusable(f"the checkpoint changed since it was stored ({', '.join(changed)}); "
                                 "run a full `audit replay`")


def store(conn: psycopg.Connection, shadow: str, hashes: dict[str, TableHash]) -> None:
    """Make `shadow` the checkpoint (replacing the previous one) with its hashes; commits."""
    with conn.transaction():
        if shadow != SCHEMA:
            conn.execute(f'DROP SCHEMA IF EXISTS "{SCHEMA}" CASCADE')
            conn.execute(f'ALTER SCHEMA "{shadow}" RENAME TO "{SCHEMA}"')
        conn.execute(f'CREATE TABLE IF NOT EXISTS "{SCHEMA}".audit_checkpoint_hashes '
                     "(table_name text PRIMARY KEY, rows bigint NOT NULL, digest numeric NOT NULL)")
        conn.execute(f'TRUNCATE "{SCHEMA}".audit_checkpoint_hashes')
        with conn.cursor() as cur:
            cur.executemany(f'INSERT INTO "{SCHEMA}".audit_checkpoint_hashes VALUES (%s, %s, %s)',
                            [(table, h.rows, h.digest) for table, h in hashes.items()])
