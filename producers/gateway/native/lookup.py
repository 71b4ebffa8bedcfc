"""Find the caller's generation for status, events, resume and WebSocket reads: read-your-writes on any gateway.

    status in Postgres or the bridge ──▶ answer
    miss ──▶ id's tag names the caller's tenant? ── no ──▶ 404 at once (another tenant's, unknown, forged)
                                                └─ yes ─▶ wait (bounded) for the bridge or the projection
                                                          ──▶ answer | 503 generation_unavailable (never 404)

A miss costs what it cost before (one status read); only an id the
controller minted for the caller's own tenant (`schemas.generation_ids`)
ever waits, and such an id is an admitted generation: the bridge, which
replays whatever the projections have not applied (`streams/replay.py`), reaches
it within a fetch or two of the 201 on any gateway.
"""
from __future__ import annotations

import asyncio
import logging
import time

from plumbing.settings import Settings
from producers.gateway.database import GatewayDatabase
from producers.gateway.errors import ApiError
from producers.gateway.native.status import read_status
from producers.gateway.streams.bridge import StreamBridge
from schemas.generation_ids import owned_by

log = logging.getLogger(__name__)

POLL_S = 0.25  # a waiting lookup re-reads the projection this often (the bridge wakes it sooner)


def not_found(generation_id: str) -> ApiError:
    return ApiError(404, "not_found", "no such generation", {"generationId": generation_id})


async def find_generation(db: GatewayDatabase, bridge: StreamBridge, settings: Settings, tenant_id: str,
                          generation_id: str) -> dict:
    """The status of `tenant_id`'s generation; ApiError 404 when it is not theirs, 503 when it is theirs but
    neither the bridge nor the projection holds it within `read_your_writes_wait_s`."""
    status = await read_status(db, bridge, tenant_id, generation_id)
    if status is not None:
        return status
    if not owned_by(settings.generation_id_key(), generation_id, tenant_id):
        raise not_found(generation_id)
    return await wait_for_owned(db, bridge, settings, tenant_id, generation_id)


async def wait_for_owned(db: GatewayDatabase, bridge: StreamBridge, settings: Settings, tenant_id: str,
                         generation_id: str) -> dict:
    started = time.monotonic()
    async with bridge.attending(generation_id):  # not in this gateway's share: read its partition meanwhile
        status = await poll_status(db, bridge, tenant_id, generation_id, started + settings.read_your_writes_wait_s)
    if status is not None:
        log.info("owned generation found generation=%s waited_ms=%.1f in_bridge=%s", generation_id,
                 (time.monotonic() - started) * 1000, bridge.view(generation_id) is not None)
        return status
    log.warning("owned generation not readable generation=%s waited_s=%.1f bridge_caught_up=%s", generation_id,
                settings.read_your_writes_wait_s, bridge.caught_up)
    raise ApiError(503, "generation_unavailable", "this generation is admitted but not readable on this gateway "
                   "yet; retry", {"generationId": generation_id}, settings.retry_after_ms)


async def poll_status(db: GatewayDatabase, bridge: StreamBridge, tenant_id: str, generation_id: str,
                      deadline: float) -> dict | None:
    while True:
        status = await read_status(db, bridge, tenant_id, generation_id)  # the backfill may have found it
        remaining = deadline - time.monotonic()
        if status is not None or remaining <= 0:
            return status
        try:
            async with asyncio.timeout(min(POLL_S, remaining)):
                await bridge.advanced.wait()
        except TimeoutError:
            pass
