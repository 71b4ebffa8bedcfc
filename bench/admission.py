"""`ledgerlm bench admission`: admission latency at a fixed rate, and platform vs engine-alone throughput.

    phase 1  POST /v1/generations (non-streaming) at `rate` req/s for `seconds`:
             HTTP latency from send to decision (p50/p95/p99), status counts, and from the gateway's
             log where its share went (render + publish, awaiting the controller's committed reply)
    phase 2  the same `num_requests` generations (fixed token ids, greedy)
             a) through gateway -> Kafka -> controller -> worker -> Kafka -> bridge, all submitted at once,
                each call waiting for its end (`?wait=true`)
             b) on an Engine alone in a fresh process with the worker's engine config, run right
                before and right after (a), so load from other processes on the machine hits both alike
             output tokens/s of each and their ratio

The controller, the worker and the gateway (`ledgerlm gateway`, uvicorn) run as
real processes in a control plane of their own (a fresh controller group),
against the real broker and database; this process is only the HTTP client.
"""
from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

from bench.common import percentile, spawn, stop_processes, wait_for_log
from plumbing.compute_threads import wait_policy_env
from plumbing.settings import REPO_ROOT, Settings


def workload(num_requests: int) -> list[str]:
    """Deterministic prompts of 8..64 corpus-like words."""
    import random

    from engine.artifacts.demo_model import _WORDS

    rng = random.Random(0)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randrange(8, 65))) for _ in range(num_requests)]


def engine_alone(model_dir: Path, settings: Settings, prompts: list[tuple[int, ...]], output_tokens: int) -> dict:
    from consumers.worker.runtime import engine_config
    from engine.engine import Engine
    from engine.request import EngineRequest, SamplingParams

    engine = Engine(model_dir, engine_config(settings))
    # Warm up (first forwards pay one-time kernel and allocator costs), as the worker was by the earlier phases.
    engine.add_request(EngineRequest("warm", prompts[0], SamplingParams(max_tokens=8)))
    while engine.has_unfinished():
        engine.step()
    started = time.perf_counter()
    for i, prompt in enumerate(prompts):
        engine.add_request(EngineRequest(f"r{i}", prompt, SamplingParams(max_tokens=output_tokens),
                                         tenant_id="bench", scope_key="bench"))
    produced = 0
    while engine.has_unfinished():
        produced += sum(len(o.new_token_ids) for o in engine.step())
    elapsed = time.perf_counter() - started
    return {"output_tokens": produced, "seconds": round(elapsed, 3), "tokens_per_s": round(produced / elapsed, 1)}


