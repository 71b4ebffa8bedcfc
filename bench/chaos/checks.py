"""What the chaos run asserts afterwards, each a count that is 0 when all is well.

    stuck                    generations of the run not terminal in Postgres (or whose client never got an end)
    audit_differences        rows that differ between the live projections and a replay from offset 0
    overbilled               billed output > what the client received, or, for completed generations, billed !=
                             the final watermark on the log (the last reports of the epoch before its end)
    duplicate_seqs/missing   per client, after every resume
    unreleased_reservations  tenants whose latest budget in the controller changelog holds tokens, concurrency or
                             queued work, plus generations whose latest identity record is not `ended`
    lost_events              probe records the brokers acknowledged (acks=all) that are not in the log, plus
                             generations the gateway admitted that have no `Admitted` event on the log
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

import psycopg

from bench.chaos.clients import ClientResult
from plumbing.kafka.clients import Kafka, make_consumer, partitions_of, read_to_end
from schemas.codec import DecodeError, decode
from schemas.lifecycle import TERMINAL_TYPES
from schemas.topics import CONTROL_CHANGELOG, GENERATIONS

TERMINAL_STATUSES = ("completed", "canceled", "interrupted", "expired", "failed", "rejected")


@dataclass(frozen=True)
class LogRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


async def read_log(kafka: Kafka, topic: str) -> list[LogRecord]:
    """Every committed record of `topic`, from offset 0 to the end as of now."""
    consumer = make_consumer(kafka, client_id="chaos-read-log", auto_offset_reset="latest", request_timeout_ms=30000)
    await consumer.start()
    found: list[LogRecord] = []
    try:
        tps = await partitions_of(consumer, topic)
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        async for tp, records in read_to_end(consumer, tps):
            found.extend(LogRecord(tp.partition, r.offset, r.key, r.value) for r in records)
    finally:
        await consumer.stop()
    return found


def decoded(topic: str, records: Iterable[LogRecord]) -> list:
    events = []
    for record in records:
        try:
            event = decode(topic, record.value)
        except DecodeError:
            continue
        if event.type != "PeriodClosed":  # a billing period's marker: of no generation
            events.append(event)
    return events


# -- stuck -------------------------------------------------------------------------------------

async def find_stuck(database_url: str, clients: list[ClientResult], settle_s: float) -> list[dict]:
    """Wait up to settle_s for every admitted generation to be terminal in Postgres; each one that is not, or
    whose client never got its final event, with its status there and what the client saw."""
    ids = [c.generation_id for c in clients if c.generation_id]
    deadline = time.monotonic() + settle_s
    while True:
        statuses = await asyncio.to_thread(_statuses, database_url, ids)
        open_ids = {i for i in ids if statuses.get(i) not in TERMINAL_STATUSES}
        if not open_ids or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
    return [{"generation_id": c.generation_id, "status": statuses.get(c.generation_id), "client_final": c.final,
             "client_last_seq": c.last_seq, "client_errors": c.errors}
            for c in clients if c.generation_id and (c.generation_id in open_ids or c.final is None)]


def _statuses(database_url: str, ids: list[str]) -> dict[str, str]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT generation_id, status FROM generations WHERE generation_id = ANY(%s)",
                            (ids,)).fetchall()
    return dict(rows)


# -- billing -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class FinalWatermark:
    terminal: str  # type of the first terminal event
    epoch: int
    processed_input_tokens: int
    generated_output_tokens: int


def final_watermarks(events: list) -> dict[str, FinalWatermark]:
    """generation -> the usage of its terminal epoch as of its first terminal event, in log order: exactly what
    a seal may bill. Reports after that event (late or duplicated) do not count."""
    marks: dict[tuple[str, int], tuple[int, int]] = {}
    finals: dict[str, FinalWatermark] = {}
    for event in events:
        if event.generation_id in finals:
            continue
        if event.type == "UsageReported":
            key = (event.generation_id, event.epoch)
            old = marks.get(key, (0, 0))
            marks[key] = (max(old[0], event.usage.processed_input_tokens),
                          max(old[1], event.usage.generated_output_tokens))
        elif event.type in TERMINAL_TYPES:
            epoch = getattr(event, "epoch", None) or 0
            finals[event.generation_id] = FinalWatermark(event.type, epoch,
                                                         *marks.get((event.generation_id, epoch), (0, 0)))
    return finals


def streamed_on_log(token_events: list) -> dict[tuple[str, int], int]:
    """(generation, epoch) -> output tokens its stream events on `llm.tokens` carry (each seq counted once)."""
    seen: dict[tuple[str, int, int], int] = {}
    for event in token_events:
        if event.type == "TokensEmitted":
            seen[(event.generation_id, event.epoch, event.seq)] = len(event.token_ids)
    streamed: dict[tuple[str, int], int] = {}
    for (generation_id, epoch, _), count in seen.items():
        streamed[(generation_id, epoch)] = streamed.get((generation_id, epoch), 0) + count
    return streamed


def find_overbilled(database_url: str, clients: list[ClientResult], generation_events: list,
                    streamed: dict[tuple[str, int], int]) -> list[dict]:
    """Bills above what the client received, or (completed) other than the final watermark on the log; with
    what the log's stream holds for the billed epoch (fewer: the watermark counted tokens that never reached
    the log; more: the client was not given all of them)."""
    by_id = {c.generation_id: c for c in clients if c.generation_id}
    # Read partition by partition, each in log order; one generation lives in one partition.
    finals = final_watermarks(generation_events)
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT generation_id, end_reason, usage_label, epoch, billed_input_tokens, billed_output_tokens "
            "FROM billing_ledger WHERE generation_id = ANY(%s)", (list(by_id),)).fetchall()
    found = []
    for generation_id, end_reason, label, epoch, billed_input, billed_output in rows:
        final = finals.get(generation_id)
        received = by_id[generation_id].tokens
        completed = final is not None and final.terminal == "Completed"
        off_watermark = completed and (billed_input, billed_output) != (
            final.processed_input_tokens, final.generated_output_tokens)
        if billed_output > received or off_watermark:
            found.append({
                "generation_id": generation_id, "why": "above_received" if billed_output > received else
                "off_final_watermark", "end_reason": end_reason, "usage_label": label, "epoch": epoch,
                "billed_input": billed_input, "billed_output": billed_output, "client_received_tokens": received,
                "tokens_on_log": streamed.get((generation_id, epoch), 0),
                "client_final": by_id[generation_id].final,
                "final_watermark": None if final is None else final.__dict__})
    return found


# -- reservations ------------------------------------------------------------------------------

def find_unreleased(changelog: list, plane: str, tenant_ids: set[str]) -> list[dict]:
    """Tenant budgets still holding something and generations not `ended`, from the latest changelog records."""
    latest: dict[str, object] = {}
    for event in changelog:
        if getattr(event, "plane", None) == plane and event.tenant_id in tenant_ids:
            latest[event.changelog_key] = event
    found = []
    for event in latest.values():
        if event.type == "TenantBudgetState" and (event.tokens_in_flight or event.concurrency or event.queued_tokens):
            found.append({"tenant_id": event.tenant_id, "tokens_in_flight": event.tokens_in_flight,
                          "concurrency": event.concurrency, "queued_tokens": event.queued_tokens})
        elif event.type == "IdentityRecorded" and event.status != "ended":
            found.append({"generation_id": event.generation_id, "status": event.status, "epoch": event.epoch,
                          "worker_id": event.worker_id, "reserved_tokens": event.reserved_tokens})
    return found


async def wait_released(bootstrap: str, plane: str, tenant_ids: set[str], settle_s: float) -> list[dict]:
    deadline = time.monotonic() + settle_s
    while True:
        unreleased = find_unreleased(decoded(CONTROL_CHANGELOG, await read_log(bootstrap, CONTROL_CHANGELOG)),
                                     plane, tenant_ids)
        if not unreleased or time.monotonic() > deadline:
            return unreleased
        await asyncio.sleep(1.0)


# -- streams -----------------------------------------------------------------------------------

def find_seq_faults(clients: list[ClientResult], kind: str) -> list[dict]:
    """Clients that saw a seq twice (`duplicate`) or never (`missing`), with the seqs."""
    found = []
    for c in clients:
        count = c.duplicate_seqs if kind == "duplicate" else c.missing_seqs
        if count:
            found.append({"generation_id": c.generation_id, "count": count, "last_seq": c.last_seq,
                          "final_seq": c.final["seq"] if c.final else None, "resumes": c.resumes,
                          "seqs": sorted(c.duplicated if kind == "duplicate" else c.missing)[:50]})
    return found


# -- lost events -------------------------------------------------------------------------------

def find_lost(acked: list[LogRecord], probe_log: list[LogRecord], clients: list[ClientResult],
              generation_events: list) -> list[dict]:
    present = {(r.partition, r.offset, r.key) for r in probe_log}
    lost = [{"probe_partition": r.partition, "probe_offset": r.offset, "probe_key": r.key.decode()}
            for r in acked if (r.partition, r.offset, r.key) not in present]
    admitted_on_log = {e.generation_id for e in generation_events if e.type == "Admitted"}
    return lost + [{"generation_id": c.generation_id, "why": "admitted without Admitted on the log",
                    "admitted_status": c.admitted_status}
                   for c in clients if c.generation_id and c.generation_id not in admitted_on_log]


async def generation_events(bootstrap: str) -> list:
    return decoded(GENERATIONS, await read_log(bootstrap, GENERATIONS))
