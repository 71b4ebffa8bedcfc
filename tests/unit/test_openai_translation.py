"""OpenAI/vLLM request fields -> the effective sampling that travels to the worker, and answers from pieces.

No Kafka or Postgres: the catalog follows one registration made in process (the tiny demo model).
"""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest

from producers.gateway.admission.prompts import ModelCatalog
from producers.gateway.database import Principal
from producers.gateway.errors import ApiError
from producers.gateway.openai.api import render
from producers.gateway.openai.chunks import End, Piece, TokenTexts
from producers.gateway.openai.reply import Reply, answer, stream
from producers.gateway.openai.requests import ChatCompletionRequest, CompletionRequest
from producers.model_registry import describe
from schemas.stream import TokenLogprob
from schemas.values import StructuredSpec

MODEL = "unit-tiny@1"
CHAT = [{"role": "user", "content": "the water is"}]
PRINCIPAL = Principal("t", 200_000, 1_000_000)


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    from engine.artifacts.demo_model import build_demo_model

    model_dir = build_demo_model(tmp_path_factory.mktemp("m") / "tiny", size="tiny", train_steps=0, progress=False)
    catalog = ModelCatalog()
    catalog.observe(describe(model_dir, MODEL))
    return SimpleNamespace(catalog=catalog)


def rendered(gateway, kind, **fields):
    body = kind.model_validate({"model": MODEL, **fields})
    body.check_supported()
    return render(gateway, body, "rid", PRINCIPAL)


def refused(gateway, kind, **fields) -> ApiError:
    with pytest.raises(ApiError) as caught:
        rendered(gateway, kind, **fields)
    return caught.value


def test_sampling_fields_reach_the_effective_request(gateway):
    native, prompt, texts = rendered(
        gateway, ChatCompletionRequest, messages=CHAT, max_tokens=4, presence_penalty=0.5, frequency_penalty=-1,
        repetition_penalty=1.2, logit_bias={"17": -100, "5": 2.5, "9": 0}, logprobs=True, top_logprobs=3,
        response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"},
                                                                "strict": True}})
    s = prompt.sampling
    assert (s.presence_penalty, s.frequency_penalty, s.repetition_penalty) == (0.5, -1.0, 1.2)
    assert s.logit_bias == ((5, 2.5), (17, -100.0))  # sorted, zero biases dropped
    assert (s.logprobs, s.prompt_logprobs, s.prompt_only) == (3, None, False)
    assert s.structured == StructuredSpec(kind="json_schema", spec='{"type":"object"}', strict=True)
    assert texts is not None and prompt.max_output_tokens == 4
    plain = rendered(gateway, ChatCompletionRequest, messages=CHAT, max_tokens=4)[1]
    assert plain.payload_hash != prompt.payload_hash
    assert plain.sampling.model_dump(exclude_defaults=True) == {"temperature": 1.0}


def test_n_choices_travel_in_the_sampling_and_count_against_the_per_request_limit(gateway):
    _native, prompt, _ = rendered(gateway, ChatCompletionRequest, messages=CHAT, max_tokens=100, n=3, seed=9)
    assert (prompt.sampling.n, prompt.sampling.seed, prompt.max_output_tokens) == (3, 9, 100)
    small = Principal("t", 250, 1_000_000)
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": CHAT, "max_tokens": 100, "n": 3})
    with pytest.raises(ApiError) as caught:
        render(gateway, body, "rid", small)  # 3 x 100 output tokens + the prompt exceed 250
    assert caught.value.code == "tenant_limit_exceeded"


def test_completion_echo_with_max_tokens_0_scores_the_prompt(gateway):
    _native, prompt, _texts = rendered(gateway, CompletionRequest, prompt="the water is", max_tokens=0, echo=True,
                                       logprobs=2)
    s = prompt.sampling
    assert (s.prompt_only, s.prompt_logprobs, s.logprobs, prompt.max_output_tokens) == (True, 2, 2, 1)
    assert refused(gateway, CompletionRequest, prompt="x", max_tokens=0).details == {"field": "max_tokens"}


@pytest.mark.parametrize("fields, field", [
    ({"guided_choice": ["a", "b"], "guided_regex": "a+"}, "guided_choice"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "structured_outputs"),
    ({"guided_json": {"type": "objectx"}}, "responseFormat"),
    ({"guided_regex": "(("}, "responseFormat"),
    ({"logit_bias": {"512": 1}}, "logitBias"),  # the tiny vocabulary is [0, 512)
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                                 "schema": {"type": "array", "contains": {}}}}},
     "responseFormat"),
])
def test_constraints_the_engine_cannot_serve_are_400_before_admission(gateway, fields, field):
    error = refused(gateway, ChatCompletionRequest, messages=CHAT, max_tokens=4, **fields)
    assert error.status == 400 and error.details["field"] == field


