"""Logprobs of output tokens and of prompt tokens (scoring), against transformers' log-softmax."""
from __future__ import annotations

import random

import pytest
import torch

from engine.errors import RequestError
from engine.limits import MAX_LOGPROBS
from engine.request import FinishReason, SamplingParams
from engine_factories import finish_of, make_request, random_prompt, run_engine, tokens_of


def reference_logprobs(hf_model, token_ids: list[int]) -> torch.Tensor:
    """[len - 1, V]: row i is log p(. | token_ids[: i + 1]) under the transformers model."""
    with torch.inference_mode():
        logits = hf_model(torch.tensor([token_ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1)


def logprobs_of(outputs) -> list:
    return [lp for o in outputs for lp in o.logprobs]


def test_greedy_token_logprob_is_the_max_of_its_top_logprobs_and_matches_transformers(make_engine, hf_model):
    prompt = random_prompt(random.Random(301), 24)
    engine = make_engine()
    engine.add_request(make_request("lp", prompt, max_tokens=8, logprobs=5))
    outputs = run_engine(engine)["lp"]
    tokens, entries = tokens_of(outputs), logprobs_of(outputs)
    assert len(entries) == len(tokens) == 8
    want = reference_logprobs(hf_model, prompt + tokens)[len(prompt) - 1 :]
    for i, (token, entry) in enumerate(zip(tokens, entries)):
        assert entry.token_id == token and len(entry.top) == 5
        assert entry.logprob == max(lp for _, lp in entry.top) == entry.top[0][1]
        assert entry.top[0][0] == token
        assert [lp for _, lp in entry.top] == sorted((lp for _, lp in entry.top), reverse=True)
        assert abs(entry.logprob - want[i, token].item()) < 1e-4
        top_ids = want[i].topk(5).indices.tolist()
        assert [t for t, _ in entry.top] == top_ids


def test_logprobs_are_the_raw_distribution_before_bias_and_temperature(make_engine, hf_model):
    prompt = random_prompt(random.Random(302), 20)
    engine = make_engine()
    forced = 77
    engine.add_request(make_request("biased", prompt, max_tokens=3, logprobs=0, temperature=1.7, seed=3,
                                    logit_bias=((forced, 100.0),)))
    outputs = run_engine(engine)["biased"]
    assert tokens_of(outputs) == [forced] * 3
    want = reference_logprobs(hf_model, prompt + [forced] * 3)[len(prompt) - 1 :]
    for i, entry in enumerate(logprobs_of(outputs)):
        assert entry.top == () and abs(entry.logprob - want[i, forced].item()) < 1e-4
        assert entry.logprob < -0.5  # the model's own belief, not the biased certainty


def test_prompt_logprobs_with_max_tokens_0_score_the_prompt_and_generate_nothing(make_engine, hf_model):
    prompt = random_prompt(random.Random(303), 40)
    engine = make_engine()
    # The same prompt already in the prefix cache: a scored prompt must still compute every position.
    engine.add_request(make_request("warm", prompt, max_tokens=2))
    run_engine(engine)
    engine.add_request(make_request("score", prompt, max_tokens=0, prompt_logprobs=3))
    outputs = run_engine(engine)["score"]
    assert len(outputs) == 1 and outputs[0].new_token_ids == () and finish_of(outputs) is FinishReason.LENGTH
    assert (outputs[0].num_prompt_tokens, outputs[0].num_cached_tokens, outputs[0].num_output_tokens) == (40, 0, 0)
    scored = outputs[0].prompt_logprobs
    want = reference_logprobs(hf_model, prompt)
    assert [e.token_id for e in scored] == prompt[1:]
    assert max(abs(e.logprob - want[i, prompt[i + 1]].item()) for i, e in enumerate(scored)) < 1e-4
    assert all([t for t, _ in e.top] == want[i].topk(3).indices.tolist() for i, e in enumerate(scored))


def test_prompt_logprobs_survive_chunked_prefill_and_preemption(make_engine, hf_model):
    rng = random.Random(304)
    prompts = {"a": random_prompt(rng, 40), "b": random_prompt(rng, 40)}
    # 16-token chunks, and a pool of 6 blocks: the two sequences preempt each other as they grow.
    engine = make_engine(num_blocks=6, max_num_seqs=2, max_num_batched_tokens=16, enable_prefix_cache=False)
    for rid, prompt in prompts.items():
        engine.add_request(make_request(rid, prompt, max_tokens=20, prompt_logprobs=1, logprobs=1))
    outputs = run_engine(engine)
    assert engine.stats().num_preemptions >= 1
    for rid, prompt in prompts.items():
        sent = [o.prompt_logprobs for o in outputs[rid] if o.prompt_logprobs is not None]
        assert len(sent) == 1 and outputs[rid][0].prompt_logprobs is sent[0]  # once, with the first token
        tokens = tokens_of(outputs[rid])
        want = reference_logprobs(hf_model, prompt + tokens)
        assert [e.token_id for e in sent[0]] == prompt[1:]
        assert max(abs(e.logprob - want[i, prompt[i + 1]].item()) for i, e in enumerate(sent[0])) < 1e-4
        generated = logprobs_of(outputs[rid])
        assert [e.token_id for e in generated] == tokens
        assert max(abs(e.logprob - want[len(prompt) - 1 + i, t].item())
                   for i, (e, t) in enumerate(zip(generated, tokens))) < 1e-4


def test_logprob_rows_do_not_change_the_tokens_of_batch_mates(make_engine, reference):
    rng = random.Random(305)
    engine = make_engine()
    plain = random_prompt(rng, 30)
    engine.add_request(make_request("plain", plain, max_tokens=8))
    engine.add_request(make_request("scored", random_prompt(rng, 50), max_tokens=4, prompt_logprobs=20, logprobs=20))
    assert tokens_of(run_engine(engine)["plain"]) == reference(plain, 8)


@pytest.mark.parametrize("params, field", [
    (dict(logprobs=MAX_LOGPROBS + 1), "logprobs"),
    (dict(prompt_logprobs=MAX_LOGPROBS + 1), "prompt_logprobs"),
])
def test_more_logprobs_than_the_bound_are_refused(make_engine, params, field):
    with pytest.raises(RequestError) as refused:
        make_engine().add_request(make_request("bad", [10, 11, 12], max_tokens=2, **params))
    assert refused.value.field == field


def test_max_tokens_0_needs_prompt_logprobs():
    with pytest.raises(ValueError, match="score the prompt"):
        SamplingParams(max_tokens=0)
    assert SamplingParams(max_tokens=0, prompt_logprobs=0).max_tokens == 0
