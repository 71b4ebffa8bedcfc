"""`ledgerlm bench stream --gateways N`: what sharing the token stream saves, with the stand-in worker of
`run.py` (same producer, same SSE clients, fresh generations per phase).

    phase "one"         1 gateway, every client on it; beside it an idle gateway of its own group with no
                        client: it reads every partition and skips every token (CPU per skipped event)
    phase "shared"      N gateways in one group (each reads its share), clients round-robin over them, as a
                        plain load balancer sends them: about (N-1)/N of the streams land on a non-owner
    phase "shared-owner-routed"  the same, each client sent to the gateway owning its generation's partition
                        (a partition-aware balancer): no gateway follows another's partition
    phase "shared-admitted-here"  the same, round-robin, each id minted into the share of the gateway its client
                        is sent to, as the controller mints the id of a request into the admitting gateway's
                        share: an OpenAI `stream` request (admitted and streamed on one connection) or a client
                        attaching where it was admitted
    phase "everything"  N gateways each reading and decoding every partition (`gateway_share_stream=false`,
                        the behaviour before sharing), clients round-robin

CPU is each gateway process's utime+stime from the producer's start to the last client's end, less what the
same process spent idle (clients subscribed, no event) over as long, measured just before.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from bench.common import free_port, wait_ready
from bench.stream.run import Client, proc_cpu_s, publish_admitted, summarize
from plumbing.settings import REPO_ROOT, Settings

TARGET_SKIP_US = 3.0
TARGET_RATIO = 0.6


@dataclass
class GatewayProc:
    name: str
    proc: subprocess.Popen
    url: str
    log: Path

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)


def start_gateway(name: str, env: dict, workdir: Path) -> GatewayProc:
    port = free_port()
    log = workdir / f"{name}.log"
    proc = subprocess.Popen([sys.executable, "-m", "ledgerlm.cli.main", "gateway", "--host", "127.0.0.1",
                             "--port", str(port)], env=env, cwd=REPO_ROOT, stdout=log.open("ab"),
                            stderr=subprocess.STDOUT)
    return GatewayProc(name, proc, f"http://127.0.0.1:{port}", log)


def stop_all(gateways: list[GatewayProc]) -> None:
    for gateway in gateways:
        gateway.proc.terminate()
    for gateway in gateways:
        try:
            gateway.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            gateway.proc.kill()


async def bridge_of(http, gateway: GatewayProc) -> dict:
    return (await http.get(f"{gateway.url}/healthz")).json()["bridge"]


async def settle(http, gateways: list[GatewayProc], partitions: int, timeout_s: float = 60) -> None:
    """Until the group's members own every partition between them (a member alone owns all)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        shares = [(await bridge_of(http, g))["ownedPartitions"] for g in gateways]
        if sorted(p for share in shares for p in share) == list(range(partitions)) and all(shares):
            return
        await asyncio.sleep(0.2)
    raise RuntimeError("the gateways' shares never settled")


