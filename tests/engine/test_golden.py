"""Golden prompts: parsing (errors name the file and the entry) and greedy runs that pass or fail."""
from __future__ import annotations

import json

import pytest

from engine.errors import ArtifactError, RequestError
from engine.artifacts.golden import GOLDEN_FORMAT, GoldenPrompt, load_golden, parse_golden, render, run_golden
from engine.request import EngineRequest, SamplingParams

MESSAGES = [{"role": "user", "content": "the water is"}]


def make_golden(*prompts: dict) -> bytes:
    return json.dumps({"format": GOLDEN_FORMAT, "prompts": list(prompts)}).encode()


def make_prompt(name: str = "water", expect: dict | None = None, **fields) -> dict:
    return {"name": name, "messages": MESSAGES, "maxOutputTokens": 8, "expect": expect or {"contains": "x"},
            **fields}


def greedy_text(engine, prompt: GoldenPrompt) -> str:
    """What the engine decodes greedily for `prompt`, learnt once so the golden file can expect it."""
    engine.add_request(EngineRequest("learn", render(engine.tokenizer, prompt),
                                     SamplingParams(max_tokens=prompt.max_output_tokens)))
    text = []
    while engine.has_unfinished():
        text += [o.text_delta for o in engine.step()]
    return "".join(text)


def test_a_golden_file_parses_into_prompts_with_defaults():
    (exact, contains) = parse_golden(make_golden(make_prompt("a", {"exact": ""}),
                                                 {"name": "b", "messages": MESSAGES, "expect": {"contains": "Paris"}}))
    assert exact == GoldenPrompt("a", (("user", "the water is"),), 8, "exact", "")
    assert (contains.max_output_tokens, contains.expect_kind, contains.expect_text) == (32, "contains", "Paris")
    assert contains.accepts("in Paris.") and not contains.accepts("in Rome.")
    assert exact.accepts("") and not exact.accepts(" ")


@pytest.mark.parametrize(("data", "fragment"), [
    (b"{oops", "not UTF-8 JSON"),
    (json.dumps({"format": "other", "prompts": []}).encode(), "format 'ledgerlm-golden/1'"),
    (make_golden(), "'prompts' must be a non-empty list"),
    (make_golden(make_prompt(expect={"exact": "a", "contains": "b"})), "prompts[0]: 'expect' must be exactly one"),
    (make_golden(make_prompt(expect={"regex": "a"})), "prompts[0]: 'expect' must be exactly one"),
    (make_golden(make_prompt(expect={"contains": ""})), "'expect.contains' must be a non-empty string"),
    (make_golden(make_prompt(), make_prompt(maxOutputTokens=0)), "prompts[1]: 'maxOutputTokens' must be"),
    (make_golden(make_prompt(messages=[{"role": "robot", "content": "hi"}])), "prompts[0]: messages[0] must be"),
    (make_golden(make_prompt(temperature=0.5)), "prompts[0]: unknown field(s) temperature"),
    (make_golden(make_prompt("same"), make_prompt("same")), "repeated: same"),
])
def test_a_malformed_golden_file_is_an_error_naming_the_file(data, fragment, tmp_path):
    (tmp_path / "golden.json").write_bytes(data)
    with pytest.raises(ArtifactError) as caught:
        load_golden(tmp_path)
    assert caught.value.path == str(tmp_path / "golden.json")
    assert fragment in caught.value.reason


def test_a_missing_or_changed_golden_file_is_refused(tmp_path):
    with pytest.raises(ArtifactError, match="golden.json missing"):
        load_golden(tmp_path)
    (tmp_path / "golden.json").write_bytes(make_golden(make_prompt()))
    with pytest.raises(ArtifactError, match="does not match the registered checksum"):
        load_golden(tmp_path, expected_sha256="00" * 32)


def test_golden_prompts_pass_on_the_exact_greedy_output_and_fail_otherwise(make_engine):
    engine = make_engine()
    learnt = greedy_text(engine, parse_golden(make_golden(make_prompt()))[0])
    assert len(learnt) > 0
    golden = parse_golden(make_golden(make_prompt("exact", {"exact": learnt}),
                                      make_prompt("inside", {"contains": learnt[1:-1] or learnt}),
                                      make_prompt("wrong", {"contains": learnt + "\u2603"}),
                                      make_prompt("longer", {"exact": learnt + " "})))
    report = run_golden(engine, golden)
    assert [(r.name, r.passed, r.output_chars, r.expect_kind) for r in report.results] == [
        ("exact", True, len(learnt), "exact"), ("inside", True, len(learnt), "contains"),
        ("wrong", False, len(learnt), "contains"), ("longer", False, len(learnt), "exact")]
    assert (report.passed, report.failures) == (False, ("wrong", "longer"))
    assert run_golden(engine, golden[:2]).passed
    assert not engine.has_unfinished()


def test_a_prompt_that_cannot_run_names_the_prompt(make_engine):
    golden = parse_golden(make_golden(make_prompt("huge", maxOutputTokens=100_000)))
    with pytest.raises(RequestError, match="golden prompt 'huge'"):
        run_golden(make_engine(), golden)
