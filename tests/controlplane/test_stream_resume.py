"""Native stream resume over the real stack: ids, Last-Event-ID / ?after=, cursor_expired, slow consumers.

A client that disconnects, or reads too slowly, is driven through the ASGI
interface itself: httpx's ASGI transport buffers whole responses, so it could
neither hang up mid-stream nor apply backpressure.
"""
from __future__ import annotations

import asyncio
import json
import time

from plumbing.settings import Settings
from producers.gateway.streams.delivery import SLOW_CONSUMER_GRACE_S
from projections.registry import all_projections
from projections.runtime import Projector
from tests.controlplane.conftest import body, post_until_admitted
from tests.waiting import wait_until


def parse_sse_ids(raw: bytes) -> list[tuple[int | None, str, dict]]:
    events = []
    for block in raw.decode().strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        events.append((int(fields["id"]) if "id" in fields else None, fields["event"], json.loads(fields["data"])))
    return events


class AsgiClient:
    """One streaming GET straight on the ASGI app: hangs up after `hang_up_after_tokens` token events
    (later bytes are lost, as on a dropped connection), or calls `slow_send` on the first token event."""

    def __init__(self, app, path: str, headers: dict[str, str], hang_up_after_tokens: int | None = None,
                 slow_send=None) -> None:
        path, _, query = path.partition("?")
        self.scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
                      "method": "GET", "scheme": "http", "path": path, "raw_path": path.encode(),
                      "query_string": query.encode(), "root_path": "", "client": ("127.0.0.1", 1),
                      "server": ("gateway", 80),
                      "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
        self.app, self.hang_up_after_tokens, self.slow_send = app, hang_up_after_tokens, slow_send
        self.status: int | None = None
        self.body = bytearray()
        self.complete = False
        self.hung_up = asyncio.Event()
        self._requested = False

    async def _receive(self):
        if not self._requested:
            self._requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.hung_up.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message):
        if self.hung_up.is_set():
            return
        if message["type"] == "http.response.start":
            self.status = message["status"]
            return
        chunk = message.get("body", b"")
        if self.slow_send is not None and b"event: token" in chunk:
            slow, self.slow_send = self.slow_send, None
            await slow()
        self.body.extend(chunk)
        self.complete = not message.get("more_body", False)
        if self.hang_up_after_tokens is not None and self.body.count(b"event: token") >= self.hang_up_after_tokens:
            self.hung_up.set()

    async def run(self, timeout_s: float = 30) -> list[tuple[int | None, str, dict]]:
        await asyncio.wait_for(self.app(self.scope, self._receive, self._send), timeout_s)
        return parse_sse_ids(bytes(self.body))


def overflowed(app_gateway, gen_id: str) -> bool:
    """The server has given up on a reader of `gen_id` that took nothing for SLOW_CONSUMER_GRACE_S."""
    return any(d.overflowed for d in app_gateway.deliveries if d.generation_id == gen_id)


async def start_generation(gateway, tenant, model: str, tokens: int) -> str:
    created = await post_until_admitted(gateway, "/v1/generations", headers=tenant.headers,
                                        json=body(model=model, maxOutputTokens=tokens))
    assert created.status_code == 201
    gen_id = created.json()["id"]
    # The status comes from the projection or the bridge; the projector does not run here, so wait for the bridge.
    await wait_until(lambda: gateway.gateway.bridge.view(gen_id), 10, what="the bridge's view")
    return gen_id


async def final_view(gateway, gen_id: str):
    bridge = gateway.gateway.bridge
    return await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 30, what="final event")


def tokens_of(events) -> list[tuple[int | None, dict]]:
    return [(event_id, data) for event_id, kind, data in events if kind == "token"]