async def run_phase(name: str, env: dict, members: int, observer: bool, tenant, job: dict,
                    workdir: Path) -> dict:
    """One phase: its gateways, its generations admitted and subscribed, the producer's load, CPU deltas."""
    import httpx

    from schemas.topics import TOKENS, spec

    group = f"bench-stream-{name}-{uuid.uuid4().hex[:6]}"
    gateways = [start_gateway(f"{name}-{i}", {**env, "LEDGERLM_GATEWAY_GROUP": group}, workdir)
                for i in range(members)]
    idle = [start_gateway(f"{name}-idle", {**env, "LEDGERLM_GATEWAY_GROUP": group + "-idle"}, workdir)] \
        if observer else []
    per_gen = max(1, int(job["rate"] * job["seconds"] / job["clients"]))
    try:
        limits = httpx.Limits(max_connections=job["clients"] + 20, max_keepalive_connections=job["clients"] + 20)
        async with httpx.AsyncClient(limits=limits, timeout=60,
                                     headers={"Authorization": f"Bearer {tenant.api_key}"}) as http:
            for gateway in gateways + idle:
                http.base_url = gateway.url
                await wait_ready(http, gateway.proc, gateway.log, path="/readyz")
            http.base_url = ""
            if env.get("LEDGERLM_GATEWAY_SHARE_STREAM") != "false":
                await settle(http, gateways, spec(TOKENS).partitions)
            routing = job["routing"] if len(gateways) > 1 else "round-robin"
            generations = await mint_ids(http, gateways, tenant.tenant_id, job["clients"], routing)
            await publish_admitted(job["bootstrap"], tenant.tenant_id, generations, per_gen)
            subscribers = [Client(gen) for gen in generations]
            routes = await route(http, gateways, generations, routing)
            for gen, gateway in zip(generations, routes):
                await wait_admitted(http, gateway.url, gen)
            stop_at = time.monotonic() + job["seconds"] + 60
            tasks = [asyncio.create_task(client.run(RoutedHttp(http, gateway.url), stop_at))
                     for client, gateway in zip(subscribers, routes)]
            await asyncio.wait_for(asyncio.gather(*(c.subscribed.wait() for c in subscribers)), 60)
            await quiet(gateways + idle)  # the subscribers' read-backs are done
            idle_cpu = await idle_cpu_per_s(gateways + idle)
            before = {g.name: g.cpu_s() for g in gateways + idle}
            began = time.monotonic()
            bridges_before = {g.name: await bridge_of(http, g) for g in gateways + idle}
            produced = await produce_load(job, generations, per_gen, workdir / f"{name}-producer.json")
            done, pending = await asyncio.wait(tasks, timeout=30)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            wall = time.monotonic() - began
            # What the load cost: the CPU in the window less what the same process spends idle in as long.
            cpu = {g.name: round(g.cpu_s() - before[g.name] - idle_cpu[g.name] * wall, 3) for g in gateways + idle}
            bridges = {g.name: delta(await bridge_of(http, g), bridges_before[g.name]) for g in gateways + idle}
    finally:
        stop_all(gateways + idle)
    report = summarize(subscribers, produced, len(generations), per_gen, job["rate"], job["seconds"], len(pending))
    return phase_report(name, report, cpu, bridges, [g.name for g in gateways], [g.name for g in idle])


async def quiet(gateways: list[GatewayProc], cores: float = 0.15, timeout_s: float = 60) -> None:
    """Until every gateway uses less than `cores` over half a second (bounded)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = {g.name: g.cpu_s() for g in gateways}
        await asyncio.sleep(0.5)
        if all((g.cpu_s() - before[g.name]) / 0.5 < cores for g in gateways):
            return


async def idle_cpu_per_s(gateways: list[GatewayProc], window_s: float = 3.0) -> dict[str, float]:
    """Each gateway's CPU per second with its clients subscribed and no event flowing (followers, heartbeats)."""
    before = {g.name: g.cpu_s() for g in gateways}
    await asyncio.sleep(window_s)
    return {g.name: (g.cpu_s() - before[g.name]) / window_s for g in gateways}


async def mint_ids(http, gateways: list[GatewayProc], tenant_id: str, count: int, routing: str) -> list[str]:
    """Ids as the controller mints them (a gateway not holding one in view finds it by its tenant tag); with
    `admitted-here`, each into the share of the gateway its client is sent to, as the controller does for the
    gateway that admitted it (`SubmitGeneration.stream_share`)."""
    from consumers.controller.decisions import in_share
    from schemas.commands import StreamShare
    from schemas.generation_ids import mint_generation_id
    from schemas.topics import TOKENS, spec

    key = Settings().generation_id_key()
    if routing != "admitted-here":
        return [mint_generation_id(key, tenant_id) for _ in range(count)]
    owned = [tuple((await bridge_of(http, g))["ownedPartitions"]) for g in gateways]
    shares = [StreamShare(partitions=spec(TOKENS).partitions, owned=share) for share in owned]
    return [mint_generation_id(key, tenant_id, in_share(shares[i % len(gateways)])) for i in range(count)]


async def route(http, gateways: list[GatewayProc], generations: list[str], routing: str) -> list[GatewayProc]:
    """Where each client connects: round-robin (a plain balancer; `admitted-here` too: a streaming request is
    served where it was admitted) or to the owner of the generation's partition (a partition-aware balancer
    reading the shares off /healthz)."""
    from plumbing.kafka.follower import partition_for
    from schemas.topics import TOKENS, spec

    if routing in ("round-robin", "admitted-here"):
        return [gateways[i % len(gateways)] for i in range(len(generations))]
    owner = {p: g for g in gateways for p in (await bridge_of(http, g))["ownedPartitions"]}
    return [owner[partition_for(gen, spec(TOKENS).partitions)] for gen in generations]


