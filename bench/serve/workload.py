"""The serving bench's load: mixes, tenants' request streams, Poisson arrival plans and prompts of exact lengths.

Pure: no HTTP, no Kafka. A plan is a list of `PlannedRequest`s sorted by send time; the same plan is replayed
against every target, so both servers see the same prompts at the same offsets.
"""
from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Api = Literal["native", "openai"]
Tier = Literal["interactive", "batch"]


@dataclass(frozen=True)
class Mix:
    """Prompt and output lengths (tokens, inclusive ranges) drawn uniformly per request."""

    name: str
    prompt_tokens: tuple[int, int]
    output_tokens: tuple[int, int]


INTERACTIVE = Mix("interactive", (64, 512), (32, 128))
LONG_DOCUMENT = Mix("long_document", (2000, 4000), (128, 600))


@dataclass(frozen=True)
class TenantLoad:
    """One tenant's open-loop stream: Poisson arrivals at `rate` req/s of `mix`, through `api`."""

    tenant: str
    mix: Mix
    rate: float
    api: Api
    tier: Tier


@dataclass(frozen=True)
class PlannedRequest:
    index: int
    at_s: float
    tenant: str
    mix: str
    api: Api
    tier: Tier
    prompt: str
    prompt_tokens: int
    max_output_tokens: int


def poisson_arrivals(rate: float, duration_s: float, rng: random.Random) -> list[float]:
    """Send offsets in [0, duration_s): exponential gaps of mean 1/rate (an open loop: nobody waits for answers)."""
    if rate <= 0:
        return []
    arrivals: list[float] = []
    t = rng.expovariate(rate)
    while t < duration_s:
        arrivals.append(t)
        t += rng.expovariate(rate)
    return arrivals


class PromptSource:
    """Prompts of an exact token count cut from one long token stream at random offsets.

    Different offsets give different first blocks, so the prefix cache cannot serve one prompt from another's
    blocks; `decode` turns the cut back into the text a client sends (its re-encoding may differ by a token or
    two at the edges: the report uses the servers' own counts).
    """

    def __init__(self, token_ids: Sequence[int], decode: Callable[[Sequence[int]], str]) -> None:
        if not token_ids:
            raise ValueError("empty token stream")
        self.token_ids = list(token_ids)
        self.decode = decode

    def prompt(self, num_tokens: int, rng: random.Random) -> str:
        ids = self.token_ids
        while len(ids) < num_tokens * 2:
            ids = ids + self.token_ids
        start = rng.randrange(0, len(ids) - num_tokens)
        return self.decode(ids[start:start + num_tokens])


def plan(loads: Sequence[TenantLoad], duration_s: float, prompts: PromptSource, seed: int) -> list[PlannedRequest]:
    """Every tenant's arrivals merged by send time; lengths and prompts drawn from one seeded generator."""
    rng = random.Random(seed)
    timed = [(at, load) for load in loads for at in poisson_arrivals(load.rate, duration_s, rng)]
    timed.sort(key=lambda item: item[0])
    requests = []
    for index, (at, load) in enumerate(timed):
        prompt_tokens = rng.randint(*load.mix.prompt_tokens)
        requests.append(PlannedRequest(
            index=index, at_s=round(at, 4), tenant=load.tenant, mix=load.mix.name, api=load.api, tier=load.tier,
            prompt=prompts.prompt(prompt_tokens, rng), prompt_tokens=prompt_tokens,
            max_output_tokens=rng.randint(*load.mix.output_tokens)))
    return requests
