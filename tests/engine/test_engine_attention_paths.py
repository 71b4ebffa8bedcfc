"""The gather and flex attention paths: the same greedy tokens as transformers, logits within 1e-5 of each other.

float32 on the tiny demo model. 1e-5 absolute on logits (and logprobs) is about ten float32 roundings of
values of size ~10: the paths sum the same products in different orders, and nothing more may differ.
"""
from __future__ import annotations

import random
from dataclasses import replace

import pytest
import torch
from torch.nn.attention.flex_attention import create_mask

from engine.attention import AttentionShape, ChunkRows, DecodeRow, GatherAttention
from engine.attention_choice import choose_attention, time_paths
from engine.config import EngineConfig
from engine.engine import Engine
from engine.errors import EngineError
from engine.flex_attention import Q_BLOCK, FlexAttention
from engine_factories import (BLOCK, kv_bytes_per_token_f32, make_request, random_prompt, record_schedules,
                              run_engine, tokens_of)

LOGIT_TOL = 1e-5
PATHS = ("gather", "flex")


def record_logits(engine) -> list[torch.Tensor]:
    seen = []
    forward = engine.runner.model.forward

    def spy(batch, kv_pool):
        logits = forward(batch, kv_pool)
        seen.append(logits.clone())
        return logits

    engine.runner.model.forward = spy
    return seen


def mixed_workload(make_engine, attention: str):
    """A prefix-cache warm-up, then 10 requests of mixed lengths (4 sharing the warm prefix) through a
    40-token budget: chunked prefills continuing cached or earlier context, decodes of mixed lengths, and
    steps mixing both."""
    rng = random.Random(29)
    shared = random_prompt(rng, 40)
    prompts = [shared + random_prompt(rng, rng.randint(1, 30)) if i % 3 == 0 else
               random_prompt(rng, rng.randint(1, 90)) for i in range(10)]
    max_tokens = [rng.randint(1, 16) for _ in prompts]
    engine = make_engine(attention=attention, max_num_batched_tokens=40, max_num_seqs=16)
    assert engine.runner.model.attention.name == attention
    engine.add_request(make_request("warm", shared + [7], max_tokens=2))
    run_engine(engine)
    schedules, logits = record_schedules(engine), record_logits(engine)
    for i, (p, n) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(make_request(f"m{i}", p, max_tokens=n, logprobs=5))
    return prompts, max_tokens, run_engine(engine), schedules, logits, engine


@pytest.fixture(scope="module")
def runs(tiny_model_dir, tiny_artifacts):
    """Both paths' runs of `mixed_workload`, once per module (the engines are conftest's `make_engine`'s)."""

    def make(num_blocks: int = 256, **overrides) -> Engine:
        config = EngineConfig(kv_cache_bytes=num_blocks * BLOCK * kv_bytes_per_token_f32(tiny_artifacts),
                              block_size=BLOCK, dtype="float32", device="cpu")
        return Engine(tiny_model_dir, replace(config, **overrides), artifacts=tiny_artifacts)

    return {path: mixed_workload(make, path) for path in PATHS}


def test_the_workload_covers_mixed_decodes_cached_context_and_mixed_steps(runs):
    _, _, _, schedules, _, engine = runs["flex"]
    steps = [s for s in schedules if not s.is_empty]
    assert any(len({d.start for d in s.decodes}) > 1 for s in steps), "decode batch of mixed lengths"
    assert any(p.start > 0 for s in steps for p in s.prefills), "prefill chunk with cached context"
    assert any(s.decodes and s.prefills for s in steps), "a step mixing decodes and a prefill"
    assert engine.stats().prefix_hit_tokens >= 3 * 32


@pytest.mark.parametrize("path", PATHS)
def test_greedy_tokens_match_transformers(runs, reference, path):
    prompts, max_tokens, outputs, *_ = runs[path]
    for i, (p, n) in enumerate(zip(prompts, max_tokens)):
        assert tokens_of(outputs[f"m{i}"]) == reference(p, n), i


def test_both_paths_give_the_same_tokens_and_logits_within_tolerance(runs):
    (_, _, gather_out, gather_sched, gather_logits, _), (_, _, flex_out, flex_sched, flex_logits, _) = (
        runs["gather"], runs["flex"])
    assert gather_sched == flex_sched
    assert {r: tokens_of(o) for r, o in gather_out.items()} == {r: tokens_of(o) for r, o in flex_out.items()}
    assert len(gather_logits) == len(flex_logits) > 10
    for g, f in zip(gather_logits, flex_logits):
        assert (g - f).abs().max().item() < LOGIT_TOL
    for rid, outputs in gather_out.items():
        for g, f in zip((lp for o in outputs for lp in o.logprobs), (lp for o in flex_out[rid] for lp in o.logprobs)):
            assert [t for t, _ in g.top] == [t for t, _ in f.top]
            assert abs(g.logprob - f.logprob) < LOGIT_TOL


def test_flex_logprobs_match_transformers(runs, hf_model):
    prompts, _, outputs, *_ = runs["flex"]
    for i in (0, 1, 3):  # two cached-prefix requests and one without
        tokens = tokens_of(outputs[f"m{i}"])
        with torch.inference_mode():
            logits = hf_model(torch.tensor([prompts[i] + tokens])).logits[0, len(prompts[i]) - 1 : -1].float()
        want = torch.log_softmax(logits, dim=-1)
        got = [lp.logprob for o in outputs[f"m{i}"] for lp in o.logprobs]
        assert max(abs(g - want[j, t].item()) for j, (g, t) in enumerate(zip(got, tokens))) < 1e-4


