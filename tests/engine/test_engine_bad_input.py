"""Hostile sampling values and failing steps (issue 15): refused, served greedily, or failed alone.

The engine is the last line of defence: a worker is reachable through Kafka, so what the gateway
refuses must not kill the engine thread when it arrives anyway.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from engine.errors import RequestError
from engine.limits import MAX_STOP_STRING_CHARS, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, MIN_TEMPERATURE
from engine.request import FinishReason, SamplingParams
from engine.sampler import Sampler
from engine_factories import finish_of, make_request, random_prompt, run_engine, tokens_of


@pytest.mark.parametrize("params, field", [
    (dict(stop_token_ids=(1_000_000_000,), min_tokens=1), "stop_token_ids"),
    (dict(stop_token_ids=(512,)), "stop_token_ids"),  # the tiny model's vocabulary is [0, 512)
    (dict(stop_token_ids=tuple(range(6, 7 + MAX_STOP_TOKEN_IDS))), "stop_token_ids"),
    (dict(stop=tuple(f"s{i}" for i in range(MAX_STOP_STRINGS + 1))), "stop"),
    (dict(stop=("x" * (MAX_STOP_STRING_CHARS + 1),)), "stop"),
    (dict(temperature=1.0, seed=2**64), "seed"),
])
def test_out_of_bounds_sampling_values_are_refused_naming_the_field(make_engine, params, field):
    engine = make_engine()
    with pytest.raises(RequestError) as refused:
        engine.add_request(make_request("bad", [10, 11, 12], max_tokens=4, **params))
    assert refused.value.field == field
    assert str(refused.value).startswith("request 'bad': ")
    assert not engine.has_unfinished()


def test_stop_values_at_the_bounds_are_served(make_engine):
    engine = make_engine()
    stops = tuple(f"{i:02d}" + "z" * (MAX_STOP_STRING_CHARS - 2) for i in range(MAX_STOP_STRINGS))
    engine.add_request(make_request("edge", [10, 11, 12], max_tokens=4, stop=stops, stop_token_ids=(511,)))
    assert finish_of(run_engine(engine)["edge"]) in (FinishReason.LENGTH, FinishReason.STOP)


@pytest.mark.parametrize("temperature", [1e-45, 1e-30, MIN_TEMPERATURE / 2])
def test_a_temperature_below_the_minimum_is_served_greedily(make_engine, reference, temperature):
    prompt = random_prompt(random.Random(151), 20)
    engine = make_engine()
    engine.add_request(make_request("cold", prompt, max_tokens=8, temperature=temperature, top_p=0.5))
    outputs = run_engine(engine)["cold"]
    assert tokens_of(outputs) == reference(prompt, 8)
    assert SamplingParams(temperature=temperature).greedy and not SamplingParams(temperature=MIN_TEMPERATURE).greedy


def test_a_tiny_top_p_keeps_the_most_likely_token(make_engine, reference):
    prompt = random_prompt(random.Random(152), 20)
    engine = make_engine()
    engine.add_request(make_request("narrow", prompt, max_tokens=8, temperature=1.0, top_p=1e-12, seed=5))
    assert tokens_of(run_engine(engine)["narrow"]) == reference(prompt, 8)


def test_a_non_finite_temperature_is_not_a_sampling_params():
    for value in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="temperature"):
            SamplingParams(temperature=value)


def test_the_sampler_gives_no_token_for_a_row_without_a_finite_distribution():
    logits = torch.tensor([[0.0, 2.0, 1.0], [0.0, math.nan, 1.0], [math.inf, 0.0, 1.0], [0.0, 3.0, 1.0],
                           [0.5, 0.1, 0.2]])
    greedy, sampled = SamplingParams(), SamplingParams(temperature=1.0)
    generators = [None, None, None, torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)]
    banned = [(), (), (), (0, 1, 2), (7,)]  # row 3: everything banned; row 4: an id outside the vocabulary
    tokens = Sampler().sample(logits, [greedy, greedy, sampled, sampled, sampled], generators, banned)
    assert tokens == [1, None, None, None, None]


def test_a_row_that_cannot_be_sampled_fails_only_its_request(make_engine, reference, monkeypatch):
    """A request that got past the check (the second line of defence): it ends failed, its batch mate does not."""
    rng = random.Random(153)
    good_prompt = random_prompt(rng, 24)
    engine = make_engine()
    monkeypatch.setattr(engine, "_validate", lambda request: None)
    engine.add_request(make_request("bad", random_prompt(rng, 12), max_tokens=8, min_tokens=1,
                                    stop_token_ids=(1_000_000_000,)))
    engine.add_request(make_request("good", good_prompt, max_tokens=8))
    outputs = run_engine(engine)
    assert [(o.new_token_ids, o.text_delta, o.finish_reason, o.num_output_tokens) for o in outputs["bad"]] == [
        ((), "", FinishReason.FAILED, 0)]
    assert tokens_of(outputs["good"]) == reference(good_prompt, 8)
    assert finish_of(outputs["good"]) in (FinishReason.LENGTH, FinishReason.STOP)  # the model's EOS may come first


def test_a_forward_error_fails_its_batch_and_the_engine_keeps_serving(make_engine, reference, monkeypatch):
    rng = random.Random(154)
    prompts = [random_prompt(rng, 20) for _ in range(3)]
    engine = make_engine()
    forward = engine.runner.model.forward
    calls = []

    def faulty(batch, kv_pool):  # test double of a device fault on the second step only
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("simulated device fault")
        return forward(batch, kv_pool)

    monkeypatch.setattr(engine.runner.model, "forward", faulty)
    engine.add_request(make_request("a", prompts[0], max_tokens=8))
    engine.add_request(make_request("b", prompts[1], max_tokens=8))
    outputs = run_engine(engine)
    for rid, prompt in (("a", prompts[0]), ("b", prompts[1])):
        assert tokens_of(outputs[rid]) == reference(prompt, 1)  # the first step's token stands
        assert [(o.finish_reason, o.num_output_tokens) for o in outputs[rid]] == [
            (None, 1), (FinishReason.FAILED, 1)]
    assert engine.stats().num_blocks_used == 0

    engine.add_request(make_request("c", prompts[2], max_tokens=8))
    later = run_engine(engine)["c"]
    assert tokens_of(later) == reference(prompts[2], 8) and finish_of(later) is not FinishReason.FAILED


def test_sampled_tokens_follow_the_distribution_and_skip_banned_ones():
    """Inverse transform sampling: frequencies match the softmax, a banned (-inf) token is never drawn, and
    a seed gives the same draws again."""
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.0, 0.0, 0.9]]))
    params = [SamplingParams(temperature=1.0)] * 2
    draws = 4000

    def counts(seed: int) -> list[list[int]]:
        generators = [torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)]
        seen = [[0] * 4, [0] * 4]
        for _ in range(draws):
            for row, token in enumerate(Sampler().sample(logits, params, generators)):
                seen[row][token] += 1
        return seen

    seen = counts(11)
    assert seen[0][3] == 0 and seen[1][1] == seen[1][2] == 0
    for row, probs in enumerate(([0.5, 0.3, 0.2, 0.0], [0.1, 0.0, 0.0, 0.9])):
        for token, p in enumerate(probs):
            assert abs(seen[row][token] / draws - p) < 0.03, (row, token, seen[row])
    assert counts(11) == seen