@pytest.mark.parametrize("fields, field", [
    ({"best_of": 2}, "best_of"), ({"use_beam_search": True}, "use_beam_search"),
    ({"functions": [{"name": "f"}]}, "functions"), ({"echo": True}, "echo"), ({"min_p": 0.1}, "min_p"),
    ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs: true
])
def test_documented_fields_beyond_their_neutral_value_are_400_naming_them(fields, field):
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": CHAT, **fields})
    with pytest.raises(ApiError) as caught:
        body.check_supported()
    assert caught.value.details == {"field": field}


def test_every_documented_label_and_neutral_value_is_accepted():
    body = ChatCompletionRequest.model_validate({
        "model": MODEL, "messages": CHAT, "n": 1, "best_of": 1, "user": "u", "metadata": {"a": "b"}, "store": False,
        "prompt_cache_key": "k", "safety_identifier": "s", "parallel_tool_calls": True, "tool_choice": "none",
        "tools": [], "modalities": ["text"], "skip_special_tokens": True, "add_generation_prompt": True,
        "guided_decoding_backend": "auto", "priority": 0, "logprobs": False, "echo": False, "min_p": 0,
        "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
    body.check_supported()
    assert body.continuous_usage


async def collect(iterator) -> list:
    return [item async for item in iterator]


async def pieces_of(items):
    for item in items:
        yield item


def test_n_choices_answer_and_stream_with_their_index_and_own_end(gateway):
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": CHAT, "n": 2, "stream": True,
                                                 "stream_options": {"include_usage": True}})
    items = [Piece("a", (5,), 1, choice=0), Piece("b", (6,), 2, choice=1, choice_end="completed"),
             Piece("c", (7,), 3, choice=0, choice_end="output-limit"), End("output-limit", 4, 0, 3)]
    reply = Reply("g2", MODEL, body, (1, 2, 3, 4), None)
    whole = asyncio.run(answer(reply, pieces_of(items)))
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in whole["choices"]] == [
        (0, "ac", "length"), (1, "b", "stop")]
    assert whole["usage"]["completion_tokens"] == 3
    lines = asyncio.run(collect(stream(reply, pieces_of(items))))
    chunks = [json.loads(line[6:]) for line in b"".join(lines).decode().split("\n\n") if line.startswith("data: {")]
    roles = [c["choices"][0]["index"] for c in chunks[:2]]
    finishes = [(c["choices"][0]["index"], c["choices"][0]["finish_reason"]) for c in chunks
                if c["choices"] and c["choices"][0]["finish_reason"]]
    assert roles == [0, 1] and finishes == [(1, "stop"), (0, "length")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_completion_echo_logprobs_answer_and_stream(gateway):
    texts = TokenTexts(gateway.catalog.grammar_tokenizer(gateway.catalog.target(MODEL).renderer))
    body = CompletionRequest.model_validate({"model": MODEL, "prompt": "ab", "max_tokens": 1, "echo": True,
                                             "logprobs": 1, "stream": True,
                                             "stream_options": {"include_usage": True,
                                                                "continuous_usage_stats": True}})
    prompt_ids = (100, 101, 102)
    scored = (TokenLogprob(token_id=101, logprob=-1.5, top=((7, -0.5),)),
              TokenLogprob(token_id=102, logprob=-2.0, top=((102, -2.0),)))
    generated = (TokenLogprob(token_id=9, logprob=-0.25, top=((9, -0.25),)),)
    items = [Piece("", (), 0, None, scored[:1]), Piece("", (), 0, None, scored[1:]),
             Piece("x", (9,), 1, generated), End("output-limit", 3, 0, 1)]
    reply = Reply("g1", MODEL, body, prompt_ids, texts)
    whole = asyncio.run(answer(reply, pieces_of(items)))
    choice = whole["choices"][0]
    assert choice["text"] == "abx" and choice["finish_reason"] == "length"
    assert choice["logprobs"]["token_logprobs"] == [None, -1.5, -2.0, -0.25]
    assert choice["logprobs"]["top_logprobs"][0] is None and len(choice["logprobs"]["tokens"]) == 4
    lines = asyncio.run(collect(stream(reply, pieces_of(items))))
    chunks = [json.loads(line[6:]) for line in (b"".join(lines).decode().split("\n\n")) if line.startswith("data: {")]
    echo, token, finish, usage = chunks
    assert echo["choices"][0]["text"] == "ab" and echo["choices"][0]["logprobs"]["token_logprobs"] == [None, -1.5,
                                                                                                       -2.0]
    assert token["choices"][0]["logprobs"]["text_offset"][0] == sum(
        len(t) for t in echo["choices"][0]["logprobs"]["tokens"])
    assert [c["usage"]["completion_tokens"] for c in (echo, token, finish)] == [0, 1, 1]
    assert usage["choices"] == [] and usage["usage"]["total_tokens"] == 4


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["city"],
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["c", "f"]}}}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def test_a_named_tool_choice_constrains_the_output_to_its_parameters(gateway):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    native, prompt, _ = rendered(gateway, ChatCompletionRequest, messages=CHAT, max_tokens=30, tools=[WEATHER, CLOCK],
                                 tool_choice=choice)
    spec = prompt.sampling.structured
    assert spec.kind == "json_schema" and json.loads(spec.spec) == WEATHER["function"]["parameters"]
    plain = rendered(gateway, ChatCompletionRequest, messages=CHAT, max_tokens=30)[1]
    assert len(prompt.token_ids) > len(plain.token_ids)  # the tools reach the prompt (a system message here)
    required = rendered(gateway, ChatCompletionRequest, messages=CHAT, max_tokens=30, tools=[WEATHER, CLOCK],
                        tool_choice="required")[1].sampling.structured
    assert json.loads(required.spec)["type"] == "array" and len(json.loads(required.spec)["items"]["anyOf"]) == 2
    assert rendered(gateway, ChatCompletionRequest, messages=CHAT, max_tokens=3, tools=[WEATHER],
                    tool_choice="auto")[1].sampling.structured is None
    error = refused(gateway, ChatCompletionRequest, messages=CHAT, max_tokens=3, tools=[WEATHER],
                    tool_choice={"type": "function", "function": {"name": "nope"}})
    assert error.details == {"field": "tool_choice"}


