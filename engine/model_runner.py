"""`ModelRunner`: turns a `SchedulerOutput` into one packed forward and sampled tokens."""
from __future__ import annotations

import torch

from engine.llama import ForwardBatch, LlamaModel, PrefillChunk
from engine.sampler import Sampler
from engine.scheduler import ScheduledChunk, SchedulerOutput


class ModelRunner:
    """Owns the model, the KV pool tensor and the sampler."""

    def __init__(self, model: LlamaModel, kv_pool: torch.Tensor, block_size: int, device: torch.device) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()
        self._offsets = torch.arange(block_size, device=device)

    def run(
        self, out: SchedulerOutput, generators: dict[str, torch.Generator]
    ) -> list[tuple[ScheduledChunk, int]]:
        """One forward; returns (chunk, next token) for every chunk that reached its sequence's end."""
        batch, sampling = self.prepare(out)
        logits = self.model.forward(batch, self.kv_pool)
        params = [c.seq.request.params for c in sampling]
        gens = [generators.get(c.seq.request_id) for c in sampling]
        tokens = self.sampler.sample(logits, params, gens)
        return list(zip(sampling, tokens))

    def prepare(self, out: SchedulerOutput) -> tuple[ForwardBatch, list[ScheduledChunk]]:
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        sampling: list[ScheduledChunk] = []

        decode_slots = decode_bias = None
        if out.decodes:
            contexts = []
            tables = []
            for row, chunk in enumerate(out.decodes):
                seq = chunk.seq
                pos = seq.num_computed_tokens
                input_ids.append(seq.token_ids[pos])
                positions.append(pos)
                slots.append(seq.block_table[pos // bs] * bs + pos % bs)
                contexts.append(pos + 1)
                tables.append(seq.block_table)
                # A one-token chunk can also be the middle of a prompt.
                if chunk.samples:
                    logits_rows.append(row)
                    sampling.append(chunk)
            decode_slots, decode_bias = self._decode_tables(tables, contexts)

        prefills = []
        for chunk in out.prefills:
            seq = chunk.seq
            pos0, n = seq.num_computed_tokens, chunk.num_tokens
            start = len(input_ids)
            input_ids.extend(seq.token_ids[pos0 : pos0 + n])
            positions.extend(range(pos0, pos0 + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(pos0, pos0 + n))
            context_slots = None
            if pos0 > 0:
                context_slots = self._slots(torch.tensor(table, device=self.device), pos0 + n)
            prefills.append(PrefillChunk(start, n, pos0, context_slots))
            if chunk.samples:
                logits_rows.append(start + n - 1)
                sampling.append(chunk)

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=self.device)

        batch = ForwardBatch(
            input_ids=t(input_ids),
            positions=t(positions),
            slot_mapping=t(slots),
            num_decodes=len(out.decodes),
            decode_slots=decode_slots,
            decode_bias=decode_bias,
            prefills=tuple(prefills),
            logits_indices=t(logits_rows),
        )
        return batch, sampling

    def _slots(self, table: torch.Tensor, num_tokens: int) -> torch.Tensor:
        return (table[:, None] * self.block_size + self._offsets).reshape(-1)[:num_tokens]

    def _decode_tables(self, tables: list[list[int]], contexts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        max_context = max(contexts)
        width = -(-max_context // self.block_size)
        # Padding entries point at slot 0 (any valid slot) and are masked to -inf.
        padded = [tbl[:width] + [0] * (width - min(len(tbl), width)) for tbl in tables]
        table = torch.tensor(padded, dtype=torch.long, device=self.device)
        slots = (table[:, :, None] * self.block_size + self._offsets).reshape(len(tables), -1)[:, :max_context]
        ctx = torch.tensor(contexts, device=self.device)
        valid = torch.arange(max_context, device=self.device)[None, :] < ctx[:, None]
        bias = torch.zeros(valid.shape, dtype=self.model.cos.dtype, device=self.device)
        bias.masked_fill_(~valid, float("-inf"))
        return slots, bias
