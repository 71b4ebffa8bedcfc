"""The official `openai` client asks the real model (SmolLM2-135M-Instruct) a golden question through the platform."""
from __future__ import annotations

import asyncio
import json

from ledgerlm.cli.main import main
from tests.controlplane.conftest import wait_until
from tests.controlplane.test_openai_api import make_client

VERSION = "smollm2-135m-instruct@1"


async def start_real_worker(bootstrap, cp_settings, smollm2_dir):
    from consumers.worker.runtime import Worker
    from engine.config import EngineConfig
    from engine.engine import Engine
    from producers.model_registry import registered_versions

    model = (await registered_versions(bootstrap))[VERSION]
    config = EngineConfig(kv_cache_bytes=128 * 16 * 46_080, reservation="full", dtype="float32", device="cpu",
                          expected_checksums=model.checksums)
    engine = await asyncio.to_thread(Engine, smollm2_dir, config)
    worker = Worker(cp_settings, bootstrap, model, engine, "real-model-worker")
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(worker.ready.wait(), 60)
    return worker, task


async def test_openai_client_gets_the_golden_answer_from_smollm2(bootstrap, cp_settings, smollm2_dir, gateway,
                                                                 controller, tenants, capsys):
    assert await asyncio.to_thread(main, ["models", "pull", "smollm2-135m-instruct", "--json"]) == 0
    pulled = json.loads(capsys.readouterr().out)
    assert (pulled["modelVersion"], pulled["modelDir"], pulled["registered"]) == (VERSION, str(smollm2_dir), True)
    golden = json.loads((smollm2_dir / "golden.json").read_text())["prompts"][0]
    worker, task = await start_real_worker(bootstrap, cp_settings, smollm2_dir)
    client = make_client(gateway, tenants["main"].api_key)
    try:
        await wait_until(lambda: VERSION in gateway.gateway.catalog.versions, 30, what="the gateway to see the model")
        answer = None
        for _ in range(40):  # until the controller has the version and the worker's heartbeat
            try:
                answer = await client.chat.completions.create(model=VERSION, messages=golden["messages"],
                                                              max_tokens=golden["maxOutputTokens"], temperature=0)
                break
            except Exception as exc:  # 404/503 while the registries catch up
                if getattr(exc, "status_code", None) not in (404, 503):
                    raise
                await asyncio.sleep(0.25)
        assert answer is not None, "the platform never admitted the request"
        assert answer.choices[0].message.content == golden["expect"]["exact"] == "The capital of France is Paris."
        assert answer.choices[0].finish_reason == "stop" and answer.model == VERSION
        assert answer.usage.completion_tokens == 8 and answer.usage.prompt_tokens > 20
    finally:
        await client.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
