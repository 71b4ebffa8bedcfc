"""The values one step passes along, as vLLM v1 does it: ids and counts, never live sequences.

    Scheduler.schedule() ─▶ SchedulerOutput ─▶ ModelRunner.run() ─▶ StepResult
                                   │                                     │
                                   └──▶ Scheduler.update_from_output() ◀─┘
                                                     │
                                                     └─▶ a SequenceUpdate per sampled row

A snapshot cannot change under its reader: what the model runner is told to compute is what the scheduler
planned, however the sequences move afterwards, and only `update_from_output` moves them.
"""
from __future__ import annotations

from dataclasses import dataclass

from engine.request import FinishReason, TokenLogprob


@dataclass(frozen=True)
class ScheduledChunk:
    """`num_tokens` tokens of request `request_id` computed this step, from position `start` (past its
    computed tokens and any prefix-cache hit taken this step). `samples`: the chunk reaches the end of the
    sequence, so its last position yields the next token."""

    request_id: str
    start: int
    num_tokens: int
    samples: bool

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    """One step's plan: decode chunks first, then prefill chunks; and the ids the step expired or preempted."""

    decodes: tuple[ScheduledChunk, ...] = ()
    prefills: tuple[ScheduledChunk, ...] = ()
    expired: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()

    @property
    def chunks(self) -> tuple[ScheduledChunk, ...]:
        return (*self.decodes, *self.prefills)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.num_tokens for c in self.prefills)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills


@dataclass(frozen=True)
class SampledToken:
    """The token drawn for a chunk that reached its sequence's end (None: the row could not be sampled), and
    its logprob when the request asked for them."""

    request_id: str
    token: int | None
    logprob: TokenLogprob | None = None


@dataclass(frozen=True)
class StepResult:
    """What one forward produced: a token per sampling chunk, in batch order, and per request asking for
    prompt logprobs the entries of the prompt positions this step computed, in order."""

    sampled: tuple[SampledToken, ...]
    prompt_logprobs: tuple[tuple[str, tuple[TokenLogprob, ...]], ...] = ()


@dataclass(frozen=True)
class SequenceUpdate:
    """What `update_from_output` did to one sampled sequence: the token it appended (None when none is
    reported: a scored prompt, or a failure), and its finish reason when it ended (`error`: why it failed)."""

    request_id: str
    token: int | None
    logprob: TokenLogprob | None
    finish_reason: FinishReason | None
    error: str | None = None
