"""The OpenAI-compatible API, beside the native one and admitted by the same flow.

    GET  /v1/models                  registered model versions and aliases (auth required), as vLLM lists them
    GET  /v1/models/{model}          one of them, 404 otherwise
    POST /v1/completions             `prompt` (one text)
    POST /v1/chat/completions        `messages`, rendered with the version's chat template
    POST /tokenize, /detokenize      vLLM's: a prompt or messages -> token ids, token ids -> text

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
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from producers.gateway.admission.prompts import EffectivePrompt
from producers.gateway.admission.requests import GenerationRequest
from producers.gateway.admission.slots import STREAMS, WAITING, holding
from producers.gateway.admission.submit import submit_generation
from producers.gateway.database import Principal
from producers.gateway.errors import ApiError, openai_error_response
from producers.gateway.gateway import principal_of
from producers.gateway.native.status import TERMINAL, read_status
from producers.gateway.native.streams import with_hole_before
from producers.gateway.openai.chunks import End, Piece, TokenTexts, end_of
from producers.gateway.openai.reply import Reply, answer, stream
from producers.gateway.openai.requests import (
    OPENAI_FIELD, ChatCompletionRequest, CompletionRequest, OpenAIRequest,
)
from producers.gateway.openai.tokenize import DetokenizeRequest, TokenizeRequest, detokenize, tokenize
from producers.gateway.streams.delivery import ClosingStreamingResponse

if TYPE_CHECKING:
    from producers.gateway.gateway import Gateway

log = logging.getLogger(__name__)

REQUEST_ID_CHARS = set(chr(c) for c in range(0x21, 0x7f))


def error_response(exc: ApiError) -> JSONResponse:
    """OpenAI's error shape (`errors.py`), naming the OpenAI field where a native one failed."""
    return openai_error_response(exc, OPENAI_FIELD)


def validation_error(exc: ValidationError) -> ApiError:
    errors = exc.errors()
    fields = [".".join(str(p) for p in e["loc"]) or "body" for e in errors]
    return ApiError(400, "invalid_request", f"{fields[0]}: {errors[0]['msg']}", {"fields": fields})


async def read_body(request: Request, kind: type[BaseModel]) -> BaseModel:
    """The JSON body as `kind`; ApiError 400 naming what is wrong."""
    try:
        return kind.model_validate(await request.json())
    except json.JSONDecodeError as exc:
        raise ApiError(400, "invalid_json", f"the body is not JSON: {exc.msg}") from None
    except UnicodeDecodeError as exc:
        raise ApiError(400, "invalid_json", f"the body is not UTF-8: byte {exc.start} is invalid") from None
    except ValidationError as exc:
        raise validation_error(exc) from None


def render(gateway: "Gateway", body: OpenAIRequest, request_id: str, principal: Principal
           ) -> tuple[GenerationRequest, EffectivePrompt, TokenTexts | None]:
    """The native request, its effective prompt and (for logprobs) token texts; blocking (tokenizer), so run it
    in a thread."""
    max_tokens = body.requested_max_tokens()
    if max_tokens is None:  # chat without a limit: the rest of the context, as OpenAI does
        probe = gateway.catalog.render(body.native(request_id, 1), principal.max_tokens_per_request)
        room = min(gateway.catalog.target(body.model).max_context_tokens, principal.max_tokens_per_request)
        max_tokens = max(room - len(probe.token_ids), 1)  # no room: the render below says why (400)
    if body.min_tokens > max_tokens:  # the limit asked for, or the room left in the context
        raise ApiError(400, "invalid_request", f"min_tokens={body.min_tokens} exceeds max_tokens={max_tokens}",
                       {"field": "min_tokens"})
    native = body.native(request_id, max_tokens)
    prompt = gateway.catalog.render(native, principal.max_tokens_per_request)
    texts = None
    if body.output_logprobs() is not None or body.scored_prompt_logprobs() is not None:
        texts = TokenTexts(gateway.catalog.grammar_tokenizer(gateway.catalog.target(body.model).renderer))
    return native, prompt, texts


