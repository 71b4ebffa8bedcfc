"""Rollout records on the compacted `llm.models` topic: qualifications and aliases.

`llm.models` is compacted by record key, so each kind of record has a key of
its own (`models_key`) and compaction keeps the latest record of each:

    ModelVersionRegistered   "<version>"              immutable: the first record wins
    ModelQualified           "qualified:<version>"    latest wins (re-qualify after a fix)
    ModelAliasSet            "alias:<alias>"          latest wins (rollback = new weights)

Version names are NAME@V; alias names never contain '@', so an alias key can
never be a version's key, and `RESERVED_PREFIXES` keeps version names off the
qualification keys.
"""
from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field, model_validator

from schemas.envelope import Envelope

QUALIFIED_PREFIX = "qualified:"
ALIAS_PREFIX = "alias:"
RESERVED_PREFIXES = (QUALIFIED_PREFIX, ALIAS_PREFIX)


class ModelQualified(Envelope):
    """The outcome of running a version's golden prompts (`ledgerlm models qualify`)."""

    type: Literal["ModelQualified"] = "ModelQualified"
    model_version: str = Field(min_length=1)
    passed: bool
    prompts: int = Field(ge=1)
    failures: tuple[str, ...] = ()
    # The content the prompts ran on: a qualification counts only for this exact content.
    content_sha256: str = Field(min_length=64, max_length=64)
    qualified_at: datetime

    @property
    def models_key(self) -> str:
        return f"{QUALIFIED_PREFIX}{self.model_version}"


class ModelAliasSet(Envelope):
    """An alias names a weighted set of versions; admission pins one of them, drawn by weight."""

    type: Literal["ModelAliasSet"] = "ModelAliasSet"
    alias: str = Field(min_length=1, max_length=256, pattern=r"^[^@\s]+$")
    weights: dict[str, int]
    set_at: datetime

    @model_validator(mode="after")
    def one_positive_weight(self) -> "ModelAliasSet":
        if not self.weights:
            raise ValueError("an alias needs at least one version")
        if any(weight < 0 for weight in self.weights.values()):
            raise ValueError("weights must be >= 0")
        if not any(self.weights.values()):
            raise ValueError("at least one weight must be positive")
        return self

    @property
    def models_key(self) -> str:
        return f"{ALIAS_PREFIX}{self.alias}"

    def positive(self) -> dict[str, int]:
        """The versions that can be drawn (weight > 0), by name."""
        return {version: weight for version, weight in sorted(self.weights.items()) if weight > 0}
