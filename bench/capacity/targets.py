"""Issue 12's targets checked against a capacity run: met (True/False, None when not measured) and a note per miss.

`runs[server][mix]` = {"levels": [level summaries], "saturation": concurrency or None}; `ratios` as
`metrics.ratios` returns them.
"""
from __future__ import annotations

TARGETS = {
    "no_503_where_pool_holds_working_set": True,
    "completed_fraction_min_at_concurrency_le_16": 0.99,
    "kv_used_mean_fraction_at_saturation_mix_b_min": 0.80,
    "ratio_vs_transformers_serve_min": 1.5,
    "ratio_vs_engine_same_concurrency_min": 0.85,
}


def no_503_where_pool_holds(ledgerlm: dict[str, dict]) -> tuple[bool | None, str | None]:
    misses, unknown = [], []
    for mix, run in sorted(ledgerlm.items()):
        for level in run["levels"]:
            holds = level.get("pool_holds_working_set")
            if holds is None:
                unknown.append(f"{mix}@{level['concurrency']}")
            elif holds and level["refused_503"]:
                misses.append(f"mix {mix} at {level['concurrency']}: {level['refused_503']} x 503 with a working set "
                              f"of {level['working_set_blocks']} blocks in a pool of {level['pool_blocks']}")
    if misses:
        return False, "; ".join(misses)
    if unknown:
        return None, f"working set or pool unknown at {', '.join(unknown)}"
    return True, None


def completed_at_low_concurrency(ledgerlm: dict[str, dict], minimum: float) -> tuple[bool | None, str | None]:
    misses = [f"mix {mix} at {lv['concurrency']}: {lv['completed_fraction']} (429: {lv['refused_429']}, 503: "
              f"{lv['refused_503']}, other: {lv['other']})"
              for mix, run in sorted(ledgerlm.items()) for lv in run["levels"]
              if lv["concurrency"] <= 16 and (lv["completed_fraction"] is None or lv["completed_fraction"] < minimum)]
    if not any(lv["concurrency"] <= 16 for run in ledgerlm.values() for lv in run["levels"]):
        return None, "no level at concurrency <= 16 was run"
    return (False, "; ".join(misses)) if misses else (True, None)


def kv_at_saturation(ledgerlm: dict[str, dict], minimum: float) -> tuple[bool | None, str | None]:
    run = ledgerlm.get("b")
    if run is None:
        return None, "mix b was not run"
    if run["saturation"] is None:
        return False, "mix b: no level produced a token"
    level = next(lv for lv in run["levels"] if lv["concurrency"] == run["saturation"])
    used = level.get("kv_used_mean_fraction")
    if used is None:
        return None, "mix b: no KV samples at saturation"
    if used < minimum:
        return False, (f"mix b at saturation ({run['saturation']}): mean {level['kv_blocks_used_mean']} of "
                       f"{level['pool_blocks']} blocks used ({used:.0%}, peak {level['kv_used_peak_fraction']:.0%})")
    return True, None


def ratio_target(ratios: dict[str, dict], key: str, minimum: float) -> tuple[bool | None, str | None]:
    if not ratios:
        return None, "no mix was run"
    misses = [f"mix {mix}: {r[key]}" if r[key] is not None else f"mix {mix}: undefined (a side has no tokens or "
              "was not run)" for mix, r in sorted(ratios.items()) if r[key] is None or r[key] < minimum]
    return (False, "; ".join(misses)) if misses else (True, None)


def check_targets(runs: dict[str, dict[str, dict]], ratios: dict[str, dict]) -> tuple[dict, dict]:
    """(targets_met, target_notes): notes only for misses and unmeasured targets."""
    ledgerlm = runs.get("ledgerlm")
    if not ledgerlm:
        return {name: None for name in TARGETS}, {name: "ledgerlm was not run" for name in TARGETS}
    checks = {
        "no_503_where_pool_holds_working_set": no_503_where_pool_holds(ledgerlm),
        "completed_fraction_min_at_concurrency_le_16": completed_at_low_concurrency(
            ledgerlm, TARGETS["completed_fraction_min_at_concurrency_le_16"]),
        "kv_used_mean_fraction_at_saturation_mix_b_min": kv_at_saturation(
            ledgerlm, TARGETS["kv_used_mean_fraction_at_saturation_mix_b_min"]),
        "ratio_vs_transformers_serve_min": ratio_target(ratios, "platform_vs_transformers_serve",
                                                        TARGETS["ratio_vs_transformers_serve_min"]),
        "ratio_vs_engine_same_concurrency_min": ratio_target(ratios, "platform_vs_engine",
                                                             TARGETS["ratio_vs_engine_same_concurrency_min"]),
    }
    return ({name: met for name, (met, _) in checks.items()},
            {name: note for name, (_, note) in checks.items() if note is not None})
