"""Bad input against a real gateway process: a schema fuzz from its OpenAPI document, then named cases.

The gateway runs as `ledgerlm gateway` (uvicorn) in front of the session's controller and worker.
Every answer must be a status the document lists for the operation; no 5xx but a documented 503;
every 4xx a JSON body whose message names the problem; nothing may hang (a 15 s client timeout);
and the worker behind it still serves afterwards.
"""
from __future__ import annotations

import asyncio
import uuid

import httpx
import pytest

from tests.controlplane.conftest import body, free_port, start_gateway_process

MAX_EXAMPLES = 12  # per operation and mode: 12 operations x 2 modes, bounded well under a minute

# Issue 15's hidden inputs: each passed the gateway's validation and then killed a worker's engine thread or
# stopped its dispatch loop. (OpenAI field, value, other fields, the field a 400 must name or None: served.)
HIDDEN_INPUTS = [
    ("stop_token_ids", [1_000_000_000], {"min_tokens": 1}, "stop_token_ids"),
    ("temperature", 1e-45, {}, None),  # below MIN_TEMPERATURE: served greedily
    ("top_p", 1e-12, {"temperature": 1.0}, None),  # the most likely token always stays: greedy
    ("stop", [f"stop-{i}" for i in range(17)], {}, "stop"),
    ("stop", ["x" * 300], {}, "stop"),
    ("stop", ["y" * 1000] * 1000, {}, "stop"),  # about 1 MB, under the 2 MiB body limit
]
NATIVE_NAMES = {"stop_token_ids": "stopTokenIds", "min_tokens": "minTokens", "top_p": "topP"}
GENERATION_ROUTES = ("/v1/generations", "/v1/completions", "/v1/chat/completions")


def hidden_body(path: str, model: str, fields: dict) -> dict:
    """A request carrying `fields` (OpenAI names) on `path`, in that route's own shape."""
    if path == "/v1/generations":
        return {"requestId": f"hidden-{uuid.uuid4().hex[:10]}", "model": model, "input": "the water is",
                "maxOutputTokens": 4, **{NATIVE_NAMES.get(k, k): v for k, v in fields.items()}}
    prompt = {"prompt": "the water is"} if path == "/v1/completions" else {
        "messages": [{"role": "user", "content": "the water is"}]}
    return {"model": model, "max_tokens": 4, **prompt, **fields}


def named_field(path: str, response) -> str | None:
    """The field a 400 names, in OpenAI's terms."""
    payload = response.json()
    if path != "/v1/generations":
        return payload["error"]["param"]
    details = payload["details"]
    native = (details.get("fields") or [details.get("field")])[0]
    return {v: k for k, v in NATIVE_NAMES.items()}.get(native, native)


@pytest.fixture(scope="module")
async def gateway_url(cp_env, controller, worker, tmp_path_factory):
    port = free_port()
    proc = await start_gateway_process(cp_env, tmp_path_factory.mktemp("fuzz-gateway") / "gateway.log", port)
    url = f"http://127.0.0.1:{port}"
    yield url
    proc.stop()


def message_of(response) -> str | None:
    try:
        payload = response.json()
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    if isinstance(payload.get("error"), dict):  # OpenAI's shape
        return payload["error"].get("message")
    return payload.get("message") if payload.get("code") else None


def judge(status: int, documented: dict, response) -> str | None:
    """What is wrong with this answer, or None."""
    if status >= 500 and not (status == 503 and "503" in documented):
        return f"server error {status}: {response.text[:200]}"
    if str(status) not in documented:
        return f"undocumented status {status}: {response.text[:200]}"
    if 400 <= status < 500 and not message_of(response):
        return f"{status} without a message naming the problem: {response.text[:200]}"
    return None