async def test_a_stream_cut_mid_way_resumes_with_last_event_id_and_carries_every_token_once(
        gateway, paced_worker, tenants, versions):
    tenant = tenants["main"]
    gen_id = await start_generation(gateway, tenant, versions["paced"], 30)  # paced: the cut falls mid-stream
    cut = AsgiClient(gateway._transport.app, f"/v1/generations/{gen_id}/events", tenant.headers,
                     hang_up_after_tokens=5)
    first = await cut.run()
    assert cut.hung_up.is_set() and not cut.complete
    # Events waiting together go out in one write, so the cut falls at or after the fifth token.
    held = len(tokens_of(first))
    assert 5 <= held < 30 and [kind for _, kind, _ in first] == ["generation"] + ["token"] * held
    assert [(event_id, data["seq"]) for event_id, data in tokens_of(first)] == [(s, s) for s in range(1, held + 1)]

    resumed = await gateway.get(f"/v1/generations/{gen_id}/events",
                                headers={**tenant.headers, "Last-Event-ID": str(held)})
    rest = parse_sse_ids(resumed.content)
    assert [kind for _, kind, _ in rest] == ["generation"] + ["token"] * (30 - held) + ["final"]
    tokens = tokens_of(first) + tokens_of(rest)
    assert [data["seq"] for _, data in tokens] == list(range(1, 31))
    view = await final_view(gateway, gen_id)
    assert "".join(data["textDelta"] for _, data in tokens) == view.text
    assert [data["tokenCount"] for _, data in tokens] == list(range(1, 31))
    final_id, _, final = rest[-1]
    assert final_id == final["seq"] == 31 and final["reason"] == "output-limit"
    assert final["usage"]["outputTokens"] == 30 and final["usageLabel"] == "final"

    by_query = parse_sse_ids((await gateway.get(f"/v1/generations/{gen_id}/events?after=28",
                                                headers=tenant.headers)).content)
    assert [event_id for event_id, _, _ in by_query] == [None, 29, 30, 31]
    done = await gateway.get(f"/v1/generations/{gen_id}/events", headers={**tenant.headers, "Last-Event-ID": "31"})
    assert done.status_code == 204  # the client holds the final event: EventSource stops reconnecting
    bad = await gateway.get(f"/v1/generations/{gen_id}/events?after=-1", headers=tenant.headers)
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_request"


async def test_a_cursor_older_than_the_retained_buffer_is_cursor_expired_and_a_retained_one_resumes(
        gateway, worker, tenants, versions, bootstrap, database_url):
    tenant = tenants["main"]
    gen_id = await start_generation(gateway, tenant, versions["served"], 12)
    view = await final_view(gateway, gen_id)
    # A buffer of 4 events, projected into the session database the gateway reads.
    projector = Projector(bootstrap, database_url, all_projections(Settings(resume_buffer_events=4)))
    try:
        await projector.catch_up()
    finally:
        projector.close()
    # As a gateway that never saw the stream (another process, or a restart) would serve it.
    del gateway.gateway.bridge.views[gen_id]
    progress = await gateway.gateway.db.stream_progress(gen_id)
    assert (progress.last_seq, progress.oldest_seq) == (13, 10)  # 12 token events and the final one

    expired = await gateway.get(f"/v1/generations/{gen_id}/events?after=5", headers=tenant.headers)
    assert expired.status_code == 410
    assert expired.json() == {"code": "cursor_expired", "message": "the events after this cursor are no longer "
                              "retained", "details": {"generationId": gen_id, "after": 5, "oldestSeq": 10}}
    resumed = parse_sse_ids((await gateway.get(f"/v1/generations/{gen_id}/events",
                                               headers={**tenant.headers, "Last-Event-ID": "9"})).content)
    assert [event_id for event_id, _, _ in resumed] == [None, 10, 11, 12, 13]
    tokens = [data for _, data in tokens_of(resumed)]
    assert "".join(t["textDelta"] for t in tokens) == "".join(t.text_delta for t in view.tokens[9:])
    assert [t["tokenCount"] for t in tokens] == [10, 11, 12]
    assert resumed[-1][2]["reason"] == "output-limit" and resumed[-1][2]["usage"]["outputTokens"] == 12