def engine_alone_process(model_dir: Path, prompts: list[tuple[int, ...]], output_tokens: int, workdir: Path,
                         env: dict[str, str]) -> dict:
    """The baseline in a fresh process, like the worker's (a process that served HTTP and Kafka for a
    minute ran the same engine 6x slower: its leftover threads are not the engine's fault)."""
    import json

    job = workdir / "engine_alone.json"
    job.write_text(json.dumps({"model_dir": str(model_dir), "prompts": [list(p) for p in prompts],
                               "output_tokens": output_tokens}))
    out = subprocess.run([sys.executable, "-m", "bench.admission", str(job)], env=env, cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"engine-alone run failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


async def run_admission_bench(model_dir: Path, rate: float, seconds: float, num_requests: int,
                              output_tokens: int, workdir: Path) -> dict:
    import httpx

    from bench.common import free_port
    from plumbing.kafka.groups import move_group_to_end
    from engine.artifacts.model_dir import load_artifacts
    from bench.common import local_endpoints
    from producers.model_registry import describe, register_model
    from producers.tenant_admin import create_tenant
    from schemas.values import TenantLimits

    plane = f"bench-{uuid.uuid4().hex[:8]}"
    base = Settings()
    bootstrap, db_url = local_endpoints(base)
    version = f"bench-{describe(model_dir, 'probe').content_sha256[:8]}@1"
    await register_model(bootstrap, model_dir, version)
    tenant = await create_tenant(bootstrap, db_url, f"bench-{uuid.uuid4().hex[:8]}",
                                 TenantLimits(max_tokens_in_flight=10_000_000, tokens_per_minute=100_000_000,
                                              max_concurrency=10_000))
    await move_group_to_end(bootstrap, plane, "llm.commands")
    # OMP_WAIT_POLICY=PASSIVE for the worker and the baseline alike: with other processes busy on 2 cores,
    # spinning OpenMP threads slowed the same engine steps 10-20x (0.2 s vs 3.6 s for this workload).
    env = {**os.environ, "LEDGERLM_KAFKA_BOOTSTRAP": bootstrap, "LEDGERLM_DATABASE_URL": db_url,
           "LEDGERLM_CONTROLLER_GROUP": plane, "LEDGERLM_ADMISSION_TIMEOUT_MS": "30000",
           **wait_policy_env()}
    workdir.mkdir(parents=True, exist_ok=True)
    logs = {role: workdir / f"{role}.log" for role in ("controller", "worker", "gateway")}
    port = free_port()
    procs = []
    try:
        procs.append(controller := spawn(["controller"], env, logs["controller"]))
        procs.append(worker := spawn(["worker", "--model-version", version, "--worker-id", f"{plane}-w1"], env,
                                     logs["worker"]))
        procs.append(gateway := spawn(["gateway", "--host", "127.0.0.1", "--port", str(port)], env, logs["gateway"]))
        await wait_for_log(logs["controller"], "controller owns partitions", controller, 120)
        await wait_for_log(logs["worker"], "worker ready", worker, 120)
        headers = {"Authorization": f"Bearer {tenant.api_key}"}
        limits = httpx.Limits(max_connections=num_requests + 50, max_keepalive_connections=num_requests + 50)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=headers, timeout=120,
                                     limits=limits) as client:
            await warm_up(client, version, gateway, logs["gateway"])
            measured_from = len(logs["gateway"].read_text(errors="replace").splitlines())
            latency = await admission_phase(client, version, rate, seconds)
            latency["gateway_breakdown_ms"] = breakdown(
                logs["gateway"].read_text(errors="replace").splitlines()[measured_from:])
            tokenizer = load_artifacts(model_dir).tokenizer
            texts = workload(num_requests)
            # The gateway's effective token ids for `input`: the engine-alone run gets exactly these.
            prompts = [tuple(tokenizer(text)["input_ids"]) for text in texts]
            before = await asyncio.to_thread(engine_alone_process, model_dir, prompts, output_tokens, workdir, env)
            platform = await throughput_phase(client, version, texts, output_tokens)
    finally:
        stop_processes(procs)
    after = await asyncio.to_thread(engine_alone_process, model_dir, prompts, output_tokens, workdir, env)
    alone = {"before": before, "after": after,
             "tokens_per_s": round((before["tokens_per_s"] + after["tokens_per_s"]) / 2, 1)}
    return {"model_dir": str(model_dir), "model_version": version, "plane": plane,
            "setup": "controller, worker and gateway are processes of their own; the HTTP clients are this one",
            "omp_wait_policy": env["OMP_WAIT_POLICY"], "machine_load_before": [round(x, 2) for x in os.getloadavg()],
            "admission": latency,
            "throughput": {"requests": num_requests, "output_tokens_per_request": output_tokens,
                           "platform": platform, "engine_alone": alone,
                           "ratio": round(platform["tokens_per_s"] / alone["tokens_per_s"], 3)},
            "targets": {"admission_p95_ms": 50, "throughput_ratio": 0.8}}


