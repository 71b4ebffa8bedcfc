"""The official `openai` client asks the real model (SmolLM2-135M-Instruct) a golden question through the platform."""
from __future__ import annotations

import asyncio
import json

import pytest
from pydantic import BaseModel, Field

from ledgerlm.cli.main import main

from tests.controlplane.test_openai_api import make_client
from tests.waiting import wait_until

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


@pytest.fixture(scope="module")
async def smollm2_client(bootstrap, cp_settings, smollm2_dir, gateway, controller, tenants):
    """SmolLM2 pulled, registered and served by a real worker; the official client for the main tenant."""
    assert await asyncio.to_thread(main, ["models", "pull", "smollm2-135m-instruct", "--json"]) == 0
    worker, task = await start_real_worker(bootstrap, cp_settings, smollm2_dir)
    client = make_client(gateway, tenants["main"].api_key)
    try:
        await wait_until(lambda: VERSION in gateway.gateway.catalog.versions, 30, what="the gateway to see the model")
        yield client
    finally:
        await client.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def first_answer(call):
    """call() once the controller has the version and the worker's heartbeat (404/503 until then)."""
    async def answer():
        try:
            return await call()
        except Exception as exc:
            if getattr(exc, "status_code", None) not in (404, 503):
                raise
            return None

    return await wait_until(answer, 120, step_s=0.25, accept=lambda got: got is not None,
                            what="the platform to admit the request")


async def test_openai_client_gets_the_golden_answer_from_smollm2(smollm2_client, smollm2_dir, capsys):
    assert await asyncio.to_thread(main, ["models", "pull", "smollm2-135m-instruct", "--json"]) == 0
    pulled = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert (pulled["modelVersion"], pulled["modelDir"], pulled["registered"]) == (VERSION, str(smollm2_dir), True)
    golden = json.loads((smollm2_dir / "golden.json").read_text())["prompts"][0]
    answer = await first_answer(lambda: smollm2_client.chat.completions.create(
        model=VERSION, messages=golden["messages"], max_tokens=golden["maxOutputTokens"], temperature=0))
    assert answer.choices[0].message.content == golden["expect"]["exact"] == "The capital of France is Paris."
    assert answer.choices[0].finish_reason == "stop" and answer.model == VERSION
    assert answer.usage.completion_tokens == 8 and answer.usage.prompt_tokens > 20


class City(BaseModel):
    name: str = Field(max_length=40)
    country: str = Field(max_length=40)
    population_millions: float
    is_capital: bool


async def test_parse_with_a_pydantic_model_returns_a_parsed_object_from_smollm2(smollm2_client):
    messages = [{"role": "user", "content": "Describe Paris as JSON with name, country, population_millions, "
                                            "is_capital."}]
    answer = await first_answer(lambda: smollm2_client.chat.completions.parse(
        model=VERSION, messages=messages, response_format=City, max_tokens=120, temperature=0))
    parsed = answer.choices[0].message.parsed
    assert isinstance(parsed, City) and answer.choices[0].finish_reason == "stop"
    assert City.model_validate_json(answer.choices[0].message.content) == parsed