SHAPE = AttentionShape(num_heads=4, num_kv_heads=2, head_dim=16, block_size=16)


def synthetic_step(num_blocks: int = 96):
    """Decodes of 1..70 tokens sharing prefix blocks, a chunk whose 300 queries span three BlockMask row tiles
    and continue 100 cached tokens, and a chunk starting its sequence; tables in scattered blocks."""
    rng = random.Random(7)
    free = list(range(num_blocks))
    rng.shuffle(free)
    prefix = [free.pop(), free.pop()]
    decodes = []
    for context in (70, 33, 32, 17, 16, 5, 1):
        own = [free.pop() for _ in range(-(-context // 16))]
        decodes.append(DecodeRow(prefix + own[2:] if context > 32 else own, context))
    long_chunk = ChunkRows(len(decodes), 300, 100, prefix + [free.pop() for _ in range(-(-400 // 16) - 2)])
    first_chunk = ChunkRows(long_chunk.start + 300, 9, 0, [free.pop()])
    return decodes, [long_chunk, first_chunk]


def test_flex_and_gather_agree_on_a_step_with_long_chunks_and_shared_blocks():
    decodes, chunks = synthetic_step()
    gen = torch.Generator().manual_seed(3)
    rows = len(decodes) + sum(c.length for c in chunks)
    q = torch.randn(rows, 4, 16, generator=gen)
    k, v = torch.randn(rows, 2, 16, generator=gen), torch.randn(rows, 2, 16, generator=gen)
    k_pool, v_pool = torch.randn(2, 96 * 16, 16, generator=gen), torch.randn(2, 96 * 16, 16, generator=gen)
    gather = GatherAttention(SHAPE, torch.device("cpu"), torch.float32)
    flex = FlexAttention(SHAPE, 96, torch.device("cpu"))
    with torch.inference_mode():
        want = gather.attend(gather.plan(decodes, chunks), q, k, v, k_pool, v_pool)
        got = flex.attend(flex.plan(decodes, chunks), q, k, v, k_pool, v_pool)
    assert got.shape == want.shape == (rows, 64)
    assert (got - want).abs().max().item() < LOGIT_TOL


def kernel_view(mask) -> tuple[torch.Tensor, torch.Tensor]:
    """What a compiled kernel attends to (every slot of a full block, mask_mod's choice within a partial one),
    and what mask_mod alone allows (what eager attends to)."""
    rows, _, q_len, kv_len = mask.shape
    exact = create_mask(mask.mask_mod, rows, 1, q_len, kv_len, device="cpu")[:, 0]
    seen = torch.zeros_like(exact)
    q_block, kv_block = mask.BLOCK_SIZE
    for b in range(rows):
        for i in range(mask.kv_num_blocks.shape[-1]):
            q = slice(i * q_block, (i + 1) * q_block)
            for num, ids, full in ((mask.kv_num_blocks, mask.kv_indices, False),
                                   (mask.full_kv_num_blocks, mask.full_kv_indices, True)):
                for block in ids[b, 0, i, : num[b, 0, i]].tolist():
                    kv = slice(block * kv_block, (block + 1) * kv_block)
                    assert not seen[b, q, kv].any(), "a block listed twice"
                    seen[b, q, kv] = True if full else exact[b, q, kv]
    return seen, exact


def test_the_block_lists_cover_exactly_what_mask_mod_allows():
    """The compiled (CUDA) kernel skips mask_mod on full blocks and never reads unlisted ones; eager runs only
    mask_mod. Both must see the same mask."""
    decodes, chunks = synthetic_step()
    plan = FlexAttention(SHAPE, 96, torch.device("cpu")).plan(decodes, chunks)
    assert plan.chunks[0].mask.kv_num_blocks.shape == (1, 1, -(-300 // Q_BLOCK))
    assert plan.chunks[1].mask is None
    for mask in (plan.decode_mask, plan.chunks[0].mask):
        seen, exact = kernel_view(mask)
        assert torch.equal(seen, exact)
    _, exact = kernel_view(plan.decode_mask)
    assert exact[:, 0].sum(-1).tolist() == [d.context for d in decodes]


def test_an_unknown_attention_path_is_refused():
    with pytest.raises(ValueError, match="unknown attention path 'fast'"):
        EngineConfig(attention="fast")


def test_auto_is_gather_on_a_cpu_and_flex_is_refused_on_cuda_with_pages_the_kernel_cannot_tile():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_attention("auto", SHAPE, 2, 96, cpu, torch.float32).name == "gather"
    assert choose_attention("flex", SHAPE, 2, 96, cpu, torch.float32).name == "flex"
    odd = AttentionShape(4, 2, 16, block_size=8)
    assert choose_attention("flex", odd, 2, 96, cpu, torch.float32).name == "flex"  # eager takes any page
    with pytest.raises(EngineError, match="power of two >= 16, not 8"):
        choose_attention("flex", odd, 2, 96, cuda, torch.bfloat16)
    assert choose_attention("auto", odd, 2, 96, cuda, torch.bfloat16).name == "gather"


def test_time_paths_reports_both_paths_and_their_agreement():
    result = time_paths(SHAPE, batch=3, context=40, device="cpu", dtype=torch.float32, num_layers=2, reps=2)
    assert {"gather_plan_ms", "gather_attend_ms", "gather_step_ms", "flex_step_ms"} <= result.keys()
    assert (result["batch"], result["context"], result["num_layers"]) == (3, 40, 2)
    assert result["flex_step_ms"] == pytest.approx(result["flex_plan_ms"] + 2 * result["flex_attend_ms"], abs=1e-3)
    assert result["max_abs_diff"] < LOGIT_TOL
