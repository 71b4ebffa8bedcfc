"""The worker's engine threads sleep while they wait (OMP_WAIT_POLICY=PASSIVE) unless the operator chose a policy."""
from __future__ import annotations

import os
import subprocess
import sys

from plumbing.compute_threads import passive_compute_threads, wait_policy_env


def test_the_worker_asks_for_sleeping_compute_threads_when_no_policy_is_set(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    passive_compute_threads()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"


def test_an_operators_policy_is_kept(monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    passive_compute_threads()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE" and wait_policy_env() == {"OMP_WAIT_POLICY": "ACTIVE"}
    monkeypatch.delenv("OMP_WAIT_POLICY")
    assert wait_policy_env() == {"OMP_WAIT_POLICY": "PASSIVE"}  # the roles a bench starts sleep theirs


def test_the_worker_command_has_not_imported_torch_before_it_sets_the_policy():
    """The policy is read when torch loads its OpenMP runtime: the CLI must not import torch before run_worker."""
    code = "import sys, ledgerlm.cli.main, ledgerlm.cli.roles, ledgerlm.cli.worker_cmd; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
