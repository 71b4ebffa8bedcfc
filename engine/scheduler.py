"""`Scheduler`: decides, each step, which sequences run and how many tokens each computes.

Order of one step (token budget `max_num_batched_tokens`, `max_num_seqs`):

1. waiting requests whose queue deadline passed and never started -> expired;
2. running decodes (one token each), most important first;
3. running sequences still in (chunked) prefill;
4. waiting sequences, picked by weighted fair queueing across tenants:
   the tenant with the fewest tokens served per unit weight goes next,
   among tenants whose next sequence is interactive while any is.

When a running sequence cannot get a block, the least important running
sequence (batch before interactive, then lowest weight, then newest) is
preempted by recompute: its blocks are freed and it re-enters the front of
its tenant's queue; recomputing its tokens is counted apart, never charged. Under the `full`
reservation policy blocks for prompt + max output are taken at admission,
so running sequences never need preempting.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.request import FinishReason
from engine.sequence import Sequence, SequenceStatus


@dataclass(frozen=True)
class ScheduledChunk:
    """`num_tokens` tokens of `seq`, starting at its `num_computed_tokens`."""

    seq: Sequence
    num_tokens: int

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the sequence, so its last
        position yields the next token."""
        return self.seq.num_computed_tokens + self.num_tokens == self.seq.num_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    """Decode chunks first, then prefill chunks; plus bookkeeping for the caller."""

    decodes: list[ScheduledChunk] = field(default_factory=list)
    prefills: list[ScheduledChunk] = field(default_factory=list)
    expired: list[Sequence] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c.num_tokens for c in self.prefills)

    @property
    def is_empty(self) -> bool:
        return not self.decodes and not self.prefills


