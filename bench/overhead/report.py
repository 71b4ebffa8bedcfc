"""The overhead bench's arithmetic: CPU per role per request and per output token, idle burn, Kafka and
PostgreSQL writes per request, and the targets. Pure: numbers in, JSON-ready dicts out.
"""
from __future__ import annotations

from collections.abc import Sequence

# Every role outside the engine's compute: what the platform costs on top of the model.
PLATFORM_ROLES = ("gateway", "controller", "projector", "worker_non_engine", "kafka", "postgres")
TARGET_FIXED_MS = 25.0
TARGET_US_PER_OUTPUT_TOKEN = 150.0
TARGET_IDLE_CORES = 0.05

DEFINITIONS = {
    "cpu_s": "user + system CPU seconds from /proc/<pid>/stat (utime + stime, plus cutime + cstime: children the "
             "process reaped) between two samples; Python roles are one process each",
    "engine": "threads of the worker whose OS name (/proc/<pid>/task/<tid>/comm) is 'engine': the engine thread "
              "names itself with prctl(PR_SET_NAME) and the OpenMP threads torch starts from it inherit the name, "
              "so this is the model's whole compute (prefill, decode, sampling, detokenization on that thread)",
    "worker_non_engine": "the worker process minus its 'engine' threads: the asyncio loop (Kafka I/O, dispatch, "
                         "token events, heartbeats) and helper threads; a thread that exits counts here",
    "kafka": "the broker JVM(s) of the local services (infra up), every thread",
    "postgres": "the postmaster and every live descendant (checkpointer, walwriter, background writer, "
                "autovacuum, each connection's backend), plus what the postmaster reaped (exited backends)",
    "load_generator": "this bench process (the HTTP clients and the sampling): reported apart, never in platform",
    "platform": "sum over " + ", ".join(PLATFORM_ROLES) + " (everything outside the engine's compute)",
    "window": "a mix's window runs from its first request to the moment the projector has applied every record "
              "its load produced (clients stop starting requests at the duration and finish those in flight), "
              "so each counted request's whole cost is inside it",
    "ms_per_request": "cpu_s * 1000 / completed requests of the window (gross: idle burn included)",
    "ms_per_request_net_of_idle": "(cpu_s - idle_cores of the role * window seconds) * 1000 / requests",
    "us_per_output_token": "cpu_s * 1e6 / output tokens of the completed requests (from their usage chunks)",
    "idle_cores": "CPU seconds / seconds over the idle phase (stack up, warmed, no traffic, nothing polled by "
                  "the bench), summed over the platform roles; idle_cores_by_role has every role",
    "kafka_topics": "records: end offsets summed over partitions (transaction markers count); bytes: growth of "
                    "the topic's log segment files (*.log) in the brokers' log dirs, batch overhead included",
    "postgres_tables": "pg_stat_user_tables n_tup_ins + n_tup_upd + n_tup_del deltas, read once the counters "
                       "held still for 11 s (backends publish pending counters within 10 s); wal_bytes from "
                       "pg_current_wal_lsn()",
    "targets": "per mix: platform ms_per_request <= fixed_ms + us_per_output_token * output tokens per request / "
               "1000; idle: idle_cores <= idle_cores target",
}


def split_worker(cpu: dict[str, float | None]) -> dict[str, float | None]:
    """`worker` (the whole process) and `worker_engine` become `engine` and `worker_non_engine`."""
    out = {k: v for k, v in cpu.items() if k not in ("worker", "worker_engine")}
    worker, engine = cpu.get("worker"), cpu.get("worker_engine")
    out["engine"] = engine
    out["worker_non_engine"] = None if worker is None or engine is None else worker - engine
    return out


def platform_total(cpu: dict[str, float | None]) -> float:
    return sum(cpu.get(role) or 0.0 for role in PLATFORM_ROLES)


def missing_roles(cpu: dict[str, float | None]) -> list[str]:
    return [role for role in PLATFORM_ROLES if cpu.get(role) is None]


def idle_cores(cpu: dict[str, float | None], seconds: float) -> dict[str, float | None]:
    return {role: None if value is None else round(value / seconds, 4) for role, value in cpu.items()}


def ratio(value: float | None, by: float, scale: float, digits: int = 3) -> float | None:
    return None if value is None or by <= 0 else round(value * scale / by, digits)


def role_costs(cpu_s: float | None, requests: int, output_tokens: int, wall_s: float,
               idle_cores_of_role: float | None) -> dict:
    net = None if cpu_s is None or idle_cores_of_role is None else cpu_s - idle_cores_of_role * wall_s
    return {"cpu_s": None if cpu_s is None else round(cpu_s, 3),
            "cores": ratio(cpu_s, wall_s, 1.0, 4),
            "ms_per_request": ratio(cpu_s, requests, 1e3),
            "us_per_output_token": ratio(cpu_s, output_tokens, 1e6, 1),
            "ms_per_request_net_of_idle": ratio(net, requests, 1e3)}


def costs(cpu: dict[str, float | None], idle: dict[str, float | None], requests: int, output_tokens: int,
          wall_s: float) -> dict:
    """Per role, the platform total and the engine: CPU, cores, per request and per output token."""
    roles = {role: role_costs(value, requests, output_tokens, wall_s, idle.get(role)) for role, value in cpu.items()}
    idle_platform = sum(idle.get(role) or 0.0 for role in PLATFORM_ROLES)
    platform = role_costs(platform_total(cpu), requests, output_tokens, wall_s, idle_platform)
    platform["missing_roles"] = missing_roles(cpu)
    return {"roles": roles, "platform": platform}


def top_roles(roles: dict[str, dict], n: int = 3) -> list[list]:
    ranked = sorted(((r, c["ms_per_request"]) for r, c in roles.items()
                     if r in PLATFORM_ROLES and c["ms_per_request"] is not None), key=lambda rc: -rc[1])
    return [[role, ms] for role, ms in ranked[:n]]


def per_unit(counts: dict[str, dict[str, int | None]], requests: int, output_tokens: int,
             keys: Sequence[str] | None = None) -> dict[str, dict]:
    """Each name's counts (records, bytes, rows...) with per-request and per-output-token rates of `keys`
    (default: every count) beside them."""
    out = {}
    for name, values in counts.items():
        row: dict = dict(values)
        for key in keys or list(values):
            value = values.get(key)
            row[f"{key}_per_request"] = ratio(value, requests, 1.0)
            row[f"{key}_per_output_token"] = ratio(value, output_tokens, 1.0, 4)
        out[name] = row
    return out


def summed(counts: dict[str, dict[str, int | None]], key: str) -> int:
    return sum(values.get(key) or 0 for values in counts.values())


def target_ms_per_request(output_tokens_per_request: float) -> float:
    return round(TARGET_FIXED_MS + TARGET_US_PER_OUTPUT_TOKEN * output_tokens_per_request / 1000, 2)


def linear_fit(points: Sequence[tuple[float, float]]) -> dict | None:
    """Least squares ms_per_request = fixed_ms + us_per_output_token * tokens / 1000 over (tokens, ms) points;
    None with fewer than two distinct token counts."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mean_x, mean_y = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    return {"fixed_ms": round(mean_y - slope * mean_x, 2), "us_per_output_token": round(slope * 1000, 1)}
