"""`GET /v1/generations/{id}`: the status projection in Postgres, or the bridge's live view.

The projection is the durable answer; the bridge is fresher by the
projector's lag, so a terminal state it has seen wins over a row that has
not caught up yet. Another tenant's generation is reported as not found.
"""
from __future__ import annotations

from producers.gateway.database import GatewayDatabase
from producers.gateway.streams.bridge import StreamBridge

TERMINAL = {"completed", "canceled", "interrupted", "expired", "failed", "rejected"}


def row_status(row: dict) -> dict:
    return {"id": row["generation_id"], "requestId": row["request_id"], "model": row["model_version"],
            "status": row["status"], "epoch": row["current_epoch"], "workerId": row["worker_id"],
            "cancelRequested": row["cancel_requested"], "endReason": row["end_reason"],
            "usage": {"inputTokens": row["processed_input_tokens"], "cachedInputTokens": row["cached_input_tokens"],
                      "outputTokens": row["generated_output_tokens"]}}


async def read_status(db: GatewayDatabase, bridge: StreamBridge, tenant_id: str, generation_id: str) -> dict | None:
    row = await db.generation(generation_id)
    view = bridge.view(generation_id)
    live = view.as_status() if view is not None and view.tenant_id == tenant_id else None
    if row is not None and row["tenant_id"] == tenant_id:
        status = row_status(row)
        if live is not None and live["status"] in TERMINAL and status["status"] not in TERMINAL:
            return live
        return status
    return live
