"""Capacity policies in the engine: batch work yields first, recompute is counted apart, `auto` pool sizing."""
from __future__ import annotations

from dataclasses import replace

import pytest

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.errors import EngineError
from engine.kv_sizing import MemoryPolicy, check_holds_one_request, cpu_pool_bytes, gpu_pool_bytes
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine_factories import make_request, make_running, run_engine, tokens_of
from plumbing.settings import parse_bytes

GiB = 1 << 30


def test_pool_running_dry_preempts_batch_first_then_lowest_weight():
    bm = BlockManager(num_blocks=5, block_size=4)
    sched = Scheduler(EngineConfig(max_num_seqs=8), bm, max_model_len=64)
    heavy_batch = make_running(sched, bm, "heavy_batch", 3.0, arrival=0, batch=True)
    light_old = make_running(sched, bm, "light_old", 1.0, arrival=1)
    heavy = make_running(sched, bm, "heavy", 2.0, arrival=2)
    light_new = make_running(sched, bm, "light_new", 1.0, arrival=3)
    out = sched.schedule(now=0.0)
    # One free block for four decodes: the batch sequence goes first whatever its weight, then the
    # lowest-weight newest one.
    assert out.preempted == ("heavy_batch", "light_new")
    assert [c.request_id for c in out.decodes] == ["heavy", "light_old"]
    bm.check_invariants()


def test_waiting_interactive_work_is_admitted_before_batch_work(make_engine):
    engine = make_engine(max_num_seqs=1)
    engine.add_request(replace(make_request("batch", [5] * 8, max_tokens=2, tenant="docs"), batch=True))
    engine.add_request(make_request("chat", [6] * 8, max_tokens=2, tenant="chat"))
    first = engine.step()
    assert [o.request_id for o in first] == ["chat"]
    outputs = run_engine(engine)
    assert len(tokens_of(outputs["batch"])) == 2


def step_tokens(out) -> dict[str, int]:
    return {c.request_id: c.num_tokens for c in out.chunks}


def batch_backlog(sched: Scheduler, count: int, prompt_tokens: int) -> None:
    for i in range(count):
        sched.add(Sequence.from_request(replace(make_request(f"b{i}", [7 + i] * prompt_tokens, tenant="docs"),
                                                batch=True), i, 1.0))


def test_beside_interactive_work_a_batch_backlog_gets_only_its_share_of_a_step():
    sched = Scheduler(EngineConfig(max_num_batched_tokens=512, batch_step_tokens=96, max_num_seqs=64),
                      BlockManager(num_blocks=512, block_size=16), max_model_len=1024)
    batch_backlog(sched, 20, 40)
    sched.add(Sequence.from_request(make_request("chat", [3] * 130, tenant="chat"), 100, 1.0))
    planned = step_tokens(sched.schedule(now=0.0))
    assert planned["chat"] == 130  # the whole prompt in one step, ahead of the backlog
    assert sum(n for rid, n in planned.items() if rid != "chat") == 96  # two prompts and a chunk of a third
    assert planned["b2"] == 16

    alone = Scheduler(EngineConfig(max_num_batched_tokens=512, batch_step_tokens=96, max_num_seqs=64),
                      BlockManager(num_blocks=512, block_size=16), max_model_len=1024)
    batch_backlog(alone, 20, 40)
    assert sum(step_tokens(alone.schedule(now=0.0)).values()) == 512  # no interactive work: the whole budget


def test_running_batch_decodes_are_never_held_back_by_the_batch_share():
    bm = BlockManager(num_blocks=64, block_size=4)
    sched = Scheduler(EngineConfig(max_num_batched_tokens=64, batch_step_tokens=2, max_num_seqs=8), bm,
                      max_model_len=64)
    for i in range(4):
        make_running(sched, bm, f"b{i}", 1.0, arrival=i, batch=True)
    make_running(sched, bm, "chat", 1.0, arrival=9)
    batch_backlog(sched, 2, 8)
    out = sched.schedule(now=0.0)
    assert sorted(c.request_id for c in out.decodes) == ["b0", "b1", "b2", "b3", "chat"]
    assert out.prefills == ()  # the 4 decodes spent the share of 2: no waiting batch prompt starts
    bm.check_invariants()


