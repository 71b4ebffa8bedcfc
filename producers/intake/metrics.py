"""`/metrics` and `/readyz` of `ledgerlm intake` (ledgerlm/telemetry/server.py serves them).

    ledgerlm:intake_requests_total{outcome}   admitted, existing (the same generation again), rejected,
                                              dead_lettered
    ledgerlm:intake_held_total                 resubmissions after a Retry-After (batch pacing)
    ledgerlm:intake_in_flight                  records submitted and not yet committed
    ledgerlm:intake_partitions_owned           intake partitions this instance owns
    ledgerlm:results_published_total           results this instance's publisher wrote
"""
from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from plumbing.telemetry.server import Readiness

PREFIX = "ledgerlm:"


class IntakeCollector(Collector):
    """Read at each scrape from the running roles (either may be absent: `--no-intake`, `--no-results`)."""

    def __init__(self, intake=None, publisher=None) -> None:
        self.intake, self.publisher = intake, publisher

    def collect(self) -> Iterator[Metric]:
        if self.intake is not None:
            counts = self.intake.submitter.counts
            requests = CounterMetricFamily(f"{PREFIX}intake_requests", "Intake records by outcome", labels=["outcome"])
            for outcome in ("admitted", "existing", "rejected", "dead_lettered"):
                requests.add_metric([outcome], getattr(counts, outcome))
            yield requests
            yield CounterMetricFamily(f"{PREFIX}intake_held", "Resubmissions after a Retry-After", value=counts.held)
            yield GaugeMetricFamily(f"{PREFIX}intake_in_flight", "Records submitted, not yet committed",
                                    value=sum(len(lane.tasks) for lane in self.intake.lanes.values()))
            yield GaugeMetricFamily(f"{PREFIX}intake_partitions_owned", "Intake partitions this instance owns",
                                    value=len(self.intake.lanes))
        if self.publisher is not None:
            yield CounterMetricFamily(f"{PREFIX}results_published", "Results written to tenants' results topics",
                                      value=self.publisher.published)


def intake_registry(intake=None, publisher=None) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(IntakeCollector(intake, publisher))
    return registry


def intake_readiness(intake=None, publisher=None) -> Readiness:
    checks = {}
    if intake is not None:
        checks["intake_consuming"] = intake.ready.is_set()
    if publisher is not None:
        checks["results_consuming"] = publisher.ready.is_set()
    return Readiness(checks)