def delta(after: dict, before: dict) -> dict:
    return {"ownedPartitions": after["ownedPartitions"], "guestPartitions": after["guestPartitions"],
            "recordsDecoded": after["recordsDecoded"] - before["recordsDecoded"],
            "recordsSkipped": after["recordsSkipped"] - before["recordsSkipped"],
            "pacing": [before.get("pacing"), after.get("pacing")]}


def phase_report(name: str, report: dict, cpu: dict, bridges: dict, members: list[str], idle: list[str]) -> dict:
    delivered = report["delivered"]["token_events"]
    total = sum(cpu[m] for m in members)
    phase = {"gateways": len(members), "gateway_cpu_s": {m: cpu[m] for m in members}, "total_gateway_cpu_s":
             round(total, 3), "bridge": {m: bridges[m] for m in members},
             "gateway_cpu_us_per_delivered_event": round(total / delivered * 1e6, 1) if delivered else None,
             "delivered": report["delivered"], "latency_ms": {k: report["latency_ms"][k] for k in ("p50", "p95", "p99")},
             "producer": report["producer"]}
    if idle:
        skipped = bridges[idle[0]]["recordsSkipped"]
        phase["idle_gateway"] = {"cpu_s": cpu[idle[0]], "bridge": bridges[idle[0]],
                                 "cpu_us_per_skipped_event": round(cpu[idle[0]] / skipped * 1e6, 2) if skipped
                                 else None}
    return phase


class RoutedHttp:
    """The shared client, sending a stream's requests to one gateway (what a load balancer chose)."""

    def __init__(self, http, base: str) -> None:
        self.http, self.base = http, base

    def stream(self, method: str, path: str, **kwargs):
        return self.http.stream(method, self.base + path, **kwargs)


