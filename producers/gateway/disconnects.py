"""The disconnect policy's moving parts: publish this gateway's presence, read every gateway's, cancel when due.

    Presence.outbox ──publish──▶ llm.presence ──follow (all partitions, small)──▶ Presence.observe
    every ≤ 1 s: Presence.due(grace) ──▶ CancelGeneration (interactive, not ended, not already canceling)
"""
from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from plumbing.kafka.clients import Kafka, publish
from plumbing.kafka.follower import REGISTRY_POLL_MS, Follower
from plumbing.settings import Settings
from producers.gateway.admission.client import AdmissionClient
from producers.gateway.streams.bridge import StreamBridge
from producers.gateway.streams.presence import Presence
from schemas.commands import CancelGeneration
from schemas.presence import WatchersChanged
from schemas.topics import PRESENCE

log = logging.getLogger(__name__)


class GatewayParts(Protocol):
    """What the policy reads of the gateway it runs in, every round: its settings (an operator, or a test,
    may replace them), the admission client that publishes and decides, and the bridge whose views say what
    still runs. Named here so the policy needs nothing of the gateway that owns it."""

    settings: Settings
    admission: AdmissionClient
    bridge: StreamBridge


class DisconnectPolicy:
    def __init__(self, kafka: Kafka, presence: Presence) -> None:
        self.presence = presence
        # From the beginning (an hour of retention): a watcher that attached elsewhere before this gateway
        # started is known before this gateway decides anything.
        self.follower = Follower(kafka, [PRESENCE], self._observe, start="beginning", client_id="gateway-presence",
                                 long_poll_ms=REGISTRY_POLL_MS)
        self._tasks: list[asyncio.Task] = []

    def _observe(self, _topic: str, event) -> None:
        if isinstance(event, WatchersChanged):
            self.presence.observe(event)

    async def start(self, gateway: GatewayParts) -> None:
        await self.follower.start()
        await self.follower.catch_up()
        self._tasks = [asyncio.create_task(self.follower.run(), name="gateway-presence-follow"),
                       asyncio.create_task(self._publish(gateway), name="gateway-presence-publish"),
                       asyncio.create_task(self._cancel_unwatched(gateway), name="gateway-disconnect-policy")]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.follower.stop()

    async def _publish(self, gateway: GatewayParts) -> None:
        while True:
            change = await self.presence.outbox.get()
            try:
                await publish(gateway.admission.producer, PRESENCE, change)
            except Exception as exc:  # noqa: BLE001 - a lost report makes the grace local to this gateway
                log.warning("presence not published generation=%s error=%s", change.generation_id,
                            type(exc).__name__)

    async def _cancel_unwatched(self, gateway: GatewayParts) -> None:
        """Cancel interactive generations nobody, on any gateway, has watched for `disconnect_grace_s`."""
        while True:
            settings = gateway.settings  # read each round: an operator (or a test) may change it
            grace = settings.disconnect_grace_s
            await asyncio.sleep(min(1.0, grace / 4))
            for generation_id in self.presence.due(grace):
                view = gateway.bridge.view(generation_id)
                if view is None or view.tier != "interactive" or view.cancel_requested or view.final is not None \
                        or view.terminal is not None:
                    continue
                command = CancelGeneration(tenant_id=view.tenant_id, generation_id=generation_id,
                                           gateway_id=gateway.admission.gateway_id,
                                           correlation_id=gateway.admission.correlation_id(),
                                           plane=settings.controller_group)
                decision = await gateway.admission.decide(command, settings.admission_timeout_ms / 1000)
                log.info("canceled after disconnect generation=%s grace_s=%.1f status=%s", generation_id, grace,
                         decision.http_status if decision else "no-decision")
