"""The gateway's OpenAPI document, made to say what the gateway really answers.

FastAPI documents 422 for every validated route, but the gateway answers
400 in its own error shape; and the OpenAI-compatible routes read their body
themselves, so FastAPI cannot see it. This fills in both: per operation the
statuses of `RESPONSES` (errors in `Error` or `OpenAIError` shape), and the
request bodies of `/v1/completions` and `/v1/chat/completions`. The schema
fuzz test (tests/controlplane/test_api_fuzz.py) holds the gateway to it.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from producers.gateway.openai.requests import ChatCompletionRequest, CompletionRequest
from producers.gateway.openai.tokenize import DetokenizeRequest, TokenizeRequest

ADMISSION = ("400", "401", "404", "409", "413", "429", "503", "504")
# (method, path) -> error statuses besides the documented successes. Every route with a key may answer 429
# auth_rate_limited (producers/gateway/auth/authenticator.py); streams also 429 too_many_streams (admission/slots.py).
RESPONSES: dict[tuple[str, str], tuple[str, ...]] = {
    ("post", "/v1/generations"): ADMISSION,
    # 503 generation_unavailable: the caller's own id, not readable in read_your_writes_wait_s (native/lookup.py)
    ("get", "/v1/generations/{generation_id}"): ("401", "404", "429", "503"),
    ("get", "/v1/generations/{generation_id}/events"): ("400", "401", "404", "410", "429", "503"),
    ("post", "/v1/generations/{generation_id}/cancel"): ("401", "404", "429", "503"),
    ("get", "/v1/usage"): ("400", "401", "429", "503"),
    ("get", "/v1/generations/{generation_id}/usage"): ("401", "404", "429", "503"),
    ("get", "/v1/statements/{period}"): ("400", "401", "404", "429", "503"),
    ("get", "/readyz"): ("503",),
    ("get", "/health"): ("503",),
    ("post", "/tokenize"): ("400", "401", "404", "413", "429", "503"),
    ("post", "/detokenize"): ("400", "401", "404", "413", "429", "503"),
    ("get", "/v1/models"): ("401", "429"),
    ("get", "/v1/models/{name}"): ("401", "404", "429"),
    ("post", "/v1/completions"): ADMISSION,
    ("post", "/v1/chat/completions"): ADMISSION,
}
SUCCESSES: dict[tuple[str, str], tuple[str, ...]] = {
    ("post", "/v1/generations"): ("200", "201"),
    ("get", "/v1/generations/{generation_id}/events"): ("200", "204"),
    ("post", "/v1/generations/{generation_id}/cancel"): ("200", "202"),
}
OPENAI_BODIES: dict[str, type[BaseModel]] = {"/v1/completions": CompletionRequest,
                                             "/v1/chat/completions": ChatCompletionRequest,
                                             "/tokenize": TokenizeRequest, "/detokenize": DetokenizeRequest}
ERROR_SCHEMAS = {
    "Error": {"type": "object", "required": ["code", "message", "details"],
              "properties": {"code": {"type": "string"}, "message": {"type": "string"},
                             "details": {"type": "object"}}},
    "OpenAIError": {"type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["message", "type", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}}},
}


def _error(schema: str) -> dict[str, Any]:
    return {"description": "error", "content": {"application/json": {"schema": {
        "$ref": f"#/components/schemas/{schema}"}}}}


def _document_body(doc: dict[str, Any], path: str, model: type[BaseModel]) -> None:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    doc["components"]["schemas"].update(schema.pop("$defs", {}))
    doc["components"]["schemas"][model.__name__] = schema
    doc["paths"][path]["post"]["requestBody"] = {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}


def build(app: FastAPI) -> dict[str, Any]:
    doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
    doc.setdefault("components", {}).setdefault("schemas", {}).update(ERROR_SCHEMAS)
    for path, model in OPENAI_BODIES.items():
        _document_body(doc, path, model)
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            for status in SUCCESSES.get((method, path), ()):
                responses.setdefault(status, {"description": "success"})
            shape = "OpenAIError" if path in OPENAI_BODIES or path.startswith("/v1/models") else "Error"
            for status in RESPONSES.get((method, path), ()):
                responses[status] = _error(shape)
    return doc


def install(app: FastAPI) -> None:
    """Serve the corrected document at /openapi.json (built once, on first request)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build(app)
        return app.openapi_schema

    app.openapi = openapi