async def wait_admitted(http, base: str, gen: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while (await http.get(f"{base}/v1/generations/{gen}")).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the gateway never saw the admission of {gen}")
        await asyncio.sleep(0.05)


async def produce_load(job: dict, generations: list[str], per_gen: int, path: Path) -> dict:
    path.write_text(json.dumps({"bootstrap": job["bootstrap"], "tenant": job["tenant"], "generations": generations,
                                "rate": job["rate"], "per_generation": per_gen}))
    producer = subprocess.Popen([sys.executable, "-m", "bench.stream.run", str(path)], env=job["env"],
                                cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = await asyncio.to_thread(producer.communicate, timeout=job["seconds"] * 3 + 60)
    finally:
        if producer.poll() is None:
            producer.kill()
    if producer.returncode != 0:
        raise RuntimeError(f"producer failed: {err[-2000:]}")
    produced = json.loads(out.strip().splitlines()[-1])
    produced.pop("cpu_s")
    return produced


def skip_cost_in_process(records: int = 200_000) -> dict:
    """CPU of the bridge's hot path on records nobody watches, without Kafka: the floor under the idle gateway."""
    from aiokafka import ConsumerRecord

    from producers.gateway.streams.bridge import StreamBridge
    from schemas.codec import encode, record_headers, record_key
    from schemas.stream import TokensEmitted
    from schemas.topics import TOKENS

    event = TokensEmitted(tenant_id="t", generation_id="gen_" + "ab" * 20, epoch=1, seq=1, token_ids=(5,),
                          text_delta="x" * 19, token_count=1)
    value, key = encode(event), record_key(TOKENS, event)
    batch = [ConsumerRecord(TOKENS, 0, i, 0, 0, key, value, None, len(key), len(value), record_headers(event))
             for i in range(500)]
    tail = StreamBridge("unused:9092").tail
    started = time.process_time()
    for _ in range(records // len(batch)):
        tail.take(batch, owned=True)
    skip_us = (time.process_time() - started) / records * 1e6
    from schemas.codec import decode
    started = time.process_time()
    for record in batch * 20:
        decode(TOKENS, record.value)
    decode_us = (time.process_time() - started) / (len(batch) * 20) * 1e6
    return {"skip_us_per_record": round(skip_us, 3), "decode_us_per_record": round(decode_us, 2),
            "records": records}


async def run_gateways_bench(clients: int, rate: int, seconds: float, gateways: int, workdir: Path) -> dict:
    from bench.common import local_endpoints
    from producers.tenant_admin import create_tenant
    from schemas.values import TenantLimits

    load_before = Path("/proc/loadavg").read_text().strip()
    bootstrap, db_url = local_endpoints(Settings())
    workdir.mkdir(parents=True, exist_ok=True)
    tenant = await create_tenant(bootstrap, db_url, f"bench-gateways-{uuid.uuid4().hex[:8]}",
                                 TenantLimits(max_tokens_in_flight=10_000_000, tokens_per_minute=100_000_000,
                                              max_concurrency=10_000))
    # No projector runs here, so "where the projections stand" would be the log's start: bound the bridges'
    # replay (and read-backs) to the last 30 s, as a projector keeping up would.
    env = {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap, "LEDGERLM_DATABASE_URL": db_url,
           "LEDGERLM_BRIDGE_REPLAY_MAX_S": "30"}
    job = {"bootstrap": bootstrap, "tenant": tenant.tenant_id, "clients": clients, "rate": rate, "seconds": seconds,
           "env": env}
    one = await run_phase("one", env, 1, True, tenant, job, workdir)
    shared = await run_phase("shared", env, gateways, False, tenant, {**job, "routing": "round-robin"}, workdir)
    owner = await run_phase("shared-owner-routed", env, gateways, False, tenant, {**job, "routing": "owner"}, workdir)
    here = await run_phase("shared-admitted-here", env, gateways, False, tenant, {**job, "routing": "admitted-here"},
                           workdir)
    everything = await run_phase("everything", {**env, "LEDGERLM_GATEWAY_SHARE_STREAM": "false"}, gateways, False,
                                 tenant, {**job, "routing": "round-robin"}, workdir)
    in_process = skip_cost_in_process()
    ratio = round(shared["total_gateway_cpu_s"] / everything["total_gateway_cpu_s"], 3)
    owner_ratio = round(owner["total_gateway_cpu_s"] / everything["total_gateway_cpu_s"], 3)
    here_ratio = round(here["total_gateway_cpu_s"] / everything["total_gateway_cpu_s"], 3)
    phases = {"one": one, "shared": shared, "shared-owner-routed": owner, "shared-admitted-here": here,
              "everything": everything}
    skip_us = one["idle_gateway"]["cpu_us_per_skipped_event"]
    return {
        "machine": "2-core CPU shared by Kafka (1 broker), PostgreSQL, the gateways, producer and clients "
                   "(and other work: see loadavg)",
        "setup": {"clients": clients, "target_rate_per_s": rate, "seconds": seconds, "gateways": gateways,
                  "routing": "round-robin over the phase's gateways, except shared-owner-routed (each client on "
                             "the gateway owning its generation's partition)"},
        "phases": phases,
        "skip_cost": {"idle_gateway_cpu_us_per_skipped_event": skip_us, "in_process": in_process},
        "summary": {
            "delivered_events_per_s": {p: r["delivered"]["events_per_s"] for p, r in phases.items()},
            "gateway_cpu_us_per_delivered_event": {p: r["gateway_cpu_us_per_delivered_event"]
                                                   for p, r in phases.items()},
            "shared_vs_everything_cpu_ratio": ratio, "owner_routed_vs_everything_cpu_ratio": owner_ratio,
            "admitted_here_vs_everything_cpu_ratio": here_ratio},
        "targets": {"skip_us": TARGET_SKIP_US, "skip_met": skip_us is not None and skip_us <= TARGET_SKIP_US,
                    "cpu_ratio": TARGET_RATIO, "cpu_ratio_met": ratio <= TARGET_RATIO,
                    "owner_routed_cpu_ratio_met": owner_ratio <= TARGET_RATIO,
                    "admitted_here_cpu_ratio_met": here_ratio <= TARGET_RATIO},
        "loadavg_before": load_before, "loadavg_after": Path("/proc/loadavg").read_text().strip(),
    }
