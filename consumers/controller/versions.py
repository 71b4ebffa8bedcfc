"""Which concrete version a request runs on: the version it names, or one drawn from an alias.

    name ─▶ candidates {version: weight}   a version: itself; an alias: its registered members of weight > 0
         ─▶ qualified(...)                 with LEDGERLM_REQUIRE_QUALIFIED: members whose latest qualification passed
         ─▶ route(...)                     draw by weight; a drawn version without a ready worker with room is set
                                           aside and the draw repeats over the rest

The draw happens once, at admission: the version is then recorded with the
generation, so a retry (same requestId and payload) never draws again.
"""
from __future__ import annotations

import random

from consumers.controller.registry import Demand, WaitTerms, WorkerChoice, WorkerRegistry
from schemas.model_book import ModelBook


def describe(name: str, candidates: dict[str, int]) -> str:
    """`name`, or for an alias `name (member, ...)`, for refusal reasons."""
    return name if list(candidates) == [name] else f"{name} ({', '.join(candidates)})"


class VersionPicker:
    def __init__(self, models: ModelBook, registry: WorkerRegistry, rng: random.Random,
                 decode_tokens_per_s: float) -> None:
        self.models = models
        self.registry = registry
        self.rng = rng
        self.decode_tokens_per_s = decode_tokens_per_s

    def candidates(self, name: str) -> dict[str, int]:
        """The versions a request for `name` may run on, by draw weight; empty when `name` is neither a
        registered version nor an alias with a registered member of positive weight."""
        if name in self.models.versions:
            return {name: 1}
        return self.models.members(name)

    def qualified(self, candidates: dict[str, int]) -> dict[str, int]:
        return {version: weight for version, weight in candidates.items() if self.models.is_qualified(version)}

    def unqualified_reason(self, name: str) -> str:
        if name in self.models.versions:
            latest = self.models.qualifications.get(name)
            state = "has not been qualified" if latest is None else (
                "failed qualification" if not latest.passed else "was qualified on other content")
            return f"model version {name} {state}; `ledgerlm models qualify {name}` must pass before it is routed to"
        return f"no version of alias {describe(name, self.models.members(name))} has passed qualification"

    def draw(self, candidates: dict[str, int]) -> str:
        """One version drawn by weight (work the controller holds is pinned to its version at admission)."""
        if len(candidates) == 1:
            return next(iter(candidates))
        return self.rng.choices(list(candidates), weights=list(candidates.values()))[0]

    def route(self, candidates: dict[str, int], demand: Demand, allowance_s: float, now: float,
              may_wait: bool = True) -> tuple[str, WorkerChoice] | None:
        """(version, worker) drawn by weight among the candidates that have a ready worker with room."""
        remaining = dict(candidates)
        while remaining:
            version = self.draw(remaining)
            choice = self.registry.choose(version, demand, allowance_s, self.decode_tokens_per_s, now,
                                          may_wait=may_wait)
            if choice is not None:
                return version, choice
            del remaining[version]
        return None

    def shortest_wait(self, candidates: dict[str, int], demand: Demand, now: float) -> WaitTerms | None:
        waits = [self.registry.shortest_wait(v, demand, self.decode_tokens_per_s, now) for v in candidates]
        return min((w for w in waits if w is not None), key=lambda w: w.ttft_s, default=None)
