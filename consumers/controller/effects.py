"""What one decision writes: the records the controller's runtime puts in one Kafka transaction."""
from __future__ import annotations

from dataclasses import dataclass, field

from schemas.changelog import HeldAttempt, IdentityRecorded, TenantBudgetState
from schemas.envelope import Envelope
from schemas.replies import AdmissionDecision


@dataclass
class Effects:
    """Records to write atomically; `changelog` records and `tombstones` (keys to null) go to the input partition
    of the changelog."""

    generations: list[Envelope] = field(default_factory=list)
    dispatch: list[Envelope] = field(default_factory=list)
    replies: list[AdmissionDecision] = field(default_factory=list)
    changelog: list[IdentityRecorded | TenantBudgetState | HeldAttempt] = field(default_factory=list)
    tombstones: list[str] = field(default_factory=list)

    def extend(self, other: "Effects") -> None:
        self.generations += other.generations
        self.dispatch += other.dispatch
        self.replies += other.replies
        self.changelog += other.changelog
        self.tombstones += other.tombstones

    def __bool__(self) -> bool:
        return bool(self.generations or self.dispatch or self.replies or self.changelog or self.tombstones)
