"""Sampling parameters, stop conditions and incremental detokenization."""
from __future__ import annotations

import random

from engine.detokenizer import IncrementalDetokenizer
from engine.request import FinishReason
from engine_factories import finish_of, make_request, random_prompt, run_engine, tokens_of

SAMPLED = dict(temperature=1.0, top_k=50, top_p=0.9)


def text_of(outputs) -> str:
    return "".join(o.text_delta for o in outputs)


def test_same_seed_same_tokens_regardless_of_batch(make_engine):
    rng = random.Random(20)
    prompt = random_prompt(rng, 20)
    engine = make_engine()
    engine.add_request(make_request("alone", prompt, max_tokens=16, seed=7, **SAMPLED))
    alone = tokens_of(run_engine(engine)["alone"])
    for i in range(5):
        engine.add_request(make_request(f"mate{i}", random_prompt(rng, 30), max_tokens=16, **SAMPLED))
    engine.add_request(make_request("batched", prompt, max_tokens=16, seed=7, **SAMPLED))
    engine.add_request(make_request("other-seed", prompt, max_tokens=16, seed=8, **SAMPLED))
    outputs = run_engine(engine)
    assert tokens_of(outputs["batched"]) == alone
    assert tokens_of(outputs["other-seed"]) != alone
    assert len(alone) == 16


def test_top_k_1_equals_greedy(make_engine, reference):
    prompt = random_prompt(random.Random(21), 25)
    engine = make_engine()
    engine.add_request(make_request("k1", prompt, max_tokens=12, temperature=0.8, top_k=1, seed=3))
    assert tokens_of(run_engine(engine)["k1"]) == reference(prompt, 12)


def test_stop_token_id_ends_request(make_engine, reference):
    prompt = random_prompt(random.Random(22), 30)
    expected = reference(prompt, 16)
    stop_id = expected[4]
    cut = expected.index(stop_id) + 1
    engine = make_engine()
    engine.add_request(make_request("s", prompt, max_tokens=16, stop_token_ids=(stop_id,)))
    outputs = run_engine(engine)["s"]
    assert tokens_of(outputs) == expected[:cut]
    assert finish_of(outputs) is FinishReason.STOP


def test_min_tokens_holds_back_stop_ids_and_eos(make_engine, reference):
    prompt = random_prompt(random.Random(22), 30)
    expected = reference(prompt, 16)
    stop_id = expected[4]
    cut = expected.index(stop_id)
    engine = make_engine()
    engine.add_request(make_request("held", prompt, max_tokens=16, min_tokens=cut + 3, stop_token_ids=(stop_id,)))
    engine.eos_token_ids = {stop_id}  # the same token as EOS: held back as well until min_tokens are out
    tokens = tokens_of(run_engine(engine)["held"])
    assert tokens[:cut] == expected[:cut]  # nothing changes before the held-back token would have come
    assert stop_id not in tokens[: cut + 3] and len(tokens) >= cut + 3


def test_ignore_eos_runs_to_max_tokens(make_engine, reference):
    prompt = random_prompt(random.Random(22), 30)
    expected = reference(prompt, 16)
    engine = make_engine()
    engine.eos_token_ids = {expected[4]}  # pretend the model's EOS comes fifth
    engine.add_request(make_request("stops", prompt, max_tokens=16))
    engine.add_request(make_request("ignores", prompt, max_tokens=16, ignore_eos=True))
    outputs = run_engine(engine)
    assert tokens_of(outputs["stops"]) == expected[: expected.index(expected[4]) + 1]
    assert finish_of(outputs["stops"]) is FinishReason.STOP
    assert tokens_of(outputs["ignores"]) == expected and finish_of(outputs["ignores"]) is FinishReason.LENGTH


def test_stop_strings_wait_for_min_tokens(make_engine):
    prompt = random_prompt(random.Random(23), 30)
    engine = make_engine()
    engine.add_request(make_request("full", prompt, max_tokens=24))
    full_text = text_of(run_engine(engine)["full"])
    stop = full_text[:3]
    engine.add_request(make_request("early", prompt, max_tokens=24, stop=(stop,)))
    engine.add_request(make_request("late", prompt, max_tokens=24, stop=(stop,), min_tokens=24))
    outputs = run_engine(engine)
    assert text_of(outputs["early"]) == "" and finish_of(outputs["early"]) is FinishReason.STOP
    assert text_of(outputs["late"]) == full_text and finish_of(outputs["late"]) is FinishReason.LENGTH


def test_text_deltas_concatenate_to_decoded_output(make_engine, tiny_artifacts):
    prompt = random_prompt(random.Random(23), 30)
    engine = make_engine()
    engine.add_request(make_request("t", prompt, max_tokens=24))
    outputs = run_engine(engine)["t"]
    decoded = tiny_artifacts.tokenizer.decode(tokens_of(outputs), skip_special_tokens=True)
    assert text_of(outputs) == decoded
    assert len(decoded) > 0


def test_stop_string_truncates_text(make_engine, tiny_artifacts):
    prompt = random_prompt(random.Random(23), 30)
    engine = make_engine()
    engine.add_request(make_request("full", prompt, max_tokens=24))
    full_text = text_of(run_engine(engine)["full"])
    stop = full_text[10:13]
    engine.add_request(make_request("cut", prompt, max_tokens=24, stop=(stop, "never-seen-xyz")))
    outputs = run_engine(engine)["cut"]
    assert text_of(outputs) == full_text[: full_text.index(stop)]
    assert finish_of(outputs) is FinishReason.STOP
    assert len(tokens_of(outputs)) < 24
    # Held-back characters never include a stop-string prefix that later matched.
    assert all(stop not in o.text_delta for o in outputs)


def test_detokenizer_never_emits_half_a_utf8_character(tiny_artifacts):
    tok = tiny_artifacts.tokenizer
    text = "Über 東京 naïve 😀🚀 ok"
    ids = tok.encode(text, add_special_tokens=False)
    # The tiny vocabulary splits multi-byte characters across tokens.
    assert any(tok.decode(ids[:i]).endswith("\ufffd") for i in range(1, len(ids)))
    detok = IncrementalDetokenizer(tok, [], ())
    deltas = []
    for t in ids:
        detok.append(t)
        deltas.append(detok.take_delta(finished=False))
    assert all("\ufffd" not in d for d in deltas)
    assert "".join(deltas) == text


def test_detokenizer_holds_back_possible_stop_prefix(tiny_artifacts):
    tok = tiny_artifacts.tokenizer
    ids = tok.encode("alpha beta gamma", add_special_tokens=False)
    detok = IncrementalDetokenizer(tok, [], ("a gam",))
    emitted = ""
    stopped = False
    for t in ids:
        stopped = detok.append(t)
        emitted += detok.take_delta(finished=stopped)
        if stopped:
            break
    assert stopped
    assert emitted == "alpha bet"
