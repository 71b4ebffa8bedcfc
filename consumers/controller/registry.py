"""The worker registry as the controller sees it: latest heartbeat per worker, plus recent dispatches.

A heartbeat is up to one interval old, so capacity the controller handed out
since then is held as `pending` and subtracted until a heartbeat sent well
after the dispatch has had the chance to count it. The worker still reserves
atomically and refuses when the estimate was wrong (docs/architecture.md, the life of a generation, step 3).

Heartbeats also list the attempts a worker holds, under an incarnation id
that is new with every process. An attempt is lost (`lost_reason`) when an
earlier incarnation listed it (the worker restarted under the same id), or
when the worker's heartbeats have not listed it for a lease since it was
dispatched or last listed: a dispatch still on its way, or a release sent
just before the heartbeat that no longer lists the attempt, stay within it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from schemas.registry_events import WorkerHeartbeat

# A dispatch is assumed to be reflected by heartbeats sent this long after it.
PENDING_GRACE_S = 0.5
# How long a listing is remembered once heartbeats stop naming the attempt: far beyond any lease, so the
# memory stays bounded by what workers ran recently.
LISTED_MEMORY_S = 300.0
# The share of a worker's places (max_attempts) batch work never takes: interactive work finds room beside a
# batch backlog. A worker's engine runs 32 sequences at a time by default: 192 batch attempts keep it busy.
INTERACTIVE_ROOM_SHARE = 0.25


def as_of(heartbeat: WorkerHeartbeat) -> datetime:
    """The time a heartbeat describes its worker at: its sending, or when that is earlier, the time its worker's
    loop described it, or had read its orders through."""
    times = (heartbeat.occurred_at, heartbeat.described_at, heartbeat.dispatch_read_through)
    return min(t for t in times if t is not None)


@dataclass(frozen=True)
class Demand:
    """What one attempt asks of a worker: its prompt and its output limit; `batch` work waits behind every
    prompt queued on the worker, interactive work only behind the interactive ones (the engine admits those
    first)."""

    prompt_tokens: int
    max_output_tokens: int
    batch: bool = False

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.max_output_tokens

    def tokens_on(self, heartbeat: WorkerHeartbeat) -> int:
        """The tokens the worker reserves at acceptance: everything (full), or prompt + headroom (optimistic)."""
        if heartbeat.reservation == "full":
            return self.total_tokens
        return self.prompt_tokens + min(self.max_output_tokens, heartbeat.headroom_tokens)


@dataclass(frozen=True)
class WorkerChoice:
    """A worker for an attempt. `queue_s` is the predicted wait before its prefill starts, `ttft_s` the
    predicted time to its first token (decision to first token at the worker: the promise); `model_*` are the
    queue model's own, before the worker's reported errors. `waits_for_kv` says the worker lacks the blocks
    now and will queue the attempt until running work frees them."""

    worker_id: str
    room_tokens: int
    queue_s: float
    waits_for_kv: bool = False
    model_queue_s: float | None = None
    ttft_s: float | None = None
    model_ttft_s: float | None = None

    @property
    def promise(self) -> dict[str, int | None]:
        """The StartAttempt fields that carry the wait and TTFT it was routed with, for the worker to measure
        against."""
        return {name: None if seconds is None else round(seconds * 1000) for name, seconds in (
            ("predicted_wait_ms", self.queue_s), ("model_wait_ms", self.model_queue_s),
            ("predicted_ttft_ms", self.ttft_s), ("model_ttft_ms", self.model_ttft_s))}


@dataclass(frozen=True)
class WaitTerms:
    """A worker's predicted wait and TTFT and what they are made of, for a refusal to say why (counts only): the
    queue model's seconds, the prompt tokens still ahead (its heartbeat's and those dispatched since, drained
    since) and the dispatches its heartbeat does not count yet; the rest of `wait_s` is the worker's median
    error, the rest of `ttft_s` (the TTFT admission judges by, `WorkerRegistry.admitting`) its high quantile."""

    worker_id: str
    wait_s: float
    model_s: float
    queued_tokens: int
    pending: int
    ttft_s: float
    model_ttft_s: float
    by_tail: bool = False  # `ttft_s` adds the high quantile of the error, not its median

    def describe(self) -> str:
        return (f"on {self.worker_id}: queue model {self.model_s:.2f} s ({self.queued_tokens} prompt tokens "
                f"queued ahead, {self.pending} dispatched since its heartbeat), TTFT model {self.model_ttft_s:.2f} "
                f"s, + measured error {self.ttft_s - self.model_ttft_s:+.2f} s"
                + (" at its 95th percentile" if self.by_tail else ""))


class Prediction(NamedTuple):
    """The queue model's prediction for one attempt on one worker (`WorkerRegistry.predicted_wait_s`)."""

    wait_s: float  # until its prefill could start
    ttft_s: float  # until its first token
    waits_for_kv: bool
    ahead_tokens: int  # prompt tokens still ahead of it


