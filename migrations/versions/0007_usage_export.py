"""Export of sealed usage to billing systems (`ledgerlm export --sink S`).

    tenants.billing  who the tenant is in the billing systems (Stripe customer, Lago subscription), from
                     `TenantRegistered.billing`
    export_ledger    per sink and sealed generation: what was sent, and whether the sink acknowledged it or
                     refused it (dead-lettered, with the sink's reason); written once
    export_offsets   per sink and partition of llm.generations: where its exporter goes on, written in the
                     transaction that records the acknowledgements (compare-and-set, as projection_offsets)

The ledger is not a projection: it records what other systems answered, which no replay of the log can
rebuild, so `audit replay` leaves it alone and `billing reconcile` compares it with the sealed bills.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-09
"""
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UPGRADE = """
ALTER TABLE tenants ADD COLUMN billing jsonb NOT NULL DEFAULT '{}';

CREATE TABLE export_ledger (
    sink                        text NOT NULL CHECK (sink IN ('kafka', 'openmeter', 'stripe', 'lago')),
    generation_id               text NOT NULL,
    record_id                   text NOT NULL,
    tenant_id                   text NOT NULL,
    epoch                       integer NOT NULL CHECK (epoch >= 0),
    billed_input_tokens         bigint NOT NULL CHECK (billed_input_tokens >= 0),
    billed_cached_input_tokens  bigint NOT NULL CHECK (billed_cached_input_tokens >= 0),
    billed_output_tokens        bigint NOT NULL CHECK (billed_output_tokens >= 0),
    sealed_at                   timestamptz NOT NULL,
    outcome                     text NOT NULL CHECK (outcome IN ('acknowledged', 'dead-lettered')),
    reason                      text,
    exported_at                 timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sink, generation_id)
);
CREATE TRIGGER export_ledger_written_once BEFORE UPDATE OR DELETE ON export_ledger
    FOR EACH ROW EXECUTE FUNCTION rows_written_once();
CREATE TRIGGER export_ledger_written_once_table BEFORE TRUNCATE ON export_ledger
    FOR EACH STATEMENT EXECUTE FUNCTION rows_written_once();

CREATE TABLE export_offsets (
    sink         text NOT NULL,
    topic        text NOT NULL,
    partition    integer NOT NULL CHECK (partition >= 0),
    next_offset  bigint NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (sink, topic, partition)
);
"""

DOWNGRADE = """
DROP TABLE export_offsets;
DROP TABLE export_ledger;
ALTER TABLE tenants DROP COLUMN billing;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    # The ledger is the only record of what the billing systems acknowledged: downgrading forgets it, and
    # an exporter run after an upgrade again would send every seal once more (each with its old id).
    op.execute(DOWNGRADE)
