"""The resume buffer keeps what issue 14 added to stream events: the choice (n > 1), its end, and logprobs.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
ALTER TABLE stream_events ADD COLUMN choice integer NOT NULL DEFAULT 0 CHECK (choice >= 0);
ALTER TABLE stream_events ADD COLUMN choice_end text;
-- {"logprobs": [...], "prompt_logprobs": [...]} as on the event (schemas.stream.TokenLogprob), when asked for
ALTER TABLE stream_events ADD COLUMN logprobs jsonb;
""")


def downgrade() -> None:
    op.execute("ALTER TABLE stream_events DROP COLUMN logprobs, DROP COLUMN choice_end, DROP COLUMN choice")
