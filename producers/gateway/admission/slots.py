"""Per-tenant bounds on what one gateway holds open: streams (SSE, WebSocket, OpenAI `stream: true`) and
waiting calls (`?wait=true`, OpenAI calls without `stream`).

    acquire(tenant, kind) ─▶ Slot (release() however the call ends) | ApiError 429 too_many_<kind>

A slot is taken before anything is admitted, so a refused call leaves no
generation behind; it is given back when the stream or the wait ends, by
completion, error or disconnect (`release` is idempotent). The bounds are per
gateway process: N gateways allow N times as many.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass

from starlette.responses import Response

from producers.gateway.errors import ApiError
from producers.gateway.streams.delivery import ClosingStreamingResponse

STREAMS = "streams"
WAITING = "waiting"


@dataclass
class Slot:
    slots: "TenantSlots"
    tenant_id: str
    kind: str
    held: bool = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.slots.give_back(self.tenant_id, self.kind)


class TenantSlots:
    def __init__(self, limits: dict[str, int], retry_after_ms: int) -> None:
        self.limits = limits
        self.retry_after_ms = retry_after_ms
        self.open: dict[str, Counter[str]] = {kind: Counter() for kind in limits}

    def acquire(self, tenant_id: str, kind: str) -> Slot:
        held = self.open[kind]
        limit = self.limits[kind]
        if held[tenant_id] >= limit:
            what = "open streams" if kind == STREAMS else "calls waiting for their generation"
            raise ApiError(429, f"too_many_{kind}", f"this tenant already has {limit} {what} on this gateway",
                           {"reason": f"too_many_{kind}", "limit": limit}, self.retry_after_ms)
        held[tenant_id] += 1
        return Slot(self, tenant_id, kind)

    def give_back(self, tenant_id: str, kind: str) -> None:
        held = self.open[kind]
        held[tenant_id] -= 1
        if held[tenant_id] <= 0:
            del held[tenant_id]  # no entry per tenant that once streamed

    def held(self, tenant_id: str, kind: str) -> int:
        return self.open[kind][tenant_id]


async def holding(slot: Slot, respond: Awaitable[Response]) -> Response:
    """`respond` with `slot` held: a streamed response keeps it until its body closes (however the client
    leaves), any other answer or an error gives it back at once."""
    try:
        response = await respond
    except BaseException:
        slot.release()
        raise
    if isinstance(response, ClosingStreamingResponse):
        response.on_close = slot.release
    else:
        slot.release()
    return response
