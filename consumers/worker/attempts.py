"""One attempt on this worker: its state, its room in the KV pool, stream position and usage watermark cadence.

An attempt exists once the engine has given it room (before that its order waits in waiting.py) and moves
one way through its states; a move not listed here is a bug, refused with `IllegalMove`:

    RUNNING   ─▶ FINISHING  every choice ended: its end is written next
              ─▶ FENCED     given up: a record undelivered, past its run time, the lease lost, ended by the
                            controller; the controller ends it Interrupted, nothing more is published for it
              ─▶ ENDED      refused by the engine
    FINISHING ─▶ ENDED      its end written (or, when it could not be, named in the heartbeats' `fenced`)
              ─▶ FENCED     the lease lost, or ended by the controller, while its end is written
    FENCED    ─▶ ENDED      the engine is done with every choice, or the writing of its end returned

ENDED: it left the worker and its room went back to the engine.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from consumers.worker.reports import StreamDeliveries
from engine.request import EngineRequest, FinishReason, RequestOutput, StructuredOutput
from engine.request import SamplingParams as EngineSampling
from engine.request import TokenLogprob as EngineLogprob
from engine.reservations import Reservation
from schemas.codec import encode
from schemas.commands import AttemptRefused
from schemas.dispatch import StartAttempt
from schemas.envelope import Envelope
from schemas.lifecycle import Canceled, Completed, Expired, Failed
from schemas.stream import TokenLogprob
from schemas.values import Usage

# How an engine finish maps to (lifecycle type, Completed.finish_reason, stream EndReason).
FINISHES = {
    FinishReason.STOP: ("Completed", "stop", "completed"),
    FinishReason.LENGTH: ("Completed", "length", "output-limit"),
    FinishReason.CANCELLED: ("Canceled", None, "canceled"),
    FinishReason.EXPIRED: ("Expired", None, "expired"),
    FinishReason.FAILED: ("Failed", None, "failed"),
}


# aiokafka's max_request_size (1 MiB, about the broker's default message.max.bytes too), less room for the key,
# headers and batch framing: a refusal must always fit one record.
MAX_REFUSAL_BYTES = 1024 * 1024 - 4096
# Prompt logprobs go out in events of at most this many (entry + alternatives), about 40 bytes each: a scored
# 8k-token prompt with 20 alternatives is 7 MB of JSON, far over one record.
PROMPT_LOGPROB_VALUES_PER_EVENT = 8192


def terminal_event(kind: str, scoped: dict, finish_reason: str | None, usage: Usage) -> Envelope:
    """The lifecycle event that ends an attempt the engine finished (`FINISHES` names the kind)."""
    if kind == "Completed":
        return Completed(**scoped, finish_reason=finish_reason, usage=usage)
    if kind == "Canceled":
        return Canceled(**scoped, usage=usage)
    if kind == "Failed":
        return Failed(**scoped, usage=usage)
    return Expired(**scoped, usage=usage)


def engine_requests(order: StartAttempt, request_id: str, deadline: float) -> list[EngineRequest]:
    """One engine request per choice (seeds seed, seed + 1, ...); ValueError for values the engine cannot take."""
    first = engine_request(order, request_id, deadline)
    seed = first.params.seed
    # The prompt is scored once, by choice 0: the others would score it again and miss the prefix cache for it.
    return [first] + [replace(first, request_id=choice_request_id(request_id, i), params=replace(
        first.params, seed=None if seed is None else (seed + i) % 2**64, prompt_logprobs=None))
        for i in range(1, order.sampling.n)]


def engine_request(order: StartAttempt, request_id: str, deadline: float) -> EngineRequest:
    """The engine's request for an order (its first choice); ValueError for values the engine cannot take."""
    sampling = order.sampling
    structured = sampling.structured
    params = EngineSampling(max_tokens=0 if sampling.prompt_only else order.max_output_tokens,
                            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                            seed=sampling.seed, stop_token_ids=sampling.stop_token_ids, stop=sampling.stop,
                            ignore_eos=sampling.ignore_eos, min_tokens=sampling.min_tokens,
                            presence_penalty=sampling.presence_penalty,
                            frequency_penalty=sampling.frequency_penalty,
                            repetition_penalty=sampling.repetition_penalty, logit_bias=sampling.logit_bias,
                            logprobs=sampling.logprobs, prompt_logprobs=sampling.prompt_logprobs,
                            structured=None if structured is None else StructuredOutput(
                                structured.kind, structured.spec, structured.strict))
    return EngineRequest(request_id=request_id, prompt_token_ids=order.input_token_ids, params=params,
                         tenant_id=order.tenant_id, scope_key=order.tenant_id, deadline=deadline,
                         batch=order.tier == "batch")


def refusal(order: StartAttempt, worker_id: str, reason: str, plane: str | None) -> AttemptRefused:
    """The order goes back whole, so any controller can reroute it; one too big for a record goes back as
    ids only (`attempt=None`), and the controller rejects the generation instead."""
    refused = AttemptRefused(tenant_id=order.tenant_id, generation_id=order.generation_id, epoch=order.epoch,
                             worker_id=worker_id, reason=reason, attempt=order, plane=plane)
    if len(encode(refused)) <= MAX_REFUSAL_BYTES:
        return refused
    return refused.model_copy(update={"attempt": None})


