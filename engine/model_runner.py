"""`ModelRunner`: turns a `SchedulerOutput` into one packed forward and sampled tokens.

Positions come from the snapshot (each chunk's `start`), token ids and block tables from the sequences it
names; the runner changes neither (the scheduler's `update_from_output` does, after the step).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from engine.attention import ChunkRows, DecodeRow
from engine.llama import ForwardBatch, LlamaModel
from engine.logits import process_logits
from engine.logprobs import logprobs_of
from engine.request import TokenLogprob
from engine.sampler import Sampler
from engine.sequence import Sequence
from engine.step_values import SampledToken, ScheduledChunk, SchedulerOutput, StepResult

@dataclass(frozen=True)
class PromptRows:
    """`count` logits rows giving the next-token distribution at prompt positions `first`, `first + 1`, ..."""

    seq: Sequence
    first: int
    count: int


@dataclass(frozen=True)
class Planned:
    """A chunk of the snapshot beside the sequence it names."""

    chunk: ScheduledChunk
    seq: Sequence


class ModelRunner:
    """Owns the model, the KV pool tensor and the sampler."""

    def __init__(self, model: LlamaModel, kv_pool: torch.Tensor, block_size: int, device: torch.device) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()

    def run(
        self, out: SchedulerOutput, seqs: Mapping[str, Sequence], generators: dict[str, torch.Generator],
        banned_for: Callable[[Sequence], tuple[int, ...]] = lambda seq: (),
    ) -> StepResult:
        """One forward; the next token of every chunk that reached its sequence's end, and prompt logprobs."""
        batch, sampling, prompt_rows = self.prepare(out, seqs)
        logits = self.model.forward(batch, self.kv_pool)
        raw = logits[: len(sampling)]
        params = [s.request.params for s in sampling]
        gens = [generators.get(s.request_id) for s in sampling]
        tokens = self.sampler.sample(process_logits(raw, sampling), params, gens, [banned_for(s) for s in sampling])
        wanted = [i for i, (p, t) in enumerate(zip(params, tokens)) if p.logprobs is not None and t is not None]
        logprobs: list[TokenLogprob | None] = [None] * len(sampling)
        if wanted:
            found = logprobs_of(raw[wanted], [tokens[i] for i in wanted], [params[i].logprobs for i in wanted])
            for i, entry in zip(wanted, found):
                logprobs[i] = entry
        sampled = tuple(SampledToken(s.request_id, t, lp) for s, t, lp in zip(sampling, tokens, logprobs))
        return StepResult(sampled, self._prompt_logprobs(logits[len(sampling):], prompt_rows))

    @staticmethod
    def _prompt_logprobs(logits: torch.Tensor,
                         rows: list[PromptRows]) -> tuple[tuple[str, tuple[TokenLogprob, ...]], ...]:
        if not rows:
            return ()
        targets = [t for r in rows for t in r.seq.token_ids[r.first + 1 : r.first + 1 + r.count]]
        tops = [r.seq.request.params.prompt_logprobs for r in rows for _ in range(r.count)]
        found = logprobs_of(logits, targets, tops)
        result, start = [], 0
        for r in rows:
            result.append((r.seq.request_id, tuple(found[start : start + r.count])))
            start += r.count
        return tuple(result)

    @staticmethod
    def _prompt_rows(seq: Sequence, pos0: int, n: int, row0: int) -> tuple[PromptRows, list[int]] | None:
        """Rows of a chunk (positions [pos0, pos0 + n) at batch rows from row0) whose logits score a prompt token
        not scored yet; None when there are none."""
        if seq.request.params.prompt_logprobs is None:
            return None
        done = len(seq.prompt_logprobs)
        # The scheduler takes no prefix-cache hit while prompt logprobs are missing: no position is skipped.
        assert done >= pos0 or done >= seq.num_prompt_tokens - 1, "prompt logprob positions skipped"
        first, end = max(pos0, done), min(pos0 + n, seq.num_prompt_tokens - 1)
        if first >= end:
            return None
        return PromptRows(seq, first, end - first), [row0 + p - pos0 for p in range(first, end)]

    def prepare(self, out: SchedulerOutput,
                seqs: Mapping[str, Sequence]) -> tuple[ForwardBatch, list[Sequence], list[PromptRows]]:
        """Flatten decodes (longest context first) then prefill chunks into one batch.

        Logits rows: one per sampling chunk (in batch order, whose sequences are returned), then the
        prompt-logprob rows.
        """
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        sampling: list[Sequence] = []
        prompt_rows: list[PromptRows] = []
        prompt_logits_rows: list[int] = []

        def score(seq: Sequence, pos0: int, n: int, row0: int) -> None:
            found = self._prompt_rows(seq, pos0, n, row0)
            if found is not None:
                prompt_rows.append(found[0])
                prompt_logits_rows.extend(found[1])

        decodes = sorted((Planned(c, seqs[c.request_id]) for c in out.decodes), key=lambda p: -p.chunk.start)
        for row, (chunk, seq) in enumerate((p.chunk, p.seq) for p in decodes):
            pos = chunk.start
            input_ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            # A one-token chunk can also be the middle of a prompt.
            if chunk.samples:
                logits_rows.append(row)
                sampling.append(seq)
            score(seq, pos, 1, row)
        decode_rows = [DecodeRow(p.seq.block_table, p.chunk.start + 1) for p in decodes]

        chunks = []
        for chunk in out.prefills:
            seq = seqs[chunk.request_id]
            pos0, n = chunk.start, chunk.num_tokens
            start = len(input_ids)
            input_ids.extend(seq.token_ids[pos0 : pos0 + n])
            positions.extend(range(pos0, pos0 + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(pos0, pos0 + n))
            chunks.append(ChunkRows(start, n, pos0, table))
            if chunk.samples:
                logits_rows.append(start + n - 1)
                sampling.append(seq)
            score(seq, pos0, n, start)

        batch = ForwardBatch(
            input_ids=self._tensor(input_ids),
            positions=self._tensor(positions),
            slot_mapping=self._tensor(slots),
            attention=self.model.attention.plan(decode_rows, chunks),
            logits_indices=self._tensor(logits_rows + prompt_logits_rows),
        )
        return batch, sampling, prompt_rows

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)
