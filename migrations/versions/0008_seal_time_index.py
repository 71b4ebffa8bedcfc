"""An index on the seal time of every bill, for the exporters' oldest-unexported-seal measure.

    billing_ledger_sealed_at  (sealed_at): the exporter asks only for seals sealed since the oldest one it
                              found unexported last time (projections/export/ledger.py), not the whole ledger

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX billing_ledger_sealed_at ON billing_ledger (sealed_at)")


def downgrade() -> None:
    op.execute("DROP INDEX billing_ledger_sealed_at")
