"""One gateway process's parts: admission client, stream bridge, database, model catalog, workers board,
key directory and authentication, per-tenant slots and presence; started and stopped together (`http/app.py` serves them).

    principal_of(connection)  the caller's tenant from its API key, for every route of every API
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from starlette.requests import HTTPConnection

from plumbing.kafka.clients import Kafka
from plumbing.kafka.follower import REGISTRY_POLL_MS, Follower
from plumbing.settings import Settings
from plumbing.telemetry.metrics import GatewayMetrics
from plumbing.telemetry.server import Readiness
from producers.gateway.admission.client import AdmissionClient
from producers.gateway.admission.pacing import BatchPacer
from producers.gateway.admission.prompts import ModelCatalog
from producers.gateway.admission.slots import STREAMS, WAITING, TenantSlots
from producers.gateway.admission.workers import WorkerBoard
from producers.gateway.auth.authenticator import Authenticator, presented_key
from producers.gateway.auth.key_directory import KeyDirectory
from producers.gateway.database import GatewayDatabase, Principal
from producers.gateway.disconnects import DisconnectPolicy
from producers.gateway.streams.bridge import StreamBridge
from producers.gateway.streams.presence import Presence
from producers.gateway.streams.replay import replay_from
from schemas.registry_events import WorkerHeartbeat
from schemas.topics import MODELS, WORKERS

log = logging.getLogger(__name__)


@dataclass
class Gateway:
    settings: Settings
    admission: AdmissionClient
    bridge: StreamBridge
    db: GatewayDatabase
    catalog: ModelCatalog
    models: Follower
    metrics: GatewayMetrics
    board: WorkerBoard
    workers_follower: Follower
    keys: KeyDirectory
    auth: Authenticator
    slots: TenantSlots
    presence: Presence
    disconnects: DisconnectPolicy
    batch_pacer: BatchPacer
    deliveries: set = field(default_factory=set)  # the open streams' queues (BoundedDelivery): what they hold
    database_reached: bool = False  # the database has answered once (readiness)

    @classmethod
    def create(cls, settings: Settings, kafka: Kafka, database_url: str) -> "Gateway":
        catalog = ModelCatalog()
        metrics = GatewayMetrics()
        board = WorkerBoard(settings.controller_group)

        def on_worker(_topic, event) -> None:
            if isinstance(event, WorkerHeartbeat):
                board.observe(event)
                if event.alive:
                    catalog.warm(event.model_versions)

        db = GatewayDatabase(database_url, settings.gateway_db_pool_size, settings.gateway_db_timeout_s,
                             settings.retry_after_ms)
        keys = KeyDirectory(kafka)
        slots = TenantSlots({STREAMS: settings.gateway_max_streams_per_tenant,
                             WAITING: settings.gateway_max_waiting_per_tenant}, settings.retry_after_ms)
        bridge = StreamBridge(kafka, start=replay_from(db.projected_offsets, settings.bridge_replay_max_s),
                              group=settings.gateway_group, share=settings.gateway_share_stream)
        admission = AdmissionClient(kafka, settings.controller_group, latency=metrics.admission_latency)
        presence = Presence(admission.gateway_id)
        pacer = BatchPacer(settings.gateway_batch_admissions_per_s, settings.gateway_batch_admission_burst)
        metrics.batch_paced.set_function(lambda: pacer.queued)
        return cls(settings, admission, bridge, db, catalog,
                   Follower(kafka, [MODELS], lambda _topic, event: catalog.observe(event),
                            client_id="gateway-models", long_poll_ms=REGISTRY_POLL_MS), metrics, board=board,
                   workers_follower=Follower(kafka, [WORKERS], on_worker, client_id="gateway-workers"),
                   keys=keys, auth=Authenticator(db, keys, settings), slots=slots, presence=presence,
                   disconnects=DisconnectPolicy(kafka, presence), batch_pacer=pacer)

    async def start(self) -> None:
        await self.db.start()
        await self.models.start()
        await self.models.catch_up()
        self._models_task = asyncio.create_task(self.models.run(), name="gateway-models")
        await self.workers_follower.start()
        self._workers_task = asyncio.create_task(self.workers_follower.run(), name="gateway-workers")
        await self.keys.start()
        await self.bridge.start()
        await self.admission.start()
        await self.disconnects.start(self)

    async def readiness(self) -> Readiness:
        """Ready: the admission client, stream bridge and model follower run, the bridge has replayed what the
        projections lack (else a read of a generation admitted elsewhere would wait), the key directory has read
        `llm.tenants` (else every key is Postgres's to answer), and the database has answered once.

        Once: a later database outage must not take every gateway out of a balancer's rotation at the same
        moment, while admissions, streams and key checks go on without it; the reads that need it answer 503
        `database_unavailable` meanwhile (and a probe does not wait out the pool's timeout each time)."""
        if not self.database_reached:
            self.database_reached = await self.db.ping()
        return Readiness({"admission": self.admission.running, "bridge": self.bridge.running,
                          "bridge_caught_up": self.bridge.caught_up, "keys": self.keys.caught_up,
                          "models": self.models.caught_up.is_set() and not self._models_task.done(),
                          "database": self.database_reached})

    async def stop(self) -> None:
        await self.disconnects.stop()
        self._models_task.cancel()
        self._workers_task.cancel()
        await self.admission.stop()
        await self.bridge.stop()
        await self.models.stop()
        await self.workers_follower.stop()
        await self.keys.stop()
        await self.db.stop()


async def principal_of(connection: HTTPConnection, api_key: str | None = None) -> Principal:
    """The caller's tenant from its API key (header, or `?api_key=` where a route takes one): 401, 429 for an
    address failing too often, 503 when only Postgres could answer and is down. The one way every route, native
    or OpenAI, HTTP or WebSocket, learns it."""
    gateway: Gateway = connection.app.state.gateway
    return await gateway.auth.principal(presented_key(connection.headers, api_key),
                                        connection.client.host if connection.client else None)
