"""Projection tables: registry, generation status, attempts, stream buffer, usage, sealed billing.

Every row here is a function of the Kafka log: timestamps come from events,
never from now(), so `audit replay` can rebuild the tables byte for byte.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATUSES = "'admitted','running','completed','canceled','interrupted','expired','rejected'"

UPGRADE = f"""
CREATE TABLE projection_offsets (
    projection   text    NOT NULL,
    topic        text    NOT NULL,
    partition    integer NOT NULL CHECK (partition >= 0),
    next_offset  bigint  NOT NULL CHECK (next_offset >= 0),
    PRIMARY KEY (projection, topic, partition)
);

CREATE TABLE tenants (
    tenant_id             text PRIMARY KEY,
    name                  text NOT NULL UNIQUE,
    weight                double precision NOT NULL CHECK (weight > 0),
    max_tokens_in_flight  bigint NOT NULL CHECK (max_tokens_in_flight > 0),
    tokens_per_minute     bigint NOT NULL CHECK (tokens_per_minute > 0),
    max_concurrency       integer NOT NULL CHECK (max_concurrency > 0),
    max_queued_tokens     bigint NOT NULL CHECK (max_queued_tokens > 0),
    registered_at         timestamptz NOT NULL
);

-- Keyed by (tenant, hash), not hash alone: if two tenants' events ever claimed one hash,
-- a hash-only key would keep whichever partition was projected first (not a function of
-- the log); this way both rows exist and authentication refuses the ambiguous key.
CREATE TABLE api_keys (
    tenant_id   text NOT NULL REFERENCES tenants (tenant_id),
    key_hash    char(64) NOT NULL,
    key_prefix  text NOT NULL,
    issued_at   timestamptz NOT NULL,
    revoked_at  timestamptz,
    PRIMARY KEY (tenant_id, key_hash)
);
CREATE INDEX api_keys_hash ON api_keys (key_hash);

CREATE TABLE model_versions (
    model_version       text PRIMARY KEY,
    name                text NOT NULL,
    checksums           jsonb NOT NULL,
    max_context_tokens  integer NOT NULL CHECK (max_context_tokens > 0),
    kv_bytes_per_token  bigint NOT NULL CHECK (kv_bytes_per_token > 0),
    registered_at       timestamptz NOT NULL
);

CREATE TABLE generations (
    generation_id      text PRIMARY KEY,
    tenant_id          text NOT NULL,
    request_id         text NOT NULL,
    model_version      text NOT NULL,
    status             text NOT NULL CHECK (status IN ({STATUSES})),
    tier               text NOT NULL DEFAULT 'interactive',
    current_epoch      integer,
    worker_id          text,
    cancel_requested   boolean NOT NULL DEFAULT false,
    end_reason         text,
    input_tokens       integer NOT NULL CHECK (input_tokens >= 0),
    max_output_tokens  integer NOT NULL CHECK (max_output_tokens > 0),
    reserved_tokens    bigint NOT NULL CHECK (reserved_tokens >= 0),
    payload_hash       char(64) NOT NULL,
    processed_input_tokens   bigint NOT NULL DEFAULT 0,
    cached_input_tokens      bigint NOT NULL DEFAULT 0,
    generated_output_tokens  bigint NOT NULL DEFAULT 0,
    admitted_at        timestamptz NOT NULL,
    started_at         timestamptz,
    ended_at           timestamptz,
    updated_at         timestamptz NOT NULL
);
-- Not UNIQUE: the controller owns identity; a read model that refused a second generation for one
-- request id would wedge on the log instead of showing it.
CREATE INDEX generations_tenant_request ON generations (tenant_id, request_id);
CREATE INDEX generations_tenant_status ON generations (tenant_id, status);

CREATE TABLE attempts (
    generation_id  text    NOT NULL,
    epoch          integer NOT NULL CHECK (epoch >= 1),
    worker_id      text    NOT NULL,
    started_at     timestamptz NOT NULL,
    ended_at       timestamptz,
    end_reason     text,
    PRIMARY KEY (generation_id, epoch)
);

CREATE TABLE stream_events (
    generation_id  text      NOT NULL,
    epoch          integer   NOT NULL CHECK (epoch >= 1),
    seq            integer   NOT NULL CHECK (seq >= 1),
    token_ids      integer[] NOT NULL,
    text_delta     text      NOT NULL,
    is_final       boolean   NOT NULL DEFAULT false,
    end_reason     text,
    usage          jsonb,
    occurred_at    timestamptz NOT NULL,
    PRIMARY KEY (generation_id, epoch, seq)
);

