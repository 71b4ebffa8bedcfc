"""Statement line items: canonical order, hash, totals, CSV (projections/statement_lines.py)."""
import csv
import hashlib
import io
import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone

from projections.statement_lines import (
    LineItem, Statement, canonical_line, line_items_sha256, model_totals, statement_csv,
)

SEALED = datetime(2026, 11, 30, 23, 59, 59, 250000, tzinfo=UTC)


def make_item(generation_id: str = "gen-a", **fields) -> LineItem:
    values = {"epoch": 1, "model_version": "demo@1", "usage_label": "final", "end_reason": "completed",
              "sealed_at": SEALED, "belongs_to": "2026-11", "input_tokens": 40, "cached_input_tokens": 16,
              "output_tokens": 7, **fields}
    return LineItem(generation_id, **values)


def test_a_canonical_line_is_compact_json_with_sorted_keys_and_a_newline():
    assert canonical_line(make_item()) == (
        '{"belongsTo":"2026-11","cachedInputTokens":16,"endReason":"completed","epoch":1,"generationId":"gen-a",'
        '"inputTokens":40,"label":"final","model":"demo@1","outputTokens":7,'
        '"sealedAt":"2026-11-30T23:59:59.250000Z"}\n')


def test_the_hash_is_sha256_of_the_lines_in_generation_id_order_whatever_order_they_come_in():
    a, b, c = make_item("gen-b"), make_item("gen-a"), make_item("Gen-c")  # "G" sorts before "g"
    expected = hashlib.sha256("".join(canonical_line(i) for i in (c, b, a)).encode()).hexdigest()
    assert line_items_sha256([a, b, c]) == line_items_sha256([c, a, b]) == expected
    assert line_items_sha256([]) == hashlib.sha256(b"").hexdigest()


def test_any_change_to_a_line_item_changes_the_hash():
    base = line_items_sha256([make_item()])
    for change in ({"output_tokens": 8}, {"belongs_to": "2026-10"}, {"usage_label": "interrupted"},
                   {"sealed_at": SEALED + timedelta(microseconds=1)}, {"epoch": None}, {"model_version": "demo@2"}):
        assert line_items_sha256([replace(make_item(), **change)]) != base, change


def test_a_sealed_time_in_another_offset_is_written_in_utc():
    east = SEALED.astimezone(timezone(timedelta(hours=5)))
    assert canonical_line(make_item(sealed_at=east)) == canonical_line(make_item())


def test_totals_are_per_model_version_and_meter():
    items = [make_item("g1"), make_item("g2", output_tokens=3, cached_input_tokens=0),
             make_item("g3", model_version="big@2", input_tokens=100)]
    assert [t.as_json() for t in model_totals(items)] == [
        {"model": "big@2", "generations": 1, "inputTokens": 100, "cachedInputTokens": 16, "outputTokens": 7},
        {"model": "demo@1", "generations": 2, "inputTokens": 80, "cachedInputTokens": 16, "outputTokens": 10}]


def test_a_statement_counts_its_late_generations_and_sums_its_meters():
    closed = datetime(2026, 12, 1, 0, 5, tzinfo=UTC)
    late = make_item("g0", belongs_to="2026-10", output_tokens=1)
    statement = Statement.of("acme", "2026-11", closed, [make_item("g2"), late])
    doc = statement.as_json()
    assert doc["generations"] == 2 and doc["lateGenerations"] == 1
    assert doc["totals"] == {"inputTokens": 80, "cachedInputTokens": 32, "outputTokens": 8}
    assert doc["closedAt"] == "2026-12-01T00:05:00.000000Z"
    assert [i["generationId"] for i in doc["lineItems"]] == ["g0", "g2"]
    # Anyone holding the JSON can recompute the hash from it.
    lines = "".join(json.dumps(i, sort_keys=True, separators=(",", ":")) + "\n" for i in doc["lineItems"])
    assert hashlib.sha256(lines.encode()).hexdigest() == doc["lineItemsSha256"]


def test_the_csv_has_a_header_and_one_row_per_item_in_canonical_order():
    text = statement_csv([make_item("g2", epoch=None), make_item("g1")])
    rows = list(csv.DictReader(io.StringIO(text)))
    assert text.splitlines()[0] == ("generationId,epoch,model,label,endReason,sealedAt,belongsTo,inputTokens,"
                                    "cachedInputTokens,outputTokens")
    assert [r["generationId"] for r in rows] == ["g1", "g2"]
    assert rows[1]["epoch"] == "" and rows[0]["outputTokens"] == "7"
    assert rows[0]["sealedAt"] == "2026-11-30T23:59:59.250000Z"
