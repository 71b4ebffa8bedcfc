"""The gateway's error shapes, both of one `ApiError`: the native API's {"code", "message", "details"}, and on
the OpenAI-compatible routes OpenAI's {"error": {"message", "type", "param", "code"}} with the same statuses,
`code` being the native code."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, details: dict[str, Any] | None = None,
                 retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = details or {}
        self.retry_after_ms = retry_after_ms


class DatabaseUnavailable(ApiError):
    """The projections database did not answer a read (unreachable, dropped, not migrated yet): 503 with
    Retry-After. Every gateway read raises it (`database.py`), so each route answers it in its own shape."""

    def __init__(self, error: str, retry_after_ms: int) -> None:
        super().__init__(503, "database_unavailable", "the database is unavailable; retry later", {"error": error},
                         retry_after_ms)


def error_response(status: int, code: str, message: str, details: dict[str, Any] | None = None,
                   retry_after_ms: int | None = None) -> JSONResponse:
    headers = {}
    if retry_after_ms is not None:
        # Retry-After is whole seconds; the exact jittered value travels in the body.
        headers["Retry-After"] = str(max(1, -(-retry_after_ms // 1000)))
        details = {**(details or {}), "retryAfterMs": retry_after_ms}
    return JSONResponse({"code": code, "message": message, "details": details or {}}, status_code=status,
                        headers=headers)


OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                      404: "not_found_error", 409: "conflict_error", 429: "rate_limit_error"}


def openai_error_response(exc: ApiError, field_names: dict[str, str] | None = None) -> JSONResponse:
    """OpenAI's shape; `param` is the first failing field, renamed by `field_names` (native -> OpenAI)."""
    details = exc.details or {}
    fields = details.get("fields") or [details.get("field")]
    param = (field_names or {}).get(fields[0], fields[0])
    kind = OPENAI_ERROR_TYPES.get(exc.status, "server_error" if exc.status >= 500 else "invalid_request_error")
    headers = {}
    if exc.retry_after_ms is not None:
        headers["Retry-After"] = str(max(1, -(-exc.retry_after_ms // 1000)))  # whole seconds, as the native API
    if exc.status == 409:
        headers["x-should-retry"] = "false"  # the official clients otherwise retry a 409
    return JSONResponse({"error": {"message": exc.message, "type": kind, "param": param, "code": exc.code}},
                        status_code=exc.status, headers=headers)


def install(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def on_api_error(_request: Request, exc: ApiError):
        return error_response(exc.status, exc.code, exc.message, exc.details, exc.retry_after_ms)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(_request: Request, exc: RequestValidationError):
        errors = exc.errors()
        if errors and errors[0]["type"] == "json_invalid":
            reason = errors[0].get("ctx", {}).get("error", "malformed")
            return error_response(400, "invalid_json", f"the body is not JSON: {reason}")
        fields = [".".join(str(p) for p in e["loc"] if p != "body") or "body" for e in errors]
        first = errors[0] if errors else {"msg": "invalid request"}
        return error_response(400, "invalid_request", f"{fields[0] if fields else 'body'}: {first['msg']}",
                              {"fields": fields})

    @app.exception_handler(StarletteHTTPException)
    async def on_http(_request: Request, exc: StarletteHTTPException):
        if exc.status_code == 400:  # FastAPI's answer to a JSON body it could not read (e.g. invalid UTF-8)
            return error_response(400, "invalid_json", f"{exc.detail}: the body must be JSON in UTF-8")
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))
