"""Closing a billing period: one `PeriodClosed` marker in every partition of `llm.generations`.

A statement must be a pure function of the log, and "sealed after its period closed" must be a matter
of log order, as "reported after the seal" is (docs/design-rules.md, rule 13). Seals are terminal events
on `llm.generations`, ordered only within a partition, so the close is written into each partition:

    partition p:  ... Completed(g1) ... PeriodClosed(2026-11, p) ... Completed(g2) ...
                                        g1 is on 2026-11's statement;  g2, sealed in November, is not:
                                        it is billed in the next period still open in p

The statement of a period is made once every partition has its marker (`partitions` says how many).
The markers of one close share `close_id`; writing them again (a close that crashed half way) changes
nothing, the first marker of a (period, partition) wins. Markers are keyed `period:<period>` and carry
no generation id: readers of `llm.generations` that follow generations skip them.
"""
from __future__ import annotations

from typing import Literal
from uuid import UUID

from pydantic import Field, model_validator

from schemas.envelope import Envelope

# A calendar month in UTC, as `YYYY-MM`, from 1970-01 to 2999-12.
PERIOD_PATTERN = r"^(19[7-9][0-9]|2[0-9]{3})-(0[1-9]|1[0-2])$"


class PeriodClosed(Envelope):
    """The operator closed `period` (`ledgerlm billing close`); this marker closes it in one partition."""

    type: Literal["PeriodClosed"] = "PeriodClosed"
    period: str = Field(pattern=PERIOD_PATTERN)
    partition: int = Field(ge=0)
    partitions: int = Field(ge=1)
    close_id: UUID

    @model_validator(mode="after")
    def partition_exists(self) -> "PeriodClosed":
        if self.partition >= self.partitions:
            raise ValueError("partition must be below partitions")
        return self

    @property
    def record_key(self) -> str:
        return f"period:{self.period}"
