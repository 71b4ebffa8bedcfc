"""The chaos run's clients: another gateway when one is down, and every request tallied for availability.

Real HTTP servers (uvicorn on loopback), no Kafka: a gateway that answers, one that is down (nothing listens
on its port) and one that drops the connection before answering or in the middle of a stream."""
from __future__ import annotations

import asyncio

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse

from bench.chaos.fleet import REPLICA_FAULTS, SINGLE_FAULTS, build_fleet, faults_for
from bench.chaos.gateways import Availability, GatewayRoute
from infra.ports import listen_port
from tests.waiting import wait_until


def free_port() -> int:
    return listen_port()


def make_gateway(status: int = 200, cut_stream: bool = False) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/generations")
    async def submit():
        return JSONResponse({"id": "g1"}, status_code=status)

    @app.get("/v1/generations/g1/events")
    async def events():
        async def body():
            yield b"event: token\ndata: {}\n\n"
            if cut_stream:
                raise RuntimeError("gateway died mid-stream")  # uvicorn drops the connection

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


@pytest.fixture
async def serve():
    servers: list[tuple[uvicorn.Server, asyncio.Task]] = []

    async def start(app: FastAPI) -> str:
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
        servers.append((server, asyncio.create_task(server.serve())))
        await wait_until(lambda: server.started, 10, step_s=0.01, what="uvicorn to start")
        return f"http://127.0.0.1:{port}"

    yield start
    for server, task in servers:
        server.should_exit = True
        await task


async def test_a_gateway_that_refuses_connections_is_passed_over_and_is_no_failed_request(serve):
    live = await serve(make_gateway(201))
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens: what a killed gateway leaves
    tally = Availability()
    async with httpx.AsyncClient(base_url=down) as dead, httpx.AsyncClient(base_url=live) as up:
        route = GatewayRoute([dead, up], first=0, tally=tally)
        response = await route.request("admission", "POST", "/v1/generations", json={})
        assert response.status_code == 201 and route.http is up
        second = await route.request("admission", "POST", "/v1/generations", json={})
    assert second.status_code == 201
    assert tally.report() == {"availability_error_fraction": 0.0, "requests": 2, "failed": 0,
                              "requests_by_kind": {"admission": 2}, "failed_by_kind": {}, "failed_after_fault": {},
                              "retry_later": {}, "failovers": 1, "streams_cut": 0}


async def test_documented_retry_answers_pass_other_statuses_and_no_gateway_at_all_fail(serve):
    busy, broken = await serve(make_gateway(503)), await serve(make_gateway(500))
    tally = Availability()
    async with httpx.AsyncClient(base_url=busy) as a, httpx.AsyncClient(base_url=broken) as b, \
            httpx.AsyncClient(base_url=f"http://127.0.0.1:{free_port()}") as c:
        await GatewayRoute([a], 0, tally).request("admission", "POST", "/v1/generations", json={})
        await GatewayRoute([b], 0, tally).request("admission", "POST", "/v1/generations", json={})
        with pytest.raises(httpx.ConnectError):
            await GatewayRoute([c], 0, tally).request("status", "GET", "/v1/generations/g1")
    began = tally.failed_at[0] - 5.0  # the run began 5 s before the first failure
    faults = [{"fault": "gateway_kill9", "began_s": 1.0}, {"fault": "broker_kill9", "began_s": 4.9},
              {"fault": "postgres_restart", "began_s": 999.0}]
    report = tally.report(faults, began)
    assert report["failed_by_kind"] == {"admission HTTP 500": 1, "status ConnectError": 1}
    assert report["failed_after_fault"] == {"broker_kill9": 2}
    assert tally.report([], began)["failed_after_fault"] == {"before_faults": 2}
    assert report["retry_later"] == {"admission 503": 1}
    assert (report["requests"], report["failed"], report["availability_error_fraction"]) == (3, 2, round(2 / 3, 6))


async def test_a_stream_cut_after_its_answer_is_counted_apart_and_the_resume_goes_to_the_next_gateway(serve):
    cutting, whole = await serve(make_gateway(cut_stream=True)), await serve(make_gateway())
    tally = Availability()
    async with httpx.AsyncClient(base_url=cutting) as a, httpx.AsyncClient(base_url=whole) as b:
        route = GatewayRoute([a, b], 0, tally)
        with pytest.raises(httpx.HTTPError):
            async with route.stream("/v1/generations/g1/events") as response:
                async for _ in response.aiter_bytes():
                    pass
        assert route.http is b
        async with route.stream("/v1/generations/g1/events") as response:
            assert (await response.aread()).startswith(b"event: token")
    report = tally.report()
    assert (report["requests_by_kind"], report["failed"], report["streams_cut"]) == ({"attach": 2}, 0, 1)


def test_gateway_and_controller_kills_need_replicas_and_unknown_faults_are_named():
    assert faults_for(1, None) == SINGLE_FAULTS and faults_for(2, None) == REPLICA_FAULTS
    assert faults_for(2, ("controller_kill9",)) == ("controller_kill9",)
    with pytest.raises(ValueError, match="need --instances 2"):
        faults_for(1, ("gateway_kill9", "worker_kill9"))
    with pytest.raises(ValueError, match="unknown faults \\['zone_kill'\\]"):
        faults_for(2, ("zone_kill",))


def test_two_instances_are_numbered_each_gateway_on_its_own_port_and_workers_get_fresh_ids(tmp_path):
    fleet = build_fleet(2, "m@1", "chaos-x", {}, tmp_path)
    assert list(fleet.roles) == ["controller-1", "controller-2", "worker-1", "worker-2", "projector-1",
                                 "projector-2", "gateway-1", "gateway-2"]
    assert len(set(fleet.gateway_ports)) == 2
    assert [fleet.roles[n].args[-1] for n in ("worker-1", "worker-2")] + [fleet.new_worker().args[-1]] == [
        "chaos-x-w1", "chaos-x-w2", "chaos-x-w3"]
    assert list(build_fleet(1, "m@1", "chaos-x", {}, tmp_path).roles) == ["controller", "worker", "projector",
                                                                           "gateway"]
