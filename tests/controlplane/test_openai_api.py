"""The OpenAI-compatible API through the official `openai` client, on the real control plane."""
from __future__ import annotations

import json
import uuid

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from producers.gateway.admission.requests import GenerationRequest
from producers.gateway.errors import ApiError
from producers.gateway.openai.api import error_response
from producers.gateway.openai.requests import ChatCompletionRequest, CompletionRequest
from tests.controlplane.conftest import body

CHAT = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the water is"}]


def make_client(gateway, api_key: str) -> AsyncOpenAI:
    """The official client on the in-process app (the `gateway` fixture's ASGI transport), no retries."""
    return AsyncOpenAI(api_key=api_key, base_url="http://gateway/v1", max_retries=0,
                       http_client=httpx.AsyncClient(transport=gateway._transport, base_url="http://gateway"))


@pytest.fixture
async def client(gateway, tenants):
    made = make_client(gateway, tenants["main"].api_key)
    yield made
    await made.close()


def prompt_tokens(gateway, model: str, **fields) -> int:
    native = GenerationRequest(request_id="probe", model=model, max_output_tokens=1, **fields)
    return len(gateway.gateway.catalog.render(native, 10**6).token_ids)


async def test_models_list_registered_versions_and_need_a_key(gateway, controller, client, versions):
    listed = await client.models.list()
    ids = [m.id for m in listed.data]
    assert set(versions.values()) <= set(ids) and ids == sorted(ids)
    card = await client.models.retrieve(versions["served"])
    assert (card.id, card.object, card.owned_by) == (versions["served"], "model", "ledgerlm")
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.models.retrieve("nope@9")
    assert unknown.value.code == "unknown_model" and unknown.value.type == "not_found_error"
    anonymous = make_client(gateway, "llm_not-a-key")
    with pytest.raises(openai.AuthenticationError) as refused:
        await anonymous.chat.completions.create(model=versions["served"], messages=CHAT, max_tokens=2)
    assert refused.value.status_code == 401
    assert refused.value.body == {"message": "a valid API key is required (Authorization: Bearer <key>)",
                                  "type": "authentication_error", "param": None, "code": "unauthorized"}
    await anonymous.close()


async def test_chat_non_stream_returns_text_finish_reason_and_usage(gateway, worker, client, versions):
    model = versions["served"]
    answer = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=5, temperature=0)
    view = gateway.gateway.bridge.view(answer.id)
    assert answer.object == "chat.completion" and answer.model == model and len(answer.choices) == 1
    choice = answer.choices[0]
    assert (choice.finish_reason, choice.message.role) == ("length", "assistant")
    assert choice.message.content == view.text and len(view.tokens) == 5
    expected_prompt = prompt_tokens(gateway, model, messages=CHAT)
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens, answer.usage.total_tokens) == (
        expected_prompt, 5, expected_prompt + 5)


async def test_chat_stream_sends_role_deltas_finish_then_usage_chunk_and_done(gateway, worker, client, versions):
    model = versions["served"]
    stream = await client.chat.completions.create(model=model, messages=CHAT, max_completion_tokens=6,
                                                  temperature=0, stream=True,
                                                  stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    gen_id = chunks[0].id
    view = gateway.gateway.bridge.view(gen_id)
    assert {c.id for c in chunks} == {gen_id} and {c.object for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == view.text and len(view.tokens) == 6
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 2) + ["length"]
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    expected_prompt = prompt_tokens(gateway, model, messages=CHAT)
    assert last.choices == [] and (last.usage.prompt_tokens, last.usage.completion_tokens,
                                   last.usage.total_tokens) == (expected_prompt, 6, expected_prompt + 6)


async def test_completion_stream_and_non_stream_match_the_native_greedy_text(gateway, worker, tenants, client,
                                                                             versions):
    model = versions["served"]
    native = await gateway.post("/v1/generations?wait=true", headers=tenants["main"].headers,
                                json=body(model=model, input="the water is", maxOutputTokens=4))
    expected = native.json()["text"]
    plain = await client.completions.create(model=model, prompt="the water is", max_tokens=4, temperature=0)
    assert plain.object == "text_completion" and plain.choices[0].text == expected
    assert plain.choices[0].finish_reason == "length"
    assert (plain.usage.prompt_tokens, plain.usage.completion_tokens) == (native.json()["inputTokens"], 4)
    stream = await client.completions.create(model=model, prompt=["the water is"], max_tokens=4, temperature=0,
                                             stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].text for c in chunks[:-1]) == expected
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert len({plain.id, chunks[0].id, native.json()["id"]}) == 3


