"""Bad input against a real gateway process: a schema fuzz from its OpenAPI document, then named cases.

The gateway runs as `ledgerlm gateway` (uvicorn) in front of the session's controller and worker.
Every answer must be a status the document lists for the operation; no 5xx but a documented 503;
every 4xx a JSON body whose message names the problem; nothing may hang (a 15 s client timeout).
"""
from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from tests.controlplane.conftest import Process, body

MAX_EXAMPLES = 12  # per operation and mode: 12 operations x 2 modes, bounded well under a minute


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
async def gateway_url(cp_env, controller, worker, tmp_path_factory):
    port = free_port()
    proc = Process(["gateway", "--port", str(port)], cp_env,
                   tmp_path_factory.mktemp("fuzz-gateway") / "gateway.log").start()
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(timeout=5) as client:
        for _ in range(300):
            assert proc.proc.poll() is None, proc.log.read_text()[-3000:]
            try:
                if (await client.get(f"{url}/readyz")).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.2)
        else:
            raise AssertionError(f"gateway not ready:\n{proc.log.read_text()[-3000:]}")
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


def fuzz(url: str, headers: dict[str, str]) -> tuple[int, list[str]]:
    """Run every operation of the document in positive and negative mode; (cases sent, problems found)."""
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


async def test_the_openapi_document_holds_under_schema_fuzzing(gateway_url, tenants):
    sent, problems = await asyncio.to_thread(fuzz, gateway_url, tenants["main"].headers)
    assert sent >= 100
    assert not problems, "\n".join(problems[:20])


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
    ("temperature", -0.5), ("mystery", 1),
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
