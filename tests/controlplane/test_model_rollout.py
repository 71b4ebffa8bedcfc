"""Rollouts end to end: golden-prompt qualification and the quality gate; aliases pinned at admission.

The quality gate runs on a control plane of its own (controller, worker and gateway in this process, with
`require_qualified`), so the session's shared controller keeps routing unqualified versions for the other tests.
"""
from __future__ import annotations

import asyncio
import json
import shutil
import time
from contextlib import asynccontextmanager, suppress
from pathlib import Path

import httpx
import psycopg

from ledgerlm.cli.main import main
from plumbing.kafka.groups import move_group_to_end
from plumbing.settings import Settings
from projections.audit import audit_replay
from tests.controlplane.conftest import BLOCK, SESSION, body
from tests.controlplane.test_projected_billing import project_all
from tests.waiting import wait_until

MESSAGES = [{"role": "user", "content": "the water is"}]


async def cli(capsys, *args: str) -> tuple[int, str, str]:
    """`ledgerlm ARGS` in a thread (it runs an event loop of its own): exit code, stdout, stderr."""
    capsys.readouterr()
    code = await asyncio.to_thread(main, list(args))
    out, err = capsys.readouterr()
    return code, out, err


def greedy_output(model_dir: Path, artifacts) -> str:
    """The model's greedy answer to MESSAGES (6 tokens), for a golden file that expects it exactly."""
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.artifacts.golden import parse_golden, render
    from engine.request import EngineRequest, SamplingParams

    engine = Engine(model_dir, EngineConfig(kv_cache_bytes=64 * BLOCK * 512, block_size=BLOCK, dtype="float32",
                                            device="cpu"), artifacts=artifacts)
    prompt = parse_golden(make_golden({"contains": "x"}))[0]
    engine.add_request(EngineRequest("learn", render(engine.tokenizer, prompt), SamplingParams(max_tokens=6)))
    text = []
    while engine.has_unfinished():
        text += [o.text_delta for o in engine.step()]
    return "".join(text)


def make_golden(expect: dict) -> bytes:
    from engine.artifacts.golden import GOLDEN_FORMAT

    return json.dumps({"format": GOLDEN_FORMAT, "prompts": [
        {"name": "capital", "messages": MESSAGES, "maxOutputTokens": 6, "expect": expect}]}).encode()


def with_golden(model_dir: Path, out: Path, expect: dict) -> Path:
    """A copy of the model with golden.json (listed in the manifest, so part of the content hash)."""
    from engine.artifacts.model_dir import write_manifest

    shutil.copytree(model_dir, out)
    (out / "golden.json").write_bytes(make_golden(expect))
    write_manifest(out)
    return out


@asynccontextmanager
async def gated_plane(bootstrap: str, database_url: str, settings: Settings):
    """A controller with `settings` (its own group) and a gateway for it, in this process."""
    from consumers.controller.runtime import Controller
    from producers.gateway.http.app import create_app

    await move_group_to_end(bootstrap, settings.controller_group, "llm.commands")
    controller = Controller(settings, bootstrap)
    task = asyncio.create_task(controller.run(), name="gated-controller")
    app = None
    try:
        await asyncio.wait_for(controller.ready.wait(), 60)
        app = create_app(settings, bootstrap, database_url)
        await app.state.gateway.start()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway",
                                     timeout=60) as client:
            client.gateway = app.state.gateway
            yield controller, client
    finally:
        if app is not None:
            await app.state.gateway.stop()
        task.cancel()
        with suppress(asyncio.CancelledError):
            await task


