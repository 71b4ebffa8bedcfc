"""A generation can end `failed`: the engine's step failed for it (schemas.lifecycle.Failed).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BEFORE = "'admitted','running','completed','canceled','interrupted','expired','rejected'"
AFTER = "'admitted','running','completed','canceled','interrupted','expired','failed','rejected'"


def _statuses(allowed: str) -> str:
    return f"""
ALTER TABLE generations DROP CONSTRAINT generations_status_check;
ALTER TABLE generations ADD CONSTRAINT generations_status_check CHECK (status IN ({allowed}));
"""


def upgrade() -> None:
    op.execute(_statuses(AFTER))


def downgrade() -> None:
    # A failed generation has no older status to fall back to: refuse rather than rewrite history.
    op.execute("DO $$ BEGIN IF EXISTS (SELECT 1 FROM generations WHERE status = 'failed') THEN "
               "RAISE EXCEPTION 'generations ended failed exist: cannot downgrade below 0002'; END IF; END $$;")
    op.execute(_statuses(BEFORE))
