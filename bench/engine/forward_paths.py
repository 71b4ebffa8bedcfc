"""Forward-path measurement behind engine/llama.py: hand-written Llama forward vs
transformers' own modules with a paged attention function registered through
`AttentionInterface`. Same packed decode batch, same paged pool, same attention
math; prints one JSON line per batch size. Usage:

    python -m bench.engine.forward_paths [MODEL_DIR]
"""
from __future__ import annotations

import json
import random
import sys
import time

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.request import EngineRequest, SamplingParams


def _paged_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention hook: write this step's keys/values into the engine's pool and
    attend with the engine's own decode kernel (query [1,H,T,D] -> out [1,T,H,D])."""
    engine, batch = kwargs["ledger_engine"], kwargs["ledger_batch"]
    model = engine.runner.model
    layer = module.layer_idx
    k = key[0].transpose(0, 1)  # [T, KVH, D]
    v = value[0].transpose(0, 1)
    k_pool, v_pool = engine.kv_pool[layer, 0], engine.kv_pool[layer, 1]
    k_pool.index_copy_(1, batch.slot_mapping, k.transpose(0, 1))
    v_pool.index_copy_(1, batch.slot_mapping, v.transpose(0, 1))
    q = query[0].transpose(0, 1)  # [T, H, D]
    out = model.attention.attend(batch.attention, q, k, v, k_pool, v_pool)  # [T, H*D]
    return out.view(1, out.shape[0], q.shape[1], q.shape[2]), None


def measure(model_dir: str, batch_sizes=(1, 8, 32, 64), context: int = 256, reps: int = 15) -> list[dict]:
    from transformers import AttentionInterface, AutoModelForCausalLM

    AttentionInterface.register("ledger_paged", _paged_attention)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="ledger_paged").eval()
    rows = []
    for b in batch_sizes:
        engine = Engine(model_dir, EngineConfig(kv_cache_bytes=512 << 20, max_num_batched_tokens=max(b * context, 512),
                                                max_num_seqs=128, device="cpu", dtype="float32"))
        rng = random.Random(b)
        for i in range(b):
            prompt = tuple(rng.randrange(6, 500) for _ in range(context))
            engine.add_request(EngineRequest(f"r{i}", prompt, SamplingParams(max_tokens=200, ignore_eos=True)))
        engine.step()  # prefill everything; from here on every step is a pure decode step
        sched = engine.scheduler.schedule(engine.clock())
        batch, _, _ = engine.runner.prepare(sched, engine.scheduler.requests)
        ids, pos = batch.input_ids[None], batch.positions[None]

        def ours():
            return engine.runner.model.forward(batch, engine.kv_pool)

        def theirs():
            return hf(input_ids=ids, position_ids=pos, logits_to_keep=batch.logits_indices,
                      ledger_engine=engine, ledger_batch=batch).logits[0]

        with torch.inference_mode():
            assert torch.allclose(ours(), theirs(), atol=1e-4), "paths disagree"
            best = {"hand_written": float("inf"), "transformers_modules": float("inf")}
            for _ in range(reps):  # interleaved so machine noise hits both alike
                for name, fn in (("hand_written", ours), ("transformers_modules", theirs)):
                    t = time.perf_counter()
                    fn()
                    best[name] = min(best[name], time.perf_counter() - t)
        rows.append({"batch": b, "context": context,
                     **{f"{k}_ms": round(v * 1e3, 3) for k, v in best.items()},
                     "transformers_over_hand_written": round(best["transformers_modules"] / best["hand_written"], 3)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


if __name__ == "__main__":
    measure(sys.argv[1] if len(sys.argv) > 1 else ".ledgerlm/models/small")