-- One row per generation: the newest epoch seen on llm.tokens and how far its stream got.
-- `oldest_seq` is the first seq still in the resume buffer (a cursor before it has expired).
CREATE TABLE stream_progress (
    generation_id  text    PRIMARY KEY,
    tenant_id      text    NOT NULL,
    epoch          integer NOT NULL CHECK (epoch >= 1),
    last_seq       integer NOT NULL CHECK (last_seq >= 0),
    oldest_seq     integer NOT NULL CHECK (oldest_seq >= 1),
    token_count    bigint  NOT NULL DEFAULT 0,
    end_reason     text,
    ended_at       timestamptz,
    updated_at     timestamptz NOT NULL
);
CREATE INDEX stream_progress_ended ON stream_progress (ended_at) WHERE ended_at IS NOT NULL;
CREATE INDEX stream_progress_updated ON stream_progress (updated_at);

CREATE TABLE usage_watermarks (
    generation_id            text    NOT NULL,
    epoch                    integer NOT NULL CHECK (epoch >= 1),
    tenant_id                text    NOT NULL,
    processed_input_tokens   bigint  NOT NULL DEFAULT 0 CHECK (processed_input_tokens >= 0),
    cached_input_tokens      bigint  NOT NULL DEFAULT 0 CHECK (cached_input_tokens >= 0),
    generated_output_tokens  bigint  NOT NULL DEFAULT 0 CHECK (generated_output_tokens >= 0),
    recompute_tokens         bigint  NOT NULL DEFAULT 0 CHECK (recompute_tokens >= 0),
    reports_counted          integer NOT NULL DEFAULT 0,
    updated_at               timestamptz NOT NULL,
    PRIMARY KEY (generation_id, epoch)
);

-- One row per counted report: a redelivered report is a primary-key conflict, not a double count.
CREATE TABLE usage_reports (
    generation_id  text    NOT NULL,
    epoch          integer NOT NULL,
    report_seq     integer NOT NULL CHECK (report_seq >= 1),
    PRIMARY KEY (generation_id, epoch, report_seq)
);

CREATE TABLE billing_ledger (
    generation_id            text PRIMARY KEY,
    tenant_id                text    NOT NULL,
    epoch                    integer,
    model_version            text    NOT NULL,
    end_reason               text    NOT NULL,
    usage_label              text    NOT NULL CHECK (usage_label IN ('final', 'interrupted')),
    billed_input_tokens      bigint  NOT NULL CHECK (billed_input_tokens >= 0),
    billed_cached_input_tokens bigint NOT NULL CHECK (billed_cached_input_tokens >= 0),
    billed_output_tokens     bigint  NOT NULL CHECK (billed_output_tokens >= 0),
    reserved_tokens          bigint  NOT NULL CHECK (reserved_tokens >= 0),
    released_tokens          bigint  NOT NULL CHECK (released_tokens >= 0),
    sealed_at                timestamptz NOT NULL
);
CREATE INDEX billing_ledger_tenant_sealed ON billing_ledger (tenant_id, sealed_at);

CREATE FUNCTION billing_ledger_is_sealed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'billing_ledger rows are sealed: % refused', TG_OP
        USING ERRCODE = 'restrict_violation';
END;
$$;
CREATE TRIGGER billing_ledger_sealed_rows BEFORE UPDATE OR DELETE ON billing_ledger
    FOR EACH ROW EXECUTE FUNCTION billing_ledger_is_sealed();
CREATE TRIGGER billing_ledger_sealed_table BEFORE TRUNCATE ON billing_ledger
    FOR EACH STATEMENT EXECUTE FUNCTION billing_ledger_is_sealed();

-- Operator's view of compute that never reaches an invoice.
CREATE TABLE usage_reconciliation (
    generation_id            text    NOT NULL,
    epoch                    integer NOT NULL,
    kind                     text    NOT NULL CHECK (kind IN ('post_seal_report', 'unbilled_tail')),
    report_seq               integer NOT NULL DEFAULT 0,
    tenant_id                text    NOT NULL,
    processed_input_tokens   bigint  NOT NULL DEFAULT 0,
    cached_input_tokens      bigint  NOT NULL DEFAULT 0,
    generated_output_tokens  bigint  NOT NULL DEFAULT 0,
    recompute_tokens         bigint  NOT NULL DEFAULT 0,
    recorded_at              timestamptz NOT NULL,
    PRIMARY KEY (generation_id, epoch, kind, report_seq)
);

CREATE TABLE tenant_usage_hourly (
    tenant_id             text        NOT NULL,
    hour                  timestamptz NOT NULL,
    generations           integer     NOT NULL DEFAULT 0,
    input_tokens          bigint      NOT NULL DEFAULT 0,
    cached_input_tokens   bigint      NOT NULL DEFAULT 0,
    output_tokens         bigint      NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, hour)
);
"""

DOWNGRADE = """
DROP TABLE tenant_usage_hourly;
DROP TABLE usage_reconciliation;
DROP TABLE billing_ledger;
DROP FUNCTION billing_ledger_is_sealed();
DROP TABLE usage_reports;
DROP TABLE usage_watermarks;
DROP TABLE stream_progress;
DROP TABLE stream_events;
DROP TABLE attempts;
DROP TABLE generations;
DROP TABLE model_versions;
DROP TABLE api_keys;
DROP TABLE tenants;
DROP TABLE projection_offsets;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
