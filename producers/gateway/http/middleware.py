"""ASGI middleware of the gateway: a request-body size limit and response counting.

Both are plain ASGI (not Starlette's BaseHTTPMiddleware) so streamed SSE
responses pass through untouched.

    client ─▶ ResponseMetrics ─▶ BodyLimit ─▶ FastAPI routes
"""
from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from plumbing.telemetry.metrics import GatewayMetrics
from producers.gateway.errors import ApiError, error_response, openai_error_response

ADMISSION_PATHS = frozenset({"/v1/generations", "/v1/completions", "/v1/chat/completions"})
OPENAI_PREFIXES = ("/v1/completions", "/v1/chat/completions", "/v1/models")


def too_large(path: str, limit: int):
    """413 in the error shape of the route: OpenAI's for the OpenAI-compatible routes, the native one elsewhere."""
    error = ApiError(413, "body_too_large", f"the request body exceeds {limit} bytes", {"limitBytes": limit})
    if path.startswith(OPENAI_PREFIXES):
        return openai_error_response(error)
    return error_response(error.status, error.code, error.message, error.details)


class BodyLimit:
    """Refuse bodies over `limit` bytes with 413: by Content-Length before reading, else while streaming in."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            await too_large(scope["path"], self.limit)(scope, receive, send)
            return
        received = 0
        answered = False  # the 413 went out: whatever the app answers after it is dropped

        async def limited_receive() -> Message:
            nonlocal received, answered
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit and not answered:
                    answered = True
                    await too_large(scope["path"], self.limit)(scope, receive, send)
                    return {"type": "http.disconnect"}  # the app stops reading as if the client left
            return message

        async def guarded_send(message: Message) -> None:
            if not answered:
                await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not answered:
                raise  # after a 413, the app's complaint about the cut body is expected and moot


class ResponseMetrics:
    """Count every response by status; refused generation requests (>= 400) also as admission rejections."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        admission = scope["method"] == "POST" and scope["path"] in ADMISSION_PATHS

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                code = str(message["status"])
                self.metrics.responses.labels(code=code).inc()
                if admission and message["status"] >= 400:
                    self.metrics.rejections.labels(code=code).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
