"""One intake request through the HTTP path's rules: render with the pinned template, submit, await the decision.

    record ─▶ parse (400s) ─▶ tenant limits ─▶ ModelCatalog.render (404, 400s) ─▶ SubmitGeneration ─▶ decision
      201/200            admitted (or the same generation again): its result comes from the log
      409                rejected request_id_conflict
      429/503, batch     held: resubmitted after the decision's Retry-After (the log is the queue)
      429/503, other     rejected with retryAfterMs
      no decision        held: resubmitted after the base Retry-After (the controller is away)

Resubmitting is safe because identity is the controller's: the same requestId and payload is the same
generation, however many times it is submitted.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiokafka import ConsumerRecord

from plumbing.settings import Settings
from producers.gateway.admission.client import AdmissionClient
from producers.gateway.admission.prompts import ModelCatalog
from producers.gateway.admission.submit import submit_command
from producers.gateway.database import Principal
from producers.gateway.errors import ApiError
from producers.intake.lanes import Outcome
from producers.intake.records import IntakeRequest, Refusal, parse_request
from schemas.codec import MalformedRecord
from schemas.intake import GenerationResult, tenant_of_intake
from schemas.values import TenantLimits

log = logging.getLogger(__name__)

RETRYABLE = (429, 503)


@dataclass
class IntakeCounts:
    admitted: int = 0
    existing: int = 0
    rejected: int = 0
    dead_lettered: int = 0
    held: int = 0  # resubmissions after a Retry-After
    by_code: dict[str, int] = field(default_factory=dict)


class Submitter:
    """Turns one intake record into its durable outcome (see the module docstring)."""

    def __init__(self, settings: Settings, admission: AdmissionClient, catalog: ModelCatalog,
                 tenants: dict[str, TenantLimits]) -> None:
        self.settings = settings
        self.admission = admission
        self.catalog = catalog
        self.tenants = tenants
        self.counts = IntakeCounts()

    def _rejected(self, tenant_id: str, request_id: str, code: str, reason: str, **fields) -> GenerationResult:
        self.counts.rejected += 1
        self.counts.by_code[code] = self.counts.by_code.get(code, 0) + 1
        return GenerationResult(request_id=request_id, tenant_id=tenant_id, status="rejected", error_code=code,
                                reason=reason, **fields)

    async def process(self, record: ConsumerRecord) -> Outcome:
        from plumbing.kafka.dead_letters import dead_letter_for

        tenant_id = tenant_of_intake(record.topic)
        parsed = parse_request(record.value)
        if isinstance(parsed, Refusal):
            if parsed.request_id is None:
                self.counts.dead_lettered += 1
                log.warning("intake dead-lettered topic=%s partition=%d offset=%d code=%s", record.topic,
                            record.partition, record.offset, parsed.error_code)
                return dead_letter_for(record, MalformedRecord(record.topic, parsed.reason))
            return self._rejected(tenant_id, parsed.request_id, parsed.error_code, parsed.reason,
                                  field=parsed.field)
        body = parsed.body
        limits = self.tenants.get(tenant_id)
        if limits is None:
            return self._rejected(tenant_id, body.request_id, "unknown_tenant",
                                  f"no tenant {tenant_id!r} is registered")
        principal = Principal(tenant_id, limits.max_tokens_in_flight, limits.tokens_per_minute)
        try:
            prompt = await asyncio.to_thread(self.catalog.render, body, principal.max_tokens_per_request)
        except ApiError as exc:
            return self._rejected(tenant_id, body.request_id, exc.code, exc.message,
                                  field=exc.details.get("field"))
        return await self._submit(principal, parsed, prompt)

    async def _submit(self, principal: Principal, request: IntakeRequest, prompt) -> Outcome:
        plane, timeout_s = self.settings.controller_group, self.settings.admission_timeout_ms / 1000
        body = request.body
        while True:
            command = submit_command(self.admission, plane, principal.tenant_id, body, prompt, request.include_tokens)
            decision = await self.admission.decide(command, timeout_s)
            if decision is not None and decision.http_status in (200, 201):
                if decision.http_status == 201:
                    self.counts.admitted += 1
                else:
                    self.counts.existing += 1
                return None
            status = decision.http_status if decision is not None else 503
            if decision is not None and (status not in RETRYABLE or body.tier != "batch"):
                return self._rejected(principal.tenant_id, body.request_id, decision.error_code or decision.outcome,
                                      decision.reason or decision.outcome, generation_id=decision.generation_id,
                                      retry_after_ms=decision.retry_after_ms if status in RETRYABLE else None)
            wait_ms = (decision.retry_after_ms if decision is not None else None) or self.settings.retry_after_ms
            self.counts.held += 1
            log.info("intake held tenant=%s request=%s status=%d retry_after_ms=%d", principal.tenant_id,
                     body.request_id, status, wait_ms)
            await asyncio.sleep(wait_ms / 1000)
