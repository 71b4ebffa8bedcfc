"""`ModelRunner`: turns a `SchedulerOutput` into one packed forward and sampled tokens."""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.llama import DecodeGroup, ForwardBatch, LlamaModel, PrefillChunk
from engine.sampler import Sampler
from engine.scheduler import ScheduledChunk, SchedulerOutput
from engine.sequence import Sequence

# A decode row joins the current group while its context is at least this
# fraction of the group's longest: bounds padding waste per row at 50%.
_GROUP_FILL = 0.5
# ...and while the group's padded context stays under this many tokens: the
# gathered keys/values of one group then stay in the CPU cache between the
# gather and the two matmuls that read them, instead of going through DRAM.
GROUP_MAX_TOKENS = 4096


class ModelRunner:
    """Owns the model, the KV pool tensor and the sampler."""

    def __init__(self, model: LlamaModel, kv_pool: torch.Tensor, block_size: int, device: torch.device) -> None:
        self.model = model
        self.kv_pool = kv_pool
        self.block_size = block_size
        self.device = device
        self.sampler = Sampler()

    def run(
        self, out: SchedulerOutput, generators: dict[str, torch.Generator],
        banned_for: Callable[[Sequence], tuple[int, ...]] = lambda seq: (),
    ) -> list[tuple[ScheduledChunk, int]]:
        """One forward; returns (chunk, next token) for every chunk that reached its sequence's end."""
        batch, sampling = self.prepare(out)
        logits = self.model.forward(batch, self.kv_pool)
        params = [c.seq.request.params for c in sampling]
        gens = [generators.get(c.seq.request_id) for c in sampling]
        tokens = self.sampler.sample(logits, params, gens, [banned_for(c.seq) for c in sampling])
        return list(zip(sampling, tokens))

    def prepare(self, out: SchedulerOutput) -> tuple[ForwardBatch, list[ScheduledChunk]]:
        """Flatten decodes (longest context first) then prefill chunks into one batch."""
        bs = self.block_size
        input_ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        logits_rows: list[int] = []
        sampling: list[ScheduledChunk] = []

        decodes = sorted(out.decodes, key=lambda c: -c.seq.num_computed_tokens)
        for row, chunk in enumerate(decodes):
            seq = chunk.seq
            pos = seq.num_computed_tokens
            input_ids.append(seq.token_ids[pos])
            positions.append(pos)
            slots.append(seq.block_table[pos // bs] * bs + pos % bs)
            # A one-token chunk can also be the middle of a prompt.
            if chunk.samples:
                logits_rows.append(row)
                sampling.append(chunk)
        groups = self._decode_groups(decodes)

        prefills = []
        for chunk in out.prefills:
            seq = chunk.seq
            pos0, n = seq.num_computed_tokens, chunk.num_tokens
            start = len(input_ids)
            input_ids.extend(seq.token_ids[pos0 : pos0 + n])
            positions.extend(range(pos0, pos0 + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(pos0, pos0 + n))
            context_blocks = None
            if pos0 > 0:
                context_blocks = self._tensor(table[: -(-(pos0 + n) // bs)])
            prefills.append(PrefillChunk(start, n, pos0, context_blocks))
            if chunk.samples:
                logits_rows.append(start + n - 1)
                sampling.append(chunk)

        batch = ForwardBatch(
            input_ids=self._tensor(input_ids),
            positions=self._tensor(positions),
            slot_mapping=self._tensor(slots),
            block_size=bs,
            decode_groups=groups,
            prefills=tuple(prefills),
            logits_indices=self._tensor(logits_rows),
        )
        return batch, sampling

    def _tensor(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=self.device)

    def _decode_groups(self, decodes: list[ScheduledChunk]) -> tuple[DecodeGroup, ...]:
        groups = []
        start = 0
        while start < len(decodes):
            longest = decodes[start].seq.num_computed_tokens + 1
            end = start + 1
            cap = max(1, GROUP_MAX_TOKENS // longest)
            while (
                end < len(decodes)
                and end - start < cap
                and decodes[end].seq.num_computed_tokens + 1 >= _GROUP_FILL * longest
            ):
                end += 1
            groups.append(self._decode_group(decodes, start, end, longest))
            start = end
        return tuple(groups)

    def _decode_group(self, decodes: list[ScheduledChunk], start: int, end: int, longest: int) -> DecodeGroup:
        bs = self.block_size
        width = -(-longest // bs)
        # Padding entries point at block 0 (any valid block) and are masked to -inf.
        tables = [c.seq.block_table[:width] + [0] * (width - min(len(c.seq.block_table), width)) for c in decodes[start:end]]
        contexts = torch.tensor([c.seq.num_computed_tokens + 1 for c in decodes[start:end]], device=self.device)
        valid = torch.arange(width * bs, device=self.device)[None, :] < contexts[:, None]
        bias = torch.zeros(valid.shape, dtype=self.model.cos.dtype, device=self.device)
        bias.masked_fill_(~valid, float("-inf"))
        return DecodeGroup(start, end - start, self._tensor(tables), bias)
