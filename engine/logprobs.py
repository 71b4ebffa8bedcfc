"""Log-probabilities of chosen tokens and their top alternatives, from the raw logits of one step.

Raw: the model's own distribution, before bias, penalties, grammar, temperature and top-k/top-p (vLLM's
default `raw_logprobs`), so a score does not depend on how the request samples. One log-softmax per slice
of rows, one top-k for the widest request, one transfer to Python.
"""
from __future__ import annotations

import torch

from engine.request import TokenLogprob

# Rows per log-softmax: a prompt chunk of 512 rows over a 49k vocabulary is 100 MB of float32 at once.
_ROWS_PER_SLICE = 128
# JSON has no -inf; OpenAI reports an impossible token as -9999.
FLOOR = -9999.0


def logprobs_of(logits: torch.Tensor, targets: list[int], tops: list[int]) -> list[TokenLogprob]:
    """For row i: log p(targets[i]) under softmax(logits[i]) and its tops[i] most likely (id, logprob)."""
    out: list[TokenLogprob] = []
    for start in range(0, len(targets), _ROWS_PER_SLICE):
        end = min(start + _ROWS_PER_SLICE, len(targets))
        logp = torch.log_softmax(logits[start:end].float(), dim=-1).clamp_(min=FLOOR)
        chosen = logp.gather(1, torch.tensor(targets[start:end], device=logp.device)[:, None])[:, 0].tolist()
        k = max(tops[start:end])
        top_values, top_ids = (logp.topk(k, dim=-1) if k else (logp[:, :0], logp[:, :0].long()))
        top_values, top_ids = top_values.tolist(), top_ids.tolist()
        for j in range(end - start):
            n = tops[start + j]
            out.append(TokenLogprob(targets[start + j], chosen[j],
                                    tuple(zip(top_ids[j][:n], top_values[j][:n]))))
    return out
