"""Attempts a worker accepted but cannot start yet: they wait for KV room until their deadline.

Interactive attempts queue ahead of batch ones, each tier in arrival order;
the head starts as soon as it fits (no overtaking, so a large prompt is not
starved by small ones).
"""
from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from schemas.dispatch import StartAttempt


class WaitingQueue:
    def __init__(self) -> None:
        self._orders: list[StartAttempt] = []

    def __len__(self) -> int:
        return len(self._orders)

    def __iter__(self) -> Iterator[StartAttempt]:
        return iter(self._orders)

    def add(self, order: StartAttempt) -> None:
        at = len(self._orders)
        if order.tier != "batch":
            at = next((i for i, o in enumerate(self._orders) if o.tier == "batch"), at)
        self._orders.insert(at, order)

    def find(self, generation_id: str, epoch: int) -> StartAttempt | None:
        return next((o for o in self._orders if o.generation_id == generation_id and o.epoch == epoch), None)

    def take(self, generation_id: str, epoch: int) -> StartAttempt | None:
        order = self.find(generation_id, epoch)
        if order is not None:
            self._orders.remove(order)
        return order

    def take_expired(self, now: datetime) -> list[StartAttempt]:
        """Remove and return every order whose deadline to start has passed."""
        expired = [o for o in self._orders if o.deadline_at <= now]
        self._orders = [o for o in self._orders if o.deadline_at > now]
        return expired

    @property
    def head(self) -> StartAttempt | None:
        return self._orders[0] if self._orders else None

    def pop_head(self) -> StartAttempt:
        return self._orders.pop(0)

    def clear(self) -> None:
        self._orders.clear()
