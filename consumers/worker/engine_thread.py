"""The engine runs in its own thread; the worker's Kafka I/O stays on the asyncio loop.

    asyncio ──submit(add / abort)──▶ inbox ──▶ engine thread: apply, step(), stats
       ▲                                              │
       └──────── deliver(outputs) (call_soon_threadsafe) ◀┘

Every engine call happens on the engine thread (the engine is not thread
safe); aborts therefore take effect at the next step boundary. Before its
first order the thread warms the engine up and measures its step costs
(`_warm_up`). A failing step
ends only its requests (`failed`, see engine.engine); should the thread die
anyway, `alive` turns false and the worker stops (`EngineStopped`), so the
controller interrupts its attempts instead of routing to a dead engine.
"""
from __future__ import annotations

import ctypes
import logging
import queue
import threading
import time
from collections.abc import Callable

from engine.engine import Engine
from engine.errors import RequestError
from engine.request import EngineRequest, EngineStats, RequestOutput, SamplingParams

log = logging.getLogger(__name__)

Deliver = Callable[[list[RequestOutput]], None]
Refuse = Callable[[str, str], None]


PR_SET_NAME = 15
# The prefill a step's cost split remembers: its history fades by a fifth per this many prefill tokens.
PREFILL_MEMORY_TOKENS = 512
# The prompt tokens the prefix-hit share remembers: its history fades by half per this many started tokens.
PREFIX_MEMORY_TOKENS = 2048
# The tenant and prefix-cache scope of the warm-up prompts: no tenant's requests share it.
WARM_UP_SCOPE = "ledgerlm-warm-up"
# A warm-up prompt takes one prefill step and two decode steps; it is given up past this many.
WARM_UP_MAX_STEPS = 16


