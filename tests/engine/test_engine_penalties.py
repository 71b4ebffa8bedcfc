"""Logit bias and the presence, frequency and repetition penalties."""
from __future__ import annotations

import random
from collections import Counter

import pytest
import torch

from engine.errors import RequestError
from engine.logits import apply_logit_bias, apply_penalties
from engine.sequence import Sequence
from engine_factories import make_request, random_prompt, run_engine, tokens_of


def make_seq(prompt: list[int], output: list[int], **params) -> Sequence:
    seq = Sequence.from_request(make_request("r", prompt, max_tokens=8, **params), 0, 1.0)
    seq.token_ids.extend(output)
    return seq


def test_penalties_move_logits_in_the_documented_direction():
    logits = torch.tensor([[2.0, -2.0, 1.0, 0.5, 3.0]] * 3)
    seqs = [
        make_seq([0, 1], [], repetition_penalty=2.0),  # seen: 0 (positive: divided), 1 (negative: multiplied)
        make_seq([4], [2, 2, 3], frequency_penalty=0.5),  # prompt tokens do not count
        make_seq([4], [2, 2, 3], presence_penalty=1.5),
    ]
    apply_penalties(logits, seqs)
    assert logits.tolist() == [[1.0, -4.0, 1.0, 0.5, 3.0],
                               [2.0, -2.0, 0.0, 0.0, 3.0],
                               [2.0, -2.0, -0.5, -1.0, 3.0]]


def test_logit_bias_adds_to_its_row_only():
    logits = torch.zeros((2, 4))
    apply_logit_bias(logits, [make_seq([0], [], logit_bias=((1, 5.0), (3, -100.0))), make_seq([0], [])])
    assert logits.tolist() == [[0.0, 5.0, 0.0, -100.0], [0.0] * 4]


def test_a_token_biased_by_minus_100_never_appears(make_engine, reference):
    prompt = random_prompt(random.Random(311), 24)
    greedy = reference(prompt, 12)
    banned = tuple((t, -100.0) for t in set(greedy))
    engine = make_engine()
    engine.add_request(make_request("banned", prompt, max_tokens=12, logit_bias=banned))
    engine.add_request(make_request("sampled", prompt, max_tokens=12, temperature=1.0, seed=4, logit_bias=banned))
    outputs = run_engine(engine)
    for rid in ("banned", "sampled"):
        assert not set(tokens_of(outputs[rid])) & set(greedy)


def test_penalties_reduce_repeats_in_the_output(make_engine, reference):
    prompt = random_prompt(random.Random(312), 24)
    greedy = reference(prompt, 24)
    engine = make_engine()
    engine.add_request(make_request("frequency", prompt, max_tokens=24, frequency_penalty=2.0))
    engine.add_request(make_request("presence", prompt, max_tokens=24, presence_penalty=2.0))
    engine.add_request(make_request("repetition", prompt, max_tokens=24, repetition_penalty=5.0))
    outputs = run_engine(engine)

    def most_repeated(tokens):
        return Counter(tokens).most_common(1)[0][1]

    assert most_repeated(greedy) > 3
    for rid in ("frequency", "presence", "repetition"):
        assert most_repeated(tokens_of(outputs[rid])) < most_repeated(greedy), rid


@pytest.mark.parametrize("params, field", [
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-2.01), "frequency_penalty"),
    (dict(repetition_penalty=10.5), "repetition_penalty"),
    (dict(logit_bias=((512, 1.0),)), "logit_bias"),
    (dict(logit_bias=((5, 101.0),)), "logit_bias"),
    (dict(logit_bias=tuple((i, 1.0) for i in range(301))), "logit_bias"),
])
def test_out_of_bounds_penalties_and_bias_are_refused(make_engine, params, field):
    with pytest.raises(RequestError) as refused:
        make_engine().add_request(make_request("bad", [10, 11, 12], max_tokens=2, **params))
    assert refused.value.field == field
