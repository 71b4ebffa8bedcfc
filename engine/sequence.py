"""`Sequence`: one request's mutable state inside the engine."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.request import EngineRequest, FinishReason, TokenLogprob

if TYPE_CHECKING:
    from engine.structured import Grammar


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    """Token ids (prompt then outputs), KV block table and progress counters.

    `num_computed_tokens` counts tokens whose keys/values are in the pool; the
    tokens after it still need a forward pass. A decode step is simply the
    case where exactly one token is left to compute. Preemption by recompute
    resets it to 0 and keeps the token ids, so the outputs survive.
    """

    request: EngineRequest
    arrival: int
    weight: float
    token_ids: list[int] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    # Chained SHA-256 of each full block of token_ids, filled lazily; valid
    # forever because token ids are append-only.
    block_hashes: list[bytes] = field(default_factory=list)
    # Full blocks of this sequence already offered to the prefix cache.
    num_committed_blocks: int = 0
    num_cached_tokens: int = 0
    # High-water mark of computed tokens: recompute after preemption is not
    # charged to the tenant's fair share again.
    num_served_tokens: int = 0
    # Tokens computed again after preemptions: physical work reported apart, never billed.
    num_recomputed_tokens: int = 0
    started: bool = False
    # Engine-clock instants of arrival and first scheduling: their difference is the queue time.
    arrived_at: float = 0.0
    first_scheduled_at: float | None = None
    status: SequenceStatus = SequenceStatus.WAITING
    finish_reason: FinishReason | None = None
    # Scores of prompt tokens 1.. computed so far, and whether they went out (with the first output).
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    # The structured-output constraint's state after the output tokens; kept through preemption.
    grammar: "Grammar | None" = None

    @classmethod
    def from_request(cls, request: EngineRequest, arrival: int, weight: float) -> "Sequence":
        return cls(
            request=request,
            arrival=arrival,
            weight=weight,
            token_ids=list(request.prompt_token_ids),
            num_prompt_tokens=len(request.prompt_token_ids),
        )

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def tenant_id(self) -> str:
        return self.request.tenant_id

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def needs_prompt_logprobs(self) -> bool:
        """Prompt logprobs asked for and not all computed: a prefix-cache hit would skip their positions."""
        return (self.request.params.prompt_logprobs is not None
                and len(self.prompt_logprobs) < self.num_prompt_tokens - 1)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    def priority_key(self) -> tuple[bool, float, int]:
        """Sort key, most important first: interactive before batch, then higher weight, then older."""
        return (self.request.batch, -self.weight, self.arrival)
