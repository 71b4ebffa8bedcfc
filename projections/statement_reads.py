"""Reading a tenant's statement back (the CLI here, the gateway with the same SQL on its own pool).

A period that is not closed has no statement (None); a closed period in which a tenant was billed for
nothing has an empty one, so a tenant can tell "nothing billed" from "not closed yet".
"""
from __future__ import annotations

import psycopg

from projections.statement_lines import LineItem, ModelTotal, Statement, line_items_sha256

# Parameters: period.
PERIOD_SQL = "SELECT closed_at FROM billing_periods WHERE period = %s"
# Parameters: tenant id, period.
STATEMENT_SQL = ("SELECT generations, late_generations, line_items_sha256 FROM statements "
                 "WHERE tenant_id = %s AND period = %s")
TOTALS_SQL = ("SELECT model_version, meter, generations, quantity FROM statement_totals "
              "WHERE tenant_id = %s AND period = %s ORDER BY model_version, meter")
ITEMS_SQL = """
    SELECT b.generation_id, b.epoch, b.model_version, b.usage_label, b.end_reason, b.sealed_at, i.belongs_to,
           b.billed_input_tokens, b.billed_cached_input_tokens, b.billed_output_tokens
    FROM statement_items i JOIN billing_ledger b USING (generation_id)
    WHERE i.tenant_id = %s AND i.period = %s
    """


def totals_of(rows: list[tuple]) -> tuple[ModelTotal, ...]:
    """(model, meter, generations, quantity) rows, one per meter, as one total per model."""
    counts: dict[str, int] = {}
    quantities: dict[str, dict[str, int]] = {}
    for model, meter, generations, quantity in rows:
        counts[model] = generations
        quantities.setdefault(model, {})[meter] = quantity
    return tuple(ModelTotal(model, counts[model], quantities[model]) for model in sorted(counts))


def statement_from(tenant_id: str, period: str, period_row: tuple | None, statement_row: tuple | None,
                   totals: list[tuple], items: list[tuple] | None) -> Statement | None:
    """The statement as stored (None: the period is not closed); `items` None: line items not read."""
    if period_row is None:
        return None
    line_items = None if items is None else tuple(sorted((LineItem(*row) for row in items),
                                                         key=lambda item: item.generation_id))
    if statement_row is None:
        return Statement(tenant_id, period, period_row[0], 0, 0, line_items_sha256([]), (),
                         () if items is not None else None)
    generations, late, sha256 = statement_row
    return Statement(tenant_id, period, period_row[0], generations, late, sha256.strip(), totals_of(totals),
                     line_items)


def read_statement(conn: psycopg.Connection, tenant_id: str, period: str, with_items: bool) -> Statement | None:
    """Sync form for the CLI."""
    one = (tenant_id, period)
    return statement_from(
        tenant_id, period, conn.execute(PERIOD_SQL, (period,)).fetchone(),
        conn.execute(STATEMENT_SQL, one).fetchone(), conn.execute(TOTALS_SQL, one).fetchall(),
        conn.execute(ITEMS_SQL, one).fetchall() if with_items else None)