def fuzz(url: str, headers: dict[str, str], model: str) -> tuple[int, list[str]]:
    """Issue 15's hidden inputs as explicit cases, then every operation of the document in positive and
    negative mode; (cases sent, problems found)."""
    import schemathesis
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    paths = schema.raw_schema["paths"]
    problems: list[str] = []
    sent = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        documented = paths[operation.path][operation.method.lower()]["responses"]
        if operation.method.lower() == "post" and operation.path in GENERATION_ROUTES:
            for name, value, others, _ in HIDDEN_INPUTS:
                case = operation.Case(body=hidden_body(operation.path, model, {name: value, **others}),
                                      media_type="application/json")
                sent += 1
                response = case.call(base_url=url, headers=headers, timeout=15)
                problem = judge(response.status_code, documented, response)
                if problem:
                    problems.append(f"{operation.label} [hidden {name}]: {problem}")
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                      phases=[Phase.generate], suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                nonlocal sent
                sent += 1
                try:
                    response = case.call(base_url=url, headers=headers, timeout=15)
                except Exception as exc:  # a hang (timeout) or a dropped connection is a finding too
                    problems.append(f"{operation.label} [{mode.value}]: {type(exc).__name__}")
                    return
                problem = judge(response.status_code, documented, response)
                if problem:
                    problems.append(f"{operation.label} [{mode.value}]: {problem}")

            try:
                run()
            except Unsatisfiable:  # negative mode of an operation without inputs: nothing to break
                assert mode is GenerationMode.NEGATIVE, operation.label
    return sent, problems


async def test_the_openapi_document_holds_under_schema_fuzzing(gateway_url, tenants, versions):
    sent, problems = await asyncio.to_thread(fuzz, gateway_url, tenants["main"].headers, versions["served"])
    assert sent >= 100
    assert not problems, "\n".join(problems[:20])
    # Whatever the fuzz sent, the worker behind the gateway still serves.
    served = await post(gateway_url, "/v1/generations?wait=true", tenants["main"].headers,
                        json=body(model=versions["served"], maxOutputTokens=4))
    assert (served.status_code, served.json()["status"]) == (201, "completed"), served.text


@pytest.mark.parametrize("path", GENERATION_ROUTES)
@pytest.mark.parametrize("name, value, others, field", HIDDEN_INPUTS,
                         ids=["stop-id-outside-vocab", "temperature-1e-45", "top-p-1e-12", "17-stops",
                              "300-char-stop", "1MB-stops"])
async def test_hidden_inputs_are_400s_naming_the_field_or_served_greedily(gateway_url, tenants, versions, path,
                                                                          name, value, others, field):
    model, headers = versions["served"], tenants["main"].headers
    route = path + ("?wait=true" if path == "/v1/generations" else "")
    response = await post(gateway_url, route, headers, json=hidden_body(path, model, {name: value, **others}))
    if field is not None:
        assert response.status_code == 400, response.text[:300]
        assert named_field(path, response) == field, response.text[:300]
        return
    greedy = await post(gateway_url, route, headers, json=hidden_body(path, model, {"temperature": 0}))
    assert response.status_code in (200, 201) and greedy.status_code in (200, 201), response.text[:300]
    assert output_text(path, response) == output_text(path, greedy)


def output_text(path: str, response) -> str:
    payload = response.json()
    if path == "/v1/generations":
        assert payload["status"] == "completed", payload
        return payload["text"]
    choice = payload["choices"][0]
    return choice["text"] if path == "/v1/completions" else choice["message"]["content"]


async def post(url: str, path: str, headers: dict, **kwargs) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(f"{url}{path}", headers=headers, **kwargs)


