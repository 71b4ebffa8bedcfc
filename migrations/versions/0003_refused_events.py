"""Events a projection refused (a constraint of the read model), kept in the transaction that skips them.

The projector used to skip such an event, advance its offset and only then
publish it to `llm.dlq`: a failed publish left it in a log line alone. Now the
event is stored here beside the offset that skips it, then dead-lettered.
A replay refuses the same events for the same reasons, so `audit replay`
rebuilds this table like any other and diffs it.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("""
CREATE TABLE refused_events (
    projection  text    NOT NULL,
    topic       text    NOT NULL,
    partition   integer NOT NULL CHECK (partition >= 0),
    "offset"    bigint  NOT NULL CHECK ("offset" >= 0),
    event_id    uuid    NOT NULL,
    event_type  text    NOT NULL,
    reason      text    NOT NULL,
    event       jsonb   NOT NULL,
    PRIMARY KEY (projection, topic, partition, "offset")
);
""")


def downgrade() -> None:
    op.execute("DROP TABLE refused_events;")
