"""The gateway's HTTP API (FastAPI).

    POST /v1/generations               201 new | 200 existing | 400 | 401 | 404 model | 409 | 429 | 503
    GET  /v1/generations/{id}          status (404 for unknown or another tenant's id; the caller's own is found
                                       on any gateway however far the projections lag: lookup.py)
    GET  /v1/generations/{id}/events   SSE stream of the generation; resumes after Last-Event-ID / ?after= (streams.py)
    POST /v1/generations/{id}/cancel   202 canceling | 200 already ended | 404
    GET  /healthz, /readyz, /metrics   alive | ready (Kafka clients running, database answers) | Prometheus text
    GET  /health                       vLLM's readiness probe: 200 when ready, 503 otherwise
    GET  /v1/usage?from=&to=           the caller's sealed usage per hour (from the billing projection)
    /v1/models, /v1/completions, /v1/chat/completions   OpenAI-compatible (`openai_api.py`)

The tenant comes from the API key (`Authorization: Bearer <key>`), never the body.
"""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from dataclasses import dataclass, field

from fastapi import FastAPI, Query, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from plumbing.kafka.clients import Kafka
from plumbing.kafka.follower import Follower
from plumbing.settings import Settings
from plumbing.telemetry.metrics import GatewayMetrics, exposition
from plumbing.telemetry.server import Readiness
from producers.gateway import errors, openai_api, openapi_doc
from producers.gateway.admission import AdmissionClient
from producers.gateway.auth import Authenticator, presented_key
from producers.gateway.bridge import StreamBridge
from producers.gateway.database import GatewayDatabase, Principal
from producers.gateway.errors import ApiError
from producers.gateway.lookup import find_generation
from producers.gateway.middleware import BodyLimit, ResponseMetrics
from producers.gateway.presence import Presence
from producers.gateway.replay import replay_from
from producers.gateway.prompts import ModelCatalog
from producers.gateway.requests import GenerationRequest
from producers.gateway.slots import STREAMS, WAITING, TenantSlots, holding
from producers.gateway.stalls import GatewayApp
from producers.gateway.status import TERMINAL, read_status
from producers.gateway.streams import (
    BoundedDelivery, ClosingStreamingResponse, close_with_error, final_payload, follow_live, open_source, parse_cursor,
    serve_websocket, sse_body,
)
from producers.gateway.submit import submit_generation
from producers.gateway.workers import WorkerBoard
from schemas.commands import CancelGeneration
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
    auth: Authenticator
    slots: TenantSlots
    presence: Presence = field(default_factory=Presence)
    deliveries: set = field(default_factory=set)  # the open streams' queues (BoundedDelivery): what they hold

    @classmethod
    def create(cls, settings: Settings, kafka: Kafka, database_url: str) -> "Gateway":
        catalog = ModelCatalog()
        metrics = GatewayMetrics()
        board = WorkerBoard(settings.controller_group)

        def on_worker(_topic, event) -> None:
            if isinstance(event, WorkerHeartbeat):
                board.observe(event)

        db = GatewayDatabase(database_url, settings.gateway_db_pool_size)
        slots = TenantSlots({STREAMS: settings.gateway_max_streams_per_tenant,
                             WAITING: settings.gateway_max_waiting_per_tenant}, settings.retry_after_ms)
        bridge = StreamBridge(kafka, start=replay_from(db.projected_offsets, settings.bridge_replay_max_s))
        return cls(settings, AdmissionClient(kafka, settings.controller_group, latency=metrics.admission_latency),
                   bridge, db, catalog,
                   Follower(kafka, [MODELS], lambda _topic, event: catalog.observe(event),
                            client_id="gateway-models"), metrics, board=board,
                   workers_follower=Follower(kafka, [WORKERS], on_worker, client_id="gateway-workers"),
                   auth=Authenticator(db, settings), slots=slots)

    async def principal(self, request: Request) -> Principal:
        """The caller's tenant from its API key (401, or 429 for an address failing too often)."""
        return await self.auth.principal(presented_key(request.headers),
                                         request.client.host if request.client else None)

    async def start(self) -> None:
        await self.db.start()
        await self.models.start()
        await self.models.catch_up()
        self._models_task = asyncio.create_task(self.models.run(), name="gateway-models")
        await self.workers_follower.start()
        self._workers_task = asyncio.create_task(self.workers_follower.run(), name="gateway-workers")
        await self.bridge.start()
        await self.admission.start()
        self._presence_task = asyncio.create_task(self.cancel_unwatched(), name="gateway-disconnect-policy")

    async def cancel_unwatched(self) -> None:
        """Disconnect policy: cancel interactive generations nobody has watched for `disconnect_grace_s`."""
        while True:
            grace = self.settings.disconnect_grace_s
            await asyncio.sleep(min(1.0, grace / 4))
            for generation_id in self.presence.due(grace):
                view = self.bridge.view(generation_id)
                if view is None or view.tier != "interactive" or view.cancel_requested or view.final is not None \
                        or view.terminal is not None:
                    continue
                command = CancelGeneration(tenant_id=view.tenant_id, generation_id=generation_id,
                                           gateway_id=self.admission.gateway_id,
                                           correlation_id=self.admission.correlation_id(),
                                           plane=self.settings.controller_group)
                decision = await self.admission.decide(command, self.settings.admission_timeout_ms / 1000)
                log.info("canceled after disconnect generation=%s grace_s=%.1f status=%s", generation_id, grace,
                         decision.http_status if decision else "no-decision")

    async def readiness(self) -> Readiness:
        """Ready: the admission client, stream bridge and model follower run, the bridge has replayed what the
        projections lack (else a read of a generation admitted elsewhere would wait), and the database answers."""
        return Readiness({"admission": self.admission.running, "bridge": self.bridge.running,
                          "bridge_caught_up": self.bridge.caught_up,
                          "models": self.models.caught_up.is_set() and not self._models_task.done(),
                          "database": await self.db.ping()})

    async def stop(self) -> None:
        self._presence_task.cancel()
        self._models_task.cancel()
        self._workers_task.cancel()
        await self.admission.stop()
        await self.bridge.stop()
        await self.models.stop()
        await self.workers_follower.stop()
        await self.db.stop()


