"""PNGs of a capacity run (matplotlib, no display): output tok/s and p95 TTFT against concurrency, per mix."""
from __future__ import annotations

from pathlib import Path

from bench.serve.plots import _figure, _save

PROMISES = {"interactive_ttft_promise_ratio": "TTFT", "interactive_wait_promise_ratio": "wait"}


def mix_plot(runs: dict[str, dict[str, dict]], mix: str, out: Path) -> Path:
    """One line per server: output tok/s (left) and p95 TTFT (right, log scale) at each concurrency."""
    plt = _figure()
    fig, (tok_s, ttft) = plt.subplots(1, 2, figsize=(12, 4))
    for server, by_mix in sorted(runs.items()):
        levels = by_mix.get(mix, {}).get("levels", [])
        if not levels:
            continue
        concurrency = [lv["concurrency"] for lv in levels]
        tok_s.plot(concurrency, [lv["output_tok_s"] or 0 for lv in levels], marker="o", label=server)
        points = [(lv["concurrency"], lv["ttft_ms"]["p95"]) for lv in levels if lv["ttft_ms"]["p95"] is not None]
        if points:
            ttft.plot(*zip(*points), marker="o", label=server)
    ticks = sorted({lv["concurrency"] for by_mix in runs.values() for lv in by_mix.get(mix, {}).get("levels", [])})
    for ax, label in ((tok_s, "output tokens / s"), (ttft, "p95 TTFT (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(c) for c in ticks])
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    tok_s.set_ylim(bottom=0)
    ttft.set_yscale("log")
    return _save(plt, fig, f"closed loop, mix {mix}: throughput and time to first token", out)


def promise_plot(levels: list[dict], out: Path) -> Path:
    """Observed / predicted TTFT and wait of ledgerlm's interactive attempts (median and p95 bucket bounds) per
    level, against the band the admission aims for (within 25 % at the median)."""
    plt = _figure()
    fig, ax = plt.subplots(figsize=(6, 4))
    for series, what in PROMISES.items():
        measured = [lv for lv in levels if (lv.get(series) or {}).get("n")]
        for key, label in (("p50_le", "median"), ("p95_le", "p95")):
            points = [(lv["concurrency"], lv[series][key]) for lv in measured if lv[series][key] is not None]
            if points:
                ax.plot(*zip(*points), marker="o", label=f"{what}, {label} (bucket bound)")
    ax.axhspan(0.75, 1.25, alpha=0.15, label="within 25 %")
    ax.set_xscale("log", base=2)
    ticks = [lv["concurrency"] for lv in levels]
    ax.set_xticks(ticks, [str(c) for c in ticks])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("observed / predicted")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    return _save(plt, fig, "admission: the TTFT and wait it predicted vs what the worker saw", out)


def write_plots(runs: dict[str, dict[str, dict]], out_dir: Path) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    mixes = sorted({mix for by_mix in runs.values() for mix in by_mix})
    written = [str(mix_plot(runs, mix, out_dir / f"capacity_mix_{mix}.png")) for mix in mixes]
    for mix, run in sorted(runs.get("ledgerlm", {}).items()):
        if any((lv.get(series) or {}).get("n") for lv in run["levels"] for series in PROMISES):
            written.append(str(promise_plot(run["levels"], out_dir / f"capacity_promise_mix_{mix}.png")))
    return written