class Scheduler:
    """Owns the waiting queues (one per tenant) and the running list."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager, max_model_len: int) -> None:
        self.config = config
        self.blocks = block_manager
        self.max_model_len = max_model_len
        self.waiting: dict[str, deque[Sequence]] = {}
        self.running: list[Sequence] = []
        # Virtual time per tenant: tokens served / weight.
        self.vtime: dict[str, float] = {}
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0
        self.num_recomputed_tokens = 0

    # -- queue management -----------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return sum(len(q) for q in self.waiting.values())

    def has_unfinished(self) -> bool:
        return bool(self.running) or self.num_waiting > 0

    def add(self, seq: Sequence) -> None:
        tenant = seq.tenant_id
        if not self._is_active(tenant):
            # A tenant returning from idle must not cash in the time it was
            # away: start it at the least-served active tenant's clock.
            active = [self.vtime[t] for t in self.vtime if self._is_active(t)]
            floor = min(active) if active else 0.0
            self.vtime[tenant] = max(self.vtime.get(tenant, 0.0), floor)
        self.waiting.setdefault(tenant, deque()).append(seq)

    def remove(self, seq: Sequence) -> None:
        """Take `seq` out of whichever queue holds it and free its blocks."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting[seq.tenant_id].remove(seq)
        self.blocks.free_sequence(seq)
        seq.status = SequenceStatus.FINISHED

    def _is_active(self, tenant: str) -> bool:
        return bool(self.waiting.get(tenant)) or any(s.tenant_id == tenant for s in self.running)

    # -- the step ---------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        """Plan one step at monotonic time `now` (see the module docstring for the order)."""
        out = SchedulerOutput()
        self._expire(now, out)
        budget = self.config.max_num_batched_tokens
        scheduled: dict[int, ScheduledChunk] = {}  # id(seq) -> chunk, insertion-ordered

        self.running.sort(key=Sequence.priority_key)
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefills = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.num_uncomputed_tokens, budget)
            while self.blocks.allocate(seq, n) is None:
                victim = self.running[-1]
                budget += self._preempt(victim, scheduled, out)
                if victim is seq:
                    break
            if seq.status is SequenceStatus.RUNNING:
                scheduled[id(seq)] = ScheduledChunk(seq, n)
                budget -= n

        # Running chunks are charged only now: a chunk can still be withdrawn
        # by a later preemption in the loop above.
        for chunk in scheduled.values():
            self._charge(chunk)
        self._admit(budget, scheduled, out, now)
        for chunk in scheduled.values():
            (out.decodes if chunk.num_tokens == 1 else out.prefills).append(chunk)
        return out

    def _admit(self, budget: int, scheduled: dict[int, ScheduledChunk], out: SchedulerOutput, now: float) -> None:
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            tenant = self._next_tenant()
            if tenant is None:
                return
            seq = self.waiting[tenant][0]
            hits = [] if seq.needs_prompt_logprobs else self.blocks.find_cached_prefix(seq)
            num_hit_tokens = len(hits) * self.blocks.block_size
            remaining = seq.num_tokens - num_hit_tokens
            n = min(remaining, budget)
            if self.config.reservation == "full":
                total = min(seq.num_prompt_tokens + seq.request.params.max_tokens, self.max_model_len)
                reserve = total - num_hit_tokens
            else:
                reserve = n
            if self.blocks.allocate(seq, reserve, hits) is None:
                return  # head of line waits for blocks; no preemption to admit
            self.waiting[tenant].popleft()
            seq.num_computed_tokens += num_hit_tokens
            if not seq.started:
                seq.first_scheduled_at = now
                seq.num_cached_tokens = num_hit_tokens
                self.prefix_hit_tokens += num_hit_tokens
            seq.num_served_tokens = max(seq.num_served_tokens, seq.num_computed_tokens)
            seq.started = True
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            chunk = ScheduledChunk(seq, n)
            scheduled[id(seq)] = chunk
            # Charged now, not at the end of the step, so the next pick in
            # this same loop already sees this tenant's new share.
            self._charge(chunk)
            budget -= n

    def _next_tenant(self) -> str | None:
        heads = {tenant: queue[0] for tenant, queue in self.waiting.items() if queue}
        if any(not head.request.batch for head in heads.values()):
            heads = {tenant: head for tenant, head in heads.items() if not head.request.batch}
        return min(heads, key=lambda tenant: self.vtime[tenant], default=None)

    def _preempt(self, victim: Sequence, scheduled: dict[int, ScheduledChunk], out: SchedulerOutput) -> int:
        """Recompute-preempt `victim`; returns the budget it had been given this step."""
        assert self.config.reservation == "optimistic", "full reservation never preempts"
        refund = 0
        chunk = scheduled.pop(id(victim), None)
        if chunk is not None:
            refund = chunk.num_tokens
        self.running.remove(victim)
        self.blocks.free_sequence(victim)
        victim.num_computed_tokens = 0
        victim.status = SequenceStatus.WAITING
        self.waiting.setdefault(victim.tenant_id, deque()).appendleft(victim)
        self.num_preemptions += 1
        out.preempted.append(victim)
        return refund

    def _expire(self, now: float, out: SchedulerOutput) -> None:
        for queue in self.waiting.values():
            for seq in [s for s in queue if not s.started and s.request.deadline is not None]:
                if seq.request.deadline <= now:
                    queue.remove(seq)
                    seq.status = SequenceStatus.FINISHED
                    seq.finish_reason = FinishReason.EXPIRED
                    out.expired.append(seq)

    def _charge(self, chunk: ScheduledChunk) -> None:
        seq = chunk.seq
        end = seq.num_computed_tokens + chunk.num_tokens
        recomputed = max(0, min(end, seq.num_served_tokens) - seq.num_computed_tokens)
        seq.num_recomputed_tokens += recomputed
        self.num_recomputed_tokens += recomputed
        fresh = max(0, end - max(seq.num_served_tokens, seq.num_computed_tokens))
        seq.num_served_tokens = max(seq.num_served_tokens, end)
        self.vtime[seq.tenant_id] = self.vtime.get(seq.tenant_id, 0.0) + fresh / seq.weight
