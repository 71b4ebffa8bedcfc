"""OpenAI/vLLM parity (issue 14) through the official `openai` client, on the real control plane (tiny model)."""
from __future__ import annotations

import json
from collections import Counter

import openai
import psycopg
import pytest
import torch

from tests.controlplane.conftest import body, parse_sse, post_until_admitted
from tests.controlplane.test_openai_api import CHAT, make_client, prompt_tokens
from tests.waiting import wait_until

LONG_CHAT = [{"role": "user", "content": "the water is cold, the sky is grey, and the wind comes from the sea"}]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "color"],
          "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
                         "color": {"enum": ["red", "green", "blue"]}}}


@pytest.fixture
async def client(gateway, tenants):
    made = make_client(gateway, tenants["main"].api_key)
    yield made
    await made.close()


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def check_schema(value: dict) -> None:
    assert set(value) == {"ok", "n", "color"}
    assert isinstance(value["ok"], bool) and 0 <= value["n"] <= 99 and value["color"] in ("red", "green", "blue")


async def test_health_models_and_vllm_tokenizer_routes(gateway, controller, tenants, versions):
    headers, model = tenants["main"].headers, versions["served"]
    health = await gateway.get("/health")
    assert health.status_code == 200 and health.content == b""
    card = (await gateway.get(f"/v1/models/{model}", headers=headers)).json()
    assert card["max_model_len"] == 512 and card["owned_by"] == "ledgerlm" and card["created"] > 0
    tokens = (await gateway.post("/tokenize", headers=headers, json={"model": model, "prompt": "the water is"})).json()
    assert tokens["tokens"] and tokens["count"] == len(tokens["tokens"]) == prompt_tokens(gateway, model,
                                                                                          input="the water is")
    assert tokens["max_model_len"] == 512 and tokens["token_strs"] is None
    chat = (await gateway.post("/tokenize", headers=headers, json={"model": model, "messages": CHAT})).json()
    assert chat["count"] == prompt_tokens(gateway, model, messages=CHAT)
    text = (await gateway.post("/detokenize", headers=headers, json={"model": model, "tokens": tokens["tokens"]}))
    assert text.json() == {"prompt": "the water is"}
    outside = await gateway.post("/detokenize", headers=headers, json={"model": model, "tokens": [512]})
    assert outside.status_code == 400 and outside.json()["error"]["param"] == "tokens"
    assert (await gateway.post("/tokenize", json={"model": model, "prompt": "x"})).status_code == 401
    unknown = await gateway.post("/tokenize", headers=headers, json={"model": "nope@1", "prompt": "x"})
    assert unknown.status_code == 404


async def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(gateway, worker, client, versions):
    model = versions["served"]
    stream = await client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=5, temperature=0, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})
    chunks = [chunk async for chunk in stream]
    prompt = prompt_tokens(gateway, model, messages=CHAT)
    counts = [c.usage.completion_tokens for c in chunks]
    assert all(c.usage is not None and c.usage.prompt_tokens == prompt for c in chunks)
    assert counts == sorted(counts) and counts[-1] == 5 and counts[0] == 0
    assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == prompt + 5


async def test_greedy_token_logprob_is_the_max_of_its_top_logprobs(gateway, worker, client, versions):
    model = versions["served"]
    answer = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=6, temperature=0,
                                                  logprobs=True, top_logprobs=4)
    content = answer.choices[0].logprobs.content
    assert len(content) == 6 == answer.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 4
        assert entry.logprob == max(t.logprob for t in entry.top_logprobs) == entry.top_logprobs[0].logprob
        assert entry.token == entry.top_logprobs[0].token and bytes(entry.bytes).decode(errors="replace") == entry.token
    stream = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=6, temperature=0,
                                                  logprobs=True, top_logprobs=4, stream=True)
    streamed = [e for c in [c async for c in stream] if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]


async def test_echo_with_max_tokens_0_scores_the_prompt_like_transformers_and_bills_it_as_input(
        gateway, worker, client, versions, hf_model, bootstrap, database_url):
    from tests.controlplane.test_projected_billing import project_all

    model, text = versions["served"], "the water is cold and the sky is"
    scored = await client.completions.create(model=model, prompt=text, max_tokens=0, echo=True, logprobs=2)
    ids = gateway.gateway.catalog.encode(gateway.gateway.catalog.target(model), text, None)
    choice = scored.choices[0]
    assert choice.text == text and choice.finish_reason == "length"
    assert (scored.usage.prompt_tokens, scored.usage.completion_tokens) == (len(ids), 0)
    with torch.inference_mode():
        want = torch.log_softmax(hf_model(torch.tensor([list(ids)])).logits[0, :-1].float(), dim=-1)
    got = choice.logprobs.token_logprobs
    assert got[0] is None and len(got) == len(ids)
    assert max(abs(got[i + 1] - want[i, ids[i + 1]].item()) for i in range(len(ids) - 1)) < 1e-4
    assert choice.logprobs.top_logprobs[0] is None and all(len(t) <= 3 for t in choice.logprobs.top_logprobs[1:])
    assert choice.logprobs.text_offset[0] == 0 and "".join(choice.logprobs.tokens) == text
    await project_all(bootstrap, database_url)
    with psycopg.connect(database_url) as conn:
        billed = conn.execute("SELECT billed_input_tokens, billed_output_tokens FROM billing_ledger "
                              "WHERE generation_id = %s", (scored.id,)).fetchone()
    assert billed == (len(ids), 0)