def logprob_value(entry: EngineLogprob) -> TokenLogprob:
    return TokenLogprob(token_id=entry.token_id, logprob=entry.logprob, top=entry.top)


def prompt_logprob_chunks(entries: list[TokenLogprob], top: int) -> list[tuple[TokenLogprob, ...]]:
    """`entries` in pieces of at most PROMPT_LOGPROB_VALUES_PER_EVENT values (one event each)."""
    size = max(1, PROMPT_LOGPROB_VALUES_PER_EVENT // (top + 1))
    return [tuple(entries[i : i + size]) for i in range(0, len(entries), size)]


def monotonic_of(instant: datetime) -> float:
    """A wall-clock instant (an event's occurred_at) on this process's monotonic clock, never in the future."""
    now = time.monotonic()
    return now - max(0.0, (datetime.now(UTC) - instant).total_seconds())


def end_of_choice(reason: FinishReason) -> str:
    return FINISHES[reason][2]


# The whole attempt's end from its choices' ends, most telling first: a failure, a cancel, an expiry, then
# `length` when any choice hit its limit, `stop` when all stopped.
_END_ORDER = (FinishReason.FAILED, FinishReason.CANCELLED, FinishReason.EXPIRED, FinishReason.LENGTH,
              FinishReason.STOP)


@dataclass
class Choice:
    """One of an attempt's n sequences of the same prompt, and what it produced but has not streamed yet."""

    index: int
    output: RequestOutput | None = None  # its latest (running totals)
    ended: FinishReason | None = None
    pending_ids: list[int] = field(default_factory=list)
    pending_text: list[str] = field(default_factory=list)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    pending_end: str | None = None

    @property
    def has_pending(self) -> bool:
        return bool(self.pending_ids or any(self.pending_text) or self.pending_end)


class AttemptState(enum.Enum):
    RUNNING = "running"  # its choices in the engine, its events going out
    FINISHING = "finishing"  # every choice ended: its end is being written
    FENCED = "fenced"  # given up: the controller ends it, nothing more is published for it
    ENDED = "ended"  # left the worker, its room given back


_MOVES = {
    AttemptState.RUNNING: {AttemptState.FINISHING, AttemptState.FENCED, AttemptState.ENDED},
    AttemptState.FINISHING: {AttemptState.FENCED, AttemptState.ENDED},
    AttemptState.FENCED: {AttemptState.ENDED},
    AttemptState.ENDED: set(),
}


class IllegalMove(RuntimeError):
    """An attempt asked to move where its state machine has no arrow: a bug in the worker, not in the input."""


@dataclass
class Attempt:
    start: StartAttempt
    reservation: Reservation
    state: AttemptState = AttemptState.RUNNING
    seq: int = 0
    report_seq: int = 0
    reported_output: int = 0
    reported_at: float = field(default_factory=time.monotonic)
    usage: Usage = Usage()
    # Choices 1.. wait here until choice 0 has run the prompt: then they find its blocks in the prefix cache.
    unstarted: list[EngineRequest] = field(default_factory=list)
    # Produced but not yet in a stream event (coalesced for `stream_flush_ms`): per choice, and prompt scores.
    choices: list[Choice] = field(default_factory=list)
    pending_prompt_logprobs: list[TokenLogprob] | None = None
    emitted_tokens: int = 0
    flushed_at: float = 0.0
    deliveries: StreamDeliveries = field(default_factory=StreamDeliveries)  # stream events a watermark waits for
    # Monotonic instants for the latency metrics: admitted by the controller, accepted here, last token out,
    # cancel ordered by the controller.
    admitted_at: float = field(default_factory=time.monotonic)
    accepted_at: float = field(default_factory=time.monotonic)
    last_token_at: float | None = None
    cancel_ordered_at: float | None = None

    def __post_init__(self) -> None:
        if not self.choices:
            self.choices = [Choice(i) for i in range(self.start.sampling.n)]

    @property
    def request_id(self) -> str:
        """The engine request id: generation and epoch, so a later epoch never collides with this one."""
        return f"{self.start.generation_id}#{self.start.epoch}"

    @property
    def engine_ids(self) -> list[str]:
        """Every choice's engine request id (choice 0's is `request_id`)."""
        return [choice_request_id(self.request_id, c.index) for c in self.choices]

    @property
    def scoped(self) -> dict:
        return {"tenant_id": self.start.tenant_id, "generation_id": self.start.generation_id,
                "epoch": self.start.epoch}

    # -- state --------------------------------------------------------------------------------
    @property
    def fenced(self) -> bool:
        return self.state is AttemptState.FENCED

    @property
    def finishing(self) -> bool:
        return self.state is AttemptState.FINISHING

    def begin_finishing(self) -> None:
        """Every choice ended in the engine: the end is written next."""
        if not self.choices_ended:
            raise IllegalMove(f"attempt {self.request_id} cannot finish while a choice runs")
        self._move(AttemptState.FINISHING)

    def fence(self) -> None:
        """Given up: publish nothing more for it (a running or finishing attempt; the controller ends it)."""
        self._move(AttemptState.FENCED)

    def end(self) -> None:
        """It left the worker (its room is given back by whoever removes it)."""
        self._move(AttemptState.ENDED)

    def _move(self, state: AttemptState) -> None:
        if state not in _MOVES[self.state]:
            raise IllegalMove(f"attempt {self.request_id} cannot go from {self.state.value} to {state.value}")
        self.state = state

    @property
    def reserved_blocks(self) -> int:
        return self.reservation.num_blocks

    @property
    def started_output(self) -> bool:
        return self.usage.generated_output_tokens > 0

    @property
    def choices_ended(self) -> bool:
        """Every choice has ended in the engine (or was ended before it reached it)."""
        return all(c.ended is not None for c in self.choices)

    def end_reason(self) -> FinishReason:
        ends = {c.ended for c in self.choices}
        return next(r for r in _END_ORDER if r in ends)

    def observe(self, output: RequestOutput, choice: int = 0) -> None:
        """Usage over the choices: the prompt once (choice 0's, as vLLM counts n), every choice's output."""
        self.choices[choice].output = output
        if output.finished:
            self.choices[choice].ended = output.finish_reason
        first = self.choices[0].output
        outputs = [c.output for c in self.choices if c.output is not None]
        self.usage = Usage(processed_input_tokens=first.num_prompt_tokens if first else 0,
                           cached_input_tokens=first.num_cached_tokens if first else 0,
                           generated_output_tokens=sum(o.num_output_tokens for o in outputs),
                           recompute_tokens=sum(o.num_recomputed_tokens for o in outputs))

    def end_unstarted(self, reason: FinishReason) -> None:
        """Choices never handed to the engine end with `reason` (a cancel before choice 0 ran its prompt)."""
        for request in self.unstarted:
            choice = self.choices[choice_of(request.request_id)]
            choice.ended = reason
            if len(self.choices) > 1:
                choice.pending_end = end_of_choice(reason)
        self.unstarted = []

    def report_due(self, every_tokens: int, every_ms: int, now: float) -> bool:
        if self.usage.generated_output_tokens == self.reported_output:
            return False
        return (self.usage.generated_output_tokens - self.reported_output >= every_tokens
                or (now - self.reported_at) * 1000 >= every_ms)

    def next_report(self, now: float) -> int:
        self.report_seq += 1
        self.reported_output = self.usage.generated_output_tokens
        self.reported_at = now
        return self.report_seq

    def buffer(self, output: RequestOutput, choice: int = 0) -> None:
        pending = self.choices[choice]
        pending.pending_ids.extend(output.new_token_ids)
        pending.pending_text.append(output.text_delta)
        pending.pending_logprobs.extend(logprob_value(e) for e in output.logprobs)
        if output.finished and len(self.choices) > 1:
            pending.pending_end = end_of_choice(output.finish_reason)
        if output.prompt_logprobs is not None:
            self.pending_prompt_logprobs = [logprob_value(e) for e in output.prompt_logprobs]

    @property
    def has_pending(self) -> bool:
        return self.pending_prompt_logprobs is not None or any(c.has_pending for c in self.choices)

    def take_pending(self, now: float) -> list[dict]:
        """The fields of the stream events for what is buffered: prompt logprobs first (in pieces), then each
        choice's tokens with their logprobs (and, with n > 1, its end). `token_count` runs over all choices."""
        events: list[dict] = []
        if self.pending_prompt_logprobs is not None:
            top = self.start.sampling.prompt_logprobs or 0
            for piece in prompt_logprob_chunks(self.pending_prompt_logprobs, top) or [()]:
                events.append({"token_ids": (), "text_delta": "", "token_count": self.emitted_tokens,
                               "prompt_logprobs": piece})
            self.pending_prompt_logprobs = None
        wants_logprobs = self.start.sampling.logprobs is not None
        for c in self.choices:
            if not c.has_pending:
                continue
            self.emitted_tokens += len(c.pending_ids)
            events.append({"token_ids": tuple(c.pending_ids), "text_delta": "".join(c.pending_text),
                           "token_count": self.emitted_tokens,
                           "logprobs": tuple(c.pending_logprobs) if wants_logprobs else None,
                           "choice": c.index, "choice_end": c.pending_end})
            c.pending_ids, c.pending_text, c.pending_logprobs, c.pending_end = [], [], [], None
        self.flushed_at = now
        return events

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    @property
    def used_tokens(self) -> int:
        return len(self.start.input_token_ids) + self.usage.generated_output_tokens


def choice_request_id(request_id: str, choice: int) -> str:
    return request_id if choice == 0 else f"{request_id}/{choice}"


def choice_of(engine_request_id: str) -> int:
    """The choice an engine request id names (`gen#epoch` is choice 0, `gen#epoch/i` choice i)."""
    _, slash, index = engine_request_id.rpartition("/")
    return int(index) if slash and index.isdigit() else 0


def attempt_id_of(engine_request_id: str) -> str:
    head, slash, index = engine_request_id.rpartition("/")
    return head if slash and index.isdigit() else engine_request_id
