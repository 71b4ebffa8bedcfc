"""PNGs of a serving-bench run (matplotlib, no display): latency CDFs, KV and queue over time, token shares."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.serve.metrics import RequestRecord, token_share_series


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, title: str, out: Path) -> Path:
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


def latency_cdfs(records: dict[str, Sequence[RequestRecord]], mix: str, out: Path) -> Path:
    """TTFT, ITL and end-to-end CDFs of one mix, one line per target."""
    plt = _figure()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, metric in zip(axes, ("ttft", "itl", "e2e")):
        for target, recs in records.items():
            values = sorted(v * 1000 for r in recs if r.mix == mix and r.completed
                            and (v := getattr(r, metric)) is not None)
            if values:
                fractions = [(i + 1) / len(values) for i in range(len(values))]
                ax.plot(values, fractions, label=f"{target} (n={len(values)})")
        ax.set_xscale("log")
        ax.set_xlabel(f"{metric} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    for ax, slo in ((axes[0], 1000), (axes[1], 50)):
        ax.axvline(slo, color="red", linestyle="--", linewidth=1)
    return _save(plt, fig, f"{mix} mix: latency CDFs (red: SLO)", out)


def kv_and_queue(samples: Sequence[dict], out: Path) -> Path:
    """The worker's used KV blocks, queued tokens and running sequences from its heartbeats."""
    plt = _figure()
    fig, (kv, queue) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    t = [s["t"] for s in samples]
    total = samples[0]["total_blocks"] if samples else 0
    kv.plot(t, [s["used_blocks"] for s in samples], label=f"used KV blocks (of {total})")
    kv.set_ylabel("blocks")
    kv.legend()
    queue.plot(t, [s["queued_tokens"] for s in samples], label="queued tokens")
    queue.set_ylabel("tokens")
    running = queue.twinx()
    running.plot(t, [s["running"] for s in samples], color="tab:orange", label="running sequences")
    running.set_ylabel("sequences")
    queue.set_xlabel("seconds since the load started")
    queue.legend(loc="upper left")
    running.legend(loc="upper right")
    return _save(plt, fig, "ledgerlm worker: KV usage and queue depth (heartbeats)", out)


def token_shares(records: dict[str, Sequence[RequestRecord]], bin_s: float, out: Path) -> Path:
    """Per target, each tenant's share of the output tokens delivered in each time bin (stacked)."""
    plt = _figure()
    fig, axes = plt.subplots(1, len(records), figsize=(7 * len(records), 4), squeeze=False)
    tenants = sorted({r.tenant for recs in records.values() for r in recs})
    colors = [f"C{i}" for i in range(len(tenants))]  # one color per tenant in every panel
    for ax, (target, recs) in zip(axes[0], records.items()):
        series = token_share_series(recs, bin_s)
        totals = [sum(point["tokens"].values()) or 1 for point in series]
        shares = [[point["tokens"].get(tenant, 0) / total for point, total in zip(series, totals)]
                  for tenant in tenants]
        if series:
            ax.stackplot([point["t_s"] for point in series], shares, labels=tenants, colors=colors)
        ax.set_ylim(0, 1)
        ax.set_title(target)
        ax.set_xlabel("seconds since the load started")
        ax.set_ylabel("share of output tokens")
        ax.legend(loc="upper right")
    return _save(plt, fig, "served-token share per tenant over time", out)


def write_plots(records: dict[str, Sequence[RequestRecord]], samples: Sequence[dict], bin_s: float,
                out_dir: Path) -> list[str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    mixes = sorted({r.mix for recs in records.values() for r in recs})
    paths = [latency_cdfs(records, mix, out_dir / f"latency_cdf_{mix}.png") for mix in mixes]
    paths.append(kv_and_queue(samples, out_dir / "kv_blocks_queue_depth.png"))
    paths.append(token_shares(records, bin_s, out_dir / "tenant_token_share.png"))
    return [str(p) for p in paths]