async def warm_up(client, version: str, gateway: subprocess.Popen, log: Path) -> None:
    """First requests load the tokenizer and open connections; they are not measured."""
    import httpx

    status = None
    for _ in range(120):
        if gateway.poll() is not None:
            break
        try:
            response = await client.post("/v1/generations?wait=true", json={
                "requestId": uuid.uuid4().hex, "model": version, "input": "warm up", "maxOutputTokens": 2})
            status = response.status_code
            if status in (200, 201):
                return
        except httpx.TransportError:
            pass  # the gateway is still starting
        await asyncio.sleep(0.5)  # 503 until the worker's heartbeat reached the controller
    raise RuntimeError(f"warm-up never admitted (last status {status}): {log.read_text(errors='replace')[-2000:]}")


async def admission_phase(client, version: str, rate: float, seconds: float) -> dict:
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def one() -> None:
        started = time.perf_counter()
        response = await client.post("/v1/generations", json={
            "requestId": uuid.uuid4().hex, "model": version, "input": "the water is", "maxOutputTokens": 4})
        latencies.append((time.perf_counter() - started) * 1000)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

    tasks = []
    total = int(rate * seconds)
    started = time.perf_counter()
    for i in range(total):
        delay = started + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one()))
    await asyncio.gather(*tasks)
    offered = total / (time.perf_counter() - started)
    return {"requests": total, "rate_target": rate, "rate_offered": round(offered, 1),
            "statuses": {str(k): v for k, v in sorted(statuses.items())},
            "latency_ms": {"p50": round(percentile(latencies, 0.5), 1), "p95": round(percentile(latencies, 0.95), 1),
                           "p99": round(percentile(latencies, 0.99), 1), "max": round(max(latencies), 1),
                           "mean": round(statistics.fmean(latencies), 1)}}


def breakdown(log_lines: list[str]) -> dict:
    """Where admission time went inside the gateway, from its `admission ...` log lines: rendering and
    publishing the command (acks=all) and then waiting for the controller's committed reply (`ms` is the
    sum of the three); the rest of the client's latency is HTTP and the event loops on both sides."""
    fields: dict[str, list[float]] = {"ms": [], "publish_ms": [], "await_ms": []}
    for line in log_lines:
        if " admission tenant=" not in line:
            continue
        for part in line.split():
            name, _, value = part.partition("=")
            if name in fields:
                fields[name].append(float(value))

    def summary(values: list[float]) -> dict:
        return {"p50": round(percentile(values, 0.5), 1), "p95": round(percentile(values, 0.95), 1)}

    return {"requests": len(fields["ms"]), "in_gateway": summary(fields["ms"]),
            "publish": summary(fields["publish_ms"]), "await_decision": summary(fields["await_ms"])}


async def throughput_phase(client, version: str, texts: list[str], output_tokens: int) -> dict:
    """Submit every prompt at once, each call waiting for its generation's end (`?wait=true`). Batch tier:
    like the engine's own queue, more requests than the worker runs at once wait for room instead of 503."""
    started = time.perf_counter()
    responses = await asyncio.gather(*[client.post("/v1/generations?wait=true", json={
        "requestId": uuid.uuid4().hex, "model": version, "input": text, "maxOutputTokens": output_tokens,
        "tier": "batch"}) for text in texts])
    done = [r.json() for r in responses if r.status_code == 201]
    if len(done) != len(texts):
        raise RuntimeError(f"throughput phase: {len(texts) - len(done)} requests refused: "
                           f"{[r.status_code for r in responses if r.status_code != 201][:5]}")
    elapsed = time.perf_counter() - started
    produced = sum(d["usage"]["outputTokens"] for d in done)
    return {"output_tokens": produced, "seconds": round(elapsed, 3), "tokens_per_s": round(produced / elapsed, 1)}


if __name__ == "__main__":
    import json
    import threading

    job = json.loads(Path(sys.argv[1]).read_text())
    result: dict = {}
    # On a thread, as the worker's EngineThread runs it.
    runner = threading.Thread(target=lambda: result.update(engine_alone(
        Path(job["model_dir"]), Settings(), [tuple(p) for p in job["prompts"]], job["output_tokens"])))
    runner.start()
    runner.join()
    print(json.dumps(result))