async def test_stream_without_include_usage_has_no_usage_chunk_and_ends_with_done(gateway, worker, tenants,
                                                                                   versions):
    response = await gateway.post("/v1/completions", headers=tenants["main"].headers,
                                  json={"model": versions["served"], "prompt": "the water is", "max_tokens": 3,
                                        "stream": True})
    lines = [line for line in response.text.split("\n\n") if line]
    assert response.status_code == 200 and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
    assert all(len(c["choices"]) == 1 and "usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_idempotency_key_repeat_is_the_same_generation_and_a_changed_body_conflicts(
        gateway, worker, client, versions):
    model, key = versions["served"], f"idem-{uuid.uuid4().hex[:10]}"
    headers = {"Idempotency-Key": key}
    first = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=3, temperature=0,
                                                 extra_headers=headers)
    again = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=3, temperature=0,
                                                 extra_headers=headers)
    assert again.id == first.id
    assert again.choices[0].message.content == first.choices[0].message.content
    assert again.usage.completion_tokens == first.usage.completion_tokens == 3
    assert gateway.gateway.bridge.view(first.id).request_id == key
    with pytest.raises(openai.ConflictError) as conflict:
        await client.chat.completions.create(model=model, messages=CHAT, max_tokens=4, temperature=0,
                                             extra_headers=headers)
    assert conflict.value.code == "request_id_conflict" and conflict.value.type == "conflict_error"
    assert conflict.value.response.headers["x-should-retry"] == "false"
    fresh = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=3, temperature=0)
    assert fresh.id != first.id


async def test_stop_token_ids_top_k_and_seed_reach_the_engine(gateway, worker, client, versions):
    model = versions["served"]
    greedy = await client.completions.create(model=model, prompt="the water is", max_tokens=3, temperature=0)
    first_token = gateway.gateway.bridge.view(greedy.id).tokens[0].token_ids[0]
    stopped = await client.completions.create(model=model, prompt="the water is", max_tokens=3, temperature=0,
                                              seed=7, extra_body={"top_k": -1, "stop_token_ids": [first_token]})
    assert stopped.id != greedy.id
    assert (stopped.choices[0].finish_reason, stopped.usage.completion_tokens, stopped.choices[0].text) == (
        "stop", 1, "")
    sampled = [await client.completions.create(model=model, prompt="the water is", max_tokens=6, temperature=1.5,
                                               seed=11, extra_body={"top_k": 5}) for _ in range(2)]
    assert sampled[0].id != sampled[1].id and sampled[0].choices[0].text == sampled[1].choices[0].text


async def test_min_tokens_and_ignore_eos_reach_the_engine(gateway, worker, client, versions):
    model = versions["served"]
    greedy = await client.completions.create(model=model, prompt="the water is", max_tokens=3, temperature=0)
    first_token = gateway.gateway.bridge.view(greedy.id).tokens[0].token_ids[0]
    # The stop token id may not end the generation before min_tokens: the engine must pick something else.
    held = await client.completions.create(model=model, prompt="the water is", max_tokens=3, temperature=0,
                                           extra_body={"stop_token_ids": [first_token], "min_tokens": 3})
    tokens = [t for event in gateway.gateway.bridge.view(held.id).tokens for t in event.token_ids]
    assert (held.choices[0].finish_reason, held.usage.completion_tokens) == ("length", 3)
    assert first_token not in tokens
    # ignore_eos is part of the effective request: the same Idempotency-Key with it flipped is another payload.
    key = {"Idempotency-Key": uuid.uuid4().hex}
    await client.completions.create(model=model, prompt="the water is", max_tokens=2, temperature=0,
                                    extra_headers=key)
    with pytest.raises(openai.ConflictError):
        await client.completions.create(model=model, prompt="the water is", max_tokens=2, temperature=0,
                                        extra_headers=key, extra_body={"ignore_eos": True})


