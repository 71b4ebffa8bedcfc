"""/metrics, /healthz and /readyz of every role after real generations through the stack."""
from __future__ import annotations

import uuid

import httpx

from tests.controlplane.conftest import Process, body, parse, post_until_admitted, scrape, value
from tests.waiting import wait_until

def worker_url(worker) -> str:
    return f"http://127.0.0.1:{worker.http.port}"


async def get(url: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url)


async def test_a_generation_moves_the_worker_controller_and_gateway_metrics(gateway, worker, controller, tenants,
                                                                           versions):
    tenant = tenants["metrics"]
    controller_url = await controller.metrics_url()
    before_worker, before_controller = await scrape(worker_url(worker)), await scrape(controller_url)

    done = await gateway.post("/v1/generations?wait=true", headers=tenant.headers,
                              json=body(model=versions["served"], maxOutputTokens=7))
    assert done.status_code == 201, done.text
    usage = done.json()["usage"]

    after = await scrape(worker_url(worker))
    served = {kind: value(after, "ledgerlm:tenant_served_tokens_total", tenant=tenant.tenant_id, kind=kind)
              for kind in ("prompt", "generation")}
    assert served == {"prompt": usage["inputTokens"], "generation": 7}
    # Other tests may share the worker: the global counters moved at least by this generation.
    at_least = {"ledgerlm:generation_tokens_total": 7, "ledgerlm:prompt_tokens_total": usage["inputTokens"],
                "ledgerlm:time_to_first_token_seconds_count": 1, "ledgerlm:inter_token_latency_seconds_count": 6,
                "ledgerlm:request_queue_time_seconds_count": 1, "ledgerlm:e2e_request_latency_seconds_count": 1}
    for name, moved in at_least.items():
        assert value(after, name) - value(before_worker, name) >= moved, name
    assert value(after, "ledgerlm:time_to_first_token_seconds_sum") > value(
        before_worker, "ledgerlm:time_to_first_token_seconds_sum")
    assert value(after, "ledgerlm:request_success_total", finished_reason="output-limit") >= 1
    assert value(after, "ledgerlm:kv_blocks_used") + value(after, "ledgerlm:kv_blocks_free") == worker.total_blocks
    assert value(after, "ledgerlm:kv_blocks_free") > 0
    for name in ("ledgerlm:prefix_cache_hit_tokens_total", "ledgerlm:preemptions_total",
                 "ledgerlm:kv_blocks_reserved", "ledgerlm:num_requests_running", "ledgerlm:num_requests_waiting"):
        assert (name, frozenset()) in after, name

    control = await scrape(controller_url)
    assert value(control, "ledgerlm:admission_decisions_total", code="201") - value(
        before_controller, "ledgerlm:admission_decisions_total", code="201") >= 1
    assert value(control, "ledgerlm:partitions_owned") > 0 and value(control, "ledgerlm:workers_live") >= 1

    metrics = await gateway.get("/metrics")
    assert metrics.status_code == 200
    gateway_samples = parse(metrics.text)
    assert value(gateway_samples, "ledgerlm:http_responses_total", code="201") >= 1
    assert value(gateway_samples, "ledgerlm:admission_latency_seconds_count") >= 1


async def test_rejections_are_counted_by_status_code(gateway, worker, controller, tenants, versions):
    controller_url = await controller.metrics_url()
    before_controller = await scrape(controller_url)
    before_gateway = parse((await gateway.get("/metrics")).text)
    idle = await gateway.post("/v1/generations", headers=tenants["main"].headers, json=body(model=versions["idle"]))
    assert idle.status_code == 503, idle.text  # a registered version no worker serves
    unknown = await gateway.post("/v1/generations", headers=tenants["main"].headers,
                                 json=body(model=f"nope-{uuid.uuid4().hex[:6]}@1"))
    assert unknown.status_code == 404, unknown.text

    after_gateway = parse((await gateway.get("/metrics")).text)
    for code in ("503", "404"):
        assert value(after_gateway, "ledgerlm:admission_rejections_total", code=code) - value(
            before_gateway, "ledgerlm:admission_rejections_total", code=code) == 1, code
    # No live worker serves the idle version: the gateway refused it without a controller transaction.
    assert value(after_gateway, "ledgerlm:early_refusals_total") - value(
        before_gateway, "ledgerlm:early_refusals_total") == 1
    control = await scrape(controller_url)
    assert value(control, "ledgerlm:admission_rejections_total", code="503") == value(
        before_controller, "ledgerlm:admission_rejections_total", code="503")


