"""A client that stops reading is aborted by the stall guard, over real TCP through uvicorn."""
from __future__ import annotations

import asyncio
import socket
import time

import uvicorn

from producers.gateway.http.stalls import GatewayApp
from producers.gateway.streams.delivery import ClosingStreamingResponse
from tests.waiting import wait_until


def streaming_app(stall_s: float, finished: list[str]) -> GatewayApp:
    app = GatewayApp()
    app.stall_timeout_s = stall_s

    @app.get("/endless")
    async def endless():
        async def body():
            try:
                while True:
                    yield b"x" * 4096
            finally:
                finished.append("closed")

        return ClosingStreamingResponse(body())

    @app.get("/small")
    async def small():
        return {"ok": True}

    return app


async def serve(app) -> tuple[uvicorn.Server, asyncio.Task, int]:
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    await wait_until(lambda: server.started, 10, what="uvicorn to start")
    return server, task, server.servers[0].sockets[0].getsockname()[1]


def open_client(port: int, path: str) -> socket.socket:
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills after a few chunks
    client.connect(("127.0.0.1", port))
    client.sendall(f"GET {path} HTTP/1.1\r\nHost: test\r\n\r\n".encode())
    return client


async def test_a_never_reading_client_is_reset_after_the_stall_timeout_and_a_reading_one_is_not():
    finished: list[str] = []
    server, task, port = await serve(streaming_app(0.5, finished))
    stuck = open_client(port, "/endless")
    try:
        started = time.monotonic()
        await wait_until(lambda: finished, 10, step_s=0.05, what="the handler stopped")
        assert finished == ["closed"]  # the handler was stopped and its body closed
        assert time.monotonic() - started < 5
        # The connection is gone, not left open with bytes waiting: reading ends (a reset or EOF) instead of
        # timing out, after at most what the socket buffers held when it was cut.
        stuck.settimeout(5)
        received = 0
        try:
            while chunk := await asyncio.to_thread(stuck.recv, 65536):
                received += len(chunk)
        except ConnectionResetError:
            pass
        assert received < 4 * 1024 * 1024
        # A client that reads gets its answers from the same server.
        reader = open_client(port, "/small")
        reader.settimeout(5)
        answer = b""
        while b'{"ok":true}' not in answer and (chunk := await asyncio.to_thread(reader.recv, 65536)):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and b'{"ok":true}' in answer
        reader.close()
    finally:
        stuck.close()
        server.should_exit = True
        await task