def name_native_thread(name: str) -> None:
    """Give the calling OS thread `name` (Python 3.11 names only its own Thread object). The engine thread's
    CPU is then told apart in `/proc/<pid>/task/<tid>/comm`, and the OpenMP workers torch starts from this
    thread inherit the name, so the engine's whole compute carries it (`ledgerlm bench overhead`)."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the name is only for observers
        pass


class EngineTiming:
    """Cumulative wall time of the engine thread: `step_s` inside steps, `stalled_s` between two steps while
    work was unfinished (the gap after a step that left nothing to do is idleness, not a stall)."""

    def __init__(self) -> None:
        self.step_s = 0.0
        self.stalled_s = 0.0
        self._busy_since: float | None = None  # end of the last step, when it left work unfinished

    def stepped(self, started: float, ended: float, still_busy: bool) -> None:
        if self._busy_since is not None:
            self.stalled_s += started - self._busy_since
        self.step_s += ended - started
        self._busy_since = ended if still_busy else None


def smoothed(previous: float | None, sample: float) -> float:
    return sample if previous is None else 0.8 * previous + 0.2 * sample


class EngineStopped(RuntimeError):
    """The engine thread is gone: the worker must say so and exit."""


class EngineThread:
    def __init__(self, engine: Engine, deliver: Deliver, refuse: Refuse, weights: dict[str, float]) -> None:
        self.engine = engine
        self.deliver = deliver
        self.refuse = refuse
        self.weights = weights  # the dict the engine's config reads tenant weights from
        self.inbox: queue.Queue = queue.Queue()
        self.stats: EngineStats = engine.stats()
        self._stop = threading.Event()
        # Tokens per second of the steps that ran prefill (prefill chunks and the decodes beside them),
        # smoothed: the heartbeat's tokens_per_s, from which the controller predicts how long queued prompts
        # take. Decode-only steps say little about that (a step of 16 decodes costs about what a step of
        # 512 prefill tokens does on a memory-bound CPU), so they are left out.
        self.tokens_per_s: float | None = None
        # How long a step that runs prefill takes (smoothed): queued prompts are served up to the per-step
        # token budget at a time: floor(queued / budget) such steps predict their wait, ceil(prompt / budget)
        # more its own prefill.
        self.prefill_step_s: float | None = None
        # How long any step takes now (smoothed, decode-only steps included): a prompt that arrives waits for
        # the step in flight first, half of one on average, at the batch running now.
        self.step_s: float | None = None
        # A step's cost split in two (smoothed): a decode-only step at the batch running now, and what each prefill
        # token adds to a step beside it. A step that fills the token budget with queued prompts costs
        # decode_step_s + budget * prefill_token_s: prefill_step_s, measured on the steps that happened to run
        # prefill (mostly one short prompt), understated it about 3x when prompts arrived together.
        self.decode_step_s: float | None = None
        self.prefill_token_s: float | None = None
        self._prefill_excess_s = 0.0  # seconds beyond a decode step, and the prefill tokens they bought, faded
        self._prefill_tokens = 0.0
        # The share of recently started prompts' tokens the prefix cache served (faded by prompt tokens): the
        # controller counts queued prompts net of it. guidellm repeats its prompts, and 144 of each 158 tokens
        # came from the cache, while the controller counted all 158 ahead and refused at 8 streams.
        self.prefix_hit_share: float | None = None
        self._hit_tokens = 0.0
        self._started_tokens = 0.0
        # Wall seconds inside step(), and seconds with unfinished work but not inside a step (applying orders,
        # handing outputs over, waiting for the interpreter): how much the worker's other threads cost the engine.
        self.timing = EngineTiming()
        self.warmed = threading.Event()  # the warm-up has ended (or the thread has died: see `alive`)
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(None)
        self._thread.join(timeout=10)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def add(self, request: EngineRequest, weight: float) -> None:
        self.inbox.put(("add", request, weight))

    def abort(self, request_id: str) -> None:
        self.inbox.put(("abort", request_id, None))

    def _apply(self, item) -> None:
        if item is None:
            return
        op, payload, weight = item
        if op == "add":
            self.weights[payload.tenant_id] = weight
            try:
                self.engine.add_request(payload)
            except RequestError as exc:
                self.refuse(payload.request_id, f"engine refused: {exc.field or type(exc).__name__}")
            except Exception as exc:  # a request the engine's check let through must not end the thread
                log.error("engine add failed request=%s error=%s", payload.request_id, type(exc).__name__)
                self.refuse(payload.request_id, f"engine refused: {type(exc).__name__}")
        elif op == "abort":
            self.engine.abort(payload)

    def _run(self) -> None:
        try:
            self._warm_up()
            self.warmed.set()
            self._loop()
        except BaseException as exc:  # whatever it was, the worker learns of it through `alive`
            log.critical("engine thread died error=%s", type(exc).__name__, exc_info=True)
        finally:
            self.warmed.set()

    def _measure(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        rate = tokens / seconds
        self.tokens_per_s = rate if self.tokens_per_s is None else 0.8 * self.tokens_per_s + 0.2 * rate
        self.prefill_step_s = seconds if self.prefill_step_s is None else 0.8 * self.prefill_step_s + 0.2 * seconds

    def _measure_cost(self, prefill_tokens: int, seconds: float) -> None:
        """A decode-only step updates the decode step; a step with prefill adds what it cost beyond a decode step
        to the prefill tokens' share, weighed by its tokens: the cost of a prefill token is the excess over the
        tokens of the last few token budgets' worth of prefill (the history fades by the tokens added, not by
        the steps). A step of a few tokens, a prompt mostly served from the prefix cache, costs a fixed part
        its few tokens cannot carry: guidellm's repeated prompts prefill 14 of 158 tokens, and counted per step
        they priced a full step at 1.9 s, against the 1.0-1.3 s a full step took."""
        if seconds <= 0:
            return
        if prefill_tokens <= 0:
            self.decode_step_s = smoothed(self.decode_step_s, seconds)
        elif self.decode_step_s is not None:
            kept = 0.8 ** (prefill_tokens / PREFILL_MEMORY_TOKENS)
            self._prefill_excess_s = kept * self._prefill_excess_s + max(0.0, seconds - self.decode_step_s)
            self._prefill_tokens = kept * self._prefill_tokens + prefill_tokens
            self.prefill_token_s = self._prefill_excess_s / self._prefill_tokens

    def _warm_up(self) -> None:
        """Before any order: three prompts of a full step's token budget, each followed by a decode step. The
        first pays for the cold kernels (its step took 0.76 s where a warm one takes 0.35 s on SmolLM2 and 2
        cores); the others are measured (a prefill token is priced against a decode step measured before it), so
        the first heartbeat already prices a full step and a decode step.
        Without a price the controller predicted an idle worker from a default rate and promised the first
        chats of a burst 0.6 s; they waited 3.8 s. The prompts are in a scope of their own (no tenant's
        prefix cache sees them) and nothing is delivered."""
        name_native_thread(self._thread.name)
        engine = self.engine
        vocab = engine.artifacts.dims.vocab_size
        pool_tokens = engine.blocks.num_blocks * engine.config.block_size  # a small pool holds a shorter prompt
        length = max(1, min(engine.config.max_num_batched_tokens, engine.max_model_len - 2, pool_tokens - 2))
        for round_ in range(3):
            request_id = f"warm-up-{round_}"
            prompt = tuple((round_ * 7919 + 31 * i + 1) % vocab for i in range(length))
            engine.add_request(EngineRequest(request_id, prompt, SamplingParams(max_tokens=2, ignore_eos=True),
                                             tenant_id=WARM_UP_SCOPE, scope_key=WARM_UP_SCOPE))
            for _ in range(WARM_UP_MAX_STEPS):
                if not engine.has_unfinished() or self._stop.is_set():
                    break
                self._step(measured=round_ > 0)
            if engine.has_unfinished():  # never expected: the prompt fits one step and the pool
                log.warning("engine warm-up did not finish request=%s", request_id)
                engine.abort(request_id)
                self._step(measured=False)

    def _measure_hits(self, hit_tokens: int, started_tokens: int) -> None:
        if started_tokens <= 0:
            return
        kept = 0.5 ** (started_tokens / PREFIX_MEMORY_TOKENS)
        self._hit_tokens = kept * self._hit_tokens + hit_tokens
        self._started_tokens = kept * self._started_tokens + started_tokens
        self.prefix_hit_share = self._hit_tokens / self._started_tokens

    def _loop(self) -> None:
        while not self._stop.is_set():
            if not self.engine.has_unfinished():
                self._apply(self.inbox.get())
            while True:
                try:
                    self._apply(self.inbox.get_nowait())
                except queue.Empty:
                    break
            if self._stop.is_set() or not self.engine.has_unfinished():
                continue
            outputs = self._step()
            if outputs:
                self.deliver(outputs)

    def _step(self, measured: bool = True) -> list:
        started, tokens_before = time.perf_counter(), self.engine.num_computed_tokens_total
        prefill_before = self.engine.num_prefill_tokens_total
        outputs = self.engine.step()  # a failing step fails its requests, not the thread
        ended = time.perf_counter()
        before, self.stats = self.stats, self.engine.stats()
        if not measured:
            return outputs
        self._measure_hits(self.stats.prefix_hit_tokens - before.prefix_hit_tokens,
                           self.stats.started_prompt_tokens - before.started_prompt_tokens)
        self.timing.stepped(started, ended, still_busy=self.engine.has_unfinished())
        seconds = ended - started
        self.step_s = seconds if self.step_s is None else 0.8 * self.step_s + 0.2 * seconds
        if self.engine.num_prefill_tokens_total > prefill_before:
            self._measure(self.engine.num_computed_tokens_total - tokens_before, seconds)
        self._measure_cost(self.engine.num_prefill_tokens_total - prefill_before, seconds)
        return outputs
