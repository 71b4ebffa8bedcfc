"""Prometheus metrics of each role, named in vLLM's style (`ledgerlm:<name>`).

Every role object owns its own `CollectorRegistry` (never prometheus_client's
global one), so one process can host several roles — the tests run a gateway
and workers side by side — without two metrics claiming one name.

    role        metrics
    gateway     http_responses_total{code}, admission_rejections_total{code}, admission_latency_seconds
    controller  admission_decisions_total{code}, admission_rejections_total{code}, partitions_owned,
                workers_live, attempts_interrupted_total
    worker      time_to_first_token / inter_token_latency / request_queue_time / e2e_request_latency /
                cancellation_lag (seconds, histograms), prompt_tokens_total, generation_tokens_total,
                tenant_served_tokens_total{tenant,kind}, request_success_total{finished_reason},
                attempts_refused_total{reason}, kv_blocks_used/free/reserved, kv_pool_blocks/tokens/bytes,
                num_requests_running/waiting, prefix_cache_hit_tokens_total, preemptions_total,
                recomputed_tokens_total
    projector   projection_consumer_lag{projection}, projection_applied_events_total{projection}
    exporter    usage_exported_total{sink}, usage_export_dead_lettered_total{sink} (alert on any),
                usage_export_retries_total{sink}, usage_export_lag{sink},
                usage_export_oldest_unexported_seconds{sink}
    every role  kafka_requests_total{client,api} (plumbing/kafka/request_counts.py)
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from plumbing.kafka import request_counts

PREFIX = "ledgerlm:"
# vLLM's buckets: TTFT spans prefill of long documents, ITL one decode step.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
# observed / promised: the admission aims for the median within 25 % of 1
PROMISE_BUCKETS = (0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0)
REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                   60.0, 120.0, 240.0, 480.0, 960.0)


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry in Prometheus text format, with the process's Kafka request counts."""
    return generate_latest(registry) + generate_latest(request_counts.REGISTRY)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.responses = Counter(f"{PREFIX}http_responses", "HTTP responses by status code", ["code"],
                                 registry=self.registry)
        self.rejections = Counter(f"{PREFIX}admission_rejections", "Generation requests answered 4xx/5xx",
                                  ["code"], registry=self.registry)
        self.early_refusals = Counter(f"{PREFIX}early_refusals", "503s answered by the gateway without a controller "
                                      "transaction: no live worker could take the request", registry=self.registry)
        self.repeated_refusals = Counter(f"{PREFIX}repeated_capacity_refusals", "503 no_capacity answered by the "
                                         "gateway while the controller's last one holds (a client that ignores "
                                         "Retry-After)", registry=self.registry)
        self.batch_paced = Gauge(f"{PREFIX}batch_admissions_waiting", "Batch requests waiting for their turn to "
                                 "be handed to the controller (gateway batch pacing)", registry=self.registry)
        self.admission_latency = Histogram(f"{PREFIX}admission_latency_seconds",
                                           "SubmitGeneration published -> controller decision received",
                                           buckets=ITL_BUCKETS, registry=self.registry)


class ControllerMetrics:
    def __init__(self, partitions_owned: Callable[[], int], workers_live: Callable[[], int]) -> None:
        self.registry = CollectorRegistry()
        self.decisions = Counter(f"{PREFIX}admission_decisions", "Admission decisions by HTTP status",
                                 ["code"], registry=self.registry)
        self.rejections = Counter(f"{PREFIX}admission_rejections", "Submissions refused, by HTTP status",
                                  ["code"], registry=self.registry)
        self.interrupted = Counter(f"{PREFIX}attempts_interrupted", "Attempts ended by an expired worker lease",
                                   registry=self.registry)
        Gauge(f"{PREFIX}partitions_owned", "llm.commands partitions this controller owns",
              registry=self.registry).set_function(partitions_owned)
        Gauge(f"{PREFIX}workers_live", "Workers whose lease is current",
              registry=self.registry).set_function(workers_live)

    def observe_submit(self, statuses: list[int]) -> None:
        for status in statuses:
            self.decisions.labels(code=str(status)).inc()
            if status >= 400:
                self.rejections.labels(code=str(status)).inc()


