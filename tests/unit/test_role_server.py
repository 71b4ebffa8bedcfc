"""The roles' tiny HTTP listener: /metrics, /healthz, /readyz over a real socket."""
from __future__ import annotations

import asyncio

import httpx
from prometheus_client import CollectorRegistry, Counter

from plumbing.telemetry.server import Readiness, RoleServer


async def raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    answer = await reader.read()
    writer.close()
    return answer


async def test_the_listener_serves_metrics_health_and_readiness():
    registry = CollectorRegistry()
    Counter("ledgerlm:things", "things", registry=registry).inc(3)
    checks = {"engine_running": True, "heartbeating": False}
    server = RoleServer("worker", registry, lambda: Readiness(dict(checks)), port=0)
    port = await server.start()
    assert port > 0
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            metrics = await client.get("/metrics")
            assert metrics.status_code == 200 and "ledgerlm:things_total 3.0" in metrics.text
            assert (await client.get("/healthz")).json() == {"ok": True, "role": "worker"}
            not_ready = await client.get("/readyz")
            assert not_ready.status_code == 503
            assert not_ready.json() == {"ready": False, "checks": {"engine_running": True, "heartbeating": False}}
            checks["heartbeating"] = True
            assert (await client.get("/readyz?verbose=1")).status_code == 200
            assert (await client.get("/other")).status_code == 404
            assert (await client.post("/metrics")).status_code == 405
        assert (await raw(port, b"nonsense\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    finally:
        await server.stop()
