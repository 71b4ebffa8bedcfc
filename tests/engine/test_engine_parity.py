"""Greedy token ids equal transformers `generate` on the same checkpoint (float32)."""
from __future__ import annotations

import random

from engine.request import FinishReason
from engine_factories import finish_of, make_request, random_prompt, record_schedules, run_engine, tokens_of


def test_single_request_matches_generate(make_engine, reference):
    prompt = random_prompt(random.Random(0), 37)
    engine = make_engine()
    engine.add_request(make_request("a", prompt, max_tokens=24))
    outputs = run_engine(engine)["a"]
    assert tokens_of(outputs) == reference(prompt, 24)
    assert finish_of(outputs) is FinishReason.LENGTH
    assert [o.num_output_tokens for o in outputs] == list(range(1, 25))
    assert outputs[-1].num_prompt_tokens == 37


def test_32_mixed_length_requests_batched(make_engine, reference):
    rng = random.Random(1)
    prompts = [random_prompt(rng, rng.randint(1, 120)) for _ in range(32)]
    max_tokens = [rng.randint(1, 20) for _ in range(32)]
    engine = make_engine(max_num_seqs=32, max_num_batched_tokens=4096)
    for i, (p, n) in enumerate(zip(prompts, max_tokens)):
        engine.add_request(make_request(f"r{i}", p, max_tokens=n))
    schedules = record_schedules(engine)
    outputs = run_engine(engine)
    # All 32 prompts are prefilled in one packed forward, then decode together.
    assert len(schedules[0].prefills) + len(schedules[0].decodes) == 32
    assert schedules[0].num_tokens == sum(len(p) for p in prompts)
    for i, (p, n) in enumerate(zip(prompts, max_tokens)):
        assert tokens_of(outputs[f"r{i}"]) == reference(p, n), i


def test_chunked_prefill_with_tiny_token_budget(make_engine, reference):
    rng = random.Random(2)
    prompts = [random_prompt(rng, n) for n in (70, 45, 9)]
    engine = make_engine(max_num_batched_tokens=7)
    for i, p in enumerate(prompts):
        engine.add_request(make_request(f"c{i}", p, max_tokens=10))
    schedules = record_schedules(engine)
    outputs = run_engine(engine)
    assert max(s.num_tokens for s in schedules) == 7
    assert schedules[0].num_tokens == 7 and [c.num_tokens for c in schedules[0].prefills] == [7]
    for i, p in enumerate(prompts):
        assert tokens_of(outputs[f"c{i}"]) == reference(p, 10)


def test_prefix_cache_hits_keep_parity(make_engine, reference):
    rng = random.Random(3)
    shared = random_prompt(rng, 40)  # 2 full blocks + 8 tokens
    prompts = [shared + random_prompt(rng, k) for k in (5, 12, 30)]
    engine = make_engine()
    engine.add_request(make_request("warm", prompts[0], max_tokens=6))
    run_engine(engine)
    for i, p in enumerate(prompts[1:]):
        engine.add_request(make_request(f"p{i}", p, max_tokens=12))
    outputs = run_engine(engine)
    for i, p in enumerate(prompts[1:]):
        assert outputs[f"p{i}"][-1].num_cached_tokens == 32
        assert tokens_of(outputs[f"p{i}"]) == reference(p, 12)
    assert engine.stats().prefix_hit_tokens == 64


def test_preemption_and_recompute_under_tiny_pool(make_engine, reference):
    rng = random.Random(4)
    prompts = [random_prompt(rng, rng.randint(20, 40)) for _ in range(6)]
    # 12 blocks = 192 slots for ~6 x 70 tokens of demand: decodes must preempt.
    engine = make_engine(num_blocks=12, enable_prefix_cache=False)
    for i, p in enumerate(prompts):
        engine.add_request(make_request(f"q{i}", p, max_tokens=30))
    outputs = run_engine(engine)
    assert engine.stats().num_preemptions > 0
    for i, p in enumerate(prompts):
        assert tokens_of(outputs[f"q{i}"]) == reference(p, 30), i


def test_full_reservation_never_preempts(make_engine, reference):
    rng = random.Random(4)
    prompts = [random_prompt(rng, rng.randint(20, 40)) for _ in range(6)]
    engine = make_engine(num_blocks=12, enable_prefix_cache=False, reservation="full")
    for i, p in enumerate(prompts):
        engine.add_request(make_request(f"q{i}", p, max_tokens=30))
    peak = []
    outputs = run_engine(engine, on_step=lambda i, e: peak.append(len(e.scheduler.running)))
    assert engine.stats().num_preemptions == 0
    assert max(peak) == 2  # 12 blocks hold two 66..70-token reservations (5 blocks each)
    for i, p in enumerate(prompts):
        assert tokens_of(outputs[f"q{i}"]) == reference(p, 30), i


def test_cancel_mid_decode_leaves_others_intact(make_engine, reference):
    rng = random.Random(5)
    prompts = [random_prompt(rng, n) for n in (12, 33, 50, 7)]
    engine = make_engine()
    for i, p in enumerate(prompts):
        engine.add_request(make_request(f"k{i}", p, max_tokens=20))

    def cancel(step, e):
        if step == 5:
            assert e.abort("k1")

    outputs = run_engine(engine, on_step=cancel)
    cancelled = outputs["k1"]
    assert finish_of(cancelled) is FinishReason.CANCELLED
    assert cancelled[-1].new_token_ids == ()
    # Steps 0..5 produced 6 tokens; the abort lands at the boundary before step 6.
    assert tokens_of(cancelled) == reference(prompts[1], 20)[:6]
    for i in (0, 2, 3):
        assert tokens_of(outputs[f"k{i}"]) == reference(prompts[i], 20)
    assert engine.abort("k1") is False
