"""Token text as bytes, refused events as JSON text: what a stream carried is stored whatever its characters.

PostgreSQL `text` cannot hold NUL (0x00) and `jsonb` refuses the `\\u0000` escape, yet a byte-level BPE
model can emit any byte. `stream_events.text_delta` becomes `bytea` holding the delta's UTF-8 (lone
surrogates kept with Python's `surrogatepass`, so any str round-trips); `refused_events.event` becomes
the event's JSON as text (JSON escapes control characters, and text keeps `EXCEPT ALL` for the audit).

Measured with `ledgerlm bench projector` on this machine: see README (resume buffer).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
ALTER TABLE stream_events ALTER COLUMN text_delta TYPE bytea USING convert_to(text_delta, 'UTF8');
ALTER TABLE refused_events ALTER COLUMN event TYPE text USING event::text;
""")


def downgrade() -> None:
    # text cannot hold what bytea may: buffered events with a NUL byte are dropped (the buffer is a projection).
    op.execute("""
DELETE FROM stream_events WHERE position('\\x00'::bytea IN text_delta) > 0;
ALTER TABLE stream_events ALTER COLUMN text_delta TYPE text USING convert_from(text_delta, 'UTF8');
ALTER TABLE refused_events ALTER COLUMN event TYPE jsonb USING event::jsonb;
""")
