"""The native API, beside the OpenAI-compatible one (`openai/api.py`); errors in the native shape (`errors.py`).

    POST /v1/generations               201 new | 200 existing | 400 | 401 | 404 model | 409 | 429 | 503
    GET  /v1/generations/{id}          status (404 for unknown or another tenant's id; the caller's own is found
                                       on any gateway however far the projections lag: lookup.py)
    GET  /v1/generations/{id}/events   SSE stream of the generation; resumes after Last-Event-ID / ?after= (streams.py)
    WS   /v1/generations/{id}/stream   the same events as WebSocket messages
    POST /v1/generations/{id}/cancel   202 canceling | 200 already ended | 404
    (usage, line items and statements: usage.py)

The tenant comes from the API key (`gateway.principal_of`), never the body.
"""
from __future__ import annotations

import asyncio
import time

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, Response

from producers.gateway.admission.requests import GenerationRequest
from producers.gateway.admission.slots import STREAMS, WAITING, holding
from producers.gateway.admission.submit import submit_generation
from producers.gateway.database import Principal
from producers.gateway.errors import ApiError
from producers.gateway.gateway import Gateway, principal_of
from producers.gateway.native.lookup import find_generation
from producers.gateway.native.status import TERMINAL, read_status
from producers.gateway.native.streams import follow_live, open_source, parse_cursor
from producers.gateway.streams.delivery import (
    BoundedDelivery, ClosingStreamingResponse, close_with_error, serve_websocket, sse_body,
)
from schemas.commands import CancelGeneration


class NativeApi:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def lookup(self, principal: Principal, generation_id: str) -> dict:
        """The caller's generation on any gateway, however far the projections lag (lookup.py); 404 / 503."""
        gateway = self.gateway
        return await find_generation(gateway.db, gateway.bridge, gateway.settings, principal.tenant_id, generation_id)

    def delivery(self, generation_id: str, source, after: int) -> BoundedDelivery:
        gateway = self.gateway
        return BoundedDelivery(source, gateway.settings.stream_queue_events, after, generation_id, gateway.presence,
                               gateway.deliveries)

    def event_stream(self, generation_id: str, first: dict, source, after: int, status_code: int = 200):
        """SSE of `source` behind this connection's bounded queue (see streams/delivery.py)."""
        return ClosingStreamingResponse(sse_body(first, self.delivery(generation_id, source, after)),
                                        status_code=status_code, media_type="text/event-stream",
                                        headers={"Cache-Control": "no-cache"})

    async def wait_for_end(self, generation_id: str) -> dict:
        """The final payload with the text; with n > 1 choices, `choices` [{index, text, endReason}] too."""
        texts: dict[int, list[str]] = {}
        ends: dict[int, str | None] = {}
        # follow_live, not the bridge alone: a view begun after the stream did lacks its first tokens.
        async for event in follow_live(self.gateway.bridge, self.gateway.db, generation_id, 0):
            data = event.data
            if event.kind == "token":
                choice = data.get("choice", 0)
                texts.setdefault(choice, []).append(data["textDelta"])
                ends[choice] = data.get("choiceEnd") or ends.get(choice)
            elif event.kind == "final":
                status = "completed" if data["reason"] in ("completed", "output-limit") else data["reason"]
                done = {**data, "status": status, "text": "".join(texts.get(0, []))}
                if len(texts) > 1:
                    done["choices"] = [{"index": i, "text": "".join(texts[i]), "endReason": ends.get(i)}
                                       for i in sorted(texts)]
                return done
            elif data.get("code") == "cursor_expired":
                raise ApiError(503, "stream_behind", "the stored stream does not hold all its tokens yet; retry",
                               {"generationId": generation_id}, retry_after_ms=1000)
        raise ApiError(504, "wait_timeout", "the generation did not end in time", {"generationId": generation_id})

    async def create(self, body: GenerationRequest, principal: Principal, wait: bool, started: float):
        """Admit `body` and answer: the generation, its stream, or (`wait`) its end."""
        gateway = self.gateway
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
            return await self.created_stream(gen_id, first, status, decision.http_status)
        if wait and status is None:
            return JSONResponse({**first, **await self.wait_for_end(gen_id)}, status_code=decision.http_status)
        if wait and status["status"] in TERMINAL:
            return JSONResponse({**first, **status}, status_code=decision.http_status)
        return JSONResponse(first if status is None else {**first, **status}, status_code=decision.http_status)

    async def created_stream(self, gen_id: str, first: dict, status: dict | None, http_status: int):
        gateway = self.gateway
        if status is None:
            source = follow_live(gateway.bridge, gateway.db, gen_id, 0)
        else:
            status = {**first, **status}
            source = await open_source(gateway.bridge, gateway.db, gen_id, status, 0)
        if source is None:
            return Response(status_code=204)
        return self.event_stream(gen_id, first if status is None else status, source, 0, http_status)

    async def events(self, generation_id: str, status: dict, cursor: int):
        source = await open_source(self.gateway.bridge, self.gateway.db, generation_id, status, cursor)
        if source is None:  # the client holds the final event; 204 also stops an EventSource reconnecting
            return Response(status_code=204)
        return self.event_stream(generation_id, status, source, cursor)

    async def websocket(self, websocket: WebSocket, generation_id: str, after: str | None, api_key: str | None):
        gateway = self.gateway
        slot = None
        try:
            principal = await principal_of(websocket, api_key)
            status = await self.lookup(principal, generation_id)
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
            await serve_websocket(websocket, status, self.delivery(generation_id, source, cursor))
        finally:
            slot.release()

    async def cancel(self, principal: Principal, generation_id: str) -> JSONResponse:
        gateway, settings = self.gateway, self.gateway.settings
        command = CancelGeneration(tenant_id=principal.tenant_id, generation_id=generation_id,
                                   gateway_id=gateway.admission.gateway_id,
                                   correlation_id=gateway.admission.correlation_id(), plane=settings.controller_group)
        decision = await gateway.admission.decide(command, settings.admission_timeout_ms / 1000)
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


