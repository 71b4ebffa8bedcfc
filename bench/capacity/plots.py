"""PNGs of a capacity run (matplotlib, no display): output tok/s and p95 TTFT against concurrency, per mix."""
from __future__ import annotations

from pathlib import Path

from bench.serve.plots import _figure, _save


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


def write_plots(runs: dict[str, dict[str, dict]], out_dir: Path) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    mixes = sorted({mix for by_mix in runs.values() for mix in by_mix})
    return [str(mix_plot(runs, mix, out_dir / f"capacity_mix_{mix}.png")) for mix in mixes]
