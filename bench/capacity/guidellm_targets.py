"""Issue 26's targets checked against a guidellm-driven capacity run (levels 1-16, the engine alone at each).

    ttft_p95_within_allowance      TTFT p95 of the admitted requests <= the interactive allowance, every level
    promise_median_within_25pct    observed / predicted TTFT (decision to first token, at the worker) of
                                   interactive attempts, median bucket in [0.75, 1.25]
    errors_max_where_engine_keeps  errors <= 1 % at every level where the engine alone keeps TTFT p95 within
                                   the allowance
    tok_s_vs_engine_min            completed tok/s >= 0.9 x the engine alone's completed tok/s (tokens of the
                                   requests that ended within the window) at the same concurrency, same levels
    overload_not_below_8           tok/s at 16 >= tok/s at 8
"""
from __future__ import annotations

from bench.capacity.metrics import level_at
from bench.serve.metrics import ratio

ERRORS_MAX = 0.01
TOK_S_VS_ENGINE_MIN = 0.9
PROMISE_BAND = (0.75, 1.25)


def per_level(ours: list[dict], engine: list[dict], allowance_ms: float) -> list[dict]:
    rows = []
    for level in ours:
        alone = level_at(engine, level["concurrency"]) or {}
        answered = level["completed"] + level["errored"]
        engine_p95 = (alone.get("ttft_ms") or {}).get("p95")
        promise = level.get("interactive_ttft_promise_ratio") or {}
        wait = level.get("interactive_wait_promise_ratio") or {}
        rows.append({
            "concurrency": level["concurrency"], "completed": level["completed"], "errored": level["errored"],
            "error_fraction": round(level["errored"] / answered, 4) if answered else None,
            "error_kinds": level.get("error_kinds"), "output_tok_s": level["output_tok_s"],
            "engine_output_tok_s": alone.get("output_tok_s"),
            "engine_completed_output_tok_s": alone.get("completed_output_tok_s"),
            "delivered_output_tok_s": level.get("delivered_output_tok_s"),
            # like for like: every token delivered within the window on both sides (the requests cut at its end
            # included); completed_vs_engine counts completed requests only on both sides, as guidellm's
            # successful-requests rate does (noisier: whole requests)
            "vs_engine": ratio(level.get("delivered_output_tok_s") or level["output_tok_s"], alone.get("output_tok_s")),
            "completed_vs_engine": ratio(level["output_tok_s"],
                                         alone.get("completed_output_tok_s") or alone.get("output_tok_s")),
            "ttft_p95_ms": (level.get("ttft_ms") or {}).get("p95"), "engine_ttft_p95_ms": engine_p95,
            "engine_keeps_allowance": None if engine_p95 is None else engine_p95 <= allowance_ms,
            "itl_p95_ms": (level.get("itl_ms") or {}).get("p95"),
            # what guidellm itself ran on the machine's cores beside the platform (the engine alone has no client)
            "client_cores": (level.get("client_cpu") or {}).get("cores"),
            "promise_ratio_p50_le": promise.get("p50_le"), "promise_ratio_n": promise.get("n"),
            "wait_promise_ratio_p50_le": wait.get("p50_le"),
            # the controller's refusals: how many, and the terms of their predicted waits (bench/capacity/refusals)
            "controller_refusals": level.get("refusals")})
    return rows


def verdict(misses: list[str], measured: bool) -> dict:
    return {"met": None if not measured else not misses, "misses": misses}


def check_guidellm(runs: dict, allowance_ms: float) -> dict:
    ours = (runs.get("ledgerlm") or {}).get("a", {}).get("levels", [])
    engine = (runs.get("engine") or {}).get("a", {}).get("levels", [])
    rows = per_level(ours, engine, allowance_ms)
    kept = [r for r in rows if r["engine_keeps_allowance"]]
    ttft = [f"{r['concurrency']}: {r['ttft_p95_ms']} ms" for r in rows
            if r["ttft_p95_ms"] is None or r["ttft_p95_ms"] > allowance_ms]
    promise = [f"{r['concurrency']}: {r['promise_ratio_p50_le']}" for r in rows if r["promise_ratio_n"]
               and not (r["promise_ratio_p50_le"] is not None and PROMISE_BAND[0] <= r["promise_ratio_p50_le"]
                        <= PROMISE_BAND[1])]
    errors = [f"{r['concurrency']}: {r['error_fraction']}" for r in kept
              if r["error_fraction"] is None or r["error_fraction"] > ERRORS_MAX]
    vs_engine = [f"{r['concurrency']}: {r['vs_engine']}" for r in kept
                 if r["vs_engine"] is None or r["vs_engine"] < TOK_S_VS_ENGINE_MIN]
    at8, at16 = level_at(rows, 8), level_at(rows, 16)
    overload = [] if not (at8 and at16) or (at16["output_tok_s"] or 0) >= (at8["output_tok_s"] or 0) else [
        f"16: {at16['output_tok_s']} < 8: {at8['output_tok_s']}"]
    return {
        "allowance_ms": allowance_ms, "levels": rows,
        "targets": {
            "ttft_p95_within_allowance": verdict(ttft, bool(rows)),
            "promise_median_within_25pct": verdict(promise, any(r["promise_ratio_n"] for r in rows)),
            "errors_max_where_engine_keeps": verdict(errors, bool(kept)),
            "tok_s_vs_engine_min": verdict(vs_engine, bool(kept)),
            "overload_not_below_8": verdict(overload, bool(at8 and at16))},
        "note": "the promise is the TTFT the controller predicted, decision to first token at the worker "
                "(histogram bucket bounds 0.25 ... 10; wait_promise_ratio_p50_le: the wait before the first "
                "scheduling alone); ttft_p95_ms is what guidellm measured",
    }
