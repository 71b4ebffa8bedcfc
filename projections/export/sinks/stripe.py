"""Stripe meter events: `POST /v1/billing/meter_events`, form-encoded, one event per meter with a value.

    event_name                     the meter's event name (one per meter, from Settings)
    payload[stripe_customer_id]    the tenant's `stripe_customer_id`; a tenant without one is dead-lettered
    payload[value]                 the meter's quantity
    identifier                     <usage id>:<meter>, at most 100 characters (a longer one is hashed)
    timestamp                      the seal time, unix seconds

Stripe keeps one event per identifier over at least 24 hours, and a retried request carries the identifier as
its Idempotency-Key too, so Stripe answers it as it answered the first. A meter whose quantity is 0 is not
sent. Stripe refuses timestamps older than 35 days: a seal that old is dead-lettered with Stripe's reason.
"""
from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence

from projections.export.ledger import Outcome
from projections.export.records import Export
from projections.export.sinks import http
from projections.export.sinks.base import Backoff, SinkRefused, until_answered

MAX_IDENTIFIER = 100
IN_FLIGHT = 8  # requests at once: Stripe takes one event per request


def identifier(record_id: str, meter: str) -> str:
    plain = f"{record_id}:{meter}"
    if len(plain) <= MAX_IDENTIFIER:
        return plain
    return f"usage:sha256:{hashlib.sha256(record_id.encode()).hexdigest()[:64]}:{meter}"


class StripeSink:
    name = "stripe"

    def __init__(self, url: str, api_key: str | None, event_names: dict[str, str],
                 on_retry: Callable[[str], None], backoff: Backoff = Backoff()) -> None:
        self.url, self.event_names = url, event_names  # meter ("input", "cached_input", "output") -> event name
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.on_retry, self.backoff = on_retry, backoff
        self.http = None
        self.in_flight = asyncio.Semaphore(IN_FLIGHT)

    async def start(self) -> None:
        self.http = http.client(self.url, self.headers)

    async def stop(self) -> None:
        await self.http.aclose()

    def meter_events(self, export: Export) -> list[dict[str, str]]:
        seal = export.seal
        values = {"input": seal.input_tokens, "cached_input": seal.cached_input_tokens,
                  "output": seal.output_tokens}
        return [{"event_name": self.event_names[meter], "identifier": identifier(seal.record_id, meter),
                 "payload[stripe_customer_id]": export.billing.stripe_customer_id,
                 "payload[value]": str(value), "timestamp": str(int(seal.sealed_at.timestamp()))}
                for meter, value in values.items() if value > 0]

    async def send_event(self, form: dict[str, str], stop: asyncio.Event) -> None:
        async with self.in_flight:
            await until_answered(
                lambda: http.post(self.http, "/v1/billing/meter_events", data=form,
                                  headers={"Idempotency-Key": form["identifier"]}),
                stop, self.backoff, self.on_retry, "stripe meter event")

    async def deliver_one(self, export: Export, stop: asyncio.Event) -> Outcome:
        if export.billing.stripe_customer_id is None:
            return Outcome(export.seal, f"tenant {export.seal.tenant_id} has no Stripe customer "
                                        "(ledgerlm tenants create --stripe-customer)")
        forms = self.meter_events(export)
        answers = await asyncio.gather(*(self.send_event(form, stop) for form in forms), return_exceptions=True)
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, SinkRefused):
                raise answer  # Stopped, or a bug: nothing is recorded
        refused = [(form["event_name"], answer.reason) for form, answer in zip(forms, answers)
                   if isinstance(answer, SinkRefused)]
        if refused:
            # The other meters of this seal were taken: the reason says which were not, for the operator.
            return Outcome(export.seal, "; ".join(f"{name}: {reason}" for name, reason in refused))
        return Outcome(export.seal)

    async def deliver(self, exports: Sequence[Export], stop: asyncio.Event) -> list[Outcome]:
        return list(await asyncio.gather(*(self.deliver_one(x, stop) for x in exports)))
