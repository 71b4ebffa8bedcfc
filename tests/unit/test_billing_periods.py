"""Billing periods: months in UTC, and the open period a seal is billed in (projections/periods.py)."""
from datetime import UTC, datetime, timedelta, timezone

import pytest

from projections.periods import Period, PeriodError, billed_in


@pytest.mark.parametrize("text", ["2026-13", "2026-00", "2026-1", "26-11", "2026/11", "2026-11-01", " 2026-11",
                                  "1969-12", "3000-01", "", "2026-11\n"])
def test_a_period_is_a_calendar_month_written_yyyy_mm(text):
    with pytest.raises(PeriodError) as caught:
        Period.parse(text)
    assert "YYYY-MM" in str(caught.value)


def test_a_period_runs_from_the_first_instant_of_its_month_to_the_first_of_the_next():
    november = Period.parse("2026-11")
    assert (november.start, november.end) == (datetime(2026, 11, 1, tzinfo=UTC), datetime(2026, 12, 1, tzinfo=UTC))
    assert str(Period.parse("2026-12").next()) == "2027-01"
    assert Period.parse("2026-12") > november and str(november) == "2026-11"


def test_the_period_of_a_time_is_its_utc_month():
    assert str(Period.of(datetime(2026, 11, 30, 23, 59, 59, 999999, tzinfo=UTC))) == "2026-11"
    assert str(Period.of(datetime(2026, 12, 1, tzinfo=UTC))) == "2026-12"
    # 00:30 on 1 December in UTC+1 is still 30 November in UTC
    assert str(Period.of(datetime(2026, 12, 1, 0, 30, tzinfo=timezone(timedelta(hours=1))))) == "2026-11"
    with pytest.raises(ValueError):
        Period.of(datetime(2026, 12, 1))


def test_a_period_has_ended_only_from_the_first_instant_of_the_next():
    november = Period.parse("2026-11")
    assert not november.has_ended(datetime(2026, 11, 30, 23, 59, 59, tzinfo=UTC))
    assert november.has_ended(datetime(2026, 12, 1, tzinfo=UTC))


@pytest.mark.parametrize(("closed", "billed"), [
    ((), "2026-11"),
    (("2026-11",), "2026-12"),
    (("2026-11", "2026-12"), "2027-01"),
    (("2026-10", "2026-12"), "2026-11"),  # an earlier or a later close does not move it
])
def test_a_seal_is_billed_in_the_first_period_from_its_own_that_is_still_open(closed, billed):
    assert str(billed_in(Period.parse("2026-11"), {Period.parse(p) for p in closed})) == billed