async def test_another_tenants_stream_is_not_found_with_or_without_a_cursor(gateway, worker, tenants, versions):
    gen_id = await start_generation(gateway, tenants["main"], versions["served"], 3)
    other = tenants["other"].headers
    for headers in (other, {**other, "Last-Event-ID": "1"}):
        response = await gateway.get(f"/v1/generations/{gen_id}/events", headers=headers)
        assert response.status_code == 404 and response.json()["code"] == "not_found"
    expired_looking = await gateway.get(f"/v1/generations/{gen_id}/events?after=0", headers=other)
    assert expired_looking.status_code == 404


async def test_a_slow_consumer_is_cut_at_the_queue_bound_with_its_last_seq_and_resumes_from_it(
        gateway, worker, tenants, versions):
    tenant = tenants["main"]
    app_gateway = gateway.gateway
    bridge = app_gateway.bridge
    settings = app_gateway.settings
    app_gateway.settings = settings.model_copy(update={"stream_queue_events": 3})
    try:
        gen_id = await start_generation(gateway, tenant, versions["served"], 40)

        async def stall():  # the client stops reading while the generation runs on, until the server gives up
            await wait_until(lambda: len(bridge.view(gen_id).tokens) >= 12, 30, what="tokens past the bound")
            await wait_until(lambda: overflowed(app_gateway, gen_id), SLOW_CONSUMER_GRACE_S + 30,
                             what="the server to give up on the slow reader")

        slow = AsgiClient(gateway._transport.app, f"/v1/generations/{gen_id}/events", tenant.headers,
                          slow_send=stall)
        cut = await slow.run()
        assert slow.complete  # the server ended the stream itself
        last_id, kind, error = cut[-1]
        assert kind == "error" and last_id is None and error["code"] == "slow_consumer"
        sent = [data["seq"] for _, data in tokens_of(cut)]
        assert sent == list(range(1, error["lastSeq"] + 1)) and error["lastSeq"] <= 4
        await final_view(gateway, gen_id)

        # A reader that keeps up is never cut, however far a replay bursts past the bound.
        rest = parse_sse_ids((await gateway.get(f"/v1/generations/{gen_id}/events?after={error['lastSeq']}",
                                                headers=tenant.headers)).content)
    finally:
        app_gateway.settings = settings
    tokens = tokens_of(cut) + tokens_of(rest)
    assert [data["seq"] for _, data in tokens] == list(range(1, 41)) and rest[-1][1] == "final"
    assert "".join(data["textDelta"] for _, data in tokens) == (await final_view(gateway, gen_id)).text


async def test_a_client_that_never_reads_is_cut_off_with_bounded_memory_and_resumes(
        gateway, worker, tenants, versions):
    tenant = tenants["main"]
    app, app_gateway = gateway._transport.app, gateway.gateway
    settings, stall_timeout_s = app_gateway.settings, app.stall_timeout_s
    app_gateway.settings = settings.model_copy(update={"stream_queue_events": 3})
    app.stall_timeout_s = 1.0
    try:
        gen_id = await start_generation(gateway, tenant, versions["served"], 40)
        never = asyncio.Event()
        stuck = AsgiClient(app, f"/v1/generations/{gen_id}/events", tenant.headers, slow_send=never.wait)
        connection = asyncio.create_task(stuck.run(timeout_s=20))
        await wait_until(lambda: app_gateway.deliveries, 10, what="the open stream")
        held = []

        def cut() -> bool:  # the generation runs on past the bound while the client reads nothing
            if connection.done():
                return True
            held.extend(d.queue.qsize() for d in app_gateway.deliveries)
            return False

        await wait_until(cut, 30, step_s=0.05, what="the server to give up on the connection")
        await connection  # the server gave up on the connection instead of holding it open
    finally:
        app_gateway.settings, app.stall_timeout_s = settings, stall_timeout_s
    assert held and max(held) <= 3 + 1  # the bound, plus the end marker
    assert not stuck.complete and not never.is_set()
    await wait_until(lambda: not app_gateway.deliveries, 5, what="the stream's queue released")
    assert gen_id not in app_gateway.presence.subscribers
    view = await final_view(gateway, gen_id)
    rest = parse_sse_ids((await gateway.get(f"/v1/generations/{gen_id}/events?after=0",
                                            headers=tenant.headers)).content)
    assert [data["seq"] for _, data in tokens_of(rest)] == list(range(1, 41)) and rest[-1][1] == "final"
    assert "".join(data["textDelta"] for _, data in tokens_of(rest)) == view.text


