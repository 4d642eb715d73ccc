"""The ``sotw`` console script: one front door that dispatches to each package's ``main(argv)``.

Packages are imported only when their command runs, so ``sotw broker`` does not pay for starting PySpark.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from sotw.errors import SotwError

# command -> (module with main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "broker": ("sotw.broker_cli", "run Apache Kafka (one node or --nodes 3) on this machine until Ctrl-C"),
    "simulate": ("simulator.cli", "run the sensor fleet: snapshots, updates, faults and a ledger"),
    "pipeline": ("pipeline.cli", "run the PySpark pipeline, or `pipeline inspect OUTPUT`"),
    "run": ("loadtest.cli", "one load-test run at a load factor (1x, 10x, ...) with a report"),
    "bench": ("loadtest.cli", "1x and 10x back to back, reported side by side"),
    "capacity": ("loadtest.cli", "search for the highest load factor the pipeline sustains"),
    "drill": ("loadtest.cli", "a game-day drill: incidents during a run, scored (`drill --list`)"),
    "locust": (
        "loadtest.locust.locust_cli",
        "Locust drives the fleet: web UI with live lag, latency and correctness",
    ),
    "compare": (
        "loadtest.reports.compare",
        "two results files (or nightly entries) side by side, B judged against A",
    ),
    "compare-engines": (
        "loadtest.engines.compare",
        "each engine's job through the same runs and drills, one table (docs/engines.md)",
    ),
    "nightly": (
        "loadtest.regressions.nightly",
        "the benchmark set, its history, the regression check and the trend page",
    ),
    "topics": ("sotw.topics", "list or delete a run's topics by prefix (`topics list --prefix P`)"),
    "plan": (
        "loadtest.planning.plan",
        "how many executor cores, partitions and brokers a fleet needs (`plan measure`)",
    ),
    "cluster": (
        "loadtest.run.cluster",
        "a Spark standalone cluster on this machine until Ctrl-C (for --master)",
    ),
    "demo": ("loadtest.demo", "the README demo on a local Apache Kafka broker"),
}


def usage() -> str:
    """The top-level help text."""
    lines = ["usage: sotw COMMAND [options]   (sotw COMMAND --help for its options)", "", "commands:"]
    lines += [f"  {name:<16} {text}" for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``sotw COMMAND ...``; expected failures print one line and return non-zero."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from sotw import __version__

        print(f"sotw {__version__}")
        return 0
    command = args[0]
    if command not in COMMANDS:
        print(f"sotw: unknown command {command!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[command][0])
    rest = args[1:] if module.__name__ != "loadtest.cli" else args
    try:
        return int(module.main(rest) or 0)
    except SotwError as exc:
        print(f"sotw {command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"sotw {command}: interrupted", file=sys.stderr)
        return 130
