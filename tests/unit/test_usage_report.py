"""The usage query's window and the report's shape (projections/usage_report.py, line_items.py; pure)."""
from datetime import UTC, datetime, timedelta

import pytest

from projections.line_items import line_item_json
from projections.usage_report import ModelUsage, UsageQueryError, UsageWindow, report_from

NOW = datetime(2026, 12, 2, 10, 30, tzinfo=UTC)


def window(start=None, end=None, granularity="hour", model=None) -> UsageWindow:
    return UsageWindow.of(start, end, granularity, model, NOW)


@pytest.mark.parametrize(("args", "fields", "fragment"), [
    ({"granularity": "week"}, ["granularity"], "granularity must be one of hour, day"),
    ({"start": NOW, "end": NOW - timedelta(hours=1)}, ["from", "to"], "from must be before to"),
    ({"start": NOW, "end": NOW}, ["from", "to"], "from must be before to"),
    ({"start": datetime(2026, 12, 1)}, ["from", "to"], "UTC offset"),
    ({"start": NOW - timedelta(days=32)}, ["from", "to", "granularity"], "at most 744 hour buckets"),
    ({"start": NOW - timedelta(days=400), "granularity": "day"}, ["from", "to", "granularity"], "366 day buckets"),
    ({"model": "has space@1"}, ["model"], "printable ASCII"),
    ({"model": ""}, ["model"], "NAME@V"),
    ({"model": "m" * 257}, ["model"], "1 to 256"),
])
def test_a_bad_usage_query_names_its_parameter_and_says_why(args, fields, fragment):
    with pytest.raises(UsageQueryError) as caught:
        window(**args)
    assert caught.value.fields == fields and fragment in str(caught.value)


def test_the_default_window_is_the_last_24_hours_in_hourly_buckets():
    w = window()
    assert (w.start, w.end, w.granularity) == (NOW - timedelta(hours=24), NOW, "hour")
    assert (w.lower, w.upper, w.buckets) == (datetime(2026, 12, 1, 10, tzinfo=UTC),
                                             datetime(2026, 12, 2, 11, tzinfo=UTC), 25)


def test_day_buckets_start_at_utc_midnight_and_a_bucket_is_kept_whole():
    w = window(datetime(2026, 11, 3, 5, tzinfo=UTC), datetime(2026, 11, 5, tzinfo=UTC), "day")
    assert (w.lower, w.upper, w.buckets) == (datetime(2026, 11, 3, tzinfo=UTC), datetime(2026, 11, 5, tzinfo=UTC), 2)
    on_the_hour = NOW.replace(minute=0)
    assert window(on_the_hour - timedelta(days=31), on_the_hour, "hour").buckets == 744  # the largest allowed


def usage(model: str, **counts) -> ModelUsage:
    return ModelUsage(model, **counts)


def test_the_report_keeps_todays_fields_and_adds_models_per_window_and_bucket():
    w = window(datetime(2026, 12, 1, 8, tzinfo=UTC), datetime(2026, 12, 1, 10, tzinfo=UTC))
    nine, eight = datetime(2026, 12, 1, 9, tzinfo=UTC), datetime(2026, 12, 1, 8, tzinfo=UTC)
    counts = (2, 80, 32, 12, 1, 40, 16, 5, 80, 32, 15, 15, 3, 3)
    rows = [(nine, "a@1", *counts), (eight, "a@1", 1, 10, 0, 4, 0, 0, 0, 0, 10, 0, 4, 4, 0, 0),
            (nine, "b@2", 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0)]
    doc = report_from("acme", w, rows).as_json()
    assert doc["totals"] == {"generations": 4, "inputTokens": 91, "cachedInputTokens": 33, "outputTokens": 17}
    assert [h["hour"] for h in doc["hours"]] == ["2026-12-01T08:00:00+00:00", "2026-12-01T09:00:00+00:00"]
    assert doc["hours"][1] | {"models": None} == {"hour": "2026-12-01T09:00:00+00:00", "generations": 3,
                                                  "inputTokens": 81, "cachedInputTokens": 33, "outputTokens": 13,
                                                  "models": None}
    a = doc["models"][0]
    assert a == {"model": "a@1", "generations": 3, "processedInputTokens": 90, "cachedInputTokens": 32,
                 "generatedOutputTokens": 19, "deliveredOutputTokens": 19, "billedInputTokens": 90,
                 "billedCachedInputTokens": 32, "billedOutputTokens": 16, "recomputeTokens": 3,
                 "unbilledTailTokens": 3,
                 "interrupted": {"generations": 1, "inputTokens": 40, "cachedInputTokens": 16, "outputTokens": 5}}
    assert [m["model"] for m in doc["models"]] == ["a@1", "b@2"] and "days" not in doc


def head(sealed: bool, epoch: int | None = 2, label: str = "interrupted") -> tuple:
    bill = (epoch, label, "interrupted", NOW, 40, 16, 9, 240, 191, "2026-12", "2026-12") if sealed else (None,) * 11
    return ("acme", "req-1", "demo@1", "interrupted", "interrupted", *bill, sealed)


def attempt(epoch: int, delivered: int | None = None, tail: int = 0) -> tuple:
    return (epoch, "worker-a", NOW, NOW, "interrupted", 40, 16, 9, 0, 2, NOW, delivered, tail, 0)


def test_a_line_item_labels_the_billed_attempt_with_the_bill_and_an_older_one_superseded():
    doc = line_item_json("gen-1", head(True), [attempt(1), attempt(2, delivered=12, tail=3)])
    assert doc["sealed"] and doc["bill"]["outputTokens"] == 9 and doc["bill"]["period"] == "2026-12"
    assert [(a["epoch"], a["billed"], a["label"], a["unbilledTailTokens"]) for a in doc["attempts"]] == [
        (1, False, "superseded", 0), (2, True, "interrupted", 3)]
    assert doc["attempts"][1]["sealedAt"] == "2026-12-02T10:30:00.000000Z" and doc["attempts"][0]["sealedAt"] is None


def test_an_unsealed_generations_newest_attempt_is_open():
    doc = line_item_json("gen-1", head(False), [attempt(1)])
    assert (doc["sealed"], doc["bill"], doc["attempts"][0]["label"]) == (False, None, "open")
