"""An intake record -> the gateway's `GenerationRequest`, or the refusal the tenant reads on its results topic.

The record is validated twice: as the versioned wire record (`schemas.intake.GenerationRequested`), then as
the body `POST /v1/generations` takes, so a Kafka request is held to exactly the HTTP path's bounds and named
fields.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from producers.gateway.admission.requests import GenerationRequest
from schemas.intake import SCHEMA_VERSIONS, GenerationRequested, GenerationResult


@dataclass(frozen=True)
class IntakeRequest:
    """A valid record: the HTTP body it stands for, and what only the Kafka API asks (tokens in the result)."""

    body: GenerationRequest
    include_tokens: bool = False


@dataclass(frozen=True)
class Refusal:
    """Why a record is not a request; `request_id` None: there is nobody to answer (a dead letter instead)."""

    request_id: str | None
    error_code: str
    reason: str
    field: str | None = None

    def result(self, tenant_id: str) -> GenerationResult:
        assert self.request_id is not None
        return GenerationResult(request_id=self.request_id, tenant_id=tenant_id, status="rejected",
                                error_code=self.error_code, reason=self.reason, field=self.field)


def _field_and_reason(exc: ValidationError) -> tuple[str | None, str]:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    field = ".".join(str(p) for p in first["loc"]) or None
    return field, f"{field or 'record'}: {first['msg']}"


def _request_id_of(raw: object) -> str | None:
    value = raw.get("requestId") if isinstance(raw, dict) else None
    return value if isinstance(value, str) and 0 < len(value) <= 256 else None


def parse_request(value: bytes | None) -> IntakeRequest | Refusal:
    """The request a record holds, or why it holds none."""
    try:
        raw = json.loads(value or b"")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Refusal(None, "invalid_json", f"not UTF-8 JSON: {type(exc).__name__}")
    request_id = _request_id_of(raw)
    if not isinstance(raw, dict):
        return Refusal(None, "invalid_json", f"expected a JSON object, got {type(raw).__name__}")
    version = raw.get("schemaVersion", 1)
    if version not in SCHEMA_VERSIONS:
        return Refusal(request_id, "unsupported_schema_version",
                       f"schemaVersion {version!r} is not one of {sorted(SCHEMA_VERSIONS)}", "schemaVersion")
    try:
        wire = GenerationRequested.model_validate(raw)
        return IntakeRequest(GenerationRequest.model_validate(wire.http_body()), wire.include_tokens)
    except ValidationError as exc:
        field, reason = _field_and_reason(exc)
        return Refusal(request_id, "invalid_request", reason, field)
