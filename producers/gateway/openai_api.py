"""The OpenAI-compatible API, beside the native one and admitted by the same flow.

    GET  /v1/models                  registered model versions and aliases (auth required)
    GET  /v1/models/{model}          one of them, 404 otherwise
    POST /v1/completions             `prompt` (one text)
    POST /v1/chat/completions        `messages`, rendered with the version's chat template

A call is one native generation: `Idempotency-Key` is its requestId (a fresh
uuid without one), so a repeat answers the same generation (same `id`), and a
changed body under the same key is a 409. `id` is the generation id, readable
with `GET /v1/generations/{id}`. `usage` is the billed usage of the final
stream event. `finish_reason` is "stop" (end token, stop string or stop token)
or "length"; an end the OpenAI API has no word for keeps the native reason
("canceled", "interrupted", "expired", "failed", "rejected").

Errors are OpenAI's `{"error": {message, type, param, code}}` with the native
statuses (and Retry-After), `code` being the native code. A 409 also says
`x-should-retry: false`, since the official clients otherwise retry 409s.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from producers.gateway.database import Principal
from producers.gateway.errors import ApiError
from producers.gateway.openai_requests import (
    OPENAI_FIELD, ChatCompletionRequest, CompletionRequest, OpenAIRequest,
)
from producers.gateway.prompts import EffectivePrompt
from producers.gateway.requests import GenerationRequest
from producers.gateway.status import TERMINAL, read_status
from producers.gateway.streams import ClosingStreamingResponse
from producers.gateway.submit import submit_generation

if TYPE_CHECKING:
    from producers.gateway.app import Gateway

log = logging.getLogger(__name__)

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 409: "conflict_error", 429: "rate_limit_error"}
FINISH_REASONS = {"completed": "stop", "output-limit": "length"}
REQUEST_ID_CHARS = set(chr(c) for c in range(0x21, 0x7f))


def error_response(exc: ApiError) -> JSONResponse:
    details = exc.details or {}
    fields = details.get("fields") or [details.get("field")]
    param = OPENAI_FIELD.get(fields[0], fields[0])
    kind = ERROR_TYPES.get(exc.status, "server_error" if exc.status >= 500 else "invalid_request_error")
    headers = {}
    if exc.retry_after_ms is not None:
        headers["Retry-After"] = str(max(1, -(-exc.retry_after_ms // 1000)))  # whole seconds, as the native API
    if exc.status == 409:
        headers["x-should-retry"] = "false"
    return JSONResponse({"error": {"message": exc.message, "type": kind, "param": param, "code": exc.code}},
                        status_code=exc.status, headers=headers)


def validation_error(exc: ValidationError) -> ApiError:
    errors = exc.errors()
    fields = [".".join(str(p) for p in e["loc"]) or "body" for e in errors]
    return ApiError(400, "invalid_request", f"{fields[0]}: {errors[0]['msg']}", {"fields": fields})


@dataclass(frozen=True)
class End:
    reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int

    @property
    def finish_reason(self) -> str:
        return FINISH_REASONS.get(self.reason, self.reason)

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


def end_of(reason: str, usage: dict) -> End:
    return End(reason, usage["inputTokens"], usage["cachedInputTokens"], usage["outputTokens"])


def render(gateway: "Gateway", body: OpenAIRequest, request_id: str, principal: Principal
           ) -> tuple[GenerationRequest, EffectivePrompt]:
    """The native request and its effective prompt; blocking (tokenizer), so run it in a thread."""
    max_tokens = body.requested_max_tokens()
    if max_tokens is None:  # chat without a limit: the rest of the context, as OpenAI does
        probe = gateway.catalog.render(body.native(request_id, 1), principal.max_tokens_per_request)
        room = min(gateway.catalog.target(body.model).max_context_tokens, principal.max_tokens_per_request)
        max_tokens = max(room - len(probe.token_ids), 1)  # no room: the render below says why (400)
    if body.min_tokens > max_tokens:  # the limit asked for, or the room left in the context
        raise ApiError(400, "invalid_request", f"min_tokens={body.min_tokens} exceeds max_tokens={max_tokens}",
                       {"field": "min_tokens"})
    native = body.native(request_id, max_tokens)
    return native, gateway.catalog.render(native, principal.max_tokens_per_request)


class OpenAIApi:
    def __init__(self, gateway: "Gateway") -> None:
        self.gateway = gateway

    async def principal_of(self, request: Request) -> Principal:
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else request.headers.get("x-api-key")
        principal = await self.gateway.db.authenticate(key)
        if principal is None:
            raise ApiError(401, "unauthorized", "a valid API key is required (Authorization: Bearer <key>)")
        return principal

    def model_card(self, name: str) -> dict:
        target = self.gateway.catalog.target(name)
        return {"id": name, "object": "model", "created": int(target.created_at.timestamp()),
                "owned_by": "ledgerlm", "max_model_len": target.max_context_tokens}

    async def models(self, request: Request) -> JSONResponse:
        await self.principal_of(request)
        return JSONResponse({"object": "list",
                             "data": [self.model_card(name) for name in self.gateway.catalog.names()]})

    async def model(self, request: Request, name: str) -> JSONResponse:
        await self.principal_of(request)
        return JSONResponse(self.model_card(name))

    async def generate(self, request: Request, kind: type[OpenAIRequest]):
        principal = await self.principal_of(request)
        started = time.perf_counter()
        try:
            body = kind.model_validate(await request.json())
        except json.JSONDecodeError as exc:
            raise ApiError(400, "invalid_json", f"the body is not JSON: {exc.msg}") from None
        except UnicodeDecodeError as exc:
            raise ApiError(400, "invalid_json", f"the body is not UTF-8: byte {exc.start} is invalid") from None
        except ValidationError as exc:
            raise validation_error(exc) from None
        body.check_supported()
        request_id = request.headers.get("idempotency-key") or str(uuid.uuid4())
        if len(request_id) > 256 or not set(request_id) <= REQUEST_ID_CHARS:
            raise ApiError(400, "invalid_request", "Idempotency-Key: 1-256 printable ASCII characters, no spaces",
                           {"field": "requestId"})
        try:
            native, prompt = await asyncio.to_thread(render, self.gateway, body, request_id, principal)
        except ValidationError as exc:
            raise validation_error(exc) from None
        decision = await submit_generation(self.gateway, principal, native, prompt, started)
        pieces = self.pieces(principal.tenant_id, decision.generation_id, fresh=decision.http_status == 201)
        chat = kind is ChatCompletionRequest
        model = decision.model_version or body.model  # an alias answers with the version it was pinned to
        if body.stream:
            return ClosingStreamingResponse(self.chunks(pieces, decision.generation_id, body, chat, model),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        text: list[str] = []
        async for piece in pieces:
            if isinstance(piece, str):
                text.append(piece)
            elif piece is None:
                raise ApiError(504, "wait_timeout", "the generation did not end in time",
                               {"generationId": decision.generation_id})
            else:
                log.info("openai answer generation=%s finish=%s output_tokens=%d", decision.generation_id,
                         piece.finish_reason, piece.completion_tokens)
                return JSONResponse(completion(decision.generation_id, model, "".join(text), piece, chat))
        raise ApiError(504, "wait_timeout", "the generation did not end in time",
                       {"generationId": decision.generation_id})

    async def pieces(self, tenant_id: str, generation_id: str, fresh: bool) -> AsyncIterator[str | End | None]:
        """The generation's text deltas, then its End (None: no end in time), from its first token.

        A generation this gateway's bridge did not see from its start (a repeat of an older one) is
        read from the resume buffer in Postgres first, as the native API does.
        """
        gateway = self.gateway
        status = None
        if not fresh and gateway.bridge.view(generation_id) is None:
            status = await read_status(gateway.db, gateway.bridge, tenant_id, generation_id)
        after_seq, timeout_s = 0, 600.0
        if status is not None:
            timeout_s = gateway.settings.admission_timeout_ms / 1000 * 30
            if status.get("epoch"):
                for seq, _token_ids, text in await gateway.db.stream_events(generation_id, status["epoch"]):
                    yield text
                    after_seq = seq
            if status["status"] in TERMINAL:
                yield end_of(status["endReason"] or status["status"], status["usage"])
                return
        async for kind, item in gateway.bridge.follow(generation_id, timeout_s=timeout_s, after_seq=after_seq):
            if kind == "token":
                yield item.text_delta
            elif kind == "final":
                usage = item.usage
                yield End(item.reason, usage.processed_input_tokens, usage.cached_input_tokens,
                          usage.generated_output_tokens)
            else:
                yield None

    async def chunks(self, pieces: AsyncIterator[str | End | None], generation_id: str, body: OpenAIRequest,
                     chat: bool, model: str) -> AsyncIterator[bytes]:
        created = int(time.time())
        kind = "chat.completion.chunk" if chat else "text_completion"
        extra = {"usage": None} if body.include_usage else {}

        def chunk(choices: list[dict], **more) -> bytes:
            data = {"id": generation_id, "object": kind, "created": created, "model": model,
                    "choices": choices, **extra, **more}
            return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()

        def choice(text: str | None, finish_reason: str | None = None) -> dict:
            if not chat:
                return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
            delta = {} if text is None else {"content": text}
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

        if chat:
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                          "finish_reason": None}])
        async for piece in pieces:
            if isinstance(piece, str):
                if piece:
                    yield chunk([choice(piece)])
            elif piece is None:
                error = {"message": "the generation did not end in time", "type": "server_error", "param": None,
                         "code": "stream_timeout"}
                yield f"data: {json.dumps({'error': error})}\n\n".encode()
                break
            else:
                log.info("openai stream end generation=%s finish=%s output_tokens=%d", generation_id,
                         piece.finish_reason, piece.completion_tokens)
                yield chunk([choice(None, piece.finish_reason)])
                if body.include_usage:
                    yield chunk([], usage=piece.usage())
        yield b"data: [DONE]\n\n"


def completion(generation_id: str, model: str, text: str, end: End, chat: bool) -> dict:
    if chat:
        choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None}, "logprobs": None,
                  "finish_reason": end.finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": end.finish_reason}
    return {"id": generation_id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": model, "choices": [choice], "usage": end.usage()}


def router(gateway: "Gateway") -> APIRouter:
    """The OpenAI-compatible routes; every failure answers in OpenAI's error shape."""
    api = OpenAIApi(gateway)
    routes = APIRouter()

    async def answer(call):
        try:
            return await call
        except ApiError as exc:
            return error_response(exc)

    @routes.get("/v1/models")
    async def list_models(request: Request):
        return await answer(api.models(request))

    @routes.get("/v1/models/{name}")
    async def get_model(name: str, request: Request):
        return await answer(api.model(request, name))

    @routes.post("/v1/completions")
    async def completions(request: Request):
        return await answer(api.generate(request, CompletionRequest))

    @routes.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer(api.generate(request, ChatCompletionRequest))

    return routes