async def test_cancellation_lag_is_observed(gateway, paced_worker, tenants, versions):
    bridge, worker = gateway.gateway.bridge, paced_worker
    before = await scrape(worker_url(worker))
    created = await post_until_admitted(gateway, "/v1/generations", headers=tenants["main"].headers,
                                        json=body(model=versions["paced"], maxOutputTokens=400))
    gen_id = created.json()["id"]
    await wait_until(lambda: (v := bridge.view(gen_id)) and len(v.tokens) >= 2, 20, what="first tokens")
    await gateway.post(f"/v1/generations/{gen_id}/cancel", headers=tenants["main"].headers)
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 20, what="its end")
    assert view.final.reason == "canceled"
    name = "ledgerlm:cancellation_lag_seconds"
    # the worker records the lag next to, not before, the events the bridge has already seen
    after = await wait_until(lambda: scrape(worker_url(worker)), 5, step_s=0.1,
                             accept=lambda samples: value(samples, f"{name}_count") > value(before, f"{name}_count"),
                             what="the worker to record the lag")
    assert value(after, f"{name}_count") - value(before, f"{name}_count") == 1
    lag = value(after, f"{name}_sum") - value(before, f"{name}_sum")
    assert 0 < lag < 5
    assert value(after, "ledgerlm:request_success_total", finished_reason="canceled") >= 1


async def test_every_role_is_healthy_and_ready(gateway, worker, controller):
    for url in (worker_url(worker), await controller.metrics_url()):
        assert (await get(f"{url}/healthz")).status_code == 200
        ready = await get(f"{url}/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True, ready.text
        assert (await get(f"{url}/nothing")).status_code == 404
    ready = await gateway.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"admission": True, "bridge": True, "bridge_caught_up": True, "keys": True,
                                      "models": True, "database": True}


async def test_a_draining_worker_is_not_ready(start_worker, controller):
    drained = await start_worker("drained")
    url = worker_url(drained)
    assert (await get(f"{url}/readyz")).status_code == 200
    drained.draining = True
    ready = await get(f"{url}/readyz")
    assert ready.status_code == 503 and ready.json()["checks"]["accepting"] is False
    drained.draining = False


async def test_the_projector_exposes_lag_per_projection_and_becomes_ready(cp_env, scratch_database,
                                                                          tmp_path):
    from migrations import runner

    runner.upgrade(scratch_database)
    env = {**cp_env, "LEDGERLM_DATABASE_URL": scratch_database, "LEDGERLM_HOME": str(tmp_path),
           "LEDGERLM_PROJECTOR_GROUP": f"test-projector-{uuid.uuid4().hex[:6]}",
           "LEDGERLM_PROJECTOR_LAG_INTERVAL_S": "0.5"}
    projector = Process(["project"], env, tmp_path / "projector.log").start()
    try:
        url = await projector.metrics_url()
        await wait_until(lambda: get(f"{url}/readyz"), 90, step_s=0.3, accept=lambda r: r.status_code == 200,
                         what=lambda r: f"the projector ready: {r.text}")
        samples = await scrape(url)
        projections = {dict(labels)["projection"] for name, labels in samples
                       if name == "ledgerlm:projection_consumer_lag"}
        assert projections == {"tenants", "models", "generations", "stream"}
        assert value(samples, "ledgerlm:projection_applied_events_total", projection="tenants") > 0
        assert (tmp_path / "metrics" / "projector.prom").is_file()  # the text file is still written
    finally:
        projector.stop()
