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

from bench.chaos_clients import ClientResult
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
            events.append(decode(topic, record.value))
        except DecodeError:
            continue
    return events


# -- stuck -------------------------------------------------------------------------------------

async def count_stuck(database_url: str, clients: list[ClientResult], settle_s: float) -> int:
    """Wait up to settle_s for every admitted generation to be terminal in Postgres; count the rest."""
    ids = [c.generation_id for c in clients if c.generation_id]
    deadline = time.monotonic() + settle_s
    while True:
        open_ids = await asyncio.to_thread(_not_terminal, database_url, ids)
        if not open_ids or time.monotonic() > deadline:
            break
        await asyncio.sleep(1.0)
    unfinished = {c.generation_id for c in clients if c.generation_id and c.final is None}
    return len(set(open_ids) | unfinished)


def _not_terminal(database_url: str, ids: list[str]) -> list[str]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute("SELECT generation_id FROM generations WHERE generation_id = ANY(%s) AND status = ANY(%s)",
                            (ids, list(TERMINAL_STATUSES))).fetchall()
    done = {row[0] for row in rows}
    return [i for i in ids if i not in done]


# -- billing -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class FinalWatermark:
    terminal: str  # type of the first terminal event
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
            mark = marks.get((event.generation_id, getattr(event, "epoch", None) or 0), (0, 0))
            finals[event.generation_id] = FinalWatermark(event.type, *mark)
    return finals


def count_overbilled(database_url: str, clients: list[ClientResult], generation_events: list) -> int:
    by_id = {c.generation_id: c for c in clients if c.generation_id}
    # Read partition by partition, each in log order; one generation lives in one partition.
    finals = final_watermarks(generation_events)
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            "SELECT generation_id, billed_input_tokens, billed_output_tokens FROM billing_ledger "
            "WHERE generation_id = ANY(%s)", (list(by_id),)).fetchall()
    overbilled = 0
    for generation_id, billed_input, billed_output in rows:
        final = finals.get(generation_id)
        completed = final is not None and final.terminal == "Completed"
        if billed_output > by_id[generation_id].tokens or (completed and (billed_input, billed_output) != (
                final.processed_input_tokens, final.generated_output_tokens)):
            overbilled += 1
    return overbilled


# -- reservations ------------------------------------------------------------------------------

def count_unreleased(changelog: list, plane: str, tenant_ids: set[str]) -> int:
    latest: dict[str, object] = {}
    for event in changelog:
        if getattr(event, "plane", None) == plane and event.tenant_id in tenant_ids:
            latest[event.changelog_key] = event
    unreleased = 0
    for event in latest.values():
        if event.type == "TenantBudgetState":
            unreleased += int(bool(event.tokens_in_flight or event.concurrency or event.queued_tokens))
        elif event.type == "IdentityRecorded":
            unreleased += int(event.status != "ended")
    return unreleased


async def wait_released(bootstrap: str, plane: str, tenant_ids: set[str], settle_s: float) -> int:
    deadline = time.monotonic() + settle_s
    while True:
        unreleased = count_unreleased(decoded(CONTROL_CHANGELOG, await read_log(bootstrap, CONTROL_CHANGELOG)),
                                      plane, tenant_ids)
        if unreleased == 0 or time.monotonic() > deadline:
            return unreleased
        await asyncio.sleep(1.0)


# -- lost events -------------------------------------------------------------------------------

def count_lost(acked: list[LogRecord], probe_log: list[LogRecord], clients: list[ClientResult],
               generation_events: list) -> int:
    present = {(r.partition, r.offset, r.key) for r in probe_log}
    lost_probes = sum(1 for r in acked if (r.partition, r.offset, r.key) not in present)
    admitted_on_log = {e.generation_id for e in generation_events if e.type == "Admitted"}
    lost_admissions = sum(1 for c in clients if c.generation_id and c.generation_id not in admitted_on_log)
    return lost_probes + lost_admissions


async def generation_events(bootstrap: str) -> list:
    return decoded(GENERATIONS, await read_log(bootstrap, GENERATIONS))