@dataclass(frozen=True)
class Pending:
    """A dispatch the worker's heartbeats do not count yet: the KV tokens it will reserve, the prompt it adds
    to the worker's prefill queue, and when it was decided (unix seconds)."""

    tokens: int
    prompt_tokens: int
    at: float
    batch: bool = False


@dataclass
class WorkerView:
    heartbeat: WorkerHeartbeat
    pending: dict[str, "Pending"] = field(default_factory=dict)  # generation id -> a dispatch not yet counted
    # "<generation id>:<epoch>" -> send time of the latest heartbeat of this incarnation that listed it
    listed: dict[str, float] = field(default_factory=dict)
    # attempts an earlier incarnation listed: the restart lost them (until the controller ends them)
    lost: set[str] = field(default_factory=set)

    def observe_listing(self, heartbeat: WorkerHeartbeat) -> None:
        if heartbeat.incarnation != self.heartbeat.incarnation:
            self.lost |= set(self.listed)
            self.listed = {}
        listed_at = as_of(heartbeat).timestamp()
        for key in heartbeat.attempts or ():
            self.listed[key] = listed_at
            self.lost.discard(key)
        for key in [k for k, at in self.listed.items() if at < listed_at - LISTED_MEMORY_S]:
            del self.listed[key]

    @property
    def capacity_tokens(self) -> int:
        return self.heartbeat.total_blocks * self.heartbeat.block_size

    @property
    def room_tokens(self) -> int:
        free = self.heartbeat.free_blocks * self.heartbeat.block_size
        return free - sum(p.tokens for p in self.pending.values())

    def full(self, batch: bool = False) -> bool:
        """The worker holds as many attempts as it takes, counting those dispatched since its heartbeat: it
        gets no more until some end, so no worker piles up thousands it cannot start soon. Batch work stops
        short of the bound by `INTERACTIVE_ROOM_SHARE` of it: a burst of 1,000 batch generations otherwise
        filled all 256 places, and every chat beside it was answered 503 "no ready worker" for 25 s."""
        bound = self.heartbeat.max_attempts
        if bound is None:
            return False
        if batch:
            bound -= max(1, int(bound * INTERACTIVE_ROOM_SHARE))
        return self.heartbeat.running + len(self.pending) >= bound