def create_app(settings: Settings, kafka: Kafka, database_url: str) -> FastAPI:
    gateway = Gateway.create(settings, kafka, database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = GatewayApp(title="ledgerlm gateway", lifespan=lifespan)
    app.stall_timeout_s = settings.stream_stall_timeout_s
    app.state.gateway = gateway
    errors.install(app)
    app.add_middleware(BodyLimit, limit=settings.max_request_body_bytes)
    app.add_middleware(ResponseMetrics, metrics=gateway.metrics)
    timeout_s = settings.admission_timeout_ms / 1000

    principal_of = gateway.principal

    async def lookup(principal: Principal, generation_id: str) -> dict:
        """The caller's generation on any gateway, however far the projections lag (lookup.py); 404 / 503."""
        return await find_generation(gateway.db, gateway.bridge, gateway.settings, principal.tenant_id, generation_id)

    def event_stream(generation_id: str, first: dict, source, after: int, status_code: int = 200):
        """SSE of `source` behind this connection's bounded queue (see streams.py)."""
        delivery = BoundedDelivery(source, gateway.settings.stream_queue_events, after, generation_id,
                                   gateway.presence, gateway.deliveries)
        return ClosingStreamingResponse(sse_body(first, delivery), status_code=status_code,
                                        media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    async def wait_for_end(generation_id: str) -> dict:
        """The final payload with the text; with n > 1 choices, `choices` [{index, text, endReason}] too."""
        texts: dict[int, list[str]] = {}
        ends: dict[int, str | None] = {}
        async for kind, item in gateway.bridge.follow(generation_id):
            if kind == "token":
                texts.setdefault(item.choice, []).append(item.text_delta)
                ends[item.choice] = item.choice_end or ends.get(item.choice)
            elif kind == "final":
                status = "completed" if item.reason in ("completed", "output-limit") else item.reason
                done = {**final_payload(item, generation_id), "status": status, "text": "".join(texts.get(0, []))}
                if len(texts) > 1:
                    done["choices"] = [{"index": i, "text": "".join(texts[i]), "endReason": ends.get(i)}
                                       for i in sorted(texts)]
                return done
        raise ApiError(504, "wait_timeout", "the generation did not end in time", {"generationId": generation_id})

    @app.get("/healthz")
    async def healthz():
        return {"ok": True, "gatewayId": gateway.admission.gateway_id, "models": sorted(gateway.catalog.versions)}

    @app.get("/readyz", responses={503: {"description": "not ready: the failing checks are false"}})
    async def readyz():
        readiness = await gateway.readiness()
        return JSONResponse(readiness.as_json(), status_code=200 if readiness.ready else 503)

    @app.get("/health", responses={503: {"description": "not ready: the failing checks are false"}})
    async def health():
        """vLLM's probe: 200 (empty) when ready, else 503 like /readyz."""
        readiness = await gateway.readiness()
        if readiness.ready:
            return Response(status_code=200)
        return JSONResponse(readiness.as_json(), status_code=503)

    @app.get("/metrics", response_class=Response)
    async def metrics():
        return Response(exposition(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/generations")
    async def create_generation(body: GenerationRequest, request: Request, wait: bool = False):
        principal = await principal_of(request)
        started = time.perf_counter()
        if body.stream or wait:
            slot = gateway.slots.acquire(principal.tenant_id, STREAMS if body.stream else WAITING)
            return await holding(slot, answer_generation(body, principal, wait, started))
        return await answer_generation(body, principal, wait, started)

    async def answer_generation(body: GenerationRequest, principal: Principal, wait: bool, started: float):
        """Admit `body` and answer: the generation, its stream, or (`wait`) its end."""
        prompt = await asyncio.to_thread(gateway.catalog.render, body, principal.max_tokens_per_request)
        decision = await submit_generation(gateway, principal, body, prompt, started)
        # The concrete version that runs: an alias was resolved (and pinned for retries) by the controller.
        first = {"id": decision.generation_id, "requestId": body.request_id,
                 "model": decision.model_version or body.model,
                 "status": "admitted" if decision.http_status == 201 else decision.status,
                 "inputTokens": len(prompt.token_ids), "created": decision.http_status == 201}
        gen_id = decision.generation_id
        # A repeat of a generation older than this gateway's bridge is served from the projections.
        seen = decision.http_status == 201 or gateway.bridge.view(gen_id) is not None
        status = None if seen else await read_status(gateway.db, gateway.bridge, principal.tenant_id, gen_id)
        if decision.http_status == 200:
            view = gateway.bridge.view(gen_id)
            first["status"] = status["status"] if status else (view.status if view else first["status"])
        if body.stream:
            if status is None:
                source = follow_live(gateway.bridge, gateway.db, gen_id, 0)
            else:
                status = {**first, **status}
                source = await open_source(gateway.bridge, gateway.db, gen_id, status, 0)
            if source is None:
                return Response(status_code=204)
            return event_stream(gen_id, first if status is None else status, source, 0, decision.http_status)
        if wait and status is None:
            return JSONResponse({**first, **await wait_for_end(gen_id)}, status_code=decision.http_status)
        if wait and status["status"] in TERMINAL:
            return JSONResponse({**first, **status}, status_code=decision.http_status)
        return JSONResponse(first if status is None else {**first, **status}, status_code=decision.http_status)

    @app.get("/v1/generations/{generation_id}")
    async def get_generation(generation_id: str, request: Request):
        principal = await principal_of(request)
        return await lookup(principal, generation_id)

    @app.get("/v1/generations/{generation_id}/events")
    async def generation_events(generation_id: str, request: Request, after: str | None = None):
        """SSE; each event's `id` is its seq, so `Last-Event-ID` (or `?after=SEQ`) resumes after it."""
        principal = await principal_of(request)
        status = await lookup(principal, generation_id)
        cursor = parse_cursor(request.headers.get("last-event-id"), after)
        return await holding(gateway.slots.acquire(principal.tenant_id, STREAMS),
                             open_events(generation_id, status, cursor))

    async def open_events(generation_id: str, status: dict, cursor: int):
        source = await open_source(gateway.bridge, gateway.db, generation_id, status, cursor)
        if source is None:  # the client holds the final event; 204 also stops an EventSource reconnecting
            return Response(status_code=204)
        return event_stream(generation_id, status, source, cursor)

    @app.websocket("/v1/generations/{generation_id}/stream")
    async def generation_stream(websocket: WebSocket, generation_id: str, after: str | None = None,
                                api_key: str | None = None):
        """The events stream as WebSocket JSON messages; `?after=SEQ` resumes; key by header or `?api_key=`."""
        await websocket.accept()
        slot = None
        try:
            principal = await gateway.auth.principal(presented_key(websocket.headers, api_key),
                                                     websocket.client.host if websocket.client else None)
            status = await lookup(principal, generation_id)
            cursor = parse_cursor(None, after)
            slot = gateway.slots.acquire(principal.tenant_id, STREAMS)
            source = await open_source(gateway.bridge, gateway.db, generation_id, status, cursor)
        except ApiError as error:
            if slot is not None:
                slot.release()
            await close_with_error(websocket, error)
            return
        try:
            if source is None:
                await websocket.close(1000, "end")
                return
            delivery = BoundedDelivery(source, gateway.settings.stream_queue_events, cursor, generation_id,
                                       gateway.presence, gateway.deliveries)
            await serve_websocket(websocket, status, delivery)
        finally:
            slot.release()

    @app.get("/v1/usage")
    async def usage(request: Request, start: datetime | None = Query(None, alias="from"),
                    end: datetime | None = Query(None, alias="to")):
        """The caller's sealed (billed) usage in hourly buckets; default: the last 24 hours."""
        principal = await principal_of(request)
        end = end or datetime.now(UTC)
        start = start or end - timedelta(hours=24)
        if start.tzinfo is None or end.tzinfo is None:
            raise ApiError(400, "invalid_request", "from/to need a UTC offset (e.g. 2026-11-29T10:00:00Z)",
                           {"fields": ["from", "to"]})
        if start >= end:
            raise ApiError(400, "invalid_request", "from must be before to", {"fields": ["from", "to"]})
        summary = await gateway.db.tenant_usage(principal.tenant_id, start, end)
        return summary.as_json()

    @app.post("/v1/generations/{generation_id}/cancel")
    async def cancel_generation(generation_id: str, request: Request):
        principal = await principal_of(request)
        command = CancelGeneration(tenant_id=principal.tenant_id, generation_id=generation_id,
                                   gateway_id=gateway.admission.gateway_id,
                                   correlation_id=gateway.admission.correlation_id(), plane=settings.controller_group)
        decision = await gateway.admission.decide(command, timeout_s)
        if decision is None:
            raise ApiError(503, "controller_unavailable", "no cancel decision in time",
                           {"generationId": generation_id}, settings.retry_after_ms)
        if decision.http_status == 404:
            # The controller forgets an identity identity_ttl_s after its end; the projection still knows it.
            ended = await read_status(gateway.db, gateway.bridge, principal.tenant_id, generation_id)
            if ended is None or ended["status"] not in TERMINAL:
                raise ApiError(404, "not_found", "no such generation", {"generationId": generation_id})
            return JSONResponse({"id": generation_id, "status": ended["status"], "endReason": ended["endReason"],
                                 "requestId": ended["requestId"]}, status_code=200)
        status, end_reason = decision.status, None
        if decision.http_status == 200:  # already ended: the controller reports how
            end_reason = decision.status
            status = "completed" if end_reason in ("completed", "output-limit") else end_reason
        return JSONResponse({"id": generation_id, "status": status, "endReason": end_reason,
                             "requestId": decision.request_id}, status_code=decision.http_status)

    app.include_router(openai_api.router(gateway))
    openapi_doc.install(app)
    return app
