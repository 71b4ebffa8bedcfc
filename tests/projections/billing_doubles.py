"""Contract doubles of OpenMeter's and Lago's ingest APIs: real HTTP servers (threads) that hold an exporter to
what those APIs document, not mocks of our code.

    OpenMeter  POST /api/v1/events, Content-Type application/cloudevents-batch+json, a JSON array of CloudEvents
               1.0 (specversion, id, source, type, subject required); deduplicates on (source, id); 204
    Lago       POST /api/v1/events/batch, {"events": [...]}, each with transaction_id, external_subscription_id,
               code (and properties an object); one event per (external_subscription_id, transaction_id); 200

Every request is kept (`deliveries`: each event id as it arrived, duplicates included) beside what was stored
once (`accepted`). Tests make the double answer 429/503 (`fail_next`), refuse chosen ids with a 4xx
(`refuse_ids`), or hold the Nth request unanswered (`hold_request`) to kill an exporter mid-batch.
"""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CLOUDEVENT_REQUIRED = ("specversion", "id", "source", "type", "subject")
LAGO_REQUIRED = ("transaction_id", "external_subscription_id", "code")


class BillingDouble:
    def __init__(self, kind: str) -> None:
        assert kind in ("openmeter", "lago")
        self.kind = kind
        self.lock = threading.Lock()
        self.accepted: dict[tuple[str, str], dict] = {}
        self.deliveries: list[str] = []
        self.batches: list[list[str]] = []  # the event ids of each request the double stored
        self.requests = 0
        self.fail_next: list[tuple[int, dict[str, str]]] = []  # (status, headers) answered before any check
        self.refuse_ids: set[str] = set()
        self.hold_request: int | None = None  # this request number (1-based) waits for `release`
        self.held = threading.Event()
        self.release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "BillingDouble":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def accepted_ids(self) -> list[str]:
        with self.lock:
            return sorted(key[1] for key in self.accepted)

    # -- the contracts -------------------------------------------------------
    def check(self, path: str, content_type: str, body: bytes) -> tuple[int, list[tuple[tuple[str, str], dict]]]:
        """(status, events to store by their dedup key); a 4xx stores nothing (the whole request is refused)."""
        try:
            doc = json.loads(body)
        except ValueError:
            return 400, []
        if self.kind == "openmeter":
            if path != "/api/v1/events" or content_type != "application/cloudevents-batch+json":
                return 415 if path == "/api/v1/events" else 404, []
            if not isinstance(doc, list) or any(not isinstance(e, dict) for e in doc):
                return 400, []
            if any(not e.get(field) for e in doc for field in CLOUDEVENT_REQUIRED) or \
                    any(e["specversion"] != "1.0" for e in doc):
                return 400, []
            return 204, [((e["source"], e["id"]), e) for e in doc]
        if path != "/api/v1/events/batch" or not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
            return 404 if path != "/api/v1/events/batch" else 400, []
        events = doc["events"]
        if any(not isinstance(e, dict) or not all(e.get(f) for f in LAGO_REQUIRED) or
               not isinstance(e.get("properties", {}), dict) for e in events):
            return 422, []
        return 200, [((e["external_subscription_id"], e["transaction_id"]), e) for e in events]

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with double.lock:
                    double.requests += 1
                    number = double.requests
                    failure = double.fail_next.pop(0) if double.fail_next else None
                if failure is not None:
                    return self.answer(failure[0], failure[1])
                status, events = double.check(self.path, self.headers.get("Content-Type", ""), body)
                ids = {key[1] for key, _ in events}
                if status < 300 and ids & double.refuse_ids:
                    status, events = 400, []
                with double.lock:
                    double.deliveries += [key[1] for key, _ in events]
                    if events:
                        double.batches.append([key[1] for key, _ in events])
                    for key, event in events:
                        double.accepted.setdefault(key, event)
                if number == double.hold_request:
                    double.held.set()
                    double.release.wait(60)
                self.answer(status, {})

            def answer(self, status: int, headers: dict[str, str]) -> None:
                payload = b"" if status == 204 else json.dumps({"status": status}).encode()
                try:
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the exporter was killed while this request was held

        return Handler


class RecordingProxy:
    """Forwards every POST to `upstream` (stripe-mock) and keeps (path, form, Idempotency-Key, status): what the
    sink sent, and what the real validator answered."""

    def __init__(self, upstream: str) -> None:
        import httpx

        self.upstream = httpx.Client(base_url=upstream, timeout=30.0)  # as the sinks: a loaded machine is slow
        self.exchanges: list[tuple[str, dict[str, str], str | None, int]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                from urllib.parse import parse_qsl

                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                forwarded = {k: v for k, v in self.headers.items() if k.lower() in (
                    "authorization", "content-type", "idempotency-key")}
                answer = proxy.upstream.post(self.path, content=body, headers=forwarded)
                proxy.exchanges.append((self.path, dict(parse_qsl(body.decode())),
                                        self.headers.get("Idempotency-Key"), answer.status_code))
                self.send_response(answer.status_code)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.upstream.close()
