"""A tenant's usage, line items and statements: read from the billing projections, never computed here.

    GET /v1/usage?from=&to=&granularity=hour|day&model=   sealed usage per bucket and model version
    GET /v1/generations/{id}/usage                         the line item: the bill and every attempt
    GET /v1/statements/{period}?lineItems=true             a closed period's statement (404 while open)

The tenant comes from the API key; another tenant's generation is 404, as an unknown one. Bad input is
400 `invalid_request` naming the parameter (`details.fields`).
"""
from __future__ import annotations

import logging
from datetime import UTC, datetime

from fastapi import APIRouter, Path, Query, Request

from producers.gateway.database import Principal
from producers.gateway.errors import ApiError
from producers.gateway.gateway import Gateway, principal_of
from producers.gateway.native.lookup import find_generation, not_found
from producers.gateway.native.usage_models import LineItem, StatementAnswer, UsageAnswer
from projections.line_items import ATTEMPTS_SQL, HEAD_SQL, line_item_json, unprojected_line_item
from projections.periods import Period, PeriodError
from projections.statement_reads import ITEMS_SQL, PERIOD_SQL, STATEMENT_SQL, TOTALS_SQL, statement_from
from projections.usage_report import USAGE_SQL, UsageQueryError, UsageWindow, report_from, usage_params

log = logging.getLogger(__name__)


def invalid(exc: UsageQueryError | PeriodError, names: list[str]) -> ApiError:
    return ApiError(400, "invalid_request", str(exc), {"fields": names})


class UsageApi:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    async def usage(self, principal: Principal, start: datetime | None, end: datetime | None, granularity: str,
                    model: str | None) -> dict:
        try:
            window = UsageWindow.of(start, end, granularity, model, datetime.now(UTC))
        except UsageQueryError as exc:
            raise invalid(exc, exc.fields) from None
        rows = await self.gateway.db.fetch(USAGE_SQL, usage_params(principal.tenant_id, window))
        log.info("usage read tenant=%s granularity=%s buckets=%d rows=%d", principal.tenant_id, granularity,
                 window.buckets, len(rows))
        return report_from(principal.tenant_id, window, rows).as_json()

    async def line_item(self, principal: Principal, generation_id: str) -> dict:
        db = self.gateway.db
        heads = await db.fetch(HEAD_SQL, {"g": generation_id})
        if heads and heads[0][0] != principal.tenant_id:
            raise not_found(generation_id)  # another tenant's: as if it did not exist
        if not heads:
            # Unknown, another tenant's, or the caller's own not projected yet (404 / 503 / its status).
            gateway = self.gateway
            status = await find_generation(db, gateway.bridge, gateway.settings, principal.tenant_id, generation_id)
            return unprojected_line_item(generation_id, status)
        attempts = await db.fetch(ATTEMPTS_SQL, {"g": generation_id})
        return line_item_json(generation_id, heads[0], attempts)

    async def statement(self, principal: Principal, text: str, with_items: bool) -> dict:
        try:
            period = str(Period.parse(text))
        except PeriodError as exc:
            raise invalid(exc, ["period"]) from None
        db, one = self.gateway.db, (principal.tenant_id, period)
        period_rows = await db.fetch(PERIOD_SQL, (period,))
        if not period_rows:
            raise ApiError(404, "not_found", f"period {period} is not closed", {"period": period})
        statement = statement_from(principal.tenant_id, period, period_rows[0],
                                   next(iter(await db.fetch(STATEMENT_SQL, one)), None),
                                   await db.fetch(TOTALS_SQL, one),
                                   await db.fetch(ITEMS_SQL, one) if with_items else None)
        return statement.as_json()


def router(gateway: Gateway) -> APIRouter:
    api = UsageApi(gateway)
    routes = APIRouter()

    @routes.get("/v1/usage", responses={200: {"model": UsageAnswer}})
    async def usage(request: Request, start: datetime | None = Query(None, alias="from"),
                    end: datetime | None = Query(None, alias="to"),
                    granularity: str = Query("hour", json_schema_extra={"enum": ["hour", "day"]}),
                    model: str | None = Query(None, description="a version NAME@V, or a name: all its versions")):
        """The caller's sealed usage per hour or day and per model version; default: the last 24 hours."""
        return await api.usage(await principal_of(request), start, end, granularity, model)

    @routes.get("/v1/generations/{generation_id}/usage", responses={200: {"model": LineItem}})
    async def generation_usage(generation_id: str, request: Request):
        """The generation's line item: its bill (once sealed) and, per attempt, watermark, label and tail."""
        return await api.line_item(await principal_of(request), generation_id)

    @routes.get("/v1/statements/{period}", responses={200: {"model": StatementAnswer}})
    async def statement(request: Request, period: str = Path(description="a calendar month in UTC, YYYY-MM"),
                        line_items: bool = Query(False, alias="lineItems")):
        """The caller's statement of a closed period (404 while it is open); it never changes."""
        return await api.statement(await principal_of(request), period, line_items)

    return routes
