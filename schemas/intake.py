"""The Kafka-native client API: a tenant's intake and results topics and their records (camelCase on the wire).

    llm.requests.<tenant>   key: requestId   GenerationRequested  (written by the tenant)
    llm.results.<tenant>    key: requestId   GenerationResult     (written by the platform)

The topic name is the tenant: nothing in a record can claim another one. Both
topics exist per tenant (`ledgerlm tenants create` / `tenants grant-kafka`),
so `topics ensure` does not create them; `TENANT_TOPICS` describes them for the
AsyncAPI document with `{tenant}` in the name.

Records are versioned (`schemaVersion`); a version this platform does not know
is refused with a `GenerationResult` naming it (or, without a usable requestId,
a dead letter). Sampling fields are those of `POST /v1/generations` and are
held to the same bounds (the intake validates through the HTTP body's model).
"""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas.topics import DAY_MS, TopicSpec

INTAKE_PREFIX = "llm.requests."
RESULTS_PREFIX = "llm.results."
INTAKE_PATTERN = r"^llm\.requests\.[a-z0-9][a-z0-9_-]{0,63}$"
SCHEMA_VERSIONS = frozenset({1})


def intake_topic(tenant_id: str) -> str:
    return INTAKE_PREFIX + tenant_id


def results_topic(tenant_id: str) -> str:
    return RESULTS_PREFIX + tenant_id


def intake_pattern(tenant_ids: list[str] | None = None) -> str:
    """Every tenant's intake topic, or only those of `tenant_ids`."""
    if not tenant_ids:
        return INTAKE_PATTERN
    return r"^llm\.requests\.(" + "|".join(re.escape(t) for t in tenant_ids) + ")$"


def tenant_of_intake(topic: str) -> str | None:
    """The tenant an intake topic belongs to; None for any other topic."""
    return topic[len(INTAKE_PREFIX):] if re.match(INTAKE_PATTERN, topic) else None


class Wire(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)


class ChatMessage(Wire):
    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str


class GenerationRequested(Wire):
    """One request a tenant publishes on `llm.requests.<tenant>` (key: requestId).

    The same requestId with the same payload is the same generation (no second one is run or billed); the
    same requestId with a changed payload is answered by a `rejected` result, `request_id_conflict`. Batch
    is the default tier: when the tenant's budget is spent, the platform holds the record and retries after
    the controller's Retry-After (the log is the queue; nothing is dropped). An interactive request refused
    for budget or capacity gets a `rejected` result carrying `retryAfterMs` instead.
    """

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="forbid")

    type: Literal["GenerationRequested"] = "GenerationRequested"
    schema_version: int = Field(default=1, alias="schemaVersion")
    request_id: str = Field(alias="requestId", min_length=1, max_length=256)
    model: str = Field(min_length=1, max_length=256, description="a model version (NAME@V) or an alias")
    input: str | None = None
    messages: list[ChatMessage] | None = None
    max_output_tokens: int = Field(alias="maxOutputTokens", strict=True)
    tier: Literal["interactive", "batch"] = "batch"
    include_tokens: bool = Field(default=False, alias="includeTokens", strict=True,
                                 description="the result carries the token events (seq, token ids, text)")
    temperature: float | None = None
    top_p: float | None = Field(default=None, alias="topP")
    top_k: int | None = Field(default=None, alias="topK", strict=True)
    seed: int | None = Field(default=None, strict=True)
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = Field(default=None, alias="stopTokenIds")
    ignore_eos: bool | None = Field(default=None, alias="ignoreEos")
    min_tokens: int | None = Field(default=None, alias="minTokens")
    presence_penalty: float | None = Field(default=None, alias="presencePenalty")
    frequency_penalty: float | None = Field(default=None, alias="frequencyPenalty")
    repetition_penalty: float | None = Field(default=None, alias="repetitionPenalty")
    logit_bias: dict[str, float] | None = Field(default=None, alias="logitBias")
    response_format: dict[str, Any] | None = Field(default=None, alias="responseFormat")

    def http_body(self) -> dict[str, Any]:
        """The same request as a `POST /v1/generations` body: validated by the gateway's own model."""
        body = self.model_dump(by_alias=True, exclude_none=True, exclude={"type", "schema_version", "include_tokens"})
        body["tier"] = self.tier
        return body


class ResultUsage(Wire):
    input_tokens: int = Field(alias="inputTokens")
    cached_input_tokens: int = Field(alias="cachedInputTokens")
    output_tokens: int = Field(alias="outputTokens")


class ResultToken(Wire):
    """One token event of the generation's final attempt (`choice` > 0 only with n > 1)."""

    seq: int
    token_ids: tuple[int, ...] = Field(alias="tokenIds")
    text: str
    choice: int = 0


ResultStatus = Literal["completed", "canceled", "interrupted", "expired", "failed", "rejected"]


class GenerationResult(Wire):
    """One record per request outcome on `llm.results.<tenant>` (key: requestId).

    A generation that ran: its id, the final text (choice 0), its end reason and billed usage (`usageLabel`
    "interrupted" where the last recorded watermark is all that was billed). A request refused before it
    became a generation (invalid, unknown model, request_id_conflict, an interactive 429/503): status
    `rejected`, `errorCode`, `reason`, `field` where one field is at fault, `retryAfterMs` when a retry may
    succeed, and no usage.
    """

    model_config = ConfigDict(populate_by_name=True, frozen=True, extra="forbid")

    type: Literal["GenerationResult"] = "GenerationResult"
    schema_version: int = Field(default=1, alias="schemaVersion")
    request_id: str = Field(alias="requestId")
    tenant_id: str = Field(alias="tenantId")
    status: ResultStatus
    generation_id: str | None = Field(default=None, alias="generationId")
    model: str | None = None
    end_reason: str | None = Field(default=None, alias="endReason")
    text: str | None = None
    usage: ResultUsage | None = None
    usage_label: Literal["final", "interrupted"] | None = Field(default=None, alias="usageLabel")
    error_code: str | None = Field(default=None, alias="errorCode")
    reason: str | None = None
    field: str | None = None
    retry_after_ms: int | None = Field(default=None, alias="retryAfterMs")
    tokens: tuple[ResultToken, ...] | None = None  # when the request said `includeTokens`

    def encode(self) -> bytes:
        return self.model_dump_json(by_alias=True, exclude_none=True).encode()


TENANT_TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(intake_topic("{tenant}"), "requestId", (GenerationRequested,), "delete", 7 * DAY_MS,
              description="A tenant's requests (created per tenant by `tenants create` / `tenants grant-kafka`; "
                          "with ACLs only the tenant's principal may write it)."),
    TopicSpec(results_topic("{tenant}"), "requestId", (GenerationResult,), "delete", 7 * DAY_MS,
              description="One result per request outcome, derived from the log (readable only by the "
                          "tenant's principal under ACLs)."),
)


def tenant_topic_specs(tenant_id: str) -> tuple[TopicSpec, ...]:
    """The intake and results topics of one tenant, as `TopicAdmin.ensure` takes them."""
    return tuple(TopicSpec(s.name.replace("{tenant}", tenant_id), s.key_field, s.carries, s.cleanup_policy,
                           s.retention_ms, s.partitions, s.min_insync_replicas, s.description)
                 for s in TENANT_TOPICS)
