"""The shapes of the usage, line item and statement answers, as the OpenAPI document shows them.

The routes answer plain JSON made by projections/usage_report.py, line_items.py and statement_lines.py;
these models only describe it (`extra="forbid"`: the tests validate real answers against them, so the
document cannot drift from what is served).
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class Shape(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class InterruptedUsage(Shape):
    """Generations a lost worker ended, billed at their last recorded watermark only."""

    generations: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


class ModelUsage(Shape):
    """One model version's sealed usage: what was processed, generated, delivered, billed and left unbilled."""

    model: str
    generations: int
    processed_input_tokens: int = Field(description="prompt tokens every attempt's watermark recorded")
    cached_input_tokens: int = Field(description="of those, served from the prefix cache")
    generated_output_tokens: int = Field(description="recorded output plus the unbilled tail")
    delivered_output_tokens: int = Field(description="output on the billed attempt's stream")
    billed_input_tokens: int
    billed_cached_input_tokens: int
    billed_output_tokens: int
    recompute_tokens: int = Field(description="work redone after a preemption: never billed")
    unbilled_tail_tokens: int = Field(description="streamed by an interrupted attempt, never recorded: not billed")
    interrupted: InterruptedUsage


class UsageBucket(Shape):
    """One hour (`hour`) or day (`day`) of seals; the totals are billed figures."""

    hour: str | None = None
    day: str | None = None
    generations: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    models: list[ModelUsage]


class UsageTotals(Shape):
    generations: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


class UsageAnswer(Shape):
    """GET /v1/usage: billed totals (as before), per model version, and per bucket (`hours` or `days`)."""

    tenant_id: str
    start: str = Field(alias="from")
    end: str = Field(alias="to")
    granularity: str
    model: str | None
    totals: UsageTotals
    models: list[ModelUsage]
    hours: list[UsageBucket] | None = None
    days: list[UsageBucket] | None = None


class Bill(Shape):
    """The seal: fixed once, never changed; `period` is the statement it is billed on."""

    epoch: int | None
    label: str = Field(description="final | interrupted (billed at the last recorded watermark)")
    end_reason: str
    sealed_at: str
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int
    reserved_tokens: int
    released_tokens: int
    period: str | None
    belongs_to: str | None = Field(description="the period of the seal; differs when sealed after it closed")


class Watermark(Shape):
    processed_input_tokens: int
    cached_input_tokens: int
    generated_output_tokens: int
    recompute_tokens: int
    reports_counted: int
    recorded_at: str


class AttemptUsage(Shape):
    """One attempt (epoch): its recorded watermark, what it delivered and what it left unbilled."""

    epoch: int
    worker_id: str | None
    started_at: str | None
    ended_at: str | None
    end_reason: str | None
    billed: bool
    label: str = Field(description="final | interrupted (the billed attempt), superseded, open")
    sealed_at: str | None
    watermark: Watermark | None
    delivered_output_tokens: int | None = Field(description="known for the newest attempt only")
    unbilled_tail_tokens: int
    post_seal_reports: int = Field(description="reports that came after the seal (reconciliation, not billed)")


class LineItem(Shape):
    """GET /v1/generations/{id}/usage."""

    id: str
    request_id: str | None
    model: str | None
    status: str | None
    end_reason: str | None
    sealed: bool
    bill: Bill | None
    attempts: list[AttemptUsage]


class StatementItem(Shape):
    generation_id: str
    epoch: int | None
    model: str
    label: str
    end_reason: str
    sealed_at: str
    belongs_to: str
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


class StatementModel(Shape):
    model: str
    generations: int
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


class StatementTotals(Shape):
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int


class StatementAnswer(Shape):
    """GET /v1/statements/{period}: a closed period's statement; it never changes."""

    tenant_id: str
    period: str
    closed_at: str
    generations: int
    late_generations: int = Field(description="sealed after their own period closed, billed here")
    totals: StatementTotals
    models: list[StatementModel]
    line_items_sha256: str = Field(alias="lineItemsSha256", description="sha256 of the canonical line items")
    line_items: list[StatementItem] | None = None
