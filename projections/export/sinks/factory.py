"""A sink by name, configured from Settings."""
from __future__ import annotations

from collections.abc import Callable

from plumbing.kafka.clients import Kafka
from plumbing.settings import Settings
from projections.export.sinks.base import Backoff, Sink
from projections.export.sinks.kafka import KafkaSink
from projections.export.sinks.lago import LagoSink
from projections.export.sinks.openmeter import OpenMeterSink
from projections.export.sinks.stripe import StripeSink

SINKS = ("kafka", "openmeter", "stripe", "lago")


def secret(value) -> str | None:
    return value.get_secret_value() if value is not None else None


def make_sink(name: str, settings: Settings, kafka: Kafka, on_retry: Callable[[str], None]) -> Sink:
    backoff = Backoff(max_s=settings.export_retry_max_s)
    if name == "kafka":
        return KafkaSink(kafka, settings.export_source, on_retry, backoff)
    if name == "openmeter":
        return OpenMeterSink(settings.openmeter_url, secret(settings.openmeter_token), settings.export_source,
                             on_retry, backoff)
    if name == "stripe":
        return StripeSink(settings.stripe_url, secret(settings.stripe_api_key),
                          {"input": settings.stripe_event_input, "cached_input": settings.stripe_event_cached_input,
                           "output": settings.stripe_event_output}, on_retry, backoff)
    if name == "lago":
        return LagoSink(settings.lago_url, secret(settings.lago_api_key), settings.lago_metric_code, on_retry,
                        backoff)
    raise ValueError(f"unknown sink {name!r}; known: {', '.join(SINKS)}")
