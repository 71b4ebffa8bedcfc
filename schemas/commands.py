"""Commands on `llm.commands` (key: tenant id), decided by the controller."""
from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.dispatch import StartAttempt
from schemas.envelope import TenantScoped, Value
from schemas.values import MAX_COMPLETION_WINDOW_S, SamplingParams, Tier, added


class Command(TenantScoped):
    """A record for the controller. `plane` names the control plane (controller group) it is for:
    two planes sharing a broker (a test session beside `ledgerlm up`) never act on each other's commands.
    None: any plane."""

    plane: str | None = None


class StreamShare(Value):
    """The `llm.generations`/`llm.tokens` partitions (of `partitions`) whose token stream the asking gateway
    reads itself: a generation id landing in one of them is streamed there without a guest read
    (`producers.gateway.streams.shared_tail`). A hint: an id elsewhere is served all the same."""

    partitions: int = Field(ge=1, le=100_000)
    owned: tuple[int, ...] = Field(max_length=100_000)


class SubmitGeneration(Command):
    """A tenant asks for a generation; the gateway awaits the decision on `llm.replies`."""

    type: Literal["SubmitGeneration"] = "SubmitGeneration"
    request_id: str = Field(min_length=1, max_length=256)
    gateway_id: str = Field(min_length=1)
    correlation_id: str = Field(min_length=1)
    # The name asked for: a version, or an alias the controller pins to one version at admission.
    model_version: str = Field(min_length=1)
    input_token_ids: tuple[int, ...]
    max_output_tokens: int = Field(ge=1)
    sampling: SamplingParams = SamplingParams()
    tier: Tier = "interactive"
    payload_hash: str = Field(min_length=64, max_length=64)
    # Asked through the Kafka intake (`includeTokens`): the tenant's results record carries the token events.
    # Not part of the payload hash: how an outcome is reported does not change what is generated.
    result_tokens: bool = added(False)
    # The admitting gateway's share of the token stream; the controller mints the id into it. Not hashed.
    stream_share: StreamShare | None = added(None)
    # Batch tier: how long it may wait for capacity (None: the tenant's or the platform's window). Not hashed:
    # when it runs does not change what is generated.
    completion_window_s: int | None = added(None, ge=60, le=MAX_COMPLETION_WINDOW_S)

    @property
    def output_tokens(self) -> int:
        """The most output it may produce: `max_output_tokens` for each of its n choices."""
        return self.max_output_tokens * self.sampling.n


class CancelGeneration(Command):
    type: Literal["CancelGeneration"] = "CancelGeneration"
    generation_id: str = Field(min_length=1)
    gateway_id: str = Field(min_length=1)
    correlation_id: str = Field(min_length=1)


class ReleaseReservation(Command):
    """Return the unused part of a generation's reserved tokens to the tenant budget."""

    type: Literal["ReleaseReservation"] = "ReleaseReservation"
    generation_id: str = Field(min_length=1)
    epoch: int = Field(ge=1)
    used_tokens: int = Field(ge=0)
    end_reason: str | None = None


class AttemptRefused(Command):
    """A worker could not reserve KV for an attempt; the controller reroutes or rejects.

    Sent by the worker on `llm.commands` (key: tenant) so the controller that owns
    the tenant's partition decides, in order with the tenant's other commands.
    """

    type: Literal["AttemptRefused"] = "AttemptRefused"
    generation_id: str = Field(min_length=1)
    epoch: int = Field(ge=1)
    worker_id: str = Field(min_length=1)
    reason: str = Field(min_length=1)
    # The refused order itself, so any controller instance can reroute it without having kept it. None when the
    # order would not fit one record beside the refusal: the controller then rejects the generation.
    attempt: StartAttempt | None = None
