"""The parity section: the engine's greedy tokens against transformers `generate` on the same device.

The golden prompts of the model directory (SmolLM2 ships them), or for a demo model the SmolLM2 golden prompts
rendered with its own chat template. All prompts run in one continuous batch in the engine and one by one in
`generate`; per prompt: whether the tokens match, where they first differ, the largest |logprob difference| of
the chosen tokens over the positions both agree on, and the smallest gap between the reference's top two logits
(a mismatch at a gap near the dtype's rounding is a tie, not a bug: docs/engine.md, Testing).
"""
from __future__ import annotations

from pathlib import Path


def golden_prompts(model_dir: Path, fallback: Path | None):
    from engine.artifacts.golden import GOLDEN_FILE, load_golden, parse_golden

    if (model_dir / GOLDEN_FILE).is_file():
        return load_golden(model_dir), str(model_dir / GOLDEN_FILE)
    if fallback is None:
        raise FileNotFoundError(f"{model_dir} has no {GOLDEN_FILE} and no fallback golden file was given")
    return parse_golden(fallback.read_bytes(), str(fallback)), str(fallback)


def engine_greedy(model_dir: Path, prompts: list[tuple[int, ...]], limits: list[int], device: str, dtype: str):
    """[(tokens, chosen-token logprobs)] of each prompt, all in one batch."""
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.request import EngineRequest, SamplingParams

    engine = Engine(model_dir, EngineConfig(kv_cache_bytes=256 << 20, max_num_batched_tokens=4096, device=device,
                                            dtype=dtype))
    for i, (prompt, n) in enumerate(zip(prompts, limits)):
        engine.add_request(EngineRequest(f"p{i}", prompt, SamplingParams(max_tokens=n, temperature=0.0, logprobs=0)))
    tokens: dict[str, list[int]] = {f"p{i}": [] for i in range(len(prompts))}
    logprobs: dict[str, list[float]] = {f"p{i}": [] for i in range(len(prompts))}
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id].extend(out.new_token_ids)
            logprobs[out.request_id].extend(lp.logprob for lp in out.logprobs)
    return [(tokens[f"p{i}"], logprobs[f"p{i}"]) for i in range(len(prompts))]


def reference_greedy(model, prompt: tuple[int, ...], n: int, device):
    """(tokens, chosen-token logprobs, smallest top-2 logit gap) from transformers `generate`."""
    import torch

    ids = torch.tensor([prompt], device=device)
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                             output_logits=True, return_dict_in_generate=True)
    tokens = out.sequences[0, len(prompt):].tolist()
    logprobs, gaps = [], []
    for token, logits in zip(tokens, out.logits):
        row = logits[0].float()
        logprobs.append(float(torch.log_softmax(row, dim=-1)[token]))
        gaps.append(float(row.topk(2).values.diff().abs()))
    return tokens, logprobs, min(gaps) if gaps else None


def compare(name: str, ours: tuple[list[int], list[float]], ref: tuple[list[int], list[float], float | None]):
    tokens, logprobs = ours
    ref_tokens, ref_logprobs, gap = ref
    agree = 0
    while agree < min(len(tokens), len(ref_tokens)) and tokens[agree] == ref_tokens[agree]:
        agree += 1
    deltas = [abs(a - b) for a, b in zip(logprobs[:agree], ref_logprobs[:agree])]
    return {"name": name, "match": tokens == ref_tokens, "tokens": len(tokens), "reference_tokens": len(ref_tokens),
            "first_difference": None if tokens == ref_tokens else agree,
            "max_abs_logprob_delta": round(max(deltas), 6) if deltas else None,
            "min_top2_logit_gap": None if gap is None else round(gap, 6)}


def parity_section(ctx) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.artifacts.golden import render

    device, _ = ctx.device_dtype()
    model_dir = ctx.real.model_dir
    prompts, source = golden_prompts(model_dir, ctx.golden_file)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    token_ids = [render(tokenizer, p) for p in prompts]
    limits = [p.max_output_tokens for p in prompts]
    dtypes = ["float32"] + (["bfloat16"] if device.type == "cuda" else [])
    out: dict = {"model": ctx.real.name, "prompts_from": source, "prompts": len(prompts), "device": str(device),
                 "dtypes": {}}
    for dtype in dtypes:
        ours = engine_greedy(model_dir, token_ids, limits, str(device), dtype)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
        rows = [compare(p.name, o, reference_greedy(model, ids, n, device))
                for p, o, ids, n in zip(prompts, ours, token_ids, limits)]
        del model
        deltas = [r["max_abs_logprob_delta"] for r in rows if r["max_abs_logprob_delta"] is not None]
        out["dtypes"][dtype] = {"all_match": all(r["match"] for r in rows),
                                "max_abs_logprob_delta": max(deltas) if deltas else None, "prompts": rows}
    return out
