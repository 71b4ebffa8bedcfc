"""A tenant's side of the Kafka API: publish a JSONL file of requests, collect their results.

    publish_requests(kafka, tenant, requests)            each on llm.requests.<tenant>, key requestId
    collect_results(kafka, tenant, ids, timeout_s)       llm.results.<tenant> from the start, one per id
    summarize(results)                                   completed / rejected / interrupted / ..., tokens billed

The results topic is read from its beginning (it keeps 7 days), so running the same file again finds the
results of requests that were already done: their repeats run nothing new.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from plumbing.kafka.clients import Kafka, make_consumer, make_producer, partitions_of
from schemas.intake import intake_topic, results_topic


def read_jsonl(path: Path) -> list[dict]:
    """The requests of a JSONL file; ValueError naming the line of one that is not a JSON object with a
    requestId."""
    requests = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("requestId"), str):
            raise ValueError(f"{path}:{number}: a request is a JSON object with a string requestId")
        requests.append(record)
    return requests


async def publish_requests(kafka: Kafka, tenant_id: str, requests: list[dict]) -> None:
    producer = make_producer(kafka, client_id=f"submit-{tenant_id}", linger_ms=5)
    await producer.start()
    try:
        topic = intake_topic(tenant_id)
        for request in requests:
            await producer.send(topic, json.dumps(request).encode(), key=request["requestId"].encode())
        await producer.flush()
    finally:
        await producer.stop()


async def collect_results(kafka: Kafka, tenant_id: str, request_ids: set[str], timeout_s: float,
                          progress: Callable[[int, int], None] | None = None) -> dict[str, dict]:
    """requestId -> its latest result, once every id has one or `timeout_s` passed (then some are missing)."""
    consumer = make_consumer(kafka, client_id=f"results-{tenant_id}")
    await consumer.start()
    found: dict[str, dict] = {}
    try:
        tps = await partitions_of(consumer, results_topic(tenant_id))
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        deadline = time.monotonic() + timeout_s
        while len(found) < len(request_ids) and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                for record in records:
                    result = json.loads(record.value)
                    if result.get("requestId") in request_ids:
                        found[result["requestId"]] = result
            if progress is not None:
                progress(len(found), len(request_ids))
    finally:
        await consumer.stop()
    return found


def summarize(results: dict[str, dict], expected: int) -> dict:
    by_status: dict[str, int] = {}
    billed = {"inputTokens": 0, "cachedInputTokens": 0, "outputTokens": 0}
    for result in results.values():
        by_status[result["status"]] = by_status.get(result["status"], 0) + 1
        for key in billed:
            billed[key] += (result.get("usage") or {}).get(key, 0)
    return {"requests": expected, "results": len(results), "missing": expected - len(results),
            "completed": by_status.get("completed", 0), "rejected": by_status.get("rejected", 0),
            "interrupted": by_status.get("interrupted", 0), "byStatus": by_status, "billed": billed}
