"""Compacted registries: workers (`llm.workers`), model versions (`llm.models`), tenants (`llm.tenants`)."""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from schemas.envelope import Envelope
from schemas.values import BillingIds, TenantLimits, added


class WorkerHeartbeat(Envelope):
    type: Literal["WorkerHeartbeat"] = "WorkerHeartbeat"
    worker_id: str = Field(min_length=1)
    model_versions: tuple[str, ...]
    total_blocks: int = Field(ge=0)
    free_blocks: int = Field(ge=0)
    block_size: int = Field(ge=1)
    running: int = Field(ge=0)
    queued_tokens: int = Field(ge=0)
    draining: bool = False
    lease_ms: int = Field(default=5000, ge=1)
    # False once the worker stopped (drained or shut down): routing skips it at once.
    alive: bool = True
    # Commands that named a stale epoch or an unknown attempt, ignored since start.
    stale_commands: int = Field(default=0, ge=0)
    plane: str | None = None  # the control plane (controller group) this worker serves; None: any
    # "<generation id>:<epoch>" of attempts this worker self-fenced (no acknowledged heartbeat for a lease)
    # that the controller has not ended yet: heartbeats delivered late after a broker outage can keep the
    # lease alive in the controller's eyes, so the worker says outright which attempts it gave up.
    fenced: tuple[str, ...] = ()
    # How the worker reserves KV for an attempt it accepts (see Demand.tokens_on), and the tokens per second
    # its engine has processed while busy (prefill and decode), for the controller's wait prediction.
    reservation: Literal["full", "optimistic"] = "full"
    headroom_tokens: int = Field(default=0, ge=0)
    tokens_per_s: float | None = Field(default=None, gt=0)
    # A step that runs prefill: how long it takes, and how many tokens one step may compute.
    prefill_step_ms: float | None = Field(default=None, gt=0)
    # Any step, decode-only ones included, at the batch running now (smoothed): the step in flight that a prompt
    # arriving now waits for first.
    step_ms: float | None = Field(default=None, gt=0)
    # A step's cost in two parts: a decode-only step at the batch running now, and what each prefill token adds.
    # A step that fills the token budget costs decode_step_ms + max_batched_tokens * prefill_token_ms.
    decode_step_ms: float | None = Field(default=None, gt=0)
    prefill_token_ms: float | None = Field(default=None, gt=0)
    max_batched_tokens: int | None = Field(default=None, ge=1)
    # A fresh id per worker process: a worker restarted under the same id (as `ledgerlm up` does) is another
    # incarnation, and whatever the previous one ran is lost. None: a worker from before incarnations.
    incarnation: str | None = None
    # "<generation id>:<epoch>" of every attempt the worker holds (running, ending or queued for KV room), so
    # the controller can interrupt one the worker no longer has. None: not listed (a worker from before the
    # list, or one holding more than MAX_LISTED_ATTEMPTS): the controller then judges by the lease only.
    attempts: tuple[str, ...] | None = None
    # Up to when the worker had read its dispatch orders through as it sent this (None: not known). An order
    # written after it may be on its way: `attempts` cannot be expected to list it (a frozen broker or a
    # starved worker delays orders, not only heartbeats).
    dispatch_read_through: datetime | None = None
    # The batch tier's part of `queued_tokens`: the engine admits interactive prompts first, so an interactive
    # attempt waits only for the interactive prompts queued ahead of it.
    batch_queued_tokens: int = added(0, ge=0)
    # While interactive work is on the engine, batch prompts get at most this many tokens of each step
    # (EngineConfig.batch_step_tokens): the step an interactive prompt lands in carries them too. None: a worker
    # from before the share.
    batch_step_tokens: int | None = added(None, ge=0)
    # The share of recently started prompts' tokens the worker's prefix cache served (faded by prompt tokens): the
    # controller counts prompts queued on this worker net of it. None: none started yet (or an older worker).
    prefix_hit_share: float | None = added(None, ge=0, le=1)
    # Median of (observed - predicted by the queue model) waits of recent interactive attempts, in ms: the
    # controller adds it to its prediction for this worker (consumers/worker/calibration.py). None: none recent.
    wait_error_ms: float | None = added(None)
    # The same for the TTFT, decision to first token, against the model's (its wait plus its own prefill steps).
    ttft_error_ms: float | None = added(None)
    # Their ADMIT_QUANTILE (0.95), in ms: the controller routes interactive work only where the model's TTFT plus
    # this fits the allowance, and promises the median (decision 0022). None: none recent, or an older worker.
    ttft_error_high_ms: float | None = added(None)
    # The most attempts this worker takes (LEDGERLM_WORKER_MAX_ATTEMPTS); `running` counts what it holds.
    # None: no bound (a worker from before it).
    max_attempts: int | None = added(None, ge=1)
    # When the worker's loop described what this heartbeat says (its attempts, room, queue), if earlier than its
    # sending: the heartbeat thread sends the newest description it has, however starved the loop
    # (consumers/worker/heartbeat_thread.py). None: described as it was sent.
    described_at: datetime | None = added(None)

    def within_lease(self, now: float, read_through: float | None = None, leases: int = 1) -> bool:
        """Sent less than a lease before `now` (unix seconds), or before `read_through` when that is earlier:
        a reader counts a worker's silence only over time it has read its heartbeats through, so the reader's
        own lag (a starved process, a frozen broker) never reads as the worker's silence. `leases` stretches the
        silence allowed to that many leases."""
        judged_at = now if read_through is None else min(now, read_through)
        return judged_at - self.occurred_at.timestamp() <= leases * self.lease_ms / 1000


# A worker holds at most max_num_seqs running attempts plus its queue; past this the list is left out rather
# than let a heartbeat grow without bound.
MAX_LISTED_ATTEMPTS = 1024


class ModelVersionRegistered(Envelope):
    """An immutable model version: what the files are (checksums) and what it can hold."""

    type: Literal["ModelVersionRegistered"] = "ModelVersionRegistered"
    model_version: str = Field(min_length=1)
    name: str = Field(min_length=1)
    checksums: dict[str, str]
    max_context_tokens: int = Field(ge=1)
    kv_bytes_per_token: int = Field(ge=1)
    registered_at: datetime
    # Where the verified files live, and what a worker/gateway must match to serve it.
    source_uri: str | None = None
    content_sha256: str | None = Field(default=None, min_length=64, max_length=64)
    tokenizer_sha256: str | None = Field(default=None, min_length=64, max_length=64)
    chat_template_sha256: str | None = Field(default=None, min_length=64, max_length=64)
    runtime: dict[str, str] = Field(default_factory=dict)

    @property
    def models_key(self) -> str:
        """The record key on `llm.models`: the version name (see schemas/model_rollout.py for the others)."""
        return self.model_version


class TenantRegistered(Envelope):
    """A tenant's full current state (snapshot, so compaction keeps the latest).

    Only the SHA-256 of the API key travels; the key itself is shown once by the CLI.
    """

    type: Literal["TenantRegistered"] = "TenantRegistered"
    tenant_id: str = Field(min_length=1, max_length=128)
    name: str = Field(min_length=1, max_length=128)
    limits: TenantLimits
    api_key_hash: str = Field(min_length=64, max_length=64)
    api_key_prefix: str = Field(min_length=1, max_length=32)
    billing: BillingIds = added(BillingIds())