class EngineSnapshot(Protocol):
    """The counters of an engine stats snapshot (`engine.request.EngineStats`) that the collector reads,
    named here so the plumbing needs nothing of the engine."""

    num_blocks_total: int
    num_blocks_used: int
    num_running: int
    num_waiting: int
    prefix_hit_tokens: int
    num_preemptions: int
    kv_bytes_per_token: int
    num_recomputed_tokens: int


class EngineStatsCollector(Collector):
    """The engine's capacity and cumulative counters, read from its latest stats snapshot at scrape time."""

    def __init__(self, stats: Callable[[], EngineSnapshot | None], reserved_blocks: Callable[[], int],
                 block_size: Callable[[], int]) -> None:
        self.stats = stats
        self.reserved_blocks = reserved_blocks
        self.block_size = block_size

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        if stats is None:
            return
        gauges = {
            "kv_blocks_used": ("KV blocks referenced by sequences", stats.num_blocks_used),
            "kv_blocks_free": ("KV blocks not referenced (free or cached)",
                               stats.num_blocks_total - stats.num_blocks_used),
            "kv_blocks_reserved": ("KV blocks reserved by accepted attempts", self.reserved_blocks()),
            "num_requests_running": ("Sequences in the running batch", stats.num_running),
            "num_requests_waiting": ("Sequences waiting in the engine", stats.num_waiting),
            "kv_pool_blocks": ("KV blocks in the pool", stats.num_blocks_total),
            "kv_pool_tokens": ("Tokens the KV pool holds", stats.num_blocks_total * self.block_size()),
            "kv_pool_bytes": ("Bytes of the KV pool",
                              stats.num_blocks_total * self.block_size() * stats.kv_bytes_per_token),
        }
        for name, (doc, value) in gauges.items():
            yield GaugeMetricFamily(f"{PREFIX}{name}", doc, value=value)
        yield CounterMetricFamily(f"{PREFIX}prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache",
                                  value=stats.prefix_hit_tokens)
        yield CounterMetricFamily(f"{PREFIX}preemptions", "Sequences preempted by recompute",
                                  value=stats.num_preemptions)
        yield CounterMetricFamily(f"{PREFIX}recomputed_tokens", "Tokens computed again after preemptions (never "
                                  "billed)", value=stats.num_recomputed_tokens)


class EngineTimingCollector(Collector):
    """The engine thread's wall seconds inside steps and stalled between them (`EngineTiming`)."""

    def __init__(self, timing: Callable[[], object | None]) -> None:
        self.timing = timing

    def collect(self) -> Iterator[Metric]:
        timing = self.timing()
        if timing is None:
            return
        yield CounterMetricFamily(f"{PREFIX}engine_step_seconds", "Wall seconds the engine thread spent in steps",
                                  value=timing.step_s)
        yield CounterMetricFamily(f"{PREFIX}engine_stalled_seconds", "Wall seconds the engine thread had unfinished "
                                  "work and was not stepping", value=timing.stalled_s)


