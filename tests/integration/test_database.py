"""Alembic on a real PostgreSQL; sealed billing rows enforced by the database; offset compare-and-set."""
import uuid
from datetime import UTC, datetime

import psycopg
import pytest
from psycopg import errors

from migrations import runner
from projections.offsets import StaleOffset, advance, load_offsets

TABLES = {"alembic_version", "api_keys", "attempts", "billing_ledger", "generations", "model_versions",
          "projection_offsets", "refused_events", "stream_events", "stream_progress", "tenant_usage_hourly", "tenants",
          "usage_reconciliation", "usage_reports", "usage_watermarks", "statement_items", "billing_period_marks",
          "billing_periods", "statements", "statement_totals", "export_ledger", "export_offsets"}


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def test_upgrade_downgrade_upgrade(scratch_database):
    runner.upgrade(scratch_database)
    assert tables(scratch_database) == TABLES
    runner.downgrade(scratch_database, "base")
    assert tables(scratch_database) == {"alembic_version"}
    runner.upgrade(scratch_database)
    assert tables(scratch_database) == TABLES
    with psycopg.connect(scratch_database) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == ("0007",)


def test_bills_sealed_before_statements_existed_are_placed_in_the_period_of_their_seal(scratch_database):
    runner.upgrade(scratch_database, "0005")
    with psycopg.connect(scratch_database) as conn:
        gen = insert_sealed_row(conn)  # sealed 2026-01-01T00:00Z
    runner.upgrade(scratch_database)
    with psycopg.connect(scratch_database) as conn:
        assert conn.execute("SELECT tenant_id, period, belongs_to FROM statement_items WHERE generation_id = %s",
                            (gen,)).fetchone() == ("acme", "2026-01", "2026-01")


def test_migration_into_a_named_schema_leaves_public_alone(scratch_database):
    runner.upgrade(scratch_database, schema="shadow_1")
    assert tables(scratch_database) == set()
    with psycopg.connect(scratch_database) as conn:
        shadow = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'shadow_1'")}
    assert shadow == TABLES


def insert_sealed_row(conn) -> str:
    gen = f"gen-{uuid.uuid4().hex[:10]}"
    conn.execute(
        "INSERT INTO billing_ledger (generation_id, tenant_id, epoch, model_version, end_reason, usage_label, "
        "billed_input_tokens, billed_cached_input_tokens, billed_output_tokens, reserved_tokens, released_tokens, "
        "sealed_at) VALUES (%s, 'acme', 1, 'demo@1', 'interrupted', 'interrupted', 50, 0, 100, 300, 150, %s)",
        (gen, datetime(2026, 1, 1, tzinfo=UTC)))
    return gen


def test_sealed_billing_row_cannot_be_updated(conn):
    gen = insert_sealed_row(conn)
    with pytest.raises(errors.RestrictViolation, match="sealed"):
        conn.execute("UPDATE billing_ledger SET billed_output_tokens = 120 WHERE generation_id = %s", (gen,))
    row = conn.execute("SELECT billed_output_tokens FROM billing_ledger WHERE generation_id = %s", (gen,)).fetchone()
    assert row == (100,)


def test_sealed_billing_row_cannot_be_deleted_or_truncated(conn):
    gen = insert_sealed_row(conn)
    with pytest.raises(errors.RestrictViolation):
        conn.execute("DELETE FROM billing_ledger WHERE generation_id = %s", (gen,))
    with pytest.raises(errors.RestrictViolation):
        conn.execute("TRUNCATE billing_ledger")
    assert conn.execute("SELECT count(*) FROM billing_ledger WHERE generation_id = %s", (gen,)).fetchone() == (1,)


def test_offset_compare_and_set_refuses_a_stale_consumer(conn):
    projection = f"p-{uuid.uuid4().hex[:8]}"
    advance(conn, projection, "llm.generations", 3, None, 10)
    advance(conn, projection, "llm.generations", 3, 10, 17)
    with pytest.raises(StaleOffset):
        advance(conn, projection, "llm.generations", 3, 10, 12)  # a consumer that still believes 10
    with pytest.raises(StaleOffset):
        advance(conn, projection, "llm.generations", 3, None, 5)  # a consumer that saw no row
    assert load_offsets(conn, projection, "llm.generations") == {3: 17}


def test_stale_offset_rolls_back_the_rows_of_its_transaction(database_url):
    projection = f"p-{uuid.uuid4().hex[:8]}"
    tenant = f"t-{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url) as conn:
        advance(conn, projection, "llm.tenants", 0, None, 4)
        conn.commit()
        with pytest.raises(StaleOffset):
            with conn.transaction():
                conn.execute("INSERT INTO tenants VALUES (%s, %s, 1, 1, 1, 1, 1, now())", (tenant, tenant))
                advance(conn, projection, "llm.tenants", 0, 3, 5)
        assert conn.execute("SELECT count(*) FROM tenants WHERE tenant_id = %s", (tenant,)).fetchone() == (0,)


def test_0005_keeps_buffered_text_as_its_utf8_bytes_and_back(scratch_database):
    runner.upgrade(scratch_database, "0004")
    row = ("INSERT INTO stream_events (generation_id, epoch, seq, token_ids, text_delta, occurred_at) "
           "VALUES (%s, 1, 1, '{1}', %s, now())")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        conn.execute(row, ("g-1", "caf\u00e9 \U0001f30a"))
    runner.upgrade(scratch_database)
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert conn.execute("SELECT text_delta FROM stream_events").fetchone() == ("caf\u00e9 \U0001f30a".encode(),)
        conn.execute(row, ("g-2", b"a\x00b"))  # what text could not hold: dropped on the way down
    runner.downgrade(scratch_database, "0004")
    with psycopg.connect(scratch_database, autocommit=True) as conn:
        assert conn.execute("SELECT generation_id, text_delta FROM stream_events").fetchall() == [
            ("g-1", "caf\u00e9 \U0001f30a")]