async def test_qualify_publishes_pass_and_fail_and_the_gate_routes_only_a_qualified_version(
        bootstrap, database_url, cp_settings, start_worker, controller, tenants, versions, model_dir,
        engine_artifacts, tmp_path, capsys):
    from producers.model_registry import register_model
    from producers.model_rollout import read_model_book

    learnt = await asyncio.to_thread(greedy_output, model_dir, engine_artifacts)
    assert learnt
    good, bad = f"cp-gated-{SESSION}@1", f"cp-gated-{SESSION}@2"
    await register_model(bootstrap, with_golden(model_dir, tmp_path / "good", {"exact": learnt}), good)
    await register_model(bootstrap, with_golden(model_dir, tmp_path / "bad", {"contains": "\u2603 not this"}), bad)
    settings = cp_settings.model_copy(update={"controller_group": f"test-gated-{SESSION}",
                                              "require_qualified": True})
    headers = tenants["main"].headers
    async with gated_plane(bootstrap, database_url, settings) as (gated, client):
        # A worker for each version: the gate, not a missing worker, is what refuses.
        for version in (good, bad):
            worker = await start_worker(version, controller_group=settings.controller_group)
            await wait_until(lambda: gated.registry.is_live(worker.worker_id, time.time()), 15, what="worker seen")
            await wait_until(lambda: client.gateway.board.could_serve([version], 8, time.time()), 15,
                             what="the gateway to see the worker")
        refused = await client.post("/v1/generations", headers=headers, json=body(model=good))
        assert refused.status_code == 503 and refused.headers["retry-after"]
        assert refused.json()["code"] == "model_not_qualified"
        assert f"model version {good} has not been qualified" in refused.json()["message"]

        code, out, _ = await cli(capsys, "models", "qualify", good, "--json")
        assert code == 0, out
        assert json.loads(out) | {"contentSha256": None} == {
            "modelVersion": good, "passed": True, "prompts": 1, "failures": [], "contentSha256": None,
            "results": [{"name": "capital", "passed": True, "expect": "exact", "outputChars": len(learnt)}]}
        code, out, _ = await cli(capsys, "models", "qualify", bad)
        assert code == 1 and "FAIL  capital (contains" in out and f"{bad} NOT qualified (1 failed)" in out
        code, _, err = await cli(capsys, "models", "qualify", versions["idle"])
        assert code == 2 and f"{versions['idle']} has no golden.json: it cannot qualify" in err
        code, _, err = await cli(capsys, "models", "qualify", f"cp-nothing-{SESSION}@1")
        assert code == 2 and "is not registered" in err

        book = await read_model_book(bootstrap)
        assert (book.qualifications[good].passed, book.qualifications[good].failures) == (True, ())
        assert (book.qualifications[bad].passed, book.qualifications[bad].failures) == (False, ("capital",))
        for name in (good, bad):
            assert book.qualifications[name].content_sha256 == book.versions[name].content_sha256
        assert book.versions[good].content_sha256 != book.versions[versions["idle"]].content_sha256

        await wait_until(lambda: gated.models.is_qualified(good), 15, what="the controller sees the qualification")
        admitted = await client.post("/v1/generations", headers=headers, json=body(model=good))
        assert (admitted.status_code, admitted.json()["model"]) == (201, good)
        failed = await client.post("/v1/generations", headers=headers, json=body(model=bad))
        assert failed.status_code == 503 and f"model version {bad} failed qualification" in failed.json()["message"]


async def admit(gateway, headers: dict, payload: dict, timeout_s: float = 15) -> httpx.Response:
    """POST until the controller knows the alias and its workers (a 404/503 records nothing: the same
    requestId may be sent again)."""
    return await wait_until(lambda: gateway.post("/v1/generations", headers=headers, json=payload), timeout_s,
                            step_s=0.1, accept=lambda r: r.status_code not in (404, 503),
                            what=lambda r: f"an answer other than 404/503: {r.status_code} {r.text}")


