"""Billing periods: calendar months in UTC, and which open period a seal is billed in.

A seal belongs to the month of its seal time (log time, never the projector's clock). It is billed in
that month unless the month was already closed in the seal's partition when the seal came (log order,
`schemas/billing_periods.py`); then in the first later month still open there:

    closed in its partition: {2026-11}           seal of 2026-11-30T23:59 -> billed in 2026-12
    closed: {2026-11, 2026-12}                   the same seal            -> billed in 2027-01
    closed: {}                                   the same seal            -> billed in 2026-11
"""
from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from schemas.billing_periods import PERIOD_PATTERN

_PERIOD = re.compile(PERIOD_PATTERN)


class PeriodError(ValueError):
    """A period that is not `YYYY-MM`; the message says what was given and what is expected."""


@dataclass(frozen=True, order=True)
class Period:
    """One calendar month in UTC; orders by time; `str()` is `YYYY-MM`."""

    year: int
    month: int

    @classmethod
    def parse(cls, text: str) -> "Period":
        if not isinstance(text, str) or not _PERIOD.fullmatch(text):
            raise PeriodError(f"period must be a calendar month YYYY-MM from 1970-01 to 2999-12 (e.g. 2026-11), "
                              f"got {str(text)[:40]!r}")
        year, month = text.split("-")
        return cls(int(year), int(month))

    @classmethod
    def of(cls, moment: datetime) -> "Period":
        """The month `moment` falls in, in UTC (a naive time is an error: log times carry their offset)."""
        if moment.tzinfo is None:
            raise ValueError("a period is taken from a time with a UTC offset")
        utc = moment.astimezone(UTC)
        return cls(utc.year, utc.month)

    def __str__(self) -> str:
        return f"{self.year:04d}-{self.month:02d}"

    @property
    def start(self) -> datetime:
        return datetime(self.year, self.month, 1, tzinfo=UTC)

    @property
    def end(self) -> datetime:
        """The first instant after the period (the start of the next one)."""
        return self.next().start

    def next(self) -> "Period":
        return Period(self.year + 1, 1) if self.month == 12 else Period(self.year, self.month + 1)

    def has_ended(self, now: datetime) -> bool:
        return now >= self.end


def billed_in(home: Period, closed: Collection[Period]) -> Period:
    """The first period from `home` on that is not in `closed` (the periods closed in the seal's partition)."""
    period = home
    while period in closed:
        period = period.next()
    return period
