"""The one configuration object of ledgerlm (environment prefix `LEDGERLM_`)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from plumbing.kafka.access import SaslMechanism, SecurityProtocol

REPO_ROOT = Path(__file__).resolve().parent.parent

UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
         "kb": 10**3, "mb": 10**6, "gb": 10**9}


def parse_bytes(text: str | int) -> int | None:
    """'auto' -> None; '2GiB', '64 MiB', '1500000' -> bytes. ValueError names the text otherwise.

    A size as an operator writes it (LEDGERLM_WORKER_KV_CACHE_BYTES): read where the setting is checked,
    so the engine only ever takes bytes."""
    if isinstance(text, int):
        return text
    cleaned = text.strip().lower()
    if cleaned == "auto":
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([a-z]*)", cleaned)
    if match is None or match.group(2) not in UNITS:
        raise ValueError(f"{text!r} is not a size (use 'auto', bytes, or a number with KiB/MiB/GiB)")
    return int(float(match.group(1)) * UNITS[match.group(2)])


class Settings(BaseSettings):
    """Settings passed down from the CLI; nothing reads the environment elsewhere.

    `kafka_bootstrap` / `database_url` point everything at existing services;
    when unset, the services started by `ledgerlm infra up` are used. Secrets
    (`database_url`, `kafka_sasl_password`) are `SecretStr`: printed, they read
    `**********`.
    """

    model_config = SettingsConfigDict(env_prefix="LEDGERLM_", extra="ignore")

    home: Path = Field(default=REPO_ROOT / ".ledgerlm", description="state, data and caches of local services")
    kafka_jars: Path | None = Field(default=None, description="Maven-resolved Kafka jars; <home>/kafka-jars when unset")
    kafka_bootstrap: str | None = None
    database_url: SecretStr | None = Field(default=None, description="libpq URL; may hold the password")

    # -- how every Kafka client authenticates (plumbing/kafka/access.py); the local broker's SASL listener
    # takes SCRAM-SHA-256 with the credentials `infra up` generated, used when no password is set here --
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: SaslMechanism = "SCRAM-SHA-256"
    kafka_sasl_username: str | None = Field(default=None, description="SASL principal; with the local broker, "
                                            "one of its generated principals (admin when unset)")
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = Field(default=None, description="CA bundle that signed the brokers (SSL)")
    kafka_ssl_certfile: Path | None = Field(default=None, description="client certificate for mutual TLS")
    kafka_ssl_keyfile: Path | None = None

    kafka_port: int | None = Field(default=None, description="local broker port; a free one when unset")
    kafka_controller_port: int | None = None
    kafka_heap: str = "768m"
    kafka_brokers: int = Field(default=1, ge=1, le=9, description="local brokers `infra up` starts (a KRaft "
                               "cluster of combined broker+controller nodes when more than one)")
    postgres_port: int | None = Field(default=None, description="local PostgreSQL port; a free one when unset")
    postgres_database: str = "ledgerlm"

    resume_buffer_events: int = Field(default=4096, ge=1, description="stream events kept per generation")
    resume_buffer_after_end_s: float = Field(default=3600.0, ge=0, description="log time a finished stream is kept")
    disconnect_grace_s: float = Field(default=30.0, gt=0, description="an interactive generation nobody watches "
                                      "for this long is cancelled; batch generations never are")
    projector_group: str = "ledgerlm-projector"
    projector_crash_after_batches: int | None = Field(default=None, description="fault injection for tests")

    topic_partitions: int = 6
    topic_replication_factor: int | None = Field(default=None, ge=1, description="replication factor of "
                                                  "declared topics; unset: min(3, brokers in the cluster)")
    startup_timeout_s: float = 60.0

    # -- control plane (gateway, controller, worker) --
    controller_group: str = Field(default="ledgerlm-controller",
                                  description="consumer group of llm.commands; transactional ids derive from it")
    controller_start: str = Field(default="earliest", description="where a new controller group starts reading")
    lease_ms: int = Field(default=5000, ge=100, description="a worker silent this long loses its attempts")
    heartbeat_interval_ms: int = Field(default=1000, ge=50)
    lease_check_interval_ms: int = Field(default=250, ge=10)
    interactive_queue_allowance_ms: int = Field(default=2000, ge=0, description="the interactive TTFT allowance: "
                                                "an interactive request is routed to a worker whose predicted, "
                                                "calibrated time to its first token fits it; beyond it, 503 with "
                                                "a Retry-After from the prediction")
    batch_completion_window_s: int = Field(default=86400, ge=60, le=7 * 86400, description="an accepted batch "
                                           "generation waits for capacity this long before it expires (a tenant's "
                                           "`batch_completion_window_s` or the request's `completionWindowS` may "
                                           "shorten it); it is never refused for load")
    batch_dispatch_wait_ms: int = Field(default=4000, ge=0, description="a batch attempt is handed to a worker "
                                        "only while that worker could start it within this (KV room now, a short "
                                        "prefill queue, which the engine serves after interactive prompts): a few "
                                        "heartbeats of work, so the engine does not idle between dispatches; "
                                        "until then the controller holds it")
    worker_decode_tokens_per_s: float = Field(default=200.0, gt=0, description="queue-time estimate for routing")
    retry_after_ms: int = Field(default=1000, ge=1, description="base Retry-After for 429/503, jittered up to +50%")
    max_refusals: int = Field(default=2, ge=0, description="reroutes after worker refusals before Rejected")
    require_qualified: bool = Field(default=False, description="route only to versions whose latest "
                                    "qualification (`models qualify`) passed on their registered content")
    max_attempt_s: float = Field(default=1800.0, gt=0, description="an attempt running longer than this since "
                                 "its dispatch is interrupted (reason max-attempt-time), and its worker aborts it")
    identity_ttl_s: float = Field(default=86400.0, gt=0, description="the controller forgets an ended "
                                  "generation's (tenant, requestId) this long after its end (tombstoned in the "
                                  "changelog); a live one never expires. After it the requestId is a new request")
    generation_deadline_s: float = Field(default=300.0, gt=0, description="an attempt must start within this")
    admission_timeout_ms: int = Field(default=10000, ge=100)
    gateway_host: str = "127.0.0.1"
    gateway_port: int = Field(default=8080, ge=0)
    gateway_keep_alive_s: int = Field(default=75, ge=1, description="an idle client connection is kept this long: "
                                      "longer than clients' own pools (httpx and the openai client: 5 s), so the "
                                      "client closes first and never sends a request on a connection being closed")
    worker_kv_cache_bytes: str = Field(default="auto", description="KV pool: 'auto' (from the machine: a capped "
                                       "share of MemAvailable on a CPU, a fraction of memory after weights on a "
                                       "GPU), bytes, or a size like '2GiB'")
    worker_memory_fraction: float = Field(default=0.9, gt=0, le=1, description="GPU memory `auto` may fill")
    worker_cpu_kv_share: float = Field(default=0.25, gt=0, le=1, description="share of MemAvailable `auto` takes "
                                       "on a CPU")
    worker_cpu_kv_cap_bytes: int = Field(default=4 << 30, ge=1, description="... at most this many bytes")
    worker_max_model_len: int | None = Field(default=None, ge=1, description="longest request (prompt + output) "
                                             "the worker runs; the model's context when unset")
    worker_reservation: Literal["optimistic", "full"] = Field(
        default="optimistic", description="optimistic: an attempt reserves its prompt blocks plus a headroom and "
        "grows, preempting by recompute when the pool runs dry; full: prompt + max output up front, never preempted")
    worker_headroom_tokens: int = Field(default=32, ge=0, description="output tokens an optimistic reservation "
                                        "holds beyond the prompt")
    worker_free_block_watermark: float = Field(default=0.01, ge=0, lt=1, description="share of the pool kept free "
                                               "when accepting attempts, so running sequences can grow")
    worker_max_num_seqs: int = Field(default=32, ge=1)
    worker_batch_step_tokens: int = Field(default=128, ge=0, description="while interactive work is on a "
                                          "worker's engine, batch prompts get at most this many tokens of each "
                                          "step, so a batch backlog does not lengthen the interactive steps")
    worker_max_attempts: int = Field(default=256, ge=1, description="attempts a worker holds at most (running, "
                                     "ending, waiting for room); beyond it the controller routes elsewhere, "
                                     "holds batch work, or answers interactive work 503 (batch work stops "
                                     "a quarter short of it, leaving room for interactive work)")
    worker_device: str = "auto"
    worker_cpu_threads: int | None = Field(
        default=None, ge=1, description="threads the engine computes with on a CPU device; unset: torch's own "
        "default (every core). Set it below the core count where busy processes share the worker's machine: the "
        "worker runs niced, and an engine thread that must wait for a core stalls every step (2 cores, one busy "
        "process beside it: a 512-token prefill step took 2.0 s on 2 sleeping threads, 2.9 s spinning, 1.4 s on 1)")
    worker_nice: int = Field(default=10, ge=0, le=19,
                             description="added to the worker's nice value at start: on a machine it shares with "
                                         "the gateway, controller and broker, the engine's compute then yields "
                                         "to their latency-bound work")
    usage_report_tokens: int = Field(default=16, ge=1, description="a watermark every N generated tokens")
    usage_report_ms: int = Field(default=500, ge=1, description="... or every T ms, whichever first")
    stream_flush_ms: int = Field(default=20, ge=0,
                                 description="coalesce a stream's tokens into one event per T ms (0: one per step)")
    stream_queue_events: int = Field(default=256, ge=1,
                                     description="events one stream connection may have waiting before it is "
                                                 "ended as a slow consumer")
    stream_stall_timeout_s: float = Field(default=10.0, gt=0,
                                          description="a connection whose client takes no bytes for this long "
                                                      "while the server waits to write is aborted")
    generation_id_secret: SecretStr | None = Field(
        default=None,
        description="HMAC key of the tenant tag in generation ids (schemas/generation_ids.py): the controller and "
                    "every gateway must share it. Unset: the one kept in <home>/credentials/generation-id-secret "
                    "(generated, mode 0600, on first use), which roles on one host share")
    read_your_writes_wait_s: float = Field(default=10.0, gt=0,
                                           description="how long a gateway waits for a generation the caller's "
                                                       "id proves it owns to reach its bridge or the projection "
                                                       "before answering 503 (never 404)")
    bridge_replay_max_s: float = Field(default=3600.0, gt=0,
                                       description="a starting gateway's bridge replays llm.generations and "
                                                   "llm.tokens from the projections' offsets, but from no "
                                                   "further back than this much log time")
    gateway_group: str = Field(default="ledgerlm-gateways",
                               description="the consumer group in which gateways share the partitions of "
                                           "llm.tokens / llm.generations (one group per deployment)")
    gateway_share_stream: bool = Field(default=True,
                                       description="false: this gateway reads and decodes every partition "
                                                   "alone (the pre-sharing behaviour; the stream benchmark's "
                                                   "baseline)")

    # -- telemetry: /metrics, /healthz, /readyz of the Kafka roles (0 = an ephemeral port, logged) --
    metrics_host: str = "127.0.0.1"
    controller_metrics_port: int = Field(default=0, ge=0)
    worker_metrics_port: int = Field(default=0, ge=0)
    projector_metrics_port: int = Field(default=0, ge=0)
    intake_metrics_port: int = Field(default=0, ge=0)
    projector_ready_lag: int = Field(default=1000, ge=0,
                                     description="the projector is ready while no projection lags more records")
    projector_lag_interval_s: float = Field(default=10.0, gt=0, description="how often projection lag is measured")
    # -- export of sealed usage (`ledgerlm export --sink S`; docs/billing.md, Export) --
    export_group: str = Field(default="ledgerlm-export", description="consumer group prefix: <group>-<sink>")
    export_source: str = Field(default="ledgerlm", description="the CloudEvents `source` of every usage "
                               "event; keep it stable (OpenMeter deduplicates on id and source)")
    export_batch_records: int = Field(default=500, ge=1, description="records of llm.generations per poll")
    export_retry_max_s: float = Field(default=30.0, gt=0, description="longest wait between two sends of a "
                                      "request a sink did not take (429, 5xx, no answer)")
    export_metrics_port: int = Field(default=0, ge=0)
    export_lag_interval_s: float = Field(default=10.0, gt=0, description="how often export lag and the "
                                         "oldest unexported seal are measured")
    openmeter_url: str = "http://127.0.0.1:8888"
    openmeter_token: SecretStr | None = None
    stripe_url: str = "https://api.stripe.com"
    stripe_api_key: SecretStr | None = None
    stripe_event_input: str = Field(default="ledgerlm_input_tokens", description="Stripe meter event name of "
                                    "billed input tokens")
    stripe_event_cached_input: str = "ledgerlm_cached_input_tokens"
    stripe_event_output: str = "ledgerlm_output_tokens"
    lago_url: str = "http://127.0.0.1:3000"
    lago_api_key: SecretStr | None = None
    lago_metric_code: str = Field(default="llm_tokens", description="the Lago billable metric's code")
    # -- gateway bounds (issue 15): what one client or tenant can make a gateway hold --
    gateway_db_pool_size: int = Field(default=4, ge=1, description="Postgres connections the gateway's reads share")
    gateway_db_timeout_s: float = Field(default=10.0, gt=0, description="how long a gateway read waits for a "
                                        "Postgres connection; then 503 database_unavailable")
    gateway_auth_cache_entries: int = Field(default=10000, ge=1, description="API key answers (hits and misses) "
                                            "cached, and client addresses whose failures are counted")
    gateway_auth_cache_s: float = Field(default=5.0, gt=0, description="how long an API key answer is cached")
    gateway_auth_failures_per_minute: int = Field(default=30, ge=1, description="failed authentications one "
                                                  "client address may make per minute (as a burst too); more: 429")
    gateway_max_streams_per_tenant: int = Field(default=256, ge=1, description="open streams (SSE, WebSocket, "
                                                "OpenAI stream) one tenant may hold on one gateway; more: 429")
    gateway_max_waiting_per_tenant: int = Field(default=256, ge=1, description="calls waiting for their "
                                                "generation's end (wait=true, OpenAI without stream) one tenant "
                                                "may hold on one gateway; more: 429")
    gateway_batch_admissions_per_s: float = Field(default=50.0, ge=0, description="batch requests one gateway "
                                                  "hands the controller per second, tenants in turn; the rest "
                                                  "wait for their turn (0: unpaced)")
    gateway_batch_admission_burst: int = Field(default=32, ge=1, description="batch requests a quiet gateway "
                                               "hands on at once before pacing starts")
    max_request_body_bytes: int = Field(default=2 * 1024 * 1024, ge=1024, description="larger HTTP bodies get 413")

    _generated_id_key: str | None = PrivateAttr(default=None)

    @field_validator("worker_kv_cache_bytes", mode="before")
    @classmethod
    def _kv_size(cls, value: object) -> str:
        text = str(value)
        parse_bytes(text)  # ValueError names the text
        return text

    @property
    def worker_kv_pool_bytes(self) -> int | None:
        """The worker's KV pool in bytes for the engine; None for `auto` (the engine sizes it from the machine)."""
        return parse_bytes(self.worker_kv_cache_bytes)

    @property
    def state_file(self) -> Path:
        return self.home / "services.json"

    def generation_id_key(self) -> str:
        """The generation-id HMAC key: the configured secret, else the host's generated one (never a constant
        every deployment shares, which would let anyone mint a valid-looking tag)."""
        if self.generation_id_secret is not None:
            return self.generation_id_secret.get_secret_value()
        if self._generated_id_key is None:
            from plumbing.secrets import generated_secret

            self._generated_id_key = generated_secret(self.home / "credentials" / "generation-id-secret")
        return self._generated_id_key
