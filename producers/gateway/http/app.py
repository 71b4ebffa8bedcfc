"""The gateway's HTTP app (FastAPI): one `Gateway` (`gateway.py`) behind three routers.

    native/api.py    /v1/generations...                      errors: {"code", "message", "details"}
    native/usage.py  /v1/usage, /v1/generations/{id}/usage, /v1/statements/{period}   (native errors)
    openai/api.py    /v1/models, /v1/completions, /v1/chat/completions, /tokenize, /detokenize
                                                             errors: OpenAI's {"error": {...}}  (both: errors.py)
    here             GET /healthz, /readyz, /health, /metrics  alive | ready | vLLM's probe | Prometheus text
"""
from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from plumbing.kafka.clients import Kafka
from plumbing.settings import Settings
from plumbing.telemetry.metrics import exposition
from producers.gateway import errors
from producers.gateway.gateway import Gateway
from producers.gateway.http import openapi_doc
from producers.gateway.http.middleware import BodyLimit, ResponseMetrics
from producers.gateway.http.stalls import GatewayApp
from producers.gateway.native import api as native_api
from producers.gateway.native import usage as usage_api
from producers.gateway.openai import api as openai_api


def probes(gateway: Gateway) -> APIRouter:
    routes = APIRouter()

    @routes.get("/healthz")
    async def healthz():
        """Alive; which partitions of the token stream this gateway reads (`bridge`)."""
        return {"ok": True, "gatewayId": gateway.admission.gateway_id, "models": sorted(gateway.catalog.versions),
                "bridge": gateway.bridge.tail.as_json()}

    @routes.get("/readyz", responses={503: {"description": "not ready: the failing checks are false"}})
    async def readyz():
        readiness = await gateway.readiness()
        return JSONResponse(readiness.as_json(), status_code=200 if readiness.ready else 503)

    @routes.get("/health", responses={503: {"description": "not ready: the failing checks are false"}})
    async def health():
        """vLLM's probe: 200 (empty) when ready, else 503 like /readyz."""
        readiness = await gateway.readiness()
        if readiness.ready:
            return Response(status_code=200)
        return JSONResponse(readiness.as_json(), status_code=503)

    @routes.get("/metrics", response_class=Response)
    async def metrics():
        return Response(exposition(gateway.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return routes


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
    app.include_router(probes(gateway))
    app.include_router(native_api.router(gateway))
    app.include_router(usage_api.router(gateway))
    app.include_router(openai_api.router(gateway))
    openapi_doc.install(app)
    return app