class OpenAIApi:
    def __init__(self, gateway: "Gateway") -> None:
        self.gateway = gateway

    def model_card(self, name: str) -> dict:
        target = self.gateway.catalog.target(name)
        return {"id": name, "object": "model", "created": int(target.created_at.timestamp()),
                "owned_by": "ledgerlm", "root": name, "parent": None, "max_model_len": target.max_context_tokens,
                "permission": []}

    async def models(self, request: Request) -> JSONResponse:
        await principal_of(request)
        return JSONResponse({"object": "list",
                             "data": [self.model_card(name) for name in self.gateway.catalog.names()]})

    async def model(self, request: Request, name: str) -> JSONResponse:
        await principal_of(request)
        return JSONResponse(self.model_card(name))

    async def tokenize(self, request: Request) -> JSONResponse:
        await principal_of(request)
        body = await read_body(request, TokenizeRequest)
        return JSONResponse(await asyncio.to_thread(tokenize, self.gateway.catalog, body))

    async def detokenize(self, request: Request) -> JSONResponse:
        await principal_of(request)
        body = await read_body(request, DetokenizeRequest)
        return JSONResponse(await asyncio.to_thread(detokenize, self.gateway.catalog, body))

    async def generate(self, request: Request, kind: type[OpenAIRequest]):
        principal = await principal_of(request)
        started = time.perf_counter()
        body = await read_body(request, kind)
        body.check_supported()
        request_id = request.headers.get("idempotency-key") or str(uuid.uuid4())
        if len(request_id) > 256 or not set(request_id) <= REQUEST_ID_CHARS:
            raise ApiError(400, "invalid_request", "Idempotency-Key: 1-256 printable ASCII characters, no spaces",
                           {"field": "requestId"})
        # Streamed or not, the call holds the connection until the generation ends: one slot of its tenant's.
        slot = self.gateway.slots.acquire(principal.tenant_id, STREAMS if body.stream else WAITING)
        return await holding(slot, self.admit_and_answer(principal, body, request_id, started))

    async def admit_and_answer(self, principal: Principal, body: OpenAIRequest, request_id: str, started: float):
        try:
            native, prompt, texts = await asyncio.to_thread(render, self.gateway, body, request_id, principal)
        except ValidationError as exc:
            raise validation_error(exc) from None
        decision = await submit_generation(self.gateway, principal, native, prompt, started)
        pieces = self.pieces(principal.tenant_id, decision.generation_id, fresh=decision.http_status == 201)
        model = decision.model_version or body.model  # an alias answers with the version it was pinned to
        tools = body.tool_mode() if isinstance(body, ChatCompletionRequest) else None
        reply = Reply(decision.generation_id, model, body, prompt.token_ids, texts, tools)
        if body.stream:
            return ClosingStreamingResponse(stream(reply, pieces), media_type="text/event-stream",
                                            headers={"Cache-Control": "no-cache"})
        return JSONResponse(await answer(reply, pieces))

    async def pieces(self, tenant_id: str, generation_id: str, fresh: bool) -> AsyncIterator[Piece | End | None]:
        """The generation's pieces, then its End (None: no end in time), from its first token.

        A generation this gateway's bridge did not see from its start (a repeat of an older one) is
        read from the resume buffer in Postgres first, as the native API does (without logprobs: the
        buffer keeps tokens and text only); so are the seqs a view lacks before its first event.
        """
        gateway = self.gateway
        status = None
        if not fresh and gateway.bridge.view(generation_id) is None:
            status = await read_status(gateway.db, gateway.bridge, tenant_id, generation_id)
        after_seq, timeout_s, count = 0, 600.0, 0
        if status is not None:
            timeout_s = gateway.settings.admission_timeout_ms / 1000 * 30
            if status.get("epoch"):
                for row in await gateway.db.stream_events(generation_id, status["epoch"]):
                    count += len(row.token_ids)
                    yield Piece(row.text, tuple(row.token_ids), count, row.logprobs(),
                                row.logprobs("prompt_logprobs"), row.choice, row.choice_end)
                    after_seq = row.seq
            if status["status"] in TERMINAL:
                yield end_of(status["endReason"] or status["status"], status["usage"])
                return
        async for kind, item in gateway.bridge.follow(generation_id, timeout_s=timeout_s, after_seq=after_seq):
            if kind == "final" or (kind == "token" and item.seq > after_seq + 1):  # not per token
                # A view begun after the stream did (its partition started where the projections stood) lacks
                # the seqs before its first event: they are in the buffer.
                item, _, rows = await with_hole_before(gateway.bridge, gateway.db, generation_id, kind, item,
                                                       after_seq)
                if rows is None:
                    yield None
                    return
                for row in rows:
                    count += len(row.token_ids)
                    yield Piece(row.text, tuple(row.token_ids), count, row.logprobs(),
                                row.logprobs("prompt_logprobs"), row.choice, row.choice_end)
            if kind == "token":
                yield Piece(item.text_delta, item.token_ids, item.token_count, item.logprobs, item.prompt_logprobs,
                            item.choice, item.choice_end)
                after_seq, count = item.seq, item.token_count
            elif kind == "final":
                usage = item.usage
                yield End(item.reason, usage.processed_input_tokens, usage.cached_input_tokens,
                          usage.generated_output_tokens)
            else:
                yield None


def router(gateway: "Gateway") -> APIRouter:
    """The OpenAI-compatible routes (and vLLM's tokenizer routes); every failure answers in OpenAI's error shape."""
    api = OpenAIApi(gateway)
    routes = APIRouter()

    async def answer_call(call):
        try:
            return await call
        except ApiError as exc:
            return error_response(exc)

    @routes.get("/v1/models")
    async def list_models(request: Request):
        return await answer_call(api.models(request))

    @routes.get("/v1/models/{name}")
    async def get_model(name: str, request: Request):
        return await answer_call(api.model(request, name))

    @routes.post("/v1/completions")
    async def completions(request: Request):
        return await answer_call(api.generate(request, CompletionRequest))

    @routes.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await answer_call(api.generate(request, ChatCompletionRequest))

    @routes.post("/tokenize")
    async def tokenize_route(request: Request):
        return await answer_call(api.tokenize(request))

    @routes.post("/detokenize")
    async def detokenize_route(request: Request):
        return await answer_call(api.detokenize(request))

    return routes