@pytest.mark.parametrize("fields, param", [
    ({"n": 17}, "n"),
    ({"extra_body": {"min_tokens": 3}}, "min_tokens"),  # more than max_tokens
    ({"extra_body": {"ignore_eos": "sometimes"}}, "ignore_eos"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"extra_body": {"best_of": 3}}, "best_of"),
    ({"extra_body": {"no_such_field": 1}}, "no_such_field"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 600}, "max_tokens"),  # 600 output tokens exceed the 512-token context
    ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
])
async def test_unsupported_or_invalid_fields_are_400_naming_the_field(gateway, controller, client, versions,
                                                                      fields, param):
    fields = {"max_tokens": 2, **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.completions.create(model=versions["served"], prompt="the water is", **fields)
    assert refused.value.status_code == 400 and refused.value.param == param
    assert refused.value.type == "invalid_request_error"


async def test_min_tokens_beyond_the_room_left_for_chat_without_a_limit_is_400(gateway, controller, client,
                                                                              versions):
    # No max_tokens: the limit is the rest of the 512-token context, which 600 tokens cannot fit in.
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=versions["served"], messages=CHAT, extra_body={"min_tokens": 600})
    assert refused.value.param == "min_tokens" and "exceeds max_tokens" in refused.value.message


async def test_neutral_values_of_unsupported_fields_are_accepted(gateway, worker, client, versions):
    answer = await client.chat.completions.create(
        model=versions["served"], messages=[{"role": "developer", "content": [{"type": "text", "text": "hi"}]},
                                            {"role": "user", "content": "the water is"}],
        max_tokens=2, temperature=0, n=1, presence_penalty=0, frequency_penalty=0.0, logprobs=False, user="u-1",
        extra_body={"ignore_eos": False, "min_tokens": 0})
    assert answer.usage.completion_tokens == 2


async def test_no_worker_for_the_version_is_503_with_retry_after_in_openai_shape(gateway, controller, tenants,
                                                                                versions):
    response = await gateway.post("/v1/chat/completions", headers=tenants["main"].headers,
                                  json={"model": versions["idle"], "messages": CHAT, "max_tokens": 2})
    assert response.status_code == 503 and response.headers["Retry-After"] in ("1", "2")
    assert response.json() == {"error": {"message": response.json()["error"]["message"], "type": "server_error",
                                         "param": None, "code": "no_capacity"}}


def test_error_shape_keeps_status_retry_after_and_maps_native_fields():
    throttled = error_response(ApiError(429, "concurrency", "too many", {"requestId": "r"}, retry_after_ms=1200))
    assert throttled.status_code == 429 and throttled.headers["Retry-After"] == "2"
    assert json.loads(throttled.body) == {"error": {"message": "too many", "type": "rate_limit_error",
                                                    "param": None, "code": "concurrency"}}
    too_long = error_response(ApiError(400, "context_length_exceeded", "x", {"field": "maxOutputTokens"}))
    assert json.loads(too_long.body)["error"]["param"] == "max_tokens" and "retry-after" not in too_long.headers


def test_request_translation_defaults_and_message_parts():
    chat = ChatCompletionRequest.model_validate({"model": "m@1", "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "user", "content": "q"}], "top_k": -1, "service_tier": "flex"})
    native = chat.native("rid", 7)
    assert [(m.role, m.content) for m in native.messages] == [("system", "a\nb"), ("user", "q")]
    assert (native.temperature, native.top_p, native.top_k, native.tier, native.max_output_tokens) == (
        1.0, 1.0, 0, "batch", 7)
    assert chat.requested_max_tokens() is None
    assert CompletionRequest.model_validate({"model": "m@1", "prompt": "p"}).requested_max_tokens() == 16
    assert CompletionRequest.model_validate({"model": "m@1", "prompt": "p", "max_completion_tokens": 9}
                                            ).requested_max_tokens() == 9


async def test_a_repeat_this_gateway_no_longer_holds_is_answered_from_the_projections(
        gateway, worker, client, versions, bootstrap, database_url):
    from tests.controlplane.test_projected_billing import project_all

    model, headers = versions["served"], {"Idempotency-Key": f"idem-{uuid.uuid4().hex[:10]}"}
    first = await client.completions.create(model=model, prompt="the water is", max_tokens=4, temperature=0,
                                            extra_headers=headers)
    await project_all(bootstrap, database_url)
    del gateway.gateway.bridge.views[first.id]  # as a gateway that did not see it (restarted, or another one)
    again = await client.completions.create(model=model, prompt="the water is", max_tokens=4, temperature=0,
                                            extra_headers=headers)
    assert gateway.gateway.bridge.view(first.id) is None
    assert (again.id, again.choices[0].text, again.choices[0].finish_reason) == (
        first.id, first.choices[0].text, "length")
    assert again.usage == first.usage
