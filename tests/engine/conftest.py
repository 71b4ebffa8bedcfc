"""Engine test fixtures: one tiny demo model per session, its transformers twin as the oracle.

float32 throughout: with this model's weights the gap between the top two
logits stays far above float32 rounding, so greedy parity does not need
float64 (see docs/engine.md, Testing; a tie would show up as a parity failure, not a flake).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Iterable

import pytest

# Before the first torch import: spinning OpenMP threads on a 2-core machine
# shared with Kafka/Postgres made engine steps several times slower.
from plumbing.compute_threads import passive_compute_threads

passive_compute_threads()
import torch  # noqa: E402

from engine.artifacts.model_dir import load_artifacts
from engine.config import EngineConfig
from engine.artifacts.demo_model import build_demo_model
from engine.engine import Engine
from engine_factories import BLOCK, kv_bytes_per_token_f32


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return build_demo_model(tmp_path_factory.mktemp("models") / "tiny", size="tiny", train_steps=5, progress=False)


@pytest.fixture(scope="session")
def tiny_artifacts(tiny_model_dir):
    return load_artifacts(tiny_model_dir)


@pytest.fixture(scope="session")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def reference(hf_model):
    """reference(prompt, n) -> transformers greedy continuation (memoised per session)."""
    cache: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def generate(prompt: Iterable[int], max_new_tokens: int) -> list[int]:
        key = (tuple(prompt), max_new_tokens)
        if key not in cache:
            ids = torch.tensor([key[0]])
            with torch.inference_mode():
                out = hf_model.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False
                )
            cache[key] = out[0, ids.shape[1] :].tolist()
        return cache[key]

    return generate


@pytest.fixture
def make_engine(tiny_model_dir, tiny_artifacts):
    """make_engine(num_blocks=..., **EngineConfig fields) -> Engine on the tiny model (float32)."""

    def make(num_blocks: int = 256, clock=None, **overrides) -> Engine:
        bytes_per_block = BLOCK * kv_bytes_per_token_f32(tiny_artifacts)
        config = EngineConfig(kv_cache_bytes=num_blocks * bytes_per_block, block_size=BLOCK, dtype="float32", device="cpu")
        config = replace(config, **overrides)
        kwargs = {"clock": clock} if clock is not None else {}
        return Engine(tiny_model_dir, config, artifacts=tiny_artifacts, **kwargs)

    return make
