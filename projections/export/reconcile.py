"""`billing reconcile --sink S`: the sink's ledger against the sealed bills, both ways.

    missing        sealed, and the sink has answered nothing for it (not exported yet, or lost)
    dead-lettered  the sink refused it; its reason
    different      the ledger's id or meters are not the seal's
    unknown        in the ledger, but no such seal
"""
from __future__ import annotations

from dataclasses import dataclass

import psycopg


@dataclass(frozen=True)
class Difference:
    kind: str
    generation_id: str
    detail: str

    def as_json(self) -> dict:
        return {"kind": self.kind, "generationId": self.generation_id, "detail": self.detail}


RECONCILE_SQL = """
    SELECT CASE WHEN e.generation_id IS NULL THEN 'missing'
                WHEN b.generation_id IS NULL THEN 'unknown'
                WHEN e.outcome = 'dead-lettered' THEN 'dead-lettered'
                ELSE 'different' END,
           COALESCE(b.generation_id, e.generation_id),
           CASE WHEN e.generation_id IS NULL THEN 'sealed at ' || to_char(b.sealed_at AT TIME ZONE 'UTC',
                                                                         'YYYY-MM-DD"T"HH24:MI:SS"Z"')
                WHEN b.generation_id IS NULL THEN 'exported as ' || e.record_id
                WHEN e.outcome = 'dead-lettered' THEN COALESCE(e.reason, '')
                ELSE format('sealed epoch %%s meters %%s/%%s/%%s, exported epoch %%s meters %%s/%%s/%%s',
                            COALESCE(b.epoch, 0), b.billed_input_tokens, b.billed_cached_input_tokens,
                            b.billed_output_tokens, e.epoch, e.billed_input_tokens,
                            e.billed_cached_input_tokens, e.billed_output_tokens) END
    FROM billing_ledger b
    FULL JOIN (SELECT * FROM export_ledger WHERE sink = %(sink)s) e ON e.generation_id = b.generation_id
    WHERE e.generation_id IS NULL OR b.generation_id IS NULL OR e.outcome = 'dead-lettered'
       OR e.epoch <> COALESCE(b.epoch, 0) OR e.tenant_id <> b.tenant_id
       OR e.billed_input_tokens <> b.billed_input_tokens
       OR e.billed_cached_input_tokens <> b.billed_cached_input_tokens
       OR e.billed_output_tokens <> b.billed_output_tokens
    ORDER BY 2
"""


def reconcile(conn: psycopg.Connection, sink: str) -> list[Difference]:
    return [Difference(*row) for row in conn.execute(RECONCILE_SQL, {"sink": sink}).fetchall()]
