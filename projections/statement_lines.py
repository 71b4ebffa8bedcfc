"""A statement's line items, their canonical order and hash, totals and the CSV (pure: no database).

The hash is what makes a closed statement checkable by anyone who holds its line items:

    lines = sorted by generationId (code point order), each one JSON object with sorted keys,
            no spaces, ASCII escapes, followed by "\\n"
    lineItemsSha256 = sha256(UTF-8 of all lines).hexdigest()      (no items: sha256 of nothing)

The line item is the sealed bill (`billing_ledger`), which never changes, so neither does the hash.
"""
from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

# meter -> the line item field it sums (statement_totals.meter)
METERS = {"input_tokens": "inputTokens", "cached_input_tokens": "cachedInputTokens",
          "output_tokens": "outputTokens"}
CSV_FIELDS = ("generationId", "epoch", "model", "label", "endReason", "sealedAt", "belongsTo", "inputTokens",
              "cachedInputTokens", "outputTokens")


def utc_text(moment: datetime) -> str:
    """A log time as the statement writes it: UTC, microseconds, `Z`."""
    return moment.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class LineItem:
    """One sealed generation on a statement; `belongs_to` is the period of its seal (another one when the
    seal came after that period closed)."""

    generation_id: str
    epoch: int | None
    model_version: str
    usage_label: str
    end_reason: str
    sealed_at: datetime
    belongs_to: str
    input_tokens: int
    cached_input_tokens: int
    output_tokens: int

    def as_json(self) -> dict[str, object]:
        return {"generationId": self.generation_id, "epoch": self.epoch, "model": self.model_version,
                "label": self.usage_label, "endReason": self.end_reason, "sealedAt": utc_text(self.sealed_at),
                "belongsTo": self.belongs_to, "inputTokens": self.input_tokens,
                "cachedInputTokens": self.cached_input_tokens, "outputTokens": self.output_tokens}


def canonical(items: Iterable[LineItem]) -> list[LineItem]:
    """Line items in the order the hash reads them: by generation id, compared by code point."""
    return sorted(items, key=lambda item: item.generation_id)


def canonical_line(item: LineItem) -> str:
    return json.dumps(item.as_json(), sort_keys=True, separators=(",", ":"), ensure_ascii=True) + "\n"


def line_items_sha256(items: Iterable[LineItem]) -> str:
    digest = hashlib.sha256()
    for item in canonical(items):
        digest.update(canonical_line(item).encode("utf-8"))
    return digest.hexdigest()


@dataclass(frozen=True)
class ModelTotal:
    """One model version's part of a statement: its generations and each meter's quantity."""

    model_version: str
    generations: int
    quantities: dict[str, int]  # meter -> tokens

    def as_json(self) -> dict[str, object]:
        return {"model": self.model_version, "generations": self.generations,
                **{METERS[meter]: self.quantities.get(meter, 0) for meter in METERS}}


def model_totals(items: Iterable[LineItem]) -> list[ModelTotal]:
    """Per model version (sorted), the count of generations and the sum of every meter."""
    counts: dict[str, int] = {}
    sums: dict[str, dict[str, int]] = {}
    for item in items:
        counts[item.model_version] = counts.get(item.model_version, 0) + 1
        meters = sums.setdefault(item.model_version, dict.fromkeys(METERS, 0))
        for meter in METERS:
            meters[meter] += getattr(item, meter)
    return [ModelTotal(model, counts[model], sums[model]) for model in sorted(counts)]


@dataclass(frozen=True)
class Statement:
    """A tenant's closed period: what `statements` and `statement_totals` hold, and the items when read."""

    tenant_id: str
    period: str
    closed_at: datetime
    generations: int
    late_generations: int
    line_items_sha256: str
    totals: tuple[ModelTotal, ...]
    items: tuple[LineItem, ...] | None = None  # None: not read

    @classmethod
    def of(cls, tenant_id: str, period: str, closed_at: datetime, items: Sequence[LineItem]) -> "Statement":
        ordered = tuple(canonical(items))
        return cls(tenant_id, period, closed_at, len(ordered),
                   sum(1 for item in ordered if item.belongs_to != period), line_items_sha256(ordered),
                   tuple(model_totals(ordered)), ordered)

    def as_json(self) -> dict[str, object]:
        doc: dict[str, object] = {
            "tenantId": self.tenant_id, "period": self.period, "closedAt": utc_text(self.closed_at),
            "generations": self.generations, "lateGenerations": self.late_generations,
            "totals": {METERS[meter]: sum(t.quantities.get(meter, 0) for t in self.totals) for meter in METERS},
            "models": [t.as_json() for t in self.totals], "lineItemsSha256": self.line_items_sha256}
        if self.items is not None:
            doc["lineItems"] = [item.as_json() for item in self.items]
        return doc


def statement_csv(items: Iterable[LineItem]) -> str:
    """The line items as CSV (header first, canonical order): what an operator imports into an invoice."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, lineterminator="\n")
    writer.writeheader()
    for item in canonical(items):
        row = item.as_json()
        writer.writerow({name: "" if row[name] is None else row[name] for name in CSV_FIELDS})
    return out.getvalue()