async def test_an_alias_pins_each_generation_to_one_version_a_retry_keeps_it_and_the_replay_agrees(
        gateway, start_worker, controller, tenants, versions, bootstrap, scratch_database, capsys):
    from plumbing.kafka.clients import make_producer, publish
    from schemas.dispatch import DrainWorker

    stable, canary = versions["stable"], versions["canary"]
    stable_worker, canary_worker = await start_worker("stable"), await start_worker("canary")
    alias = f"cp-chat-{SESSION}"
    code, out, err = await cli(capsys, "models", "alias", alias, f"{stable}=100", f"{canary}=0", "--json")
    assert code == 0, err
    assert json.loads(out)["weights"] == {canary: 0, stable: 100}
    code, _, err = await cli(capsys, "models", "alias", alias, f"{stable}=1", f"cp-nothing-{SESSION}@1=1")
    assert code == 2 and f"'cp-nothing-{SESSION}@1' is not a registered model version" in err
    code, _, err = await cli(capsys, "models", "alias", stable, f"{canary}=1")
    assert code == 2 and "a name without '@'" in err

    headers, bridge = tenants["main"].headers, gateway.gateway.bridge
    await wait_until(lambda: alias in gateway.gateway.catalog.names(), 10, what="the gateway sees the alias")
    first_body = body(model=alias, maxOutputTokens=2)
    first = await admit(gateway, headers, first_body)
    assert (first.status_code, first.json()["model"]) == (201, stable), first.text
    pinned = [first] + [await admit(gateway, headers, body(model=alias, maxOutputTokens=2)) for _ in range(3)]
    long_running = await admit(gateway, headers, body(model=alias, maxOutputTokens=48))
    assert [r.json()["model"] for r in pinned + [long_running]] == [stable] * 5
    ids = [r.json()["id"] for r in pinned]
    await wait_until(lambda: all((v := bridge.view(i)) and v.worker_id for i in ids), 20, what="attempts started")
    assert {bridge.view(i).worker_id for i in ids} == {stable_worker.worker_id}
    retry = await gateway.post("/v1/generations", headers=headers, json=first_body)
    assert (retry.status_code, retry.json()["id"], retry.json()["model"]) == (200, first.json()["id"], stable)

    # Roll forward: new weights are a new record; the old version's worker drains without cutting its stream.
    assert (await cli(capsys, "models", "alias", alias, f"{stable}=0", f"{canary}=100"))[0] == 0
    moved = await wait_until(lambda: admit(gateway, headers, body(model=alias, maxOutputTokens=2)), 15, step_s=0.05,
                             accept=lambda r: r.json()["model"] == canary, what="the controller to draw the canary")
    moved_id = moved.json()["id"]
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        await publish(producer, "llm.dispatch", DrainWorker(worker_id=stable_worker.worker_id))
    finally:
        await producer.stop()
    await asyncio.wait_for(stable_worker.stopped.wait(), 30)
    long_id = long_running.json()["id"]
    final = await wait_until(lambda: (v := bridge.view(long_id)) and v.final, 20, what="the long stream's end")
    assert (final.reason, final.usage.generated_output_tokens) == ("output-limit", 48)
    again = await gateway.post("/v1/generations", headers=headers, json=first_body)
    assert (again.status_code, again.json()["id"], again.json()["model"]) == (200, first.json()["id"], stable)
    status = (await gateway.get(f"/v1/generations/{moved_id}", headers=headers)).json()
    assert status["model"] == canary and bridge.view(moved_id).worker_id == canary_worker.worker_id

    listed = (await gateway.get("/v1/models", headers=headers)).json()["data"]
    assert {"id": alias, "max_model_len": 512} in [{k: m[k] for k in ("id", "max_model_len")} for m in listed]

    # Status, billing and the replay audit all see the concrete version.
    all_ids = ids + [long_id, moved_id]
    await wait_until(lambda: all((v := bridge.view(i)) and v.final for i in all_ids), 20, what="every end")
    from migrations import runner

    runner.upgrade(scratch_database)
    await project_all(bootstrap, scratch_database)
    with psycopg.connect(scratch_database) as conn:
        statuses = dict(conn.execute("SELECT generation_id, model_version FROM generations "
                                     "WHERE generation_id = ANY(%s)", (all_ids,)).fetchall())
        billed = dict(conn.execute("SELECT generation_id, model_version FROM billing_ledger "
                                   "WHERE generation_id = ANY(%s)", (all_ids,)).fetchall())
    expected = {i: stable for i in ids + [long_id]} | {moved_id: canary}
    assert statuses == expected and billed == expected
    audit = await audit_replay(bootstrap, scratch_database, Settings())
    assert audit.differences == 0, audit.as_dict()
