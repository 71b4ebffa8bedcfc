"""`ledgerlm bench stream`: SSE fan-out of the gateway: token events/s delivered and worker-append -> client latency.

    producer process ("the worker") ──llm.tokens──▶ Kafka ──▶ gateway (its bridge: one tail) ──SSE──▶ 100 clients

  * The gateway is the real one (`ledgerlm gateway`), a process of its own on 127.0.0.1, against the real
    broker and database. A fresh tenant is created for the run.
  * No model: a producer process acts as the worker. It publishes `Admitted` (llm.generations) for each
    generation, then, once every client is subscribed, `TokensEmitted` round-robin over the generations at a
    fixed total rate, then one `StreamFinished` per generation.
  * Each token event carries its append time (wall clock, ns) in `occurred_at` and in `text_delta`, the part of
    the event the SSE payload forwards; taken right before the producer's `send`. A client's latency is its
    receive time (wall clock, same machine, taken when the chunk holding the event is read) minus that.
    So it includes the producer's batching (linger 2 ms), the broker, the bridge's fetch, SSE and the client.
  * Clients: httpx streaming GET /v1/generations/{id}/events, one per generation; each checks its seqs arrive
    in order without gaps or duplicates and that the final event comes last.
  * Everything runs on this one machine (2 cores shared by Kafka, Postgres, the gateway, the producer and the
    clients), so the numbers are a lower bound of what the gateway alone would do.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from bench.common import free_port, percentile, wait_ready
from plumbing.settings import REPO_ROOT, Settings

HASH = "ab" * 32
TARGET_EVENTS_PER_S = 20000
TARGET_P95_MS = 10.0


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process so far, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU seconds spent not idle on the whole machine so far, all cores together."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- the producer ("worker"), in its own process

async def produce(job: dict) -> dict:
    """Token events at a fixed total rate, round-robin over the generations.

    The worker's own cost is not what is measured, so this stand-in keeps its CPU small: events are built
    without re-validation (`model_construct`; they are valid by construction) and appended to one record batch
    per partition per millisecond tick, as a producer's accumulator would, instead of one `send` each.
    """
    from plumbing.kafka.clients import make_producer
    from plumbing.kafka.follower import partition_for
    from schemas.codec import encode, record_headers, record_key
    from schemas.stream import StreamFinished, TokensEmitted
    from schemas.topics import TOKENS
    from schemas.values import Usage

    tenant, gens, rate, per_gen = job["tenant"], job["generations"], job["rate"], job["per_generation"]
    total = per_gen * len(gens)
    producer = make_producer(job["bootstrap"], client_id="bench-stream-producer")
    await producer.start()
    futures = []
    sent = 0
    try:
        partitions = len(await producer.partitions_for(TOKENS))
        partition_of = {gen: partition_for(gen, partitions) for gen in gens}

        full: list = []  # (partition, batch) in append order, sent before the open batches

        async def flush(batches: dict) -> None:
            for partition, batch in [*full, *batches.items()]:
                futures.append(await producer.send_batch(batch, TOKENS, partition=partition))
            full.clear()
            batches.clear()

        def append(batches: dict, event) -> None:
            partition = partition_of[event.generation_id]
            record = dict(key=record_key(TOKENS, event), value=encode(event), timestamp=None,
                          headers=record_headers(event))
            batch = batches.setdefault(partition, producer.create_batch())
            if batch.append(**record) is None:  # the batch is full: it goes out first, the event opens the next
                full.append((partition, batches.pop(partition)))
                batches[partition] = producer.create_batch()
                batches[partition].append(**record)

        began = time.perf_counter()
        start_ns = time.time_ns()
        batches: dict = {}
        while sent < total:
            due = min(total, int((time.perf_counter() - began) * rate) + 1)
            while sent < due:
                gen, seq = gens[sent % len(gens)], sent // len(gens) + 1
                now_ns = time.time_ns()
                append(batches, TokensEmitted.model_construct(
                    type="TokensEmitted", tenant_id=tenant, generation_id=gen, epoch=1, seq=seq,
                    token_ids=(seq % 500,), text_delta=str(now_ns), token_count=seq,
                    occurred_at=datetime.fromtimestamp(now_ns / 1e9, UTC)))
                sent += 1
            await flush(batches)
            await asyncio.sleep(0.001)
        tokens_s = time.perf_counter() - began
        for gen in gens:
            append(batches, StreamFinished(tenant_id=tenant, generation_id=gen, epoch=1, seq=per_gen + 1,
                                           reason="completed", usage=Usage(generated_output_tokens=per_gen)))
        await flush(batches)
        await producer.flush()
        results = await asyncio.gather(*futures, return_exceptions=True)
        failed = sum(1 for r in results if isinstance(r, BaseException))
    finally:
        await producer.stop()
    return {"cpu_s": round(time.process_time(), 2), "token_events_sent": sent, "finals_sent": len(gens),
            "send_failures": failed, "start_ns": start_ns, "seconds": round(tokens_s, 3),
            "offered_per_s": round(sent / tokens_s, 1)}


# ---------------------------------------------------------------- the clients

class Client:
    def __init__(self, generation_id: str) -> None:
        self.generation_id = generation_id
        self.latencies_ms: list[float] = []
        self.sent_ns: list[int] = []
        self.received = 0
        self.gaps = 0
        self.duplicates = 0
        self.last_seq = 0
        self.final: dict | None = None
        self.errors: list[str] = []
        self.first_recv_ns: int | None = None
        self.last_recv_ns: int | None = None
        self.subscribed = asyncio.Event()

    def on_event(self, kind: str, data: str, now_ns: int) -> None:
        if kind == "generation":
            self.subscribed.set()
        elif kind == "token":
            body = json.loads(data)
            seq = body["seq"]
            if seq <= self.last_seq:
                self.duplicates += 1
                return
            if seq != self.last_seq + 1:
                self.gaps += seq - self.last_seq - 1
            self.last_seq = seq
            self.received += 1
            sent_ns = int(body["textDelta"])
            self.sent_ns.append(sent_ns)
            self.latencies_ms.append((now_ns - sent_ns) / 1e6)
            self.first_recv_ns = self.first_recv_ns or now_ns
            self.last_recv_ns = now_ns
        elif kind == "final":
            self.final = json.loads(data)
        else:
            self.errors.append(f"{kind}: {data[:200]}")

    async def run(self, http, deadline: float) -> None:
        try:
            async with http.stream("GET", f"/v1/generations/{self.generation_id}/events") as response:
                if response.status_code != 200:
                    self.errors.append(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
                    self.subscribed.set()
                    return
                buffer = b""
                async for chunk in response.aiter_raw():
                    now_ns = time.time_ns()
                    buffer += chunk
                    *blocks, buffer = buffer.split(b"\n\n")
                    for block in blocks:
                        kind, data = "message", ""
                        for line in block.decode().split("\n"):
                            if line.startswith("event: "):
                                kind = line[7:]
                            elif line.startswith("data: "):
                                data = line[6:]
                        self.on_event(kind, data, now_ns)
                    if self.final is not None or self.errors or time.monotonic() > deadline:
                        return
        except Exception as exc:  # reported, not raised: one broken client must not hide the others' numbers
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            self.subscribed.set()


# ---------------------------------------------------------------- the run

async def publish_admitted(bootstrap: str, tenant: str, generations: list[str], per_gen: int) -> None:
    from plumbing.kafka.clients import make_producer, publish
    from schemas.lifecycle import Admitted
    from schemas.topics import GENERATIONS

    producer = make_producer(bootstrap, client_id="bench-stream-admit")
    await producer.start()
    try:
        for gen in generations:
            await publish(producer, GENERATIONS, Admitted(
                tenant_id=tenant, generation_id=gen, epoch=1, request_id=gen, model_version="bench-stream@1",
                input_tokens=8, max_output_tokens=per_gen + 1, reserved_tokens=per_gen + 9, payload_hash=HASH))
    finally:
        await producer.stop()


async def run_stream_bench(clients: int, rate: int, seconds: float, workdir: Path) -> dict:
    import httpx

    from bench.common import local_endpoints
    from producers.tenant_admin import create_tenant
    from schemas.values import TenantLimits

    load_before = [round(x, 2) for x in os.getloadavg()]  # other work on the machine skews every number here
    settings = Settings()
    bootstrap, db_url = local_endpoints(settings)
    workdir.mkdir(parents=True, exist_ok=True)
    run_id = uuid.uuid4().hex[:8]
    tenant = await create_tenant(bootstrap, db_url, f"bench-stream-{run_id}",
                                 TenantLimits(max_tokens_in_flight=10_000_000, tokens_per_minute=100_000_000,
                                              max_concurrency=10_000))
    generations = [f"bench-stream-{run_id}-{i:03d}" for i in range(clients)]
    per_gen = max(1, int(rate * seconds / clients))
    port = free_port()
    # No projector runs here, so "where the projections stand" would be the log's start: bound the bridge's
    # replay to the last 30 s, as a projector keeping up would, and measure only once it has caught up.
    env = {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap, "LEDGERLM_DATABASE_URL": db_url,
           "LEDGERLM_BRIDGE_REPLAY_MAX_S": "30"}
    log = workdir / "gateway.log"
    gateway = subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", "gateway", "--host", "127.0.0.1",
                                "--port", str(port)], env=env, cwd=REPO_ROOT, stdout=log.open("ab"),
                               stderr=subprocess.STDOUT)
    producer = None
    try:
        limits = httpx.Limits(max_connections=clients + 10, max_keepalive_connections=clients + 10)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=60,
                                     headers={"Authorization": f"Bearer {tenant.api_key}"}) as http:
            await wait_ready(http, gateway, log, path="/readyz")
            # The bridge follows from the end: it must be up before the admissions are published.
            await publish_admitted(bootstrap, tenant.tenant_id, generations, per_gen)
            deadline = time.monotonic() + 30
            for gen in generations:
                while (await http.get(f"/v1/generations/{gen}")).status_code != 200:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the gateway never saw the admission of {gen}")
                    await asyncio.sleep(0.05)
            subscribers = [Client(gen) for gen in generations]
            stop_at = time.monotonic() + seconds + 60
            tasks = [asyncio.create_task(c.run(http, stop_at)) for c in subscribers]
            await asyncio.wait_for(asyncio.gather(*(c.subscribed.wait() for c in subscribers)), 30)
            job = workdir / "producer.json"
            job.write_text(json.dumps({"bootstrap": bootstrap, "tenant": tenant.tenant_id, "generations": generations,
                                       "rate": rate, "per_generation": per_gen}))
            cpu_before = {"gateway": proc_cpu_s(gateway.pid), "clients": time.process_time(),
                          "machine": machine_busy_s(), "wall": time.monotonic()}
            producer = subprocess.Popen([sys.executable, "-m", "bench.stream.run", str(job)], env=env,
                                        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            out, err = await asyncio.to_thread(producer.communicate, timeout=seconds * 3 + 60)
            if producer.returncode != 0:
                raise RuntimeError(f"producer failed: {err[-2000:]}")
            produced = json.loads(out.strip().splitlines()[-1])
            # Clients end at their final event; a client still waiting after a bound is reported, not awaited.
            done, pending = await asyncio.wait(tasks, timeout=30)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            wall = time.monotonic() - cpu_before["wall"]
            cpu = {"wall_s": round(wall, 2),
                   "gateway_cpu_s": round(proc_cpu_s(gateway.pid) - cpu_before["gateway"], 2),
                   "clients_cpu_s": round(time.process_time() - cpu_before["clients"], 2),
                   "producer_cpu_s": produced.pop("cpu_s"),
                   "machine_busy_cores": round((machine_busy_s() - cpu_before["machine"]) / wall, 2),
                   "note": "from the producer's start to the last client's end; the rest of the machine's busy "
                           "time is mostly Kafka and Postgres"}
    finally:
        if producer is not None and producer.poll() is None:
            producer.kill()
        gateway.terminate()
        try:
            gateway.wait(timeout=20)
        except subprocess.TimeoutExpired:
            gateway.kill()
    report = summarize(subscribers, produced, clients, per_gen, rate, seconds, len(pending))
    delivered = report["delivered"]["token_events"]
    # What one delivered event costs the gateway (its idle polling included): 1e6 / this = events/s per core.
    cpu["gateway_cpu_us_per_event"] = round(cpu["gateway_cpu_s"] / delivered * 1e6, 1) if delivered else None
    report["cpu"] = cpu
    report["machine_load_before"] = load_before
    return report


def summarize(subscribers: list[Client], produced: dict, clients: int, per_gen: int, rate: int, seconds: float,
              unfinished: int) -> dict:
    latencies = [x for c in subscribers for x in c.latencies_ms]
    received = sum(c.received for c in subscribers)
    last_ns = max((c.last_recv_ns for c in subscribers if c.last_recv_ns), default=produced["start_ns"])
    window_s = (last_ns - produced["start_ns"]) / 1e9
    delivered_per_s = received / window_s if window_s > 0 else 0.0
    p95 = percentile(latencies, 0.95)
    finals_ok = sum(1 for c in subscribers if c.final and c.final.get("seq") == per_gen + 1
                    and c.final.get("reason") == "completed")
    errors = [f"{c.generation_id}: {e}" for c in subscribers for e in c.errors]
    by_second: dict[int, list[float]] = {}
    for c in subscribers:
        for sent_ns, latency in zip(c.sent_ns, c.latencies_ms):
            by_second.setdefault((sent_ns - produced["start_ns"]) // 1_000_000_000, []).append(latency)
    series = [{"second": k, "events": len(v), "p50": round(percentile(v, 0.5), 2), "p95": round(percentile(v, 0.95), 2)}
              for k, v in sorted(by_second.items())]
    return {
        "machine": "2-core CPU shared by Kafka 4 (KRaft, 1 broker), PostgreSQL 15, the gateway, producer and clients",
        "setup": {"clients": clients, "transport": "SSE over HTTP/1.1, 127.0.0.1", "gateway": "one process (uvicorn)",
                  "token_events_per_client": per_gen, "target_rate_per_s": rate, "seconds": seconds},
        "producer": produced,
        "delivered": {"token_events": received, "expected": per_gen * clients,
                      "window_s": round(window_s, 3), "events_per_s": round(delivered_per_s, 1),
                      "gaps": sum(c.gaps for c in subscribers), "duplicates": sum(c.duplicates for c in subscribers),
                      "clients_with_final": finals_ok, "clients_unfinished": unfinished,
                      "client_errors": len(errors), "first_errors": errors[:5]},
        "latency_ms": {"definition": "client receive (wall) - producer append (wall, just before send)",
                       "p50": round(percentile(latencies, 0.5), 2), "p95": round(p95, 2),
                       "p99": round(percentile(latencies, 0.99), 2),
                       "max": round(max(latencies, default=float("nan")), 2),
                       "by_send_second": series},
        "targets": {"events_per_s": TARGET_EVENTS_PER_S, "events_per_s_met": delivered_per_s >= TARGET_EVENTS_PER_S,
                    "latency_p95_ms": TARGET_P95_MS, "latency_p95_met": p95 <= TARGET_P95_MS,
                    "no_gaps_or_duplicates": not any(c.gaps or c.duplicates for c in subscribers)},
    }


if __name__ == "__main__":
    print(json.dumps(asyncio.run(produce(json.loads(Path(sys.argv[1]).read_text())))))
