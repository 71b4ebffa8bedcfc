"""`Scheduler`: decides, each step, which sequences run and how many tokens each computes.

Order of one step (token budget `max_num_batched_tokens`, `max_num_seqs`):

1. waiting requests whose queue deadline passed and never started -> expired;
2. running decodes (one token each), most important first;
3. running sequences still in (chunked) prefill;
4. waiting sequences, picked by weighted fair queueing across tenants:
   the tenant with the fewest tokens served per unit weight goes next,
   among tenants whose next sequence is interactive while any is.

While any interactive sequence is running or waiting, batch sequences share
at most `batch_step_tokens` of the step (their running decodes first, and
never held back): a backlog of batch prompts would otherwise fill every step
to the budget and make each interactive first token and gap wait a long step.

When a running sequence cannot get a block, the least important running
sequence (batch before interactive, then lowest weight, then newest) is
preempted by recompute: its blocks are freed and it re-enters the front of
its tenant's queue; recomputing its tokens is counted apart, never charged. Under the `full`
reservation policy blocks for prompt + max output are taken at admission,
so running sequences never need preempting.

After the forward, `update_from_output` is the one place a step changes its sequences: computed tokens
advanced, full blocks offered to the prefix cache, the sampled token appended and fed to the grammar, a
finished sequence ended. A sequence's status changes only in `_move`, which refuses a move that makes no
sense (a finished sequence never runs again).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.prefix_hash import extend_block_hashes
from engine.request import FinishReason
from engine.sequence import Sequence, SequenceStatus
from engine.step_values import ScheduledChunk, SchedulerOutput, SequenceUpdate, StepResult

# Why a sequence stops after its newest token, or None: the engine's stop checks (stop and EOS ids, stop
# strings through its detokenizer, a finished grammar, length); they read the sequence, never change it.
StopCheck = Callable[[Sequence, int], "FinishReason | None"]

_MOVES = {
    SequenceStatus.WAITING: {SequenceStatus.RUNNING, SequenceStatus.FINISHED},
    SequenceStatus.RUNNING: {SequenceStatus.WAITING, SequenceStatus.FINISHED},  # waiting again: preempted
    SequenceStatus.FINISHED: set(),
}

Planned = dict[str, tuple[Sequence, ScheduledChunk]]  # request id -> chunk, insertion-ordered


class Scheduler:
    """Owns the waiting queues (one per tenant), the running list and every unfinished sequence by id."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager, max_model_len: int,
                 compat_key: bytes = b"") -> None:
        self.config = config
        self.blocks = block_manager
        self.max_model_len = max_model_len
        self.compat_key = compat_key  # the prefix hashes' compatibility key (engine.prefix_hash)
        self.requests: dict[str, Sequence] = {}
        self.waiting: dict[str, deque[Sequence]] = {}
        self.running: list[Sequence] = []
        # Virtual time per tenant: tokens served / weight.
        self.vtime: dict[str, float] = {}
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0
        self.started_prompt_tokens = 0
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
        self.requests[seq.request_id] = seq
        self.waiting.setdefault(tenant, deque()).append(seq)

    def finish(self, seq: Sequence, reason: FinishReason) -> None:
        """End `seq` with `reason`: out of whichever queue holds it, its blocks freed."""
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting[seq.tenant_id].remove(seq)
        self.blocks.free_sequence(seq)
        self._move(seq, SequenceStatus.FINISHED)
        seq.finish_reason = reason
        self.requests.pop(seq.request_id, None)

    def _is_active(self, tenant: str) -> bool:
        return bool(self.waiting.get(tenant)) or any(s.tenant_id == tenant for s in self.running)

    @staticmethod
    def _move(seq: Sequence, status: SequenceStatus) -> None:
        """The one place a sequence's status changes."""
        if status not in _MOVES[seq.status]:
            raise RuntimeError(f"sequence {seq.request_id!r} cannot go from {seq.status.value} to {status.value}")
        seq.status = status

    # -- the step ---------------------------------------------------------------
    def schedule(self, now: float) -> SchedulerOutput:
        """Plan one step at monotonic time `now` (see the module docstring for the order)."""
        expired = self._expire(now)
        preempted: list[str] = []
        budget = self.config.max_num_batched_tokens
        batch_budget = self.config.batch_step_tokens if self._interactive_present() else budget
        planned: Planned = {}

        self.running.sort(key=Sequence.priority_key)
        decodes = [s for s in self.running if s.num_uncomputed_tokens == 1]
        prefills = [s for s in self.running if s.num_uncomputed_tokens > 1]
        for seq in decodes + prefills:
            if budget == 0:
                break
            if seq.status is not SequenceStatus.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.num_uncomputed_tokens, budget)
            if seq.request.batch and n > 1:
                n = min(n, batch_budget)
                if n <= 0:
                    continue
            while self.blocks.allocate(seq, n) is None:
                victim = self.running[-1]
                returned = self._preempt(victim, planned)
                budget += returned
                batch_budget += returned if victim.request.batch else 0
                preempted.append(victim.request_id)
                if victim is seq:
                    break
            if seq.status is SequenceStatus.RUNNING:
                planned[seq.request_id] = (seq, self._chunk(seq, seq.num_computed_tokens, n))
                budget -= n
                batch_budget -= n if seq.request.batch else 0

        # Running chunks are charged only now: a chunk can still be withdrawn
        # by a later preemption in the loop above.
        for seq, chunk in planned.values():
            self._charge(seq, chunk)
        self._admit(budget, batch_budget, planned, now)
        chunks = [chunk for _, chunk in planned.values()]
        return SchedulerOutput(decodes=tuple(c for c in chunks if c.num_tokens == 1),
                               prefills=tuple(c for c in chunks if c.num_tokens > 1),
                               expired=tuple(expired), preempted=tuple(preempted))

    def update_from_output(self, out: SchedulerOutput, result: StepResult, stop: StopCheck) -> list[SequenceUpdate]:
        """Apply a step that ran: every chunk's tokens computed, prompt scores kept, then each sampled token
        (in batch order, so a sequence that ends frees its blocks before the next is looked at)."""
        for chunk in out.chunks:
            seq = self.requests[chunk.request_id]
            assert seq.num_computed_tokens <= chunk.start, "a chunk starts at or past the computed tokens"
            seq.num_computed_tokens = chunk.end
            self.blocks.commit_full_blocks(seq)
        for request_id, entries in result.prompt_logprobs:
            self.requests[request_id].prompt_logprobs.extend(entries)
        return [self._apply_sampled(s.request_id, s.token, s.logprob, stop) for s in result.sampled]

    def _apply_sampled(self, request_id: str, token: int | None, logprob, stop: StopCheck) -> SequenceUpdate:
        seq = self.requests[request_id]
        if seq.request.params.max_tokens == 0:  # a scored prompt: nothing to generate
            self.finish(seq, FinishReason.LENGTH)
            return SequenceUpdate(request_id, None, None, FinishReason.LENGTH)
        if token is None:
            return self._failed(seq, "no finite distribution to sample from")
        try:
            seq.token_ids.append(token)
            extend_block_hashes(seq.block_hashes, seq.token_ids, self.blocks.block_size, self.compat_key,
                                seq.request.scope_key)
            if seq.grammar is not None and not seq.grammar.accept(token):
                raise RuntimeError("the grammar refused a token its mask allowed")
            reason = stop(seq, token)
        except Exception as exc:  # grammar, stop checks and detokenization of this sequence alone
            return self._failed(seq, type(exc).__name__)
        if reason is not None:
            self.finish(seq, reason)
        return SequenceUpdate(request_id, token, logprob, reason)

    def _failed(self, seq: Sequence, why: str) -> SequenceUpdate:
        self.finish(seq, FinishReason.FAILED)
        return SequenceUpdate(seq.request_id, None, None, FinishReason.FAILED, error=why)

    def _chunk(self, seq: Sequence, start: int, n: int) -> ScheduledChunk:
        return ScheduledChunk(seq.request_id, start, n, samples=start + n == seq.num_tokens)

    def _admit(self, budget: int, batch_budget: int, planned: Planned, now: float) -> None:
        while budget > 0 and len(self.running) < self.config.max_num_seqs:
            tenant = self._next_tenant()
            if tenant is None:
                return
            seq = self.waiting[tenant][0]
            hits = [] if seq.needs_prompt_logprobs else self.blocks.find_cached_prefix(seq)
            num_hit_tokens = len(hits) * self.blocks.block_size
            remaining = seq.num_tokens - num_hit_tokens
            n = min(remaining, budget, batch_budget if seq.request.batch else budget)
            if n <= 0:
                return  # batch work's share of the step is spent (only batch heads are left)
            if self.config.reservation == "full":
                total = min(seq.num_prompt_tokens + seq.request.params.max_tokens, self.max_model_len)
                reserve = total - num_hit_tokens
            else:
                reserve = n
            if self.blocks.allocate(seq, reserve, hits) is None:
                return  # head of line waits for blocks; no preemption to admit
            self.waiting[tenant].popleft()
            # The hit's tokens count as computed from the chunk's start; update_from_output makes it so.
            start = seq.num_computed_tokens + num_hit_tokens
            if not seq.started:
                seq.first_scheduled_at = now
                seq.num_cached_tokens = num_hit_tokens
                self.prefix_hit_tokens += num_hit_tokens
                self.started_prompt_tokens += seq.num_prompt_tokens
            seq.num_served_tokens = max(seq.num_served_tokens, start)
            seq.started = True
            self._move(seq, SequenceStatus.RUNNING)
            self.running.append(seq)
            chunk = self._chunk(seq, start, n)
            planned[seq.request_id] = (seq, chunk)
            # Charged now, not at the end of the step, so the next pick in
            # this same loop already sees this tenant's new share.
            self._charge(seq, chunk)
            budget -= n
            batch_budget -= n if seq.request.batch else 0

    def _interactive_present(self) -> bool:
        return any(not s.request.batch for s in self.running) or \
            any(not s.request.batch for queue in self.waiting.values() for s in queue)

    def _next_tenant(self) -> str | None:
        heads = {tenant: queue[0] for tenant, queue in self.waiting.items() if queue}
        if any(not head.request.batch for head in heads.values()):
            heads = {tenant: head for tenant, head in heads.items() if not head.request.batch}
        return min(heads, key=lambda tenant: self.vtime[tenant], default=None)

    def _preempt(self, victim: Sequence, planned: Planned) -> int:
        """Recompute-preempt `victim`; returns the budget it had been given this step."""
        assert self.config.reservation == "optimistic", "full reservation never preempts"
        withdrawn = planned.pop(victim.request_id, None)
        self.running.remove(victim)
        self.blocks.free_sequence(victim)
        victim.num_computed_tokens = 0  # recompute: its token ids stay, their keys and values go
        self._move(victim, SequenceStatus.WAITING)
        self.waiting.setdefault(victim.tenant_id, deque()).appendleft(victim)
        self.num_preemptions += 1
        return 0 if withdrawn is None else withdrawn[1].num_tokens

    def _expire(self, now: float) -> list[str]:
        """End waiting sequences that never started and whose deadline passed; their ids."""
        expired = [seq for queue in self.waiting.values() for seq in queue
                   if not seq.started and seq.request.deadline is not None and seq.request.deadline <= now]
        for seq in expired:
            self.finish(seq, FinishReason.EXPIRED)
        return [seq.request_id for seq in expired]

    def _charge(self, seq: Sequence, chunk: ScheduledChunk) -> None:
        end = chunk.end
        recomputed = max(0, min(end, seq.num_served_tokens) - chunk.start)
        seq.num_recomputed_tokens += recomputed
        self.num_recomputed_tokens += recomputed
        fresh = max(0, end - max(seq.num_served_tokens, chunk.start))
        seq.num_served_tokens = max(seq.num_served_tokens, end)
        self.vtime[seq.tenant_id] = self.vtime.get(seq.tenant_id, 0.0) + fresh / seq.weight
