"""Admission of one generation: publish `SubmitGeneration`, await the controller's decision.

Shared by the native API and the OpenAI-compatible one, so both admit by the
same rules and answer the same statuses.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from producers.gateway.admission.prompts import EffectivePrompt
from producers.gateway.admission.requests import GenerationRequest
from producers.gateway.database import Principal
from producers.gateway.errors import ApiError
from schemas.commands import StreamShare, SubmitGeneration
from schemas.replies import AdmissionDecision

if TYPE_CHECKING:
    from producers.gateway.admission.client import AdmissionClient
    from producers.gateway.gateway import Gateway

log = logging.getLogger(__name__)


def decision_error(decision: AdmissionDecision) -> ApiError:
    details = {k: v for k, v in (("requestId", decision.request_id), ("generationId", decision.generation_id))
               if v is not None}
    return ApiError(decision.http_status, decision.error_code or decision.outcome, decision.reason or decision.outcome,
                    details, decision.retry_after_ms)


async def refuse_without_workers(gateway: "Gateway", principal: Principal, body: GenerationRequest,
                                 prompt: EffectivePrompt) -> None:
    """503 at once when no live worker could ever take the request (see `producers.gateway.admission.workers`)."""
    if not gateway.workers_follower.caught_up.is_set():
        return
    total = len(prompt.token_ids) + prompt.max_output_tokens * prompt.sampling.n
    versions, now, read_through = gateway.catalog.versions_of(body.model), time.time(), \
        gateway.workers_follower.read_through()
    if gateway.board.could_serve(versions, total, now, read_through):
        return
    if gateway.bridge.knows_request(principal.tenant_id, body.request_id) or \
            await gateway.db.knows_request(principal.tenant_id, body.request_id):
        return  # a repeat: the controller answers it (200 existing or 409)
    gateway.metrics.early_refusals.inc()
    log.info("refused early tenant=%s request=%s total_tokens=%d heartbeat_age_s=%s read_through_lag_s=%s",
             principal.tenant_id, body.request_id, total, gateway.board.freshest_age_s(versions, now),
             None if read_through is None else round(now - read_through, 2))
    raise ApiError(503, "no_capacity", f"no live worker serves {body.model} with room for {total} tokens",
                   {"requestId": body.request_id}, gateway.settings.retry_after_ms)


def submit_command(admission: "AdmissionClient", plane: str, tenant_id: str, body: GenerationRequest,
                   prompt: EffectivePrompt, result_tokens: bool = False,
                   stream_share: StreamShare | None = None) -> SubmitGeneration:
    """The `SubmitGeneration` of a rendered request: the gateway and the Kafka intake build it the same way
    (a gateway names its share of the token stream, where the generation's stream is cheapest to serve)."""
    return SubmitGeneration(
        tenant_id=tenant_id, request_id=body.request_id, gateway_id=admission.gateway_id,
        correlation_id=admission.correlation_id(), model_version=body.model,
        input_token_ids=prompt.token_ids, max_output_tokens=prompt.max_output_tokens, sampling=prompt.sampling,
        tier=body.tier, payload_hash=prompt.payload_hash, plane=plane, result_tokens=result_tokens,
        stream_share=stream_share, completion_window_s=body.completion_window_s)


async def submit_generation(gateway: "Gateway", principal: Principal, body: GenerationRequest,
                            prompt: EffectivePrompt, started: float) -> AdmissionDecision:
    """The admitting decision (201 new, 200 existing); ApiError for every other answer or none in time."""
    admission, settings = gateway.admission, gateway.settings
    await repeat_capacity_refusal(gateway, principal, body)
    await refuse_without_workers(gateway, principal, body, prompt)
    if body.tier == "batch":
        await gateway.batch_pacer.turn(principal.tenant_id)
    command = submit_command(admission, settings.controller_group, principal.tenant_id, body, prompt,
                             stream_share=gateway.bridge.tail.share())
    timing: list[float] = []
    decision = await admission.decide(command, settings.admission_timeout_ms / 1000, timing)
    if decision is None:
        raise ApiError(503, "controller_unavailable", "no admission decision in time",
                       {"requestId": body.request_id}, settings.retry_after_ms)
    log.info("admission tenant=%s request=%s status=%d input_tokens=%d ms=%.1f publish_ms=%.1f await_ms=%.1f",
             principal.tenant_id, body.request_id, decision.http_status, len(prompt.token_ids),
             (time.perf_counter() - started) * 1000, *timing)
    if decision.http_status not in (200, 201):
        tarpit_s = admission.refusals.observe(body.model, body.tier, decision.error_code, decision.retry_after_ms)
        if tarpit_s:
            await asyncio.sleep(tarpit_s)  # a client that resends at once asks twice a second at most
        raise decision_error(decision)
    admission.refusals.admitted(body.model, body.tier)
    return decision


async def repeat_capacity_refusal(gateway: "Gateway", principal: Principal, body: GenerationRequest) -> None:
    """While the controller's last no_capacity for this model and tier holds (admission/refusals.py): wait it
    out and answer 503, asking nobody. A request the bridge knows (a repeat of an admitted one) still goes to
    the controller for its 200."""
    held = gateway.admission.refusals.held(body.model, body.tier)
    if held is None or gateway.bridge.knows_request(principal.tenant_id, body.request_id):
        return
    wait_s, retry_after_ms = held
    gateway.metrics.repeated_refusals.inc()
    await asyncio.sleep(wait_s)
    raise ApiError(503, "no_capacity", f"no ready worker with {body.model} whose predicted wait fits the "
                   f"{body.tier} allowance (the controller's answer of a moment ago)",
                   {"requestId": body.request_id}, retry_after_ms)