async def test_an_oversized_body_is_413_in_the_routes_shape(gateway_url, tenants, cp_settings):
    headers = tenants["main"].headers
    big = b"x" * (cp_settings.max_request_body_bytes + 1)
    native = await post(gateway_url, "/v1/generations", headers, content=big)
    assert native.status_code == 413
    assert native.json()["code"] == "body_too_large" and str(cp_settings.max_request_body_bytes) in \
        native.json()["message"]
    openai = await post(gateway_url, "/v1/chat/completions", headers, content=big)
    assert openai.status_code == 413 and openai.json()["error"]["code"] == "body_too_large"

    async def chunks():  # no Content-Length: the limit holds while the body streams in
        for _ in range(4):
            yield b"y" * (cp_settings.max_request_body_bytes // 2)

    streamed = await post(gateway_url, "/v1/generations", headers, content=chunks())
    assert streamed.status_code == 413 and streamed.json()["code"] == "body_too_large"


async def test_invalid_utf8_is_400_invalid_json(gateway_url, tenants):
    headers = {**tenants["main"].headers, "Content-Type": "application/json"}
    raw = b'{"requestId": "r-\xff\xfe", "model": "m@1", "input": "x", "maxOutputTokens": 4}'
    native = await post(gateway_url, "/v1/generations", headers, content=raw)
    assert native.status_code == 400 and native.json()["code"] == "invalid_json"
    assert "UTF-8" in native.json()["message"]
    openai = await post(gateway_url, "/v1/completions", headers, content=raw)
    assert openai.status_code == 400 and openai.json()["error"]["code"] == "invalid_json"
    assert "UTF-8" in openai.json()["error"]["message"]


async def test_a_body_that_is_not_json_is_400_invalid_json(gateway_url, tenants):
    headers = {**tenants["main"].headers, "Content-Type": "application/json"}
    native = await post(gateway_url, "/v1/generations", headers, content=b'{"requestId": ')
    assert native.status_code == 400 and native.json()["code"] == "invalid_json", native.text
    assert native.json()["message"].startswith("the body is not JSON")


@pytest.mark.parametrize("field, value", [
    ("maxOutputTokens", 10**12), ("maxOutputTokens", -1), ("maxOutputTokens", 0), ("maxOutputTokens", 2.5),
    ("maxOutputTokens", "8"), ("maxOutputTokens", True), ("topK", -3), ("topK", 1.5), ("seed", -1),
    ("temperature", -0.5), ("mystery", 1), ("completionWindowS", 30), ("completionWindowS", "24h"),
])
async def test_bad_fields_are_400_naming_the_field(gateway_url, tenants, versions, field, value):
    request = {**body(model=versions["served"]), field: value}
    response = await post(gateway_url, "/v1/generations", tenants["main"].headers, json=request)
    assert response.status_code == 400, response.text
    assert response.json()["code"] == "invalid_request"
    assert response.json()["details"]["fields"][0] == field and response.json()["message"].startswith(field)


async def test_output_beyond_the_context_is_400_naming_the_limit(gateway_url, tenants, versions):
    request = body(model=versions["served"], maxOutputTokens=999_999)
    response = await post(gateway_url, "/v1/generations", tenants["main"].headers, json=request)
    assert response.status_code == 400 and response.json()["code"] == "context_length_exceeded", response.text


async def test_unknown_models_are_404_naming_the_model(gateway_url, tenants):
    headers = tenants["main"].headers
    native = await post(gateway_url, "/v1/generations", headers, json=body(model="no-such-model@9"))
    assert native.status_code == 404 and native.json()["details"]["model"] == "no-such-model@9"
    openai = await post(gateway_url, "/v1/chat/completions", headers,
                        json={"model": "no-such-model@9", "messages": [{"role": "user", "content": "hi"}]})
    assert openai.status_code == 404 and "no-such-model@9" in openai.json()["error"]["message"]


@pytest.mark.parametrize("field, value", [("max_tokens", -1), ("max_tokens", 10**12), ("max_tokens", 2.5),
                                          ("mystery", 1)])
async def test_bad_openai_fields_are_400_naming_the_field(gateway_url, tenants, versions, field, value):
    request = {"model": versions["served"], "prompt": "the water is", field: value}
    response = await post(gateway_url, "/v1/completions", tenants["main"].headers, json=request)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == field or field in response.json()["error"]["message"]
