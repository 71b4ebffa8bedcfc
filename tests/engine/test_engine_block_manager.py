"""Block pool accounting, LRU eviction of cached blocks, prefix-cache scoping, pool size."""
from __future__ import annotations

import random

import torch

from engine.block_manager import BlockManager
from engine.kv_cache import KVCacheSpec
from engine.prefix_hash import extend_block_hashes
from engine.request import EngineRequest
from engine.sequence import Sequence
from engine_factories import BLOCK, kv_bytes_per_token_f32, make_request, random_prompt, run_engine

COMPAT = b"compat"


def make_seq(tokens: list[int], scope: str = "s", arrival: int = 0, block_size: int = 4) -> Sequence:
    seq = Sequence.from_request(EngineRequest(f"s{arrival}", tuple(tokens), scope_key=scope), arrival, 1.0)
    extend_block_hashes(seq.block_hashes, seq.token_ids, block_size, COMPAT, scope)
    return seq


def compute_all(bm: BlockManager, seq: Sequence) -> None:
    seq.num_computed_tokens = seq.num_tokens
    bm.commit_full_blocks(seq)


def test_allocate_and_free_exact_block_ids():
    bm = BlockManager(num_blocks=6, block_size=4)
    a = make_seq(list(range(10)), arrival=0)
    assert bm.allocate(a, 10) == [0, 1, 2] == a.block_table
    assert bm.allocate(a, 2) == []  # its table already covers that: a success that adds no block
    b = make_seq(list(range(100, 105)), arrival=1)
    assert bm.allocate(b, 5) == [3, 4] == b.block_table
    c = make_seq(list(range(200, 208)), arrival=2)
    assert bm.allocate(c, 8) is None  # needs 2, only 1 left: nothing changes
    assert c.block_table == [] and bm.num_free == 1
    bm.free_sequence(a)
    assert (bm.num_free, bm.num_cached_free, bm.num_used) == (4, 0, 2)
    bm.check_invariants()


def test_cached_blocks_evicted_lru_after_plain_free_blocks():
    bm = BlockManager(num_blocks=4, block_size=4)
    a = make_seq(list(range(8)), arrival=0)  # two full blocks
    assert bm.allocate(a, 8) == [0, 1] == a.block_table
    compute_all(bm, a)
    bm.free_sequence(a)
    assert (bm.num_free, bm.num_cached_free) == (2, 2)
    # Tail released first, so the suffix block 1 is the LRU victim before prefix block 0.
    assert list(bm.cached_free) == [1, 0]
    b = make_seq(list(range(50, 62)), arrival=1)  # needs 3 blocks: 2 plain, then evict block 1
    assert bm.allocate(b, 12) == [2, 3, 1] == b.block_table
    assert list(bm.cached_free) == [0]
    assert bm.find_cached_prefix(make_seq(list(range(8)) + [9], arrival=2)) == [0]
    bm.check_invariants()


def test_cached_prefix_leaves_last_token_uncomputed_and_shares_blocks():
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(list(range(8)), arrival=0)
    bm.allocate(a, 8)
    compute_all(bm, a)
    same = make_seq(list(range(8)), arrival=1)
    hits = bm.find_cached_prefix(same)
    assert hits == [0]  # block 1 would cover the last token, which must be computed
    assert bm.allocate(same, 4, hits) == [0, 2] == same.block_table  # the hit, then a fresh block
    assert bm.ref_counts[0] == 2
    bm.free_sequence(a)
    assert bm.ref_counts[0] == 1 and bm.num_cached_free == 1  # block 1 only
    bm.check_invariants()


def test_scope_key_changes_block_hashes():
    tokens = list(range(12))
    assert make_seq(tokens, scope="tenant-a").block_hashes[0] != make_seq(tokens, scope="tenant-b").block_hashes[0]
    bm = BlockManager(num_blocks=8, block_size=4)
    a = make_seq(tokens, scope="tenant-a")
    bm.allocate(a, 12)
    compute_all(bm, a)
    assert bm.find_cached_prefix(make_seq(tokens + [1], scope="tenant-b", arrival=1)) == []
    assert bm.find_cached_prefix(make_seq(tokens + [1], scope="tenant-a", arrival=1)) == a.block_table


def test_engine_prefix_cache_is_scoped(make_engine):
    prompt = random_prompt(random.Random(7), 40)
    engine = make_engine()
    engine.add_request(make_request("a", prompt, max_tokens=4, scope="tenant-1"))
    first = run_engine(engine)["a"]
    engine.add_request(make_request("b", prompt, max_tokens=4, scope="tenant-2"))
    other_scope = run_engine(engine)["b"]
    engine.add_request(make_request("c", prompt, max_tokens=4, scope="tenant-1"))
    same_scope = run_engine(engine)["c"]
    assert first[-1].num_cached_tokens == 0
    assert other_scope[-1].num_cached_tokens == 0
    assert same_scope[-1].num_cached_tokens == 32  # the two full blocks shared with "a"
    assert engine.stats().prefix_hit_tokens == 32


def test_kv_pool_bytes_match_formula(make_engine, tiny_artifacts):
    import json

    cfg = json.loads((tiny_artifacts.path / "config.json").read_text())
    head_dim = cfg["hidden_size"] // cfg["num_attention_heads"]
    per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head_dim * 4  # float32
    assert per_token == kv_bytes_per_token_f32(tiny_artifacts) == 512
    engine = make_engine(num_blocks=37)
    pool = engine.kv_pool
    assert engine.stats().num_blocks_total == 37
    assert engine.stats().kv_bytes_per_token == per_token
    assert pool.numel() * pool.element_size() == 37 * BLOCK * per_token


def test_kv_spec_rounds_budget_down_to_whole_blocks():
    spec = KVCacheSpec.from_budget(4, 2, 64, torch.bfloat16, 16, kv_cache_bytes=10 * 16 * 2048 + 2047)
    assert spec.bytes_per_token == 2 * 4 * 2 * 64 * 2
    assert spec.num_blocks == 10
