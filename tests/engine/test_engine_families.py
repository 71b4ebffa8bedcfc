"""Llama, Mistral, Qwen2 and Qwen3 checkpoints load through the same path and match transformers."""
from __future__ import annotations

import random
import shutil

import pytest
import torch

from engine.artifacts.model_dir import sliding_window, write_manifest
from engine.config import EngineConfig
from engine.engine import Engine
from engine_factories import make_request, random_prompt, run_engine, tokens_of

COMMON = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    max_position_embeddings=256,
    # Ten times the default init spread: at 0.02 the residual stream dominates and
    # most families just repeat one token, so attention changes would go unseen.
    initializer_range=0.2,
)


def family_configs():
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    return {
        # Qwen2: QKV bias, tied embeddings, 4:1 GQA.
        "qwen2": Qwen2Config(num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True, **COMMON),
        # Qwen3: per-head q/k RMSNorm, no QKV bias, head_dim 32 != hidden/heads 16.
        "qwen3": Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True, **COMMON),
        # Mistral: explicit head_dim different from hidden/heads, window longer than the model.
        "mistral": MistralConfig(num_attention_heads=4, num_key_value_heads=1, head_dim=32, sliding_window=4096, **COMMON),
        # Llama 3 RoPE scaling comes from transformers' RoPE tables.
        "llama3-rope": LlamaConfig(
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_bias=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 50000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            **COMMON,
        ),
    }


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "mistral", "llama3-rope"])
def test_family_matches_generate(family, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    config = family_configs()[family]
    torch.manual_seed(11)
    model = AutoModelForCausalLM.from_config(config).float().eval()
    if config.model_type == "qwen2" or getattr(config, "attention_bias", False):
        with torch.no_grad():  # default init zeroes biases; make them matter
            for name, p in model.named_parameters():
                if name.endswith("proj.bias"):
                    p.normal_(0, 0.5)
    with torch.no_grad():  # default init makes norm weights ones; q/k norms must visibly scale
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.normal_(1, 0.3)
    out = tmp_path / family
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tiny_model_dir / name, out / name)
    write_manifest(out)

    rng = random.Random(12)
    prompts = [random_prompt(rng, n) for n in (90, 5)]  # positions beyond the llama3 original window
    engine = Engine(out, EngineConfig(kv_cache_bytes=4 << 20, dtype="float32", device="cpu"))
    for i, p in enumerate(prompts):
        engine.add_request(make_request(f"f{i}", p, max_tokens=10))
    outputs = run_engine(engine)
    for i, p in enumerate(prompts):
        ids = torch.tensor([p])
        ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False)
        assert tokens_of(outputs[f"f{i}"]) == ref[0, len(p) :].tolist()


def test_qwen3_window_counts_only_if_a_layer_slides():
    from transformers import Qwen3Config

    def qwen3(**kw):
        return Qwen3Config(num_attention_heads=4, num_key_value_heads=2, head_dim=32, **COMMON, **kw)

    assert sliding_window(qwen3()) is None  # the usual checkpoint: use_sliding_window false
    # A window size with every layer below max_window_layers: all layers attend fully.
    assert sliding_window(qwen3(use_sliding_window=True, sliding_window=64, max_window_layers=2)) is None
    assert sliding_window(qwen3(use_sliding_window=True, sliding_window=64, max_window_layers=1)) == 64
