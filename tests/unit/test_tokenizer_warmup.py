"""The gateway loads a served version's tokenizer before its first request asks for it (ModelCatalog.warm)."""
from __future__ import annotations

import shutil
import threading

import pytest

from producers.gateway.admission.prompts import ModelCatalog
from producers.gateway.admission.requests import GenerationRequest
from producers.gateway.errors import ApiError
from producers.model_registry import describe
from tests.waiting import wait_until_sync

MODEL = "warm-tiny@1"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from engine.artifacts.demo_model import build_demo_model

    return build_demo_model(tmp_path_factory.mktemp("m") / "tiny", size="tiny", train_steps=0, progress=False)


def warming_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "tokenizer-warm")


def test_a_served_versions_tokenizer_is_loaded_once_before_its_first_request(model_dir):
    catalog = ModelCatalog()
    catalog.observe(describe(model_dir, MODEL))
    catalog.warm([MODEL, "nobody-registered@1"])
    loaded = wait_until_sync(lambda: catalog._tokenizers.get(MODEL), 60, "the tokenizer loaded in the background")
    catalog.warm([MODEL])  # every heartbeat asks again: nothing more is loaded
    assert warming_threads() == 0
    assert catalog.tokenizer(catalog.versions[MODEL]) is loaded
    assert set(catalog._tokenizers) == {MODEL}


def test_a_tokenizer_that_fails_its_checksum_is_tried_once_and_its_requests_say_why(model_dir, tmp_path):
    broken = shutil.copytree(model_dir, tmp_path / "broken")
    catalog = ModelCatalog()
    catalog.observe(describe(broken, MODEL))
    (broken / "tokenizer.json").write_text("{}")
    catalog.warm([MODEL])
    wait_until_sync(lambda: warming_threads() == 0, 60, "the failed warm-up to end")
    catalog.warm([MODEL])
    assert warming_threads() == 0 and MODEL not in catalog._tokenizers
    with pytest.raises(ApiError) as refused:
        catalog.render(GenerationRequest.model_validate({"model": MODEL, "requestId": "r1", "input": "hello",
                                                              "maxOutputTokens": 2}),
                       1000)
    assert refused.value.status == 503 and "tokenizer.json does not match" in refused.value.message
