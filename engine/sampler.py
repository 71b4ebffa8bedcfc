"""`Sampler`: next-token choice for a batch of logits rows, one `SamplingParams` per row."""
from __future__ import annotations

import torch

from engine.request import SamplingParams


class Sampler:
    """Greedy rows share one argmax; sampled rows each use their request's generator,
    so a seeded request draws the same tokens whatever else is in the batch."""

    def sample(
        self, logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
        banned: list[tuple[int, ...]] | None = None,
    ) -> list[int]:
        """`banned[row]`: token ids that row may not produce now (min_tokens holds back EOS and stop ids)."""
        if banned and any(banned):
            logits = logits.clone()  # the forward's output is an inference tensor: not writable out here
            for row, ids in enumerate(banned):
                if ids:
                    logits[row, list(ids)] = float("-inf")
        tokens = logits.argmax(dim=-1).tolist()
        for row, p in enumerate(params):
            if not p.greedy:
                tokens[row] = self._sample_row(logits[row], p, generators[row])
        return tokens

    @staticmethod
    def _sample_row(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None) -> int:
        logits = logits.float() / p.temperature
        if 0 < p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # Keep the smallest prefix whose mass reaches top_p (always >= 1 token).
            drop = probs.cumsum(-1) - probs >= p.top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
        probs = torch.softmax(logits, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator).item())