def test_preempted_sequence_resumes_without_repeats_and_counts_recompute(make_engine):
    # 6 blocks of 16: two sequences of 40 prompt tokens (3 blocks each) fill the pool; growing past
    # 48 tokens needs a fourth block, so the newer one is preempted and recomputed later.
    engine = make_engine(num_blocks=6, max_num_seqs=2, reservation="optimistic", enable_prefix_cache=False)
    reference = make_engine(num_blocks=64)
    for e in (engine, reference):
        e.add_request(make_request("old", list(range(10, 50)), max_tokens=20))
        e.add_request(make_request("new", list(range(60, 100)), max_tokens=20))
    got, want = run_engine(engine), run_engine(reference)
    assert engine.stats().num_preemptions >= 1
    for rid in ("old", "new"):
        assert tokens_of(got[rid]) == tokens_of(want[rid])  # greedy: the same 20 tokens, none repeated
    recomputed = got["new"][-1].num_recomputed_tokens
    assert recomputed > 0 and want["new"][-1].num_recomputed_tokens == 0
    assert engine.stats().num_recomputed_tokens == sum(outs[-1].num_recomputed_tokens for outs in got.values())
    assert got["new"][-1].num_prompt_tokens == 40  # the bill's input stays the prompt


def test_auto_sizing_on_a_cpu_takes_a_capped_share_of_available_memory():
    policy = MemoryPolicy(cpu_share=0.25, cpu_cap_bytes=4 * GiB)
    assert cpu_pool_bytes(8 * GiB, policy).num_bytes == 2 * GiB
    capped = cpu_pool_bytes(20 * GiB, policy)
    assert capped.num_bytes == 4 * GiB and capped.how.startswith("cap 4.0 GiB")


def test_auto_sizing_on_a_gpu_takes_the_fraction_left_after_weights_and_activations():
    size = gpu_pool_bytes(total=80 * GiB, in_use=2 * GiB, activation_peak=GiB, policy=MemoryPolicy(gpu_fraction=0.9))
    assert size.num_bytes == int(72 * GiB) - 3 * GiB
    assert gpu_pool_bytes(10 * GiB, 9 * GiB, GiB, MemoryPolicy()).num_bytes == 0


def test_sizes_parse_and_a_pool_below_one_max_length_request_is_refused():
    assert parse_bytes("auto") is None and parse_bytes("2GiB") == 2 * GiB and parse_bytes("64 MiB") == 64 << 20
    assert parse_bytes("1500000") == 1_500_000 and parse_bytes(7) == 7
    with pytest.raises(ValueError, match="'2 GB!' is not a size"):
        parse_bytes("2 GB!")
    check_holds_one_request(512, 16, 8192, "x")
    with pytest.raises(EngineError, match="holds 91 blocks = 1456 tokens, less than one request of max_model_len 8192"):
        check_holds_one_request(91, 16, 8192, "configured 64 MiB")


def test_engine_with_auto_pool_sizes_it_from_the_machine(tiny_model_dir, tiny_artifacts):
    from engine.engine import Engine
    from engine.kv_sizing import mem_available_bytes

    policy = MemoryPolicy(cpu_share=0.001, cpu_cap_bytes=1 << 20)  # keep the test's pool small
    engine = Engine(tiny_model_dir, EngineConfig(kv_cache_bytes=None, dtype="float32", device="cpu", memory=policy),
                    artifacts=tiny_artifacts)
    expected = cpu_pool_bytes(mem_available_bytes(), policy).num_bytes
    per_block = engine.kv_spec.bytes_per_token * engine.config.block_size
    assert abs(engine.kv_spec.num_blocks - expected // per_block) <= 1
    assert engine.kv_size.num_bytes <= 1 << 20