async def test_logit_bias_bans_tokens_and_penalties_reduce_repeats(gateway, worker, client, versions):
    model = versions["served"]
    greedy = await client.completions.create(model=model, prompt="the water is", max_tokens=12, temperature=0)
    tokens = [t for e in gateway.gateway.bridge.view(greedy.id).tokens for t in e.token_ids]
    banned = await client.completions.create(model=model, prompt="the water is", max_tokens=12, temperature=0,
                                             logit_bias={str(t): -100 for t in set(tokens)})
    assert not {t for e in gateway.gateway.bridge.view(banned.id).tokens for t in e.token_ids} & set(tokens)
    penalized = await client.completions.create(model=model, prompt="the water is", max_tokens=12, temperature=0,
                                                frequency_penalty=2.0)
    again = [t for e in gateway.gateway.bridge.view(penalized.id).tokens for t in e.token_ids]
    assert Counter(again).most_common(1)[0][1] <= Counter(tokens).most_common(1)[0][1] and again != tokens


async def test_json_schema_stream_parses_when_joined_and_guided_choice_picks_one(gateway, worker, client, versions):
    model = versions["served"]
    stream = await client.chat.completions.create(
        model=model, messages=CHAT, max_tokens=80, temperature=0.8, seed=5, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}})
    chunks = [c async for c in stream]
    check_schema(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)))
    assert chunks[-1].choices[0].finish_reason == "stop"
    choices = ["yes", "no", "it depends"]
    picked = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=20, temperature=1.0,
                                                  extra_body={"guided_choice": choices})
    assert picked.choices[0].message.content in choices
    regex = await client.completions.create(model=model, prompt="the water is", max_tokens=20, temperature=0,
                                            extra_body={"structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"}})
    assert len(regex.choices[0].text) == 6 and regex.choices[0].text[3] == "-"


@pytest.mark.parametrize("fields, param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objectx"}}}},
     "response_format"),
    ({"extra_body": {"guided_regex": "(("}}, "response_format"),
    ({"extra_body": {"guided_regex": "a", "guided_choice": ["a"]}}, "guided_choice"),
    ({"logit_bias": {"512": 5}}, "logit_bias"),
    ({"logit_bias": {"5": 101}}, "logit_bias"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"n": 17}, "n"),
    ({"extra_body": {"best_of": 2}}, "best_of"),
])
async def test_constraints_and_bounds_are_400_naming_the_field_before_admission(gateway, controller, client,
                                                                               versions, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model=versions["served"], messages=CHAT, max_tokens=4, **fields)
    assert refused.value.status_code == 400 and refused.value.param == param, refused.value.message


async def test_n_choices_stream_with_their_index_and_usage_and_bill_count_all_of_them(
        gateway, worker, client, versions, bootstrap, database_url):
    from tests.controlplane.test_projected_billing import project_all

    model = versions["served"]
    hits_before = worker.engine.stats().prefix_hit_tokens
    # ignore_eos: every choice runs its 6 tokens whatever its seed draws (the sampler's draws are not pinned)
    stream = await client.chat.completions.create(model=model, messages=LONG_CHAT, max_tokens=6, temperature=1.0,
                                                  seed=3, n=3, stream=True, stream_options={"include_usage": True},
                                                  extra_body={"ignore_eos": True})
    chunks = [c async for c in stream]
    texts = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
             for i in range(3)}
    finishes = {c.choices[0].index: c.choices[0].finish_reason for c in chunks
                if c.choices and c.choices[0].finish_reason}
    assert finishes == {0: "length", 1: "length", 2: "length"} and len(set(texts.values())) > 1
    usage = chunks[-1].usage
    assert usage.completion_tokens == 18 and usage.prompt_tokens == prompt_tokens(gateway, model, messages=LONG_CHAT)
    # Choices 1 and 2 start once choice 0 has run the prompt: its full blocks come from the prefix cache.
    full_blocks = (usage.prompt_tokens - 1) // 16
    assert full_blocks >= 1 and worker.engine.stats().prefix_hit_tokens - hits_before >= 2 * full_blocks * 16
    again = await client.chat.completions.create(model=model, messages=LONG_CHAT, max_tokens=6, temperature=1.0, seed=3,
                                                 n=3, extra_body={"ignore_eos": True})
    assert [c.message.content for c in again.choices] == [texts[0], texts[1], texts[2]]  # seeds seed, seed+1, ...
    assert [c.index for c in again.choices] == [0, 1, 2] and again.usage.completion_tokens == 18
    await project_all(bootstrap, database_url)
    with psycopg.connect(database_url) as conn:
        billed = conn.execute("SELECT billed_input_tokens, billed_output_tokens FROM billing_ledger "
                              "WHERE generation_id = %s", (chunks[0].id,)).fetchone()
    assert billed == (usage.prompt_tokens, 18)


