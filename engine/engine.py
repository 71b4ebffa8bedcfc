"""`Engine`: the step loop tying scheduler, block manager, model runner and detokenizer together.

    add_request() ─▶ waiting ─▶ step(): schedule ─▶ one forward ─▶ sample
                                  ▲                                 │
                                  └──── outputs, frees, cache ◀─────┘

Synchronous by design: `abort()` only marks a request, and the mark is
applied at the start of the next `step()`, so blocks are never freed while a
forward pass that reads them is in flight. A worker thread drives `step()`,
and every call but two comes from that thread: `reserve()` and `release()`
touch only the reservation ledger (engine.reservations), behind its own lock,
so a caller admits work by the engine's own count from any thread.

A step that fails ends only the requests involved, `failed` with their output
so far: a row that cannot be sampled (non-finite logits) fails its own request;
an exception from the forward pass, which no row can be blamed for, fails
every request of that batch. The engine goes on serving the others.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

import torch

from engine.artifacts.model_dir import ModelArtifacts, load_artifacts
from engine.attention import AttentionShape
from engine.attention_choice import choose_attention
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.errors import EngineError, RequestError
from engine.kv_cache import KVCacheSpec
from engine.kv_sizing import KVPoolSize, cpu_pool_bytes, gpu_pool_bytes, mem_available_bytes
from engine.checks import check_sampling
from engine.llama import LlamaModel, LlamaWeights
from engine.model_runner import ModelRunner
from engine.prefix_hash import compatibility_key, extend_block_hashes
from engine.request import EngineRequest, EngineStats, FinishReason, RequestOutput, TokenLogprob
from engine.reservations import KVReservations, Reservation
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from engine.step_values import SchedulerOutput, SequenceUpdate
from engine.structured import GrammarCompiler

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(config: EngineConfig) -> tuple[torch.device, torch.dtype]:
    """CUDA + bfloat16 when available, else CPU + float32 (bf16 matmuls are slow on CPUs)."""
    if config.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(config.device)
    if config.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = _DTYPES[config.dtype]
    return device, dtype


class Engine:
    """Paged-KV continuous-batching engine over one model directory."""

    def __init__(
        self,
        model_dir: str | Path,
        config: EngineConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        artifacts: ModelArtifacts | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        self.clock = clock
        self.artifacts = artifacts or load_artifacts(model_dir, self.config.expected_checksums)
        self.tokenizer = self.artifacts.tokenizer
        dims = self.artifacts.dims
        self.device, self.dtype = resolve_device(self.config)

        limit = min(dims.max_position_embeddings, self.artifacts.sliding_window or dims.max_position_embeddings)
        self.max_model_len = min(self.config.max_model_len or limit, limit)
        weights = LlamaWeights(dims, self.artifacts.tensors, self.dtype, self.device)
        self.kv_size = self._kv_pool_size(weights)
        self.kv_spec = KVCacheSpec.from_budget(
            dims.num_layers, dims.num_kv_heads, dims.head_dim, self.dtype, self.config.block_size, self.kv_size.num_bytes
        )
        if self.kv_spec.num_blocks < 1:
            raise EngineError(
                f"the KV pool ({self.kv_size.how}) holds no block "
                f"({self.config.block_size} tokens x {self.kv_spec.bytes_per_token} bytes)"
            )
        shape = AttentionShape(dims.num_heads, dims.num_kv_heads, dims.head_dim, self.config.block_size)
        attention = choose_attention(self.config.attention, shape, dims.num_layers, self.kv_spec.num_blocks,
                                     self.device, self.dtype)
        model = LlamaModel(dims, weights, self.artifacts.inv_freq, self.artifacts.attention_scaling, attention)
        self.kv_pool = self.kv_spec.allocate(self.device)
        self.runner = ModelRunner(model, self.kv_pool, self.config.block_size, self.device)
        self.blocks = BlockManager(self.kv_spec.num_blocks, self.config.block_size, self.config.enable_prefix_cache)
        self.compat_key = compatibility_key(self.artifacts.checksums, str(self.dtype), self.config.block_size)
        self.scheduler = Scheduler(self.config, self.blocks, self.max_model_len, self.compat_key)
        watermark = self.config.free_block_watermark if self.config.reservation == "optimistic" else 0.0
        self.room = KVReservations(self.kv_spec.num_blocks, self.config.block_size,
                                   int(self.kv_spec.num_blocks * watermark))
        self.eos_token_ids = self._eos_ids()
        self.grammars = GrammarCompiler(self.tokenizer, dims.vocab_size, self.eos_token_ids)

        self._seqs: dict[str, Sequence] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        self._generators: dict[str, torch.Generator] = {}
        self._pending_aborts: list[str] = []
        self.num_computed_tokens_total = 0  # prefill and decode tokens through the model, ever
        self.num_prefill_tokens_total = 0  # of which prompt (or recompute) tokens in prefill chunks
        self._arrivals = 0
        self._default_generator = torch.Generator(device=self.device)
        self._default_generator.seed()

    def _kv_pool_size(self, weights: LlamaWeights) -> KVPoolSize:
        """The configured bytes, or (None) what the machine allows after the weights."""
        if self.config.kv_cache_bytes is not None:
            return KVPoolSize(self.config.kv_cache_bytes, f"configured {self.config.kv_cache_bytes} bytes")
        if self.device.type != "cuda":
            return cpu_pool_bytes(mem_available_bytes(), self.config.memory)
        d = self.artifacts.dims
        size = torch.empty((), dtype=self.dtype).element_size()
        # Activations of one full step, estimated from the widest tensors of a layer (hidden states, fused
        # QKV and gate/up outputs) and the logits rows; not profiled.
        widest = 3 * d.hidden_size + d.q_size + 2 * d.kv_size + 3 * d.intermediate_size
        activations = self.config.max_num_batched_tokens * widest * size + self.config.max_num_seqs * d.vocab_size * 4
        free, total = torch.cuda.mem_get_info(self.device)  # the weights are already on the device
        return gpu_pool_bytes(total, total - free, activations, self.config.memory)

    # -- public API -------------------------------------------------------------
    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; raises `RequestError` if it can never run here."""
        self._validate(request)
        seq = Sequence.from_request(request, self._arrivals, self.config.weight_of(request.tenant_id))
        if request.params.structured is not None:
            try:
                seq.grammar = self.grammars.grammar(request.params.structured)
            except RequestError as exc:
                raise RequestError(f"request {request.request_id!r}: {exc}", field=exc.field) from None
        seq.arrived_at = self.clock()
        self._arrivals += 1
        extend_block_hashes(seq.block_hashes, seq.token_ids, self.config.block_size, self.compat_key, request.scope_key)
        self._seqs[request.request_id] = seq
        self._detok[request.request_id] = IncrementalDetokenizer(
            self.tokenizer, list(request.prompt_token_ids), request.params.stop
        )
        if not request.params.greedy:
            gen = torch.Generator(device=self.device)
            if request.params.seed is not None:
                gen.manual_seed(request.params.seed)
            else:
                gen.manual_seed(int(torch.randint(0, 2**62, (1,), generator=self._default_generator)))
            self._generators[request.request_id] = gen
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Cancel at the next step boundary. Returns False for unknown or finished ids."""
        if request_id not in self._seqs:
            return False
        if request_id not in self._pending_aborts:
            self._pending_aborts.append(request_id)
        return True

    def has_unfinished(self) -> bool:
        return bool(self._seqs)

    def reserve(self, request_id: str, num_tokens: int) -> Reservation | None:
        """Room for `num_tokens` promised to `request_id`, or None when it is not free now (engine.reservations).
        Safe from any thread."""
        return self.room.reserve(request_id, num_tokens)

    def release(self, request_id: str) -> None:
        """Give back the room promised to `request_id`. Safe from any thread."""
        self.room.release(request_id)

    def step(self) -> list[RequestOutput]:
        """Apply cancellations, schedule, run one forward, and report what changed."""
        try:
            return self._step()
        finally:  # a step boundary, however the step went: what reservations are measured against
            self.room.note_used(self.blocks.num_used)

    def _step(self) -> list[RequestOutput]:
        outputs: list[RequestOutput] = []
        for request_id in self._pending_aborts:
            seq = self._seqs.get(request_id)
            if seq is not None:
                self.scheduler.finish(seq, FinishReason.CANCELLED)
                outputs.append(self._finish(seq, ()))
        self._pending_aborts.clear()

        sched = self.scheduler.schedule(self.clock())
        outputs.extend(self._finish(self._seqs[request_id], ()) for request_id in sched.expired)
        if not sched.is_empty:
            outputs.extend(self._run(sched))
        return outputs

    def _run(self, sched: SchedulerOutput) -> list[RequestOutput]:
        """One forward of a planned step, then the scheduler's update of the sequences it ran."""
        try:
            result = self.runner.run(sched, self.scheduler.requests, self._generators, self._banned_tokens)
        except Exception as exc:  # the forward pass: no row to blame, so the whole batch fails
            log.error("engine step failed error=%s requests=%d", type(exc).__name__, len(sched.chunks))
            return [self._fail(self._seqs[chunk.request_id], type(exc).__name__) for chunk in sched.chunks]
        self.num_computed_tokens_total += sched.num_tokens
        self.num_prefill_tokens_total += sched.num_tokens - len(sched.decodes)
        updates = self.scheduler.update_from_output(sched, result, self._stop_reason)
        return [self._update_output(update) for update in updates]

    def stats(self) -> EngineStats:
        return EngineStats(
            num_blocks_total=self.blocks.num_blocks,
            num_blocks_used=self.blocks.num_used,
            num_blocks_free=self.blocks.num_free,
            num_blocks_cached_free=self.blocks.num_cached_free,
            num_running=len(self.scheduler.running),
            num_waiting=self.scheduler.num_waiting,
            prefix_hit_tokens=self.scheduler.prefix_hit_tokens,
            started_prompt_tokens=self.scheduler.started_prompt_tokens,
            num_preemptions=self.scheduler.num_preemptions,
            kv_bytes_per_token=self.kv_spec.bytes_per_token,
            num_recomputed_tokens=self.scheduler.num_recomputed_tokens,
        )

    # -- internals ----------------------------------------------------------------
    def _banned_tokens(self, seq: Sequence) -> tuple[int, ...]:
        """What `seq` may not sample next: its stop ids (and EOS, unless ignored) until min_tokens are out."""
        params = seq.request.params
        if seq.num_output_tokens >= params.min_tokens:
            return ()
        eos = () if params.ignore_eos else tuple(self.eos_token_ids)
        return (*params.stop_token_ids, *eos)

    def _stop_reason(self, seq: Sequence, token: int) -> FinishReason | None:
        """Why `seq` stops after `token`, its newest (the scheduler's StopCheck): a stop or EOS id, a stop string
        (the detokenizer sees only tokens that are neither), a finished grammar, or its length."""
        params = seq.request.params
        if token in params.stop_token_ids or (not params.ignore_eos and token in self.eos_token_ids):
            return FinishReason.STOP
        if self._detok[seq.request_id].append(token, check_stop=seq.num_output_tokens >= params.min_tokens):
            return FinishReason.STOP
        if seq.grammar is not None and seq.grammar.done:
            return FinishReason.STOP
        if seq.num_output_tokens >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            return FinishReason.LENGTH
        return None

    def _update_output(self, update: SequenceUpdate) -> RequestOutput:
        seq = self._seqs[update.request_id]
        if update.error is not None:
            return self._fail(seq, update.error)
        new_tokens = () if update.token is None else (update.token,)
        logprobs = () if update.logprob is None else (update.logprob,)
        if update.finish_reason is not None:
            return self._finish(seq, new_tokens, logprobs)
        return self._output(seq, new_tokens, self._detok[seq.request_id].take_delta(False), None, logprobs)

    def _fail(self, seq: Sequence, why: str) -> RequestOutput:
        """End `seq` failed with what it produced so far (text held back for stop strings is dropped)."""
        log.warning("request failed request=%s output_tokens=%d reason=%s", seq.request_id, seq.num_output_tokens,
                    why)
        if seq.status is not SequenceStatus.FINISHED:
            self.scheduler.finish(seq, FinishReason.FAILED)
        self._detok.pop(seq.request_id, None)
        self._seqs.pop(seq.request_id, None)
        self._generators.pop(seq.request_id, None)
        return self._output(seq, (), "", FinishReason.FAILED)

    def _finish(self, seq: Sequence, new_tokens: tuple[int, ...],
                logprobs: tuple[TokenLogprob, ...] = ()) -> RequestOutput:
        """The last output of `seq`, which the scheduler has finished: the rest of its text goes with it."""
        detok = self._detok.pop(seq.request_id)
        self._seqs.pop(seq.request_id, None)
        self._generators.pop(seq.request_id, None)
        return self._output(seq, new_tokens, detok.take_delta(True), seq.finish_reason, logprobs)

    @staticmethod
    def _output(seq: Sequence, new_tokens: tuple[int, ...], text: str, reason: FinishReason | None,
                logprobs: tuple[TokenLogprob, ...] = ()) -> RequestOutput:
        prompt_logprobs = None
        if seq.request.params.prompt_logprobs is not None and not seq.prompt_logprobs_sent \
                and not seq.needs_prompt_logprobs:
            prompt_logprobs = tuple(seq.prompt_logprobs)
            seq.prompt_logprobs_sent = True
        return RequestOutput(
            request_id=seq.request_id,
            new_token_ids=new_tokens,
            text_delta=text,
            finish_reason=reason,
            num_prompt_tokens=seq.num_prompt_tokens,
            num_output_tokens=seq.num_output_tokens,
            num_cached_tokens=seq.num_cached_tokens,
            queue_time_s=None if seq.first_scheduled_at is None else seq.first_scheduled_at - seq.arrived_at,
            num_recomputed_tokens=seq.num_recomputed_tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
        )

    def _validate(self, request: EngineRequest) -> None:
        rid = request.request_id
        if rid in self._seqs:
            raise RequestError(f"request {rid!r} is already in the engine")
        n = len(request.prompt_token_ids)
        if n == 0:
            raise RequestError(f"request {rid!r} has an empty prompt")
        vocab = self.artifacts.dims.vocab_size
        if any(not 0 <= t < vocab for t in request.prompt_token_ids):
            raise RequestError(f"request {rid!r} has token ids outside [0, {vocab})", field="prompt_token_ids")
        try:
            check_sampling(request.params, vocab)
        except RequestError as exc:
            raise RequestError(f"request {rid!r}: {exc}", field=exc.field) from None
        total = n + request.params.max_tokens
        if total > self.max_model_len:
            raise RequestError(f"request {rid!r}: {n} prompt + {request.params.max_tokens} output tokens exceed {self.max_model_len}")
        if self.blocks.blocks_needed(total) > self.blocks.num_blocks:
            raise RequestError(f"request {rid!r} needs more KV blocks than the pool has ({self.blocks.num_blocks})")

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for value in (getattr(self.artifacts.config, "eos_token_id", None), getattr(self.tokenizer, "eos_token_id", None)):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return frozenset(ids)