def test_tool_calls_come_back_with_finish_reason_tool_calls_streamed_as_deltas(gateway):
    choice = {"type": "function", "function": {"name": "get_weather"}}
    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": CHAT, "tools": [WEATHER],
                                                 "tool_choice": choice, "stream": True})
    reply = Reply("g3", MODEL, body, (1, 2), None, body.tool_mode())
    items = [Piece('{"city": ', (5,), 1), Piece('"Oslo"}', (6,), 2), End("completed", 2, 0, 2)]
    whole = asyncio.run(answer(reply, pieces_of(items)))
    message = whole["choices"][0]["message"]
    assert whole["choices"][0]["finish_reason"] == "tool_calls" and message["content"] is None
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Oslo"})]
    lines = asyncio.run(collect(stream(reply, pieces_of(items))))
    chunks = [json.loads(line[6:]) for line in b"".join(lines).decode().split("\n\n") if line.startswith("data: {")]
    deltas = [c["choices"][0]["delta"].get("tool_calls") for c in chunks if c["choices"]]
    calls = [d[0] for d in deltas if d]
    assert calls[0]["function"] == {"name": "get_weather", "arguments": ""} and calls[0]["id"]
    assert "".join(c["function"]["arguments"] for c in calls) == '{"city": "Oslo"}'
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    auto = ChatCompletionRequest.model_validate({"model": MODEL, "messages": CHAT, "tools": [WEATHER, CLOCK]})
    text = 'Sure. <tool_call>{"name": "get_time", "arguments": {}}</tool_call>'
    hermes = asyncio.run(answer(Reply("g4", MODEL, auto, (1,), None, auto.tool_mode()),
                                pieces_of([Piece(text, (5,), 1), End("completed", 1, 0, 1)])))
    assert hermes["choices"][0]["message"]["content"] == "Sure."
    assert hermes["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}


def test_a_stream_whose_source_the_database_fails_ends_with_an_error_chunk_and_done(gateway):
    from producers.gateway.errors import DatabaseUnavailable

    body = ChatCompletionRequest.model_validate({"model": MODEL, "messages": CHAT, "stream": True})
    reply = Reply("g5", MODEL, body, (1, 2), None)

    async def failing():
        yield Piece("a", (5,), 1)
        raise DatabaseUnavailable("OperationalError", 1000)  # the resume buffer's next read

    lines = b"".join(asyncio.run(collect(stream(reply, failing())))).decode().split("\n\n")
    chunks = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
    assert chunks[-2]["choices"][0]["delta"].get("content") == "a"  # what came before the failure went out
    assert chunks[-1] == {"error": {"message": "the database is unavailable; retry later", "type": "server_error",
                                    "param": None, "code": "database_unavailable"}}
    assert [line for line in lines if line][-1] == "data: [DONE]"