class AsgiWebSocket:
    """One WebSocket session straight on the ASGI app; `slow_send` runs on the first token message."""

    def __init__(self, app, path: str, headers: dict[str, str], slow_send=None) -> None:
        path, _, query = path.partition("?")
        self.scope = {"type": "websocket", "asgi": {"version": "3.0", "spec_version": "2.3"},
                      "http_version": "1.1", "scheme": "ws", "path": path, "raw_path": path.encode(),
                      "query_string": query.encode(), "root_path": "", "client": ("127.0.0.1", 1),
                      "server": ("gateway", 80), "subprotocols": [],
                      "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
        self.app, self.slow_send = app, slow_send
        self.messages: list[dict] = []
        self.close: tuple[int, str] | None = None
        self.ended = asyncio.Event()
        self._connected = False

    async def _receive(self):
        if not self._connected:
            self._connected = True
            return {"type": "websocket.connect"}
        await self.ended.wait()
        return {"type": "websocket.disconnect", "code": 1000}

    async def _send(self, message):
        if message["type"] == "websocket.send":
            data = json.loads(message["text"])
            if self.slow_send is not None and data["type"] == "token":
                slow, self.slow_send = self.slow_send, None
                await slow()
            self.messages.append(data)
        elif message["type"] == "websocket.close":
            self.close = (message.get("code", 1000), message.get("reason", ""))
            self.ended.set()

    async def run(self, timeout_s: float = 30) -> tuple[list[dict], tuple[int, str] | None]:
        await asyncio.wait_for(self.app(self.scope, self._receive, self._send), timeout_s)
        return self.messages, self.close


async def test_the_websocket_stream_resumes_after_a_seq_refuses_other_tenants_and_closes_slow_consumers(
        gateway, worker, tenants, versions):
    tenant, app = tenants["main"], gateway._transport.app
    gen_id = await start_generation(gateway, tenant, versions["served"], 20)
    view = await final_view(gateway, gen_id)
    messages, close = await AsgiWebSocket(
        app, f"/v1/generations/{gen_id}/stream?after=15&api_key={tenant.api_key}", {}).run()
    assert [m["type"] for m in messages] == ["generation"] + ["token"] * 5 + ["final"] and close == (1000, "end")
    assert [m["seq"] for m in messages[1:]] == [16, 17, 18, 19, 20, 21]
    assert "".join(m["textDelta"] for m in messages[1:-1]) == "".join(t.text_delta for t in view.tokens[15:])

    messages, close = await AsgiWebSocket(app, f"/v1/generations/{gen_id}/stream", tenants["other"].headers).run()
    assert [m["code"] for m in messages] == ["not_found"] and close == (4404, "not_found")

    app_gateway = gateway.gateway
    settings = app_gateway.settings
    app_gateway.settings = settings.model_copy(update={"stream_queue_events": 3})
    try:
        slow_id = await start_generation(gateway, tenant, versions["served"], 40)

        async def stall():
            await wait_until(lambda: len(app_gateway.bridge.view(slow_id).tokens) >= 12, 30, what="tokens")
            await wait_until(lambda: overflowed(app_gateway, slow_id), SLOW_CONSUMER_GRACE_S + 30,
                             what="the server to give up on the slow reader")

        messages, close = await AsgiWebSocket(app, f"/v1/generations/{slow_id}/stream", tenant.headers,
                                              slow_send=stall).run()
    finally:
        app_gateway.settings = settings
    last_seq = messages[-1]["lastSeq"]
    assert messages[-1]["code"] == "slow_consumer" and close == (4008, f"slow_consumer lastSeq={last_seq}")
    assert [m["seq"] for m in messages if m["type"] == "token"] == list(range(1, last_seq + 1))


async def test_an_interactive_generation_nobody_watches_is_canceled_after_the_grace_and_batch_is_not(
        gateway, paced_worker, tenants, versions):
    tenant = tenants["main"]
    app_gateway = gateway.gateway
    settings = app_gateway.settings
    app_gateway.settings = settings.model_copy(update={"disconnect_grace_s": 0.1})
    try:
        outcomes = {}
        for tier in ("interactive", "batch"):
            created = await post_until_admitted(gateway, "/v1/generations", headers=tenant.headers,
                                                json=body(model=versions["paced"], maxOutputTokens=480, tier=tier))
            assert created.status_code == 201
            gen_id = created.json()["id"]
            await wait_until(lambda g=gen_id: app_gateway.bridge.view(g), 10, what="the bridge's view")
            watcher = AsgiClient(gateway._transport.app, f"/v1/generations/{gen_id}/events", tenant.headers,
                                 hang_up_after_tokens=2)
            await watcher.run()
            assert watcher.hung_up.is_set()
            view = await final_view(gateway, gen_id)
            outcomes[tier] = (view.final.reason, len(view.tokens), view.cancel_requested)
    finally:
        app_gateway.settings = settings
    reason, streamed, cancel_requested = outcomes["interactive"]
    assert (reason, cancel_requested) == ("canceled", True) and streamed < 480
    assert outcomes["batch"] == ("output-limit", 480, False)


async def test_a_stream_of_nul_and_control_characters_resumes_through_the_buffer_byte_for_byte(
        gateway, tenants, bootstrap, database_url, producer):
    """Deltas PostgreSQL text cannot hold, served by a gateway that did not see the stream (a restart): both
    the first read and the resume come from the resume buffer, and every seq arrives once, byte for byte."""
    import uuid

    from plumbing.kafka.clients import publish
    from schemas.topics import GENERATIONS, TOKENS
    from tests.projections.conftest import Gen
    from tests.projections.test_any_token_text import DELTAS, weird_stream

    tenant = tenants["main"]
    gen = Gen(tenant_id=tenant.tenant_id, generation_id=f"gen-{uuid.uuid4().hex[:12]}")
    n = len(DELTAS)
    for event in (gen.admitted(max_output_tokens=n), gen.started()):
        await publish(producer, GENERATIONS, event)
    for event in weird_stream(gen):
        await publish(producer, TOKENS, event)
    await publish(producer, GENERATIONS, gen.completed(n))
    await publish(producer, TOKENS, gen.finished(n + 1, reason="output-limit", output=n))
    projector = Projector(bootstrap, database_url, all_projections(Settings()))
    try:
        stats = await projector.catch_up()
    finally:
        projector.close()
    assert stats.refused.get("stream", 0) == 0
    bridge = gateway.gateway.bridge
    await wait_until(lambda: (v := bridge.view(gen.generation_id)) and v.final, 30, what="the bridge's final")
    del bridge.views[gen.generation_id]

    path = f"/v1/generations/{gen.generation_id}/events"
    cut = AsgiClient(gateway._transport.app, path, tenant.headers, hang_up_after_tokens=4)
    first = tokens_of(await cut.run())
    assert cut.hung_up.is_set() and len(first) >= 4
    # The buffer goes out in one write: the connection drops inside it, after the fourth event's bytes.
    held = first[:4]
    resumed = parse_sse_ids((await gateway.get(path, headers={**tenant.headers, "Last-Event-ID": "4"})).content)
    tokens = held + tokens_of(resumed)
    assert [(event_id, data["seq"]) for event_id, data in tokens] == [(s, s) for s in range(1, n + 1)]
    assert [data["textDelta"] for _, data in tokens] == list(DELTAS)
    assert [data["tokenCount"] for _, data in tokens] == list(range(1, n + 1))
    assert resumed[-1][1] == "final" and resumed[-1][0] == n + 1
