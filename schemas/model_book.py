"""`ModelBook`: the state of `llm.models` as every reader must see it.

The gateway, the controller and the CLI all fold the same compacted topic;
the rules live here once so they cannot disagree:

    ModelVersionRegistered  first record of a version wins (versions are immutable)
    ModelQualified          latest record of a version wins; it counts only for the registered content
    ModelAliasSet           latest record of an alias wins

A name that is a registered version is that version, never an alias.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from schemas.envelope import Envelope
from schemas.model_rollout import ModelAliasSet, ModelQualified
from schemas.registry_events import ModelVersionRegistered


@dataclass
class ModelBook:
    versions: dict[str, ModelVersionRegistered] = field(default_factory=dict)
    qualifications: dict[str, ModelQualified] = field(default_factory=dict)
    aliases: dict[str, ModelAliasSet] = field(default_factory=dict)

    def observe(self, event: Envelope) -> None:
        if isinstance(event, ModelVersionRegistered):
            self.versions.setdefault(event.model_version, event)
        elif isinstance(event, ModelQualified):
            self.qualifications[event.model_version] = event
        elif isinstance(event, ModelAliasSet):
            self.aliases[event.alias] = event

    def alias(self, name: str) -> ModelAliasSet | None:
        """The alias called `name`, unless `name` is a registered version."""
        return None if name in self.versions else self.aliases.get(name)

    def members(self, alias: str) -> dict[str, int]:
        """The registered versions an alias can draw (weight > 0), by name; empty for a non-alias."""
        found = self.alias(alias)
        if found is None:
            return {}
        return {version: weight for version, weight in found.positive().items() if version in self.versions}

    def is_qualified(self, version: str) -> bool:
        """The version's latest qualification passed, on the content registered under its name."""
        registered = self.versions.get(version)
        latest = self.qualifications.get(version)
        return (registered is not None and latest is not None and latest.passed
                and latest.content_sha256 == registered.content_sha256)

    def names(self) -> list[str]:
        """Every name a request may use: versions, then aliases."""
        return sorted(self.versions) + sorted(a for a in self.aliases if a not in self.versions)