class WorkerRegistry:
    def __init__(self) -> None:
        self.workers: dict[str, WorkerView] = {}
        # Unix time up to which the heartbeats have all been read (Follower.read_through); None: judge as of now.
        # Leases are judged as of this time: a controller too starved to read (or a broker frozen) is behind
        # on heartbeats, and its lag must not read as the workers' silence.
        self.read_through: float | None = None

    def observe(self, heartbeat: WorkerHeartbeat) -> None:
        view = self.workers.get(heartbeat.worker_id)
        if view is None or heartbeat.occurred_at >= view.heartbeat.occurred_at:
            if view is None:
                view = self.workers[heartbeat.worker_id] = WorkerView(heartbeat)
            view.observe_listing(heartbeat)
            view.heartbeat = heartbeat
            # A heartbeat describes the worker as of when it had read its orders through, which may be well
            # before its sending (a starved worker's loop: heartbeat_thread.py).
            counted = as_of(heartbeat).timestamp()
            for gen_id in [g for g, p in view.pending.items() if p.at < counted - PENDING_GRACE_S]:
                del view.pending[gen_id]

    def has_fenced(self, worker_id: str, generation_id: str, epoch: int | None) -> bool:
        """The worker's latest heartbeat says it gave this attempt up (self-fenced)."""
        view = self.workers.get(worker_id)
        return view is not None and f"{generation_id}:{epoch}" in view.heartbeat.fenced

    def lost_reason(self, worker_id: str, generation_id: str, epoch: int | None,
                    dispatched_at: float | None, commands_read_through: float | None = None) -> str | None:
        """Why the worker no longer holds this attempt, from its heartbeats (None: it holds it, or cannot tell).

        `worker-restarted`: an earlier incarnation of the worker listed it. `attempt-not-listed`: the latest
        heartbeat, sent (and its orders read through) more than a lease after the attempt's dispatch (unix
        seconds) and after its last listing, does not list it. `commands_read_through` is the unix time up to
        which the controller has read the attempt's commands partition (-inf: not since it took the partition;
        None: judge without it): a release the worker sent before it stopped listing the attempt, still waiting
        there for a new partition owner, is not a lost attempt."""
        view = self.workers.get(worker_id)
        if view is None:
            return None
        key = f"{generation_id}:{epoch}"
        if key in view.lost:
            return "worker-restarted"
        hb = view.heartbeat
        if hb.attempts is None or key in hb.attempts:
            return None
        since = max(view.listed.get(key, float("-inf")), dispatched_at if dispatched_at is not None else float("-inf"))
        if since == float("-inf"):
            return None  # dispatched before the controller recorded dispatch times, never listed: the lease decides
        # Judged as of when the worker had read its orders through: an order still on its way (a frozen broker,
        # a starved worker) is not yet one the worker lost.
        judged_s = as_of(hb).timestamp()
        if commands_read_through is not None:
            judged_s = min(judged_s, commands_read_through)
        return "attempt-not-listed" if judged_s - since > hb.lease_ms / 1000 else None

    def is_live(self, worker_id: str, now: float) -> bool:
        """The worker's latest heartbeat is alive and within its lease, as of `now` or of the time the
        heartbeats have been read through, whichever is earlier."""
        view = self.workers.get(worker_id)
        if view is None or not view.heartbeat.alive:
            return False
        return view.heartbeat.within_lease(now, self.read_through)

    def predicted_wait_s(self, view: WorkerView, demand: Demand, decode_tokens_per_s: float,
                         now: float) -> Prediction:
        """Seconds until this attempt's prefill could start and until its first token, whether it waits for
        KV, and the prompt tokens ahead of it, from the heartbeat, as of `now`.

        Chunked prefill serves the prompts queued ahead (`ahead_tokens`: drained since they were counted) and
        then this one, up to the per-step token budget at a time. Its prefill starts in the step where the
        queue ahead ends, so it waits floor(ahead / budget) whole steps; its first token comes with the step
        that takes the prompt's last token, after ceil((ahead + prompt) / budget) - 1 whole steps, and that
        last step carries the rest of the queue's tokens as well as its own and, for interactive work, the batch
        prompts' share of a step (`batch_step_tokens`) while any are queued. (Counting only its own prompt in
        that step made a burst's promise up to a whole step short: the 4th of 8 prompts of 158 tokens, with
        474 tokens ahead, was promised 0.4 s and waited 1.5 s.) A whole step costs a decode step at the batch
        running now plus the budget's tokens at the measured cost of a prefill token (`full_step_s`). What is
        left of the step running now, half a step of the length measured at the batch running now on
        average (`step_ms`), comes first when the worker runs anything. The KV tokens this attempt lacks free
        up at the measured token rate. A worker that has not measured yet is predicted from
        `decode_tokens_per_s`.
        """
        hb = view.heartbeat
        rate = hb.tokens_per_s or decode_tokens_per_s
        deficit = max(0, demand.tokens_on(hb) - view.room_tokens)
        first_s = hb.step_ms / 2000 if hb.step_ms and (hb.running or view.pending) else 0.0
        first_s += deficit / rate
        full_step_s = self.full_step_s(hb)
        if full_step_s is None:
            ahead = self.ahead_tokens(view, demand, now, rate)
            wait_s = ahead / rate
            return Prediction(first_s + wait_s, first_s + wait_s + self.computed(hb, demand.prompt_tokens) / rate,
                              deficit > 0, ahead)
        budget = hb.max_batched_tokens
        ahead = self.ahead_tokens(view, demand, now, budget / full_step_s)  # the budget per whole step
        through = ahead + round(self.computed(hb, demand.prompt_tokens))
        whole = max(0, -(-through // budget) - 1)
        beside = 0 if demand.batch else min(hb.batch_queued_tokens, hb.batch_step_tokens or 0)
        ttft_s = whole * full_step_s + self.step_s(hb, min(budget, through - whole * budget + beside))
        return Prediction(first_s + ahead // budget * full_step_s, first_s + ttft_s, deficit > 0, ahead)

    @staticmethod
    def full_step_s(hb: WorkerHeartbeat) -> float | None:
        """A step whose token budget is all prefill (None: not measured)."""
        if not hb.max_batched_tokens:
            return None
        return WorkerRegistry.step_s(hb, hb.max_batched_tokens)

    @staticmethod
    def step_s(hb: WorkerHeartbeat, prefill_tokens: int) -> float | None:
        """A step with `prefill_tokens` beside the running decodes: a decode step plus that many tokens at the
        cost of a prefill token; where the worker has not split its step cost yet, the mean step that ran
        prefill (None: not measured)."""
        if hb.decode_step_ms and hb.prefill_token_ms:
            return (hb.decode_step_ms + prefill_tokens * hb.prefill_token_ms) / 1000
        return hb.prefill_step_ms / 1000 if hb.prefill_step_ms else None

    @staticmethod
    def ahead_tokens(view: WorkerView, demand: Demand, now: float, prefill_per_s: float) -> int:
        """Prompt tokens still ahead of an attempt of this tier at `now`, net of the prefix cache's share
        (`computed`): the heartbeat's queue (for interactive work, its interactive part) and the prompts
        dispatched since (each from when it was decided, or the heartbeat if later), drained at `prefill_per_s`
        while any is queued. (Counting every dispatch since
        the heartbeat in full, a prompt dispatched 0.9 s before, long in its decodes, still counted as
        queued: at 8 guidellm streams, 4 of them made 632 tokens and the refusals' 1.3 s.)"""
        hb = view.heartbeat
        queued = WorkerRegistry.computed(hb, hb.queued_tokens if demand.batch
                                         else hb.queued_tokens - hb.batch_queued_tokens)
        at = as_of(hb).timestamp()
        arrivals = sorted((max(p.at, at), WorkerRegistry.computed(hb, p.prompt_tokens))
                          for p in view.pending.values() if demand.batch or not p.batch)
        for arrived, tokens in arrivals:
            queued = max(0.0, queued - prefill_per_s * (arrived - at)) + tokens
            at = arrived
        return round(max(0.0, queued - prefill_per_s * max(0.0, now - at)))

    @staticmethod
    def computed(hb: WorkerHeartbeat, prompt_tokens: int) -> float:
        """The prompt tokens a worker will compute of `prompt_tokens`: net of the share its prefix cache served of
        the prompts it started lately (guidellm repeats its prompts: 144 of each 158 tokens were served, and
        counting them in full refused a third of the requests at 8 streams)."""
        return prompt_tokens * (1.0 - (hb.prefix_hit_share or 0.0))

    @staticmethod
    def calibrated(view: WorkerView, demand: Demand, model_s: float, ttft: bool = False) -> float:
        """The model's wait (or TTFT) plus what it missed on this worker lately: the heartbeat's
        `wait_error_ms` (`ttft_error_ms`; the wait's where the TTFT's is not measured), measured on interactive
        attempts: batch work waits behind every prompt and is not promised a latency."""
        hb = view.heartbeat
        error_ms = hb.wait_error_ms if not ttft or hb.ttft_error_ms is None else hb.ttft_error_ms
        if demand.batch or error_ms is None:
            return model_s
        return max(0.0, model_s + error_ms / 1000)

    @staticmethod
    def admitting(view: WorkerView, demand: Demand, model_ttft_s: float) -> float:
        """The TTFT an interactive attempt is admitted by: the model's plus the high quantile of its recent errors
        on this worker (`ttft_error_high_ms`), where the promise adds their median; the promise where the worker
        reports no high quantile."""
        high_ms = view.heartbeat.ttft_error_high_ms
        if demand.batch or high_ms is None:
            return WorkerRegistry.calibrated(view, demand, model_ttft_s, ttft=True)
        return max(0.0, model_ttft_s + high_ms / 1000)

    def candidates(self, model_version: str, demand: Demand, now: float, exclude: frozenset[str]):
        for worker_id, view in self.workers.items():
            hb = view.heartbeat
            if (worker_id not in exclude and not hb.draining and model_version in hb.model_versions
                    and self.is_live(worker_id, now) and demand.total_tokens <= view.capacity_tokens
                    and not view.full(demand.batch)):
                yield worker_id, view

    def choose(self, model_version: str, demand: Demand, allowance_s: float, decode_tokens_per_s: float,
               now: float, exclude: frozenset[str] = frozenset(), may_wait: bool = True) -> WorkerChoice | None:
        """Among the ready workers with the version whose prediction fits `allowance_s` (an interactive
        attempt's TTFT at the high quantile of its error, `admitting`; a batch attempt's wait: it is promised no
        latency, and is dispatched only where it would start soon), the one holding the fewest attempts, then the
        shortest predicted wait, then the most room. (By the wait first, identical workers split work by the noise
        in their measured steps: 3 of 4 requests went to the one whose warm-up had measured a few ms less.)

        An attempt that lacks KV room waits on the worker until running work frees it; `may_wait=False`
        routes only to workers with room now.
        """
        best: WorkerChoice | None = None
        best_key: tuple = ()
        for worker_id, view in self.candidates(model_version, demand, now, exclude):
            model_s, model_ttft_s, waits, _ = self.predicted_wait_s(view, demand, decode_tokens_per_s, now)
            queue_s = self.calibrated(view, demand, model_s)
            ttft_s = self.calibrated(view, demand, model_ttft_s, ttft=True)
            judged_s = queue_s if demand.batch else self.admitting(view, demand, model_ttft_s)
            if judged_s > allowance_s or (waits and not may_wait):
                continue
            choice = WorkerChoice(worker_id, view.room_tokens, queue_s, waits, model_s, ttft_s, model_ttft_s)
            key = (view.heartbeat.running + len(view.pending), choice.queue_s, -choice.room_tokens)
            if best is None or key < best_key:
                best, best_key = choice, key
        return best

    def shortest_wait(self, model_version: str, demand: Demand, decode_tokens_per_s: float,
                      now: float) -> WaitTerms | None:
        """The best TTFT admission judges by (`admitting`) over every ready worker with the version, whatever
        the allowance, with the terms it is made of."""
        best: WaitTerms | None = None
        for worker_id, view in self.candidates(model_version, demand, now, frozenset()):
            model_s, model_ttft_s, _, ahead = self.predicted_wait_s(view, demand, decode_tokens_per_s, now)
            terms = WaitTerms(worker_id, self.calibrated(view, demand, model_s), model_s, ahead, len(view.pending),
                              self.admitting(view, demand, model_ttft_s), model_ttft_s,
                              not demand.batch and view.heartbeat.ttft_error_high_ms is not None)
            if best is None or terms.ttft_s < best.ttft_s:
                best = terms
        return best

    def hold(self, worker_id: str, generation_id: str, demand: Demand, now: float) -> None:
        """Count the tokens the worker will reserve for this attempt until its heartbeats show them."""
        view = self.workers.get(worker_id)
        if view is not None:
            view.pending[generation_id] = Pending(demand.tokens_on(view.heartbeat), demand.prompt_tokens, now,
                                                  demand.batch)

    def forget(self, worker_id: str | None, generation_id: str) -> None:
        view = self.workers.get(worker_id) if worker_id else None
        if view is not None:
            view.pending.pop(generation_id, None)
            view.lost = {key for key in view.lost if key.rsplit(":", 1)[0] != generation_id}
