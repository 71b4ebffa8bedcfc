"""`Sampler`: next-token choice for a batch of logits rows, one `SamplingParams` per row."""
from __future__ import annotations

import math

import torch

from engine.request import SamplingParams


class Sampler:
    """Greedy rows share one argmax; sampled rows each use their request's generator,
    so a seeded request draws the same tokens whatever else is in the batch.

    A row's token is None when the row has no finite distribution to draw from (a NaN or inf logit,
    every token banned) or its sampling raised: that request fails and its batch mates go on.
    """

    def sample(
        self, logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None],
        banned: list[tuple[int, ...]] | None = None,
    ) -> list[int | None]:
        """`banned[row]`: token ids that row may not produce now (min_tokens holds back EOS and stop ids)."""
        broken: set[int] = set()
        if banned and any(banned):
            logits = logits.clone()  # the forward's output is an inference tensor: not writable out here
            for row, ids in enumerate(banned):
                try:
                    if ids:
                        logits[row, list(ids)] = float("-inf")
                except IndexError:  # an id outside the vocabulary; the engine's request check refuses those
                    broken.add(row)
        best = logits.argmax(dim=-1)
        # argmax lands on a NaN or +inf when the row has one, and on -inf when everything is banned.
        finite = torch.isfinite(logits.gather(-1, best[:, None])[:, 0])
        tokens: list[int | None] = torch.where(finite, best, -1).tolist()
        for row, p in enumerate(params):
            if tokens[row] == -1 or row in broken:
                tokens[row] = None
            elif not p.greedy:
                try:
                    tokens[row] = self._sample_row(logits[row], p, generators[row])
                except RuntimeError:  # torch's refusal of this row's distribution: this row's failure only
                    tokens[row] = None
        return tokens

    @staticmethod
    def _sample_row(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None) -> int | None:
        # p.temperature >= MIN_TEMPERATURE here (below it a request is greedy), so finite logits stay finite.
        logits = logits.float() / p.temperature
        if 0 < p.top_k < logits.numel():
            kth = torch.topk(logits, p.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(logits, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # Keep the smallest prefix whose mass reaches top_p: the first token's preceding mass is 0 < top_p,
            # so the most likely token always stays and a tiny top_p samples greedily.
            drop = probs.cumsum(-1) - probs >= p.top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.full_like(logits, float("-inf")).scatter(0, order, sorted_logits)
        # One uniform draw against the cumulative distribution (inverse transform sampling): ~0.06 ms for
        # SmolLM2's 49,152-token vocabulary on a CPU, where torch.multinomial took ~1.5 ms and a finiteness check
        # of every probability ~0.4 ms, per sampled row and step. Probabilities are in [0, 1], so their running
        # sum is finite everywhere exactly when its last element is: that one element is the check.
        cumulative = torch.softmax(logits, dim=-1).cumsum(dim=-1)
        total = float(cumulative[-1])
        if not math.isfinite(total) or total <= 0.0:
            return None
        draw = torch.rand(1, generator=generator, dtype=cumulative.dtype) * total
        # `right=True`: the first index whose running sum exceeds the draw, so a zero-probability token (a
        # running sum equal to its predecessor's) is never chosen. A draw rounded up to the total itself falls
        # to the first index that reaches the total: the last token with any probability.
        index = int(torch.searchsorted(cumulative, draw, right=True).item())
        if index >= logits.numel():
            index = int(torch.searchsorted(cumulative, draw, right=False).item())
        return index
