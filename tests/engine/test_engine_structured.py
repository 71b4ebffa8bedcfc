"""Structured outputs: a grammar mask per step, per sequence, through preemption."""
from __future__ import annotations

import json
import random
import re

import pytest

from engine.errors import RequestError
from engine.request import FinishReason, StructuredOutput
from engine.structured import check_structured, grammar_of
from engine_factories import finish_of, make_request, random_prompt, run_engine, tokens_of

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "color"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "color": {"enum": ["red", "green", "blue"]}}}


def text_of(outputs) -> str:
    return "".join(o.text_delta for o in outputs)


def schema_output(schema: dict = SCHEMA) -> StructuredOutput:
    return StructuredOutput("json_schema", json.dumps(schema))


def check_schema(value: dict) -> None:
    assert set(value) == {"ok", "n", "color"}
    assert isinstance(value["ok"], bool) and 0 <= value["n"] <= 99 and value["color"] in ("red", "green", "blue")


def test_json_schema_output_parses_and_validates_whatever_the_model_prefers(make_engine):
    engine = make_engine()
    rng = random.Random(321)
    for i in range(3):
        engine.add_request(make_request(f"s{i}", random_prompt(rng, 20), max_tokens=60, structured=schema_output(),
                                        **({"temperature": 1.0, "seed": i} if i else {})))
    outputs = run_engine(engine)
    for rid, outs in outputs.items():
        assert finish_of(outs) is FinishReason.STOP, rid
        check_schema(json.loads(text_of(outs)))


def test_choice_regex_and_json_object(make_engine):
    engine = make_engine()
    prompt = random_prompt(random.Random(322), 16)
    engine.add_request(make_request("choice", prompt, max_tokens=20,
                                    structured=StructuredOutput("choice", json.dumps(["yes", "no", "maybe so"]))))
    engine.add_request(make_request("regex", prompt, max_tokens=20, structured=StructuredOutput("regex", "[ab]{3}-[0-9]")))
    engine.add_request(make_request("object", prompt, max_tokens=40, temperature=0.7, seed=1,
                                    structured=StructuredOutput("json_object")))
    outputs = run_engine(engine)
    assert text_of(outputs["choice"]) in ("yes", "no", "maybe so")
    assert re.fullmatch("[ab]{3}-[0-9]", text_of(outputs["regex"]))
    assert finish_of(outputs["choice"]) is finish_of(outputs["regex"]) is FinishReason.STOP
    text = text_of(outputs["object"])
    assert text.startswith("{")
    if finish_of(outputs["object"]) is FinishReason.STOP:
        assert isinstance(json.loads(text), dict)


def test_a_constrained_row_leaves_its_batch_mates_alone(make_engine, reference):
    rng = random.Random(323)
    plain = random_prompt(rng, 24)
    engine = make_engine()
    engine.add_request(make_request("plain", plain, max_tokens=10))
    engine.add_request(make_request("json", random_prompt(rng, 24), max_tokens=60, structured=schema_output()))
    assert tokens_of(run_engine(engine)["plain"]) == reference(plain, 10)


def test_grammar_state_survives_preemption_and_recompute(make_engine):
    rng = random.Random(324)
    # 30 prompt + ~40 output tokens each: two of them outgrow a 6-block pool, so one is preempted.
    prompts = {"a": random_prompt(rng, 30), "b": random_prompt(rng, 30)}
    outputs = {}
    for name, blocks in (("tight", 6), ("roomy", 64)):
        engine = make_engine(num_blocks=blocks, max_num_seqs=2, enable_prefix_cache=False)
        for rid, prompt in prompts.items():
            engine.add_request(make_request(rid, prompt, max_tokens=60, structured=schema_output()))
        outputs[name] = run_engine(engine)
        if name == "tight":
            assert engine.stats().num_preemptions >= 1
    for rid in prompts:
        assert tokens_of(outputs["tight"][rid]) == tokens_of(outputs["roomy"][rid])
        check_schema(json.loads(text_of(outputs["tight"][rid])))


@pytest.mark.parametrize("structured, problem", [
    (StructuredOutput("json_schema", '{"type": "objectx"}'), "Invalid type"),
    (StructuredOutput("json_schema", "{not json"), "not valid JSON"),
    (StructuredOutput("json_schema", json.dumps({"type": "string", "pattern": "(("})), "unclosed group"),
    (StructuredOutput("regex", "[a-z]+("), "unclosed group"),
    (StructuredOutput("choice", "[]"), "non-empty list"),
])
def test_a_spec_the_grammar_engine_cannot_compile_is_refused_naming_the_problem(make_engine, structured, problem):
    engine = make_engine()
    with pytest.raises(RequestError) as refused:
        engine.add_request(make_request("bad", [10, 11, 12], max_tokens=4, structured=structured))
    assert refused.value.field == "structured" and problem in str(refused.value)
    with pytest.raises(RequestError, match=re.escape(problem)):
        check_structured(structured, engine.grammars.tokenizer)
    assert not engine.has_unfinished()


def test_strict_refuses_unsupported_schema_keywords_and_lenient_ignores_them(make_engine):
    tokenizer = make_engine().grammars.tokenizer
    schema = json.dumps({"type": "array", "contains": {"type": "string"}})
    with pytest.raises(RequestError, match="Unimplemented keys"):
        check_structured(StructuredOutput("json_schema", schema, strict=True), tokenizer)
    check_structured(StructuredOutput("json_schema", schema, strict=False), tokenizer)
    assert grammar_of(StructuredOutput("json_schema", schema, strict=False))