async def test_cancel_of_an_n_choice_generation_ends_every_choice(gateway, paced_worker, tenants, versions):
    headers, bridge = tenants["main"].headers, gateway.gateway.bridge
    created = await post_until_admitted(gateway, "/v1/generations", headers=headers,
                                        json=body(model=versions["paced"], maxOutputTokens=400, n=3,
                                                  temperature=1.0, ignoreEos=True))
    gen_id = created.json()["id"]
    await wait_until(lambda: (v := bridge.view(gen_id)) and len({t.choice for t in v.tokens}) == 3, 20,
                     what="tokens of all three choices")
    await gateway.post(f"/v1/generations/{gen_id}/cancel", headers=headers)
    view = await wait_until(lambda: (v := bridge.view(gen_id)) and v.final and v, 20, what="the end")
    assert view.final.reason == "canceled"
    assert {t.choice: t.choice_end for t in view.tokens if t.choice_end} == {0: "canceled", 1: "canceled",
                                                                             2: "canceled"}
    assert view.final.usage.generated_output_tokens == sum(len(t.token_ids) for t in view.tokens) < 1200


async def test_native_api_takes_response_format_penalties_and_logprobs(gateway, worker, tenants, versions):
    headers, model = tenants["main"].headers, versions["served"]
    response = await gateway.post("/v1/generations", headers=headers, json=body(
        model=model, maxOutputTokens=80, stream=True, logprobs=2, promptLogprobs=1, presencePenalty=0.5,
        logitBias={"300": -100}, responseFormat={"type": "json_schema", "schema": SCHEMA}))
    events = parse_sse(response.text)
    tokens = [data for kind, data in events if kind == "token"]
    check_schema(json.loads("".join(t["textDelta"] for t in tokens)))
    scored = [e for t in tokens for e in t.get("promptLogprobs", [])]
    assert len(scored) == prompt_tokens(gateway, model, input="the water is") - 1
    generated = [e for t in tokens for e in t.get("logprobs", [])]
    assert [e["tokenId"] for e in generated] == [i for t in tokens for i in t["tokenIds"]]
    assert all(len(e["top"]) == 2 for e in generated)
    assert events[-1][0] == "final" and events[-1][1]["reason"] == "completed"
    bad = await gateway.post("/v1/generations", headers=headers, json=body(
        model=model, responseFormat={"type": "regex", "pattern": "(("}))
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_response_format"
    missing = await gateway.post("/v1/generations", headers=headers, json=body(model=model, maxOutputTokens=0))
    assert missing.status_code == 400


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "additionalProperties": False,
                                                           "required": ["city", "unit"],
                                                           "properties": {"city": {"type": "string", "maxLength": 12},
                                                                          "unit": {"enum": ["c", "f"]}}}}}


async def test_a_named_tool_choice_returns_a_tool_call_whose_arguments_fit_the_schema(gateway, worker, client,
                                                                                       versions):
    model = versions["served"]
    named = {"type": "function", "function": {"name": "get_weather"}}
    answer = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=60, temperature=0.7, seed=2,
                                                  tools=[WEATHER], tool_choice=named)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and call.type == "function" and call.id
    assert set(arguments) == {"city", "unit"} and len(arguments["city"]) <= 12 and arguments["unit"] in ("c", "f")
    stream = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=60, temperature=0.7, seed=2,
                                                  tools=[WEATHER], tool_choice=named, stream=True)
    chunks = [c async for c in stream]
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert deltas[0].function.name == "get_weather" and deltas[0].id.startswith("call-")
    assert json.loads("".join(d.function.arguments or "" for d in deltas)) == arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    required = await client.chat.completions.create(model=model, messages=CHAT, max_tokens=80, temperature=0,
                                                    tools=[WEATHER], tool_choice="required")
    assert required.choices[0].finish_reason in ("tool_calls", "length")
    if required.choices[0].finish_reason == "tool_calls":
        assert {c.function.name for c in required.choices[0].message.tool_calls} == {"get_weather"}
    history = CHAT + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                      {"role": "tool", "tool_call_id": call.id, "content": "12 degrees"}]
    follow_up = await client.chat.completions.create(model=model, messages=history, max_tokens=3, temperature=0,
                                                     tools=[WEATHER])
    assert follow_up.usage.prompt_tokens > answer.usage.prompt_tokens
