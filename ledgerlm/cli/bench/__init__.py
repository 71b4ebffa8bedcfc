"""`ledgerlm bench ...`: benchmarks are programs with JSON output; one module here per bench, each adding its
subcommand (`register_<bench>`), in the order `ledgerlm bench --help` lists them."""
from __future__ import annotations

import argparse

from ledgerlm.cli.bench.admission import register_admission  # control plane (issue 4)
from ledgerlm.cli.bench.audit import register_audit  # audit replay speed (issue 18)
from ledgerlm.cli.bench.batch import register_batch  # the batch tier's completion window (issue 26)
from ledgerlm.cli.bench.capacity import register_capacity  # closed-loop capacity, default settings (issue 12)
from ledgerlm.cli.bench.chaos import register_chaos  # faults under load (issue 7)
from ledgerlm.cli.bench.device import register_device  # the prepared run for a lent accelerator (issue 29)
from ledgerlm.cli.bench.efficiency import register_efficiency  # the platform vs its engine (issue 25)
from ledgerlm.cli.bench.engine import register_engine
from ledgerlm.cli.bench.intake import register_intake  # Kafka-native client API (issue 17)
from ledgerlm.cli.bench.overhead import register_overhead  # CPU per role per request (issue 13)
from ledgerlm.cli.bench.projector import register_projector
from ledgerlm.cli.bench.serve import register_serve  # serving SLOs vs transformers serve (issue 7)
from ledgerlm.cli.bench.stream import register_stream  # streaming bridge (issue 6)

BENCHES = (register_engine, register_projector, register_admission, register_stream, register_chaos, register_serve,
           register_capacity, register_overhead, register_efficiency, register_batch, register_audit, register_intake,
           register_device)


def register(subparsers: argparse._SubParsersAction) -> None:
    bench = subparsers.add_parser("bench", help="benchmarks (JSON output)").add_subparsers(dest="bench", required=True)
    for register_bench in BENCHES:
        register_bench(bench)
