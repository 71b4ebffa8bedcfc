"""The exporter of the chaos run, the fault that kills it mid-batch, and what is counted at the end.

    receiver   a contract double of OpenMeter's HTTP ingest (POST /api/v1/events, a batch of CloudEvents 1.0,
               deduplicated on (source, id), 204) on 127.0.0.1: every event id it is sent, with the time it came
    exporter   `ledgerlm export --sink openmeter` beside the stack, supervised like the other roles
    fault      the receiver stores the exporter's next batch and holds its answer; the exporter is killed -9
               while it waits for that answer (after the sink has the batch, before the ledger records it),
               then started again: it sends the unrecorded batch again, with the same ids
    counts     once the exporter has passed the end of llm.generations:
               export_missing      sealed attempts (billing_ledger) whose id the receiver never got
               export_duplicates   deliveries of an id after the sink's ledger had recorded its acknowledgement:
                                   what a sink with a bounded deduplication window (Stripe, OpenMeter) bills twice
               export_unknown      ids the receiver got that name no sealed attempt
               export_reconcile_differences   `billing reconcile --sink openmeter`: every one listed
               (repeats of an id not yet recorded, the batch in flight at the kill, are `redelivered`: the
               designed resend the sink deduplicates, counted apart)
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg

from bench.chaos.faults import FaultLog, Plane
from plumbing.kafka.clients import Kafka, make_consumer, partitions_of
from projections.export.reconcile import reconcile
from schemas.topics import GENERATIONS
from schemas.usage_export import usage_id

SINK = "openmeter"
EXPORTER = "exporter"  # the role's name in the fleet
CLOUDEVENT_REQUIRED = ("specversion", "id", "source", "type", "subject")
# The report's counts (0 in a run without an exporter, whose `export` is null).
COUNTS = ("export_missing", "export_duplicates", "export_unknown", "export_reconcile_differences")


@dataclass(frozen=True)
class Delivery:
    record_id: str
    generation_id: str
    at: float  # time.time() when the request came


class MeterReceiver:
    """OpenMeter's ingest contract on a local port; `hold_next()` keeps the next stored batch unanswered."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.deliveries: list[Delivery] = []
        self.accepted: set[tuple[str, str]] = set()
        self.refused = 0
        self._hold = False
        self.held_ids: list[str] = []
        self.held = threading.Event()
        self.release = threading.Event()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, name="chaos-meter", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "MeterReceiver":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def hold_next(self) -> None:
        with self.lock:
            self.held.clear()
            self.release.clear()
            self._hold = True

    def events_of(self, path: str, content_type: str, body: bytes) -> list[dict] | None:
        """The batch's events, or None when the request breaks the contract (answered 4xx, nothing stored)."""
        if path != "/api/v1/events" or content_type != "application/cloudevents-batch+json":
            return None
        try:
            events = json.loads(body)
        except ValueError:
            return None
        if not isinstance(events, list) or any(not isinstance(e, dict) for e in events):
            return None
        if any(not e.get(f) for e in events for f in CLOUDEVENT_REQUIRED) or any(
                e["specversion"] != "1.0" or not isinstance(e.get("data"), dict) for e in events):
            return None
        return events

    def _handler(self):
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                events = receiver.events_of(self.path, self.headers.get("Content-Type", ""), body)
                if events is None:
                    with receiver.lock:
                        receiver.refused += 1
                    return self.answer(400)
                now = time.time()
                with receiver.lock:
                    receiver.deliveries += [Delivery(e["id"], str(e["data"].get("generation_id")), now)
                                            for e in events]
                    receiver.accepted.update((e["source"], e["id"]) for e in events)
                    hold = receiver._hold and bool(events)
                    if hold:  # this batch only
                        receiver._hold = False
                        receiver.held_ids = [e["id"] for e in events]
                        receiver.held.set()
                if hold:
                    receiver.release.wait(120)
                self.answer(204)

            def answer(self, status: int) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass  # the exporter was killed while its batch was held

        return Handler


def exporter_env(env: dict[str, str], receiver: MeterReceiver, plane: str) -> dict[str, str]:
    return {**env, "LEDGERLM_OPENMETER_URL": receiver.url, "LEDGERLM_EXPORT_GROUP": f"{plane}-export",
            "LEDGERLM_EXPORT_LAG_INTERVAL_S": "1", "LEDGERLM_EXPORT_RETRY_MAX_S": "2"}


