"""A dated Markdown page from a `bench efficiency` report: what docs/benchmarks/ holds."""
from __future__ import annotations

from datetime import date


def cell(value: object) -> str:
    return "n/a" if value is None else str(value)


def efficiency_page(report: dict, day: date | None = None) -> str:
    day = day or date.today()
    machine = report["machine"]
    lines = [f"# bench efficiency, {day.isoformat()}", "",
             f"`ledgerlm bench efficiency` with default settings on `{report['model_dir'].rsplit('/', 1)[-1]}`; "
             f"{machine['cpus']} CPUs, load average {machine['load_average_at_start']} at the start and "
             f"{machine['load_average_at_end']} at the end; {report['wall_s']} s in all. Generated from the "
             "report's JSON.", "",
             "| streams | platform tok/s | engine tok/s | ratio | ITL p50/p95 ms platform | engine | ITL p95 ratio "
             "| TTFT p50/p95 ms platform | engine | outside the engine, ms CPU per token | errors |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in report["comparison"]:
        p_itl, e_itl = row["platform_itl_ms"], row["engine_itl_ms"] or {}
        p_ttft, e_ttft = row["platform_ttft_ms"], row["engine_ttft_ms"] or {}
        errors = sum(row["errors"].values())
        lines.append(f"| {row['concurrency']} | {cell(row['platform_tok_s'])} | {cell(row['engine_tok_s'])} "
                     f"| {cell(row['tok_s_ratio'])} | {cell(p_itl.get('p50'))}/{cell(p_itl.get('p95'))} "
                     f"| {cell(e_itl.get('p50'))}/{cell(e_itl.get('p95'))} | {cell(row['itl_p95_ratio'])} "
                     f"| {cell(p_ttft.get('p50'))}/{cell(p_ttft.get('p95'))} "
                     f"| {cell(e_ttft.get('p50'))}/{cell(e_ttft.get('p95'))} "
                     f"| {cell(row['outside_engine_ms_per_output_token'])} | {errors} |")
    roles = ("gateway", "controller", "projector", "worker_engine", "worker_other", "kafka", "postgres")
    lines += ["", "CPU per role while the streams were open: cores, and ms per output token with the idle burn "
              "subtracted.", "", "| streams | " + " | ".join(roles) + " |", "| --- |" + " --- |" * len(roles)]
    for level in report["platform"]["levels"]:
        costs = level["roles"]
        lines.append(f"| {level['concurrency']} | " + " | ".join(
            f"{cell(costs[r]['cores'])} / {cell(costs[r]['ms_per_output_token'])}" for r in roles) + " |")
    idle_before, idle_after = report["platform"]["idle_before"], report["platform"]["idle_after"]
    lines += ["", f"Idle burn of the stack: {cell(idle_before['cores'])} cores before the load, "
              f"{cell(idle_after['cores'])} after (by role after: "
              + ", ".join(f"{r} {cell(idle_after['cores_by_role'].get(r))}" for r in roles) + ").", "",
              "Targets met: " + ", ".join(f"{k} {cell(v)}" for k, v in report["targets_met"].items()) + ".", "",
              "Not measured: " + "; ".join(report["not_measured"]) + ".", ""]
    return "\n".join(lines)
