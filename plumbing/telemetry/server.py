"""A tiny HTTP/1.1 listener on the role's own event loop: `/metrics`, `/healthz`, `/readyz`.

The controller, worker and projector are Kafka processes, not web servers;
this answers GET only, one request per connection, and needs nothing beyond
asyncio and prometheus_client. Port 0 binds an ephemeral port; the bound
one is logged (`metrics listening role=R port=N`) so tests and benches find it.

    /metrics  200 Prometheus text format
    /healthz  200 {"ok": true, "role": R}            the loop answers
    /readyz   200 | 503 {"ready": bool, "checks": {...}}   the role's own readiness checks
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry

from plumbing.telemetry.metrics import exposition

log = logging.getLogger(__name__)

REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request", 503: "Service Unavailable"}


@dataclass(frozen=True)
class Readiness:
    """Named checks; ready when every one holds."""

    checks: dict[str, bool] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return all(self.checks.values())

    def as_json(self) -> dict:
        return {"ready": self.ready, "checks": self.checks}


class RoleServer:
    def __init__(self, role: str, registry: CollectorRegistry, readiness: Callable[[], Readiness],
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.role = role
        self.registry = registry
        self.readiness = readiness
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("metrics listening role=%s host=%s port=%d", self.role, self.host, self.port)
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    def respond(self, method: str, path: str) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0]
        if path not in ("/metrics", "/healthz", "/readyz"):
            return 404, "application/json", b'{"code": "not_found"}'
        if method != "GET":
            return 405, "application/json", b'{"code": "method_not_allowed"}'
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, exposition(self.registry)
        if path == "/healthz":
            return 200, "application/json", json.dumps({"ok": True, "role": self.role}).encode()
        readiness = self.readiness()
        return (200 if readiness.ready else 503), "application/json", json.dumps(readiness.as_json()).encode()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
            status, media_type, body = self.respond(parts[0], parts[1]) if len(parts) == 3 else \
                (400, "application/json", b'{"code": "bad_request"}')
            writer.write(f"HTTP/1.1 {status} {REASONS[status]}\r\nContent-Type: {media_type}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that sent no complete request head gets nothing
        finally:
            writer.close()