def router(gateway: Gateway) -> APIRouter:
    """The native routes; an ApiError answers in the native shape (the app's handler, `errors.install`)."""
    api = NativeApi(gateway)
    routes = APIRouter()

    @routes.post("/v1/generations")
    async def create_generation(body: GenerationRequest, request: Request, wait: bool = False):
        principal = await principal_of(request)
        started = time.perf_counter()
        if body.stream or wait:
            slot = gateway.slots.acquire(principal.tenant_id, STREAMS if body.stream else WAITING)
            return await holding(slot, api.create(body, principal, wait, started))
        return await api.create(body, principal, wait, started)

    @routes.get("/v1/generations/{generation_id}")
    async def get_generation(generation_id: str, request: Request):
        return await api.lookup(await principal_of(request), generation_id)

    @routes.get("/v1/generations/{generation_id}/events")
    async def generation_events(generation_id: str, request: Request, after: str | None = None):
        """SSE; each event's `id` is its seq, so `Last-Event-ID` (or `?after=SEQ`) resumes after it."""
        principal = await principal_of(request)
        status = await api.lookup(principal, generation_id)
        cursor = parse_cursor(request.headers.get("last-event-id"), after)
        return await holding(gateway.slots.acquire(principal.tenant_id, STREAMS),
                             api.events(generation_id, status, cursor))

    @routes.websocket("/v1/generations/{generation_id}/stream")
    async def generation_stream(websocket: WebSocket, generation_id: str, after: str | None = None,
                                api_key: str | None = None):
        """The events stream as WebSocket JSON messages; `?after=SEQ` resumes; key by header or `?api_key=`."""
        await websocket.accept()
        await api.websocket(websocket, generation_id, after, api_key)

    @routes.post("/v1/generations/{generation_id}/cancel")
    async def cancel_generation(generation_id: str, request: Request):
        return await api.cancel(await principal_of(request), generation_id)

    return routes