async def kill_exporter(plane: Plane, journal: FaultLog, receiver: MeterReceiver, hold_within_s: float = 30.0,
                        down_s: float = 1.0) -> None:
    """kill -9 the exporter while the receiver holds the answer to a batch it stored; start it again."""
    role = plane.roles[EXPORTER]
    receiver.hold_next()
    began = time.monotonic()
    mid_batch = await asyncio.to_thread(receiver.held.wait, hold_within_s)
    role.kill9()
    receiver.release.set()
    with receiver.lock:
        receiver._hold = False
        in_flight = len(receiver.held_ids) if mid_batch else 0
    await asyncio.sleep(down_s)
    role.start()
    journal.add("exporter_kill9", began, killed=EXPORTER, mid_batch=mid_batch, batch_in_flight=in_flight,
                down_s=down_s)


async def generation_ends(kafka: Kafka) -> dict[int, int]:
    consumer = make_consumer(kafka, client_id="chaos-export-ends")
    await consumer.start()
    try:
        ends = await consumer.end_offsets(await partitions_of(consumer, GENERATIONS))
    finally:
        await consumer.stop()
    return {tp.partition: end for tp, end in ends.items()}


def _caught_up(database_url: str, ends: dict[int, int]) -> bool:
    with psycopg.connect(database_url) as conn:
        stored = dict(conn.execute("SELECT partition, next_offset FROM export_offsets WHERE sink = %s",
                                   (SINK,)).fetchall())
    return all(stored.get(partition, 0) >= end for partition, end in ends.items())


async def wait_exported(kafka: Kafka, database_url: str, settle_s: float) -> bool:
    """Until the exporter's offsets pass today's end of llm.generations (False: not within settle_s)."""
    ends = await generation_ends(kafka)
    deadline = time.monotonic() + settle_s
    while True:
        try:
            if await asyncio.to_thread(_caught_up, database_url, ends):
                return True
        except psycopg.OperationalError:
            pass
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.5)


def count_exports(sealed: dict[str, str], acknowledged_at: dict[str, float],
                  deliveries: list[Delivery]) -> dict[str, list[dict]]:
    """sealed: record id -> generation; acknowledged_at: record id -> when the ledger recorded the sink's answer.
    What was never delivered, delivered after it was recorded, or names no seal; and what was sent again
    before any answer was recorded (the designed resend)."""
    delivered = Counter(d.record_id for d in deliveries)
    found: dict[str, list[dict]] = {"missing": [], "duplicates": [], "unknown": [], "redelivered": []}
    for record_id, generation_id in sorted(sealed.items()):
        if record_id not in delivered:
            found["missing"].append({"generation_id": generation_id, "record_id": record_id})
    seen: set[str] = set()
    for d in deliveries:
        if d.record_id not in sealed:
            found["unknown"].append({"generation_id": d.generation_id, "record_id": d.record_id})
        elif d.record_id in acknowledged_at and d.at > acknowledged_at[d.record_id]:
            found["duplicates"].append({"generation_id": d.generation_id, "record_id": d.record_id,
                                        "after_ack_s": round(d.at - acknowledged_at[d.record_id], 3),
                                        "deliveries": delivered[d.record_id]})
        elif d.record_id in seen:
            found["redelivered"].append({"generation_id": d.generation_id, "record_id": d.record_id})
        seen.add(d.record_id)
    return found


def _ledgers(database_url: str) -> tuple[dict[str, str], dict[str, float], list]:
    with psycopg.connect(database_url) as conn:
        sealed = {usage_id(gid, epoch): gid for gid, epoch in conn.execute(
            "SELECT generation_id, COALESCE(epoch, 0) FROM billing_ledger").fetchall()}
        acknowledged: dict[str, datetime] = dict(conn.execute(
            "SELECT record_id, exported_at FROM export_ledger WHERE sink = %s AND outcome = 'acknowledged'",
            (SINK,)).fetchall())
        differences = reconcile(conn, SINK)
    return sealed, {rid: at.timestamp() for rid, at in acknowledged.items()}, differences


async def check_export(kafka: Kafka, database_url: str, receiver: MeterReceiver, settle_s: float) -> dict:
    """The export counts of the run (each 0 when every seal reached the sink once), with their evidence."""
    caught_up = await wait_exported(kafka, database_url, settle_s)
    sealed, acknowledged_at, differences = await asyncio.to_thread(_ledgers, database_url)
    with receiver.lock:
        deliveries = list(receiver.deliveries)
        refused = receiver.refused
    found = count_exports(sealed, acknowledged_at, deliveries)
    found["reconcile_differences"] = [{"generation_id": d.generation_id, "kind": d.kind, "detail": d.detail}
                                      for d in differences]
    return {"caught_up": caught_up, "sealed": len(sealed), "delivered": len(deliveries),
            "distinct_delivered": len({d.record_id for d in deliveries}), "acknowledged": len(acknowledged_at),
            "redelivered": len(found.pop("redelivered")), "refused_requests": refused, "found": found}
