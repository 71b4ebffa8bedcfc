"""What a projection is: a named pure function from a topic's events to rows.

`apply(conn, events)` runs inside the transaction that also advances the
projection's offsets, so rows and position commit together or not at all.
Events arrive in partition order; a projection must never depend on wall
clock time or on another topic's progress for its result.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import psycopg

from schemas.envelope import Envelope


class Projection(Protocol):
    name: str
    topic: str

    def apply(self, conn: psycopg.Connection, events: Sequence[Envelope]) -> None: ...

    def tables(self) -> tuple[str, ...]:
        """Tables this projection owns (rebuilt and diffed by `audit replay`)."""
        ...