class WorkerMetrics:
    def __init__(self, stats: Callable[[], EngineSnapshot | None], reserved_blocks: Callable[[], int],
                 block_size: Callable[[], int] = lambda: 16, timing: Callable[[], object | None] = lambda: None,
                 ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(f"{PREFIX}time_to_first_token_seconds", "Admission -> first output token",
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram(f"{PREFIX}inter_token_latency_seconds", "Gap between successive output tokens",
                             buckets=ITL_BUCKETS, registry=r)
        self.queue_time = Histogram(f"{PREFIX}request_queue_time_seconds",
                                    "Admission -> first scheduled by the engine", buckets=REQUEST_BUCKETS, registry=r)
        self.wait_promise_ratio = Histogram(
            f"{PREFIX}queue_wait_promise_ratio", "Observed / predicted wait before the first scheduling, per tier",
            ["tier"], buckets=PROMISE_BUCKETS, registry=r)
        self.ttft_promise_ratio = Histogram(
            f"{PREFIX}ttft_promise_ratio", "Observed / predicted time from admission to the first token, per tier",
            ["tier"], buckets=PROMISE_BUCKETS, registry=r)
        self.e2e = Histogram(f"{PREFIX}e2e_request_latency_seconds", "Admission -> end of the attempt",
                             buckets=REQUEST_BUCKETS, registry=r)
        self.cancellation_lag = Histogram(f"{PREFIX}cancellation_lag_seconds",
                                          "Cancel ordered by the controller -> removed from the engine",
                                          buckets=ITL_BUCKETS, registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens", "Prompt tokens processed (cached included)",
                                     registry=r)
        self.generation_tokens = Counter(f"{PREFIX}generation_tokens", "Output tokens generated", registry=r)
        self.tenant_tokens = Counter(f"{PREFIX}tenant_served_tokens", "Tokens served per tenant",
                                     ["tenant", "kind"], registry=r)
        self.finished = Counter(f"{PREFIX}request_success", "Attempts ended, by reason", ["finished_reason"],
                                registry=r)
        self.refused = Counter(f"{PREFIX}attempts_refused", "Attempts refused by this worker", ["reason"],
                               registry=r)
        r.register(EngineStatsCollector(stats, reserved_blocks, block_size))
        r.register(EngineTimingCollector(timing))

    def served(self, tenant: str, prompt_tokens: int, output_tokens: int) -> None:
        if prompt_tokens:
            self.prompt_tokens.inc(prompt_tokens)
            self.tenant_tokens.labels(tenant=tenant, kind="prompt").inc(prompt_tokens)
        if output_tokens:
            self.generation_tokens.inc(output_tokens)
            self.tenant_tokens.labels(tenant=tenant, kind="generation").inc(output_tokens)


class ProjectorMetrics:
    def __init__(self, applied: Callable[[], dict[str, int]]) -> None:
        self.registry = CollectorRegistry()
        self.lag = Gauge(f"{PREFIX}projection_consumer_lag", "Records in the log not yet applied",
                         ["projection"], registry=self.registry)
        self.registry.register(_AppliedCollector(applied))

    def observe_lag(self, lag: dict[str, int]) -> None:
        for name, behind in lag.items():
            self.lag.labels(projection=name).set(behind)


class _AppliedCollector(Collector):
    def __init__(self, applied: Callable[[], dict[str, int]]) -> None:
        self.applied = applied

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(f"{PREFIX}projection_applied_events", "Events applied per projection",
                                     labels=["projection"])
        for name, count in sorted(self.applied().items()):
            family.add_metric([name], count)
        yield family


class ExporterMetrics:
    """One sink's exporter. The dead-letter counter is the alert: each one is a seal the sink refused."""

    def __init__(self, sink: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.exported = Counter(f"{PREFIX}usage_exported", "Sealed attempts the sink acknowledged", ["sink"],
                                registry=r).labels(sink=sink)
        self.dead_lettered = Counter(f"{PREFIX}usage_export_dead_lettered", "Sealed attempts the sink refused "
                                     "(4xx), dead-lettered to llm.dlq with its reason", ["sink"],
                                     registry=r).labels(sink=sink)
        self.retries = Counter(f"{PREFIX}usage_export_retries", "Requests sent again after a 429, 5xx or no "
                               "answer", ["sink"], registry=r).labels(sink=sink)
        self.lag = Gauge(f"{PREFIX}usage_export_lag", "Records of llm.generations this exporter has not "
                         "passed yet", ["sink"], registry=r).labels(sink=sink)
        self.oldest_unexported = Gauge(f"{PREFIX}usage_export_oldest_unexported_seconds", "Age of the oldest "
                                       "sealed bill the sink's ledger has no answer for (0: none)", ["sink"],
                                       registry=r).labels(sink=sink)
