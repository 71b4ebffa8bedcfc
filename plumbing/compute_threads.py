"""How the engine's compute threads wait for work: asleep (`OMP_WAIT_POLICY=PASSIVE`) unless the operator chose a
policy. OpenMP reads the variable when torch first loads, so a process sets it before it imports torch, and passes
it to the roles it starts.

On a machine the worker shares with the gateway, broker and database, spinning threads took cores those needed and
made each engine step wait for a descheduled thread (`bench engine --quick` ran 4x slower; decision 0019)."""
from __future__ import annotations

import os

WAIT_POLICY = "OMP_WAIT_POLICY"


def passive_compute_threads() -> None:
    """Sleeping compute threads for this process and the ones it starts, unless a policy is set already."""
    os.environ.setdefault(WAIT_POLICY, "PASSIVE")


def wait_policy_env() -> dict[str, str]:
    """The policy for a role's environment: the operator's, or sleeping threads."""
    return {WAIT_POLICY: os.environ.get(WAIT_POLICY, "PASSIVE")}
