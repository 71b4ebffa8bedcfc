"""One generation's line item: its bill and, per attempt, what was recorded, delivered and left unbilled.

    bill      the seal (billing_ledger) and the statement period it is billed in (statement_items)
    attempts  every epoch seen: its worker and end, its watermark, the stream it delivered (the newest
              epoch's only: the resume buffer keeps one), the unbilled tail and reports after the seal

An attempt's label: the billed one carries the bill's ("final" | "interrupted"); an older epoch than the
newest is "superseded" (handed back, never billed); the newest of an unsealed generation is "open".
"""
from __future__ import annotations

from datetime import datetime

from projections.statement_lines import utc_text

# Parameter: generation id.
HEAD_SQL = """
    SELECT g.tenant_id, g.request_id, g.model_version, g.status, g.end_reason, b.epoch, b.usage_label,
           b.end_reason, b.sealed_at, b.billed_input_tokens, b.billed_cached_input_tokens, b.billed_output_tokens,
           b.reserved_tokens, b.released_tokens, i.period, i.belongs_to, b.generation_id IS NOT NULL
    FROM generations g LEFT JOIN billing_ledger b USING (generation_id)
    LEFT JOIN statement_items i USING (generation_id)
    WHERE g.generation_id = %(g)s
    """
ATTEMPTS_SQL = """
    WITH epochs AS (
        SELECT epoch FROM attempts WHERE generation_id = %(g)s
        UNION SELECT epoch FROM usage_watermarks WHERE generation_id = %(g)s
        UNION SELECT epoch FROM billing_ledger WHERE generation_id = %(g)s AND epoch IS NOT NULL)
    SELECT e.epoch, a.worker_id, a.started_at, a.ended_at, a.end_reason, w.processed_input_tokens,
           w.cached_input_tokens, w.generated_output_tokens, w.recompute_tokens, w.reports_counted, w.updated_at,
           sp.token_count, COALESCE(t.generated_output_tokens, 0),
           (SELECT count(*) FROM usage_reconciliation r WHERE r.generation_id = %(g)s AND r.epoch = e.epoch
              AND r.kind = 'post_seal_report')
    FROM epochs e
    LEFT JOIN attempts a ON a.generation_id = %(g)s AND a.epoch = e.epoch
    LEFT JOIN usage_watermarks w ON w.generation_id = %(g)s AND w.epoch = e.epoch
    LEFT JOIN stream_progress sp ON sp.generation_id = %(g)s AND sp.epoch = e.epoch
    LEFT JOIN usage_reconciliation t ON t.generation_id = %(g)s AND t.epoch = e.epoch AND t.kind = 'unbilled_tail'
         AND t.report_seq = 0
    ORDER BY e.epoch
    """


def _time(moment: datetime | None) -> str | None:
    return None if moment is None else utc_text(moment)


def bill_json(head: tuple) -> dict[str, object] | None:
    (epoch, label, end_reason, sealed_at, billed_in, billed_cached, billed_out, reserved, released, period,
     belongs_to, sealed) = head[5:]
    if not sealed:
        return None
    return {"epoch": epoch, "label": label, "endReason": end_reason, "sealedAt": _time(sealed_at),
            "inputTokens": billed_in, "cachedInputTokens": billed_cached, "outputTokens": billed_out,
            "reservedTokens": reserved, "releasedTokens": released, "period": period, "belongsTo": belongs_to}


def attempt_json(row: tuple, bill: dict | None, newest: int) -> dict[str, object]:
    (epoch, worker, started, ended, end_reason, processed, cached, generated, recompute, reports, recorded_at,
     delivered, tail, post_seal) = row
    billed = bill is not None and bill["epoch"] == epoch
    label = bill["label"] if billed else ("superseded" if epoch < newest or bill is not None else "open")
    watermark = None if recorded_at is None else {
        "processedInputTokens": processed, "cachedInputTokens": cached, "generatedOutputTokens": generated,
        "recomputeTokens": recompute, "reportsCounted": reports, "recordedAt": _time(recorded_at)}
    return {"epoch": epoch, "workerId": worker, "startedAt": _time(started), "endedAt": _time(ended),
            "endReason": end_reason, "billed": billed, "label": label,
            "sealedAt": bill["sealedAt"] if billed else None, "watermark": watermark,
            "deliveredOutputTokens": delivered, "unbilledTailTokens": tail, "postSealReports": post_seal}


def line_item_json(generation_id: str, head: tuple, attempts: list[tuple]) -> dict[str, object]:
    """HEAD_SQL's row and ATTEMPTS_SQL's rows as the answer of GET /v1/generations/{id}/usage."""
    _tenant, request_id, model, status, end_reason = head[:5]
    bill = bill_json(head)
    newest = max((row[0] for row in attempts), default=0)
    return {"id": generation_id, "requestId": request_id, "model": model, "status": status, "endReason": end_reason,
            "sealed": bill is not None, "bill": bill, "attempts": [attempt_json(row, bill, newest) for row in attempts]}


def unprojected_line_item(generation_id: str, status: dict) -> dict[str, object]:
    """The caller's own generation, admitted but not projected yet: nothing is sealed or recorded here."""
    return {"id": generation_id, "requestId": status.get("requestId"), "model": status.get("model"),
            "status": status.get("status"), "endReason": status.get("endReason"), "sealed": False, "bill": None,
            "attempts": []}
