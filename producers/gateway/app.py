"""The gateway's HTTP API (FastAPI).

    POST /v1/generations               201 new | 200 existing | 400 | 401 | 404 model | 409 | 429 | 503
    GET  /v1/generations/{id}          status (404 for unknown or another tenant's id)
    GET  /v1/generations/{id}/events   SSE stream of the generation (token events, then the final event)
    POST /v1/generations/{id}/cancel   202 canceling | 200 already ended | 404
    GET  /v1/usage?from=&to=           the caller's sealed usage per hour (from the billing projection)
    /v1/models, /v1/completions, /v1/chat/completions   OpenAI-compatible (`openai_api.py`)

The tenant comes from the API key (`Authorization: Bearer <key>`), never the body.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from dataclasses import dataclass

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, StreamingResponse

from consumers.kafka.follower import Follower
from ledgerlm.settings import Settings
from producers.gateway import errors, openai_api
from producers.gateway.admission import AdmissionClient
from producers.gateway.bridge import FinalEvent, StreamBridge
from producers.gateway.database import GatewayDatabase, Principal
from producers.gateway.errors import ApiError
from producers.gateway.prompts import ModelCatalog
from producers.gateway.requests import GenerationRequest
from producers.gateway.status import TERMINAL, read_status
from producers.gateway.submit import submit_generation
from schemas.commands import CancelGeneration
from schemas.registry_events import ModelVersionRegistered
from schemas.topics import MODELS

log = logging.getLogger(__name__)


@dataclass
class Gateway:
    settings: Settings
    admission: AdmissionClient
    bridge: StreamBridge
    db: GatewayDatabase
    catalog: ModelCatalog
    models: Follower

    @classmethod
    def create(cls, settings: Settings, bootstrap: str, database_url: str) -> "Gateway":
        catalog = ModelCatalog()

        def on_model(_topic, event):
            if isinstance(event, ModelVersionRegistered):
                catalog.observe(event)

        return cls(settings, AdmissionClient(bootstrap, settings.controller_group), StreamBridge(bootstrap),
                   GatewayDatabase(database_url), catalog,
                   Follower(bootstrap, [MODELS], on_model, client_id="gateway-models"))

    async def start(self) -> None:
        await self.db.start()
        await self.models.start()
        await self.models.catch_up()
        self._models_task = asyncio.create_task(self.models.run(), name="gateway-models")
        await self.bridge.start()
        await self.admission.start()

    async def stop(self) -> None:
        self._models_task.cancel()
        await self.admission.stop()
        await self.bridge.stop()
        await self.models.stop()
        await self.db.stop()


def sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def final_payload(final: FinalEvent, generation_id: str) -> dict:
    usage = final.usage
    return {"id": generation_id, "reason": final.reason, "seq": final.seq, "usageLabel": final.usage_label,
            "usage": {"inputTokens": usage.processed_input_tokens, "cachedInputTokens": usage.cached_input_tokens,
                      "outputTokens": usage.generated_output_tokens}}


def create_app(settings: Settings, bootstrap: str, database_url: str) -> FastAPI:
    gateway = Gateway.create(settings, bootstrap, database_url)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        await gateway.start()
        try:
            yield
        finally:
            await gateway.stop()

    app = FastAPI(title="ledgerlm gateway", lifespan=lifespan)
    app.state.gateway = gateway
    errors.install(app)
    timeout_s = settings.admission_timeout_ms / 1000

    async def principal_of(request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else request.headers.get("x-api-key")
        principal = await gateway.db.authenticate(key)
        if principal is None:
            raise ApiError(401, "unauthorized", "a valid API key is required (Authorization: Bearer <key>)")
        return principal

    async def live_events(generation_id: str, **follow):
        """The bridge's token and final events of one generation, as SSE."""
        async for kind, item in gateway.bridge.follow(generation_id, **follow):
            if kind == "token":
                yield sse("token", {"seq": item.seq, "epoch": item.epoch, "tokenIds": list(item.token_ids),
                                    "text": item.text_delta})
            elif kind == "final":
                yield sse("final", final_payload(item, generation_id))
            else:
                yield sse("error", {"code": "stream_timeout", "message": "no final event in time", "details": {}})

    async def stream_events(generation_id: str, first: dict):
        yield sse("generation", first)
        async for event in live_events(generation_id):
            yield event

    async def wait_for_end(generation_id: str) -> dict:
        text: list[str] = []
        async for kind, item in gateway.bridge.follow(generation_id):
            if kind == "token":
                text.append(item.text_delta)
            elif kind == "final":
                status = "completed" if item.reason in ("completed", "output-limit") else item.reason
                return {**final_payload(item, generation_id), "status": status, "text": "".join(text)}
        raise ApiError(504, "wait_timeout", "the generation did not end in time", {"generationId": generation_id})

    @app.get("/healthz")
    async def healthz():
        return {"ok": True, "gatewayId": gateway.admission.gateway_id, "models": sorted(gateway.catalog.versions)}

    @app.post("/v1/generations")
    async def create_generation(body: GenerationRequest, request: Request, wait: bool = False):
        principal = await principal_of(request)
        started = time.perf_counter()
        prompt = await asyncio.to_thread(gateway.catalog.render, body, principal.max_tokens_per_request)
        decision = await submit_generation(gateway.admission, settings, principal, body, prompt, started)
        first = {"id": decision.generation_id, "requestId": body.request_id, "model": body.model,
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
            events = stream_events(gen_id, first) if status is None else replay_events(gen_id, {**first, **status})
            return StreamingResponse(events, status_code=decision.http_status, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        if wait and status is None:
            return JSONResponse({**first, **await wait_for_end(gen_id)}, status_code=decision.http_status)
        if wait and status["status"] in TERMINAL:
            return JSONResponse({**first, **status}, status_code=decision.http_status)
        return JSONResponse(first if status is None else {**first, **status}, status_code=decision.http_status)

    @app.get("/v1/generations/{generation_id}")
    async def get_generation(generation_id: str, request: Request):
        principal = await principal_of(request)
        status = await read_status(gateway.db, gateway.bridge, principal.tenant_id, generation_id)
        if status is None:
            raise ApiError(404, "not_found", "no such generation", {"generationId": generation_id})
        return status

    async def replay_events(generation_id: str, status: dict):
        """A stream this gateway did not see from its start: the resume buffer, then live events."""
        yield sse("generation", status)
        last_seq = 0
        if status.get("epoch"):
            for seq, token_ids, text in await gateway.db.stream_events(generation_id, status["epoch"]):
                yield sse("token", {"seq": seq, "epoch": status["epoch"], "tokenIds": token_ids, "text": text})
                last_seq = seq
        if status["status"] in TERMINAL:
            usage = status["usage"]
            yield sse("final", {"id": generation_id, "reason": status["endReason"] or status["status"],
                                "seq": last_seq + 1, "usageLabel": "interrupted" if status["status"] == "interrupted"
                                else "final", "usage": usage})
            return
        async for event in live_events(generation_id, timeout_s=settings.admission_timeout_ms / 1000 * 30,
                                       after_seq=last_seq):
            yield event

    @app.get("/v1/generations/{generation_id}/events")
    async def generation_events(generation_id: str, request: Request):
        principal = await principal_of(request)
        status = await read_status(gateway.db, gateway.bridge, principal.tenant_id, generation_id)
        if status is None:
            raise ApiError(404, "not_found", "no such generation", {"generationId": generation_id})
        events = stream_events(generation_id, status) if gateway.bridge.view(generation_id) is not None \
            else replay_events(generation_id, status)
        return StreamingResponse(events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

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
            raise ApiError(404, "not_found", "no such generation", {"generationId": generation_id})
        status, end_reason = decision.status, None
        if decision.http_status == 200:  # already ended: the controller reports how
            end_reason = decision.status
            status = "completed" if end_reason in ("completed", "output-limit") else end_reason
        return JSONResponse({"id": generation_id, "status": status, "endReason": end_reason,
                             "requestId": decision.request_id}, status_code=decision.http_status)

    app.include_router(openai_api.router(gateway))
    return app
