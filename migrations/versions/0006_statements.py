"""Closed billing periods and tenants' statements, all projected from `llm.generations`.

    statement_items       each sealed generation: the period it is billed in and the one it belongs to
    billing_period_marks  the PeriodClosed marker seen in each partition (first per period and partition)
    billing_periods       a period whose markers are all seen: closed, its statements made
    statements            per tenant and closed period: generations, late ones, the line items' sha256
    statement_totals      per tenant, period, model version and meter: the quantity

Every row is written once and never changed (the same trigger as the sealed bills). Bills sealed before
this revision are placed in the period of their seal: no period was closed then.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02
"""
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

PERIOD = "text NOT NULL CHECK ({0} ~ '^[0-9]{{4}}-[0-9]{{2}}$')"
WRITTEN_ONCE = ("statement_items", "billing_period_marks", "billing_periods", "statements", "statement_totals")

UPGRADE = f"""
CREATE TABLE statement_items (
    generation_id  text PRIMARY KEY,
    tenant_id      text NOT NULL,
    period         {PERIOD.format("period")},
    belongs_to     {PERIOD.format("belongs_to")}
);
CREATE INDEX statement_items_period ON statement_items (period, tenant_id);

CREATE TABLE billing_period_marks (
    period      {PERIOD.format("period")},
    partition   integer NOT NULL CHECK (partition >= 0),
    partitions  integer NOT NULL CHECK (partitions > partition),
    close_id    uuid NOT NULL,
    closed_at   timestamptz NOT NULL,
    PRIMARY KEY (period, partition)
);

CREATE TABLE billing_periods (
    period       text PRIMARY KEY CHECK (period ~ '^[0-9]{{4}}-[0-9]{{2}}$'),
    closed_at    timestamptz NOT NULL,
    partitions   integer NOT NULL CHECK (partitions > 0),
    tenants      integer NOT NULL CHECK (tenants >= 0),
    generations  bigint  NOT NULL CHECK (generations >= 0)
);

CREATE TABLE statements (
    tenant_id          text NOT NULL,
    period             {PERIOD.format("period")},
    closed_at          timestamptz NOT NULL,
    generations        bigint NOT NULL CHECK (generations >= 0),
    late_generations   bigint NOT NULL CHECK (late_generations >= 0),
    line_items_sha256  char(64) NOT NULL,
    PRIMARY KEY (tenant_id, period)
);

CREATE TABLE statement_totals (
    tenant_id      text NOT NULL,
    period         {PERIOD.format("period")},
    model_version  text NOT NULL,
    meter          text NOT NULL CHECK (meter IN ('input_tokens', 'cached_input_tokens', 'output_tokens')),
    generations    bigint NOT NULL CHECK (generations >= 0),
    quantity       bigint NOT NULL CHECK (quantity >= 0),
    PRIMARY KEY (tenant_id, period, model_version, meter)
);

CREATE FUNCTION rows_written_once() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% rows are written once: % refused', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;
""" + "".join(f"""
CREATE TRIGGER {table}_written_once BEFORE UPDATE OR DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION rows_written_once();
CREATE TRIGGER {table}_written_once_table BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION rows_written_once();
""" for table in WRITTEN_ONCE) + """
INSERT INTO statement_items (generation_id, tenant_id, period, belongs_to)
SELECT generation_id, tenant_id, to_char(sealed_at AT TIME ZONE 'UTC', 'YYYY-MM'),
       to_char(sealed_at AT TIME ZONE 'UTC', 'YYYY-MM')
FROM billing_ledger;
"""

DOWNGRADE = """
DROP TABLE statement_totals;
DROP TABLE statements;
DROP TABLE billing_periods;
DROP TABLE billing_period_marks;
DROP TABLE statement_items;
DROP FUNCTION rows_written_once();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    # Statements are projections of the log: dropping them loses nothing a replay cannot rebuild.
    op.execute(DOWNGRADE)
