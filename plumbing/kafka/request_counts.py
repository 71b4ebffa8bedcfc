"""How many requests this process's Kafka clients send, by client id and API (Fetch, Produce, Heartbeat...).

Idle cost is requests: a consumer that asks the broker faster than records arrive burns CPU on both sides
without carrying anything. Every client `plumbing.kafka.clients` makes is counted here, and every role's
`/metrics` shows the counts as `ledgerlm:kafka_requests_total{client,api}`, so a bench can read each role's
fetch and produce rates. Requests go through `AIOKafkaClient.send` (fetches, produces, group heartbeats,
offset commits); the metadata refreshes a client sends on its connections directly are not counted.
"""
from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

COUNTS: Counter[tuple[str, str]] = Counter()
_VERSION = re.compile(r"(Request)?_v\d+$")


def api_name(request: object) -> str:
    """FetchRequest_v11 → Fetch."""
    return _VERSION.sub("", type(request).__name__).removesuffix("Request")


def count_requests(client: object, client_id: str) -> None:
    """Count every request `client` (an aiokafka consumer, producer or admin client) sends from now on."""
    # aiokafka has no request hook; its producer keeps its network client as `client`, the others as `_client`.
    inner = getattr(client, "client", None) or getattr(client, "_client", None)
    send = getattr(inner, "send", None)
    if send is None or getattr(send, "counted", False):
        return

    async def counted_send(node_id, request, *args, **kwargs):
        COUNTS[(client_id, api_name(request))] += 1
        return await send(node_id, request, *args, **kwargs)

    counted_send.counted = True
    inner.send = counted_send


class _RequestCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("ledgerlm:kafka_requests", "Kafka requests sent by this process's clients",
                                     labels=["client", "api"])
        for (client, api), n in sorted(COUNTS.items()):
            family.add_metric([client, api], n)
        yield family


REGISTRY = CollectorRegistry()
REGISTRY.register(_RequestCollector())
