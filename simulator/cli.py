"""``sotw simulate``: run the sensor fleet from flags or a TOML scenario, with a live progress line.

This is the edge: flags and scenario files become a ``SimulatorConfig`` here and nowhere else. Without
``--bootstrap`` a local Apache Kafka broker is started for the run and stopped after it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from simulator.config import PRODUCER_PATHS, FaultConfig, SimulatorConfig, SimulatorError, load_scenario
from simulator.producer import RunSummary, Simulator, SimulatorStats
from sotw.broker import local_broker
from sotw.cliargs import add_kafka_args, add_logging_args, kafka_config, setup_logging
from sotw.kafka import parse_settings

# flag dest -> SimulatorConfig field (None default = "not given", so scenario values survive)
_FIELDS = {
    "sensors": ("sensors", int, "sensors at the start (default 24)"),
    "rows": ("rows", int, "rows per sensor table (default 200)"),
    "columns": ("columns", int, "measurement columns besides id (default 4)"),
    "topic_prefix": (
        "topic_prefix",
        str,
        "topic prefix; topics are PREFIX<sensor-id> (default sotw-sensor-)",
    ),
    "partitions": ("partitions", int, "partitions per sensor topic (default 3)"),
    "rate": (
        "rate",
        float,
        "total messages/s before the load factor; 0 = as fast as possible (default 2000)",
    ),
    "load_factor": ("load_factor", float, "multiplies --rate, e.g. 10 for 10x (default 1)"),
    "skew": ("skew", float, "Zipf exponent of the per-sensor rate share; 0 = even (default 0)"),
    "duration": ("duration_s", float, "seconds of schedule to run (default 30; 0 = no limit)"),
    "max_messages": ("max_messages", int, "stop after planning this many messages"),
    "session_interval": ("session_interval_s", float, "mean session length in seconds (default 60)"),
    "join_rate": ("join_rate", float, "new sensors per second (default 0)"),
    "retire_rate": ("retire_rate", float, "sensors retired per second (default 0)"),
    "seed": ("seed", int, "random seed (default 0)"),
    "insert_ratio": ("insert_ratio", float, "share of updates that insert a row (default 0.05)"),
    "delete_ratio": ("delete_ratio", float, "share of updates that delete a row (default 0.05)"),
    "flush_timeout": ("flush_timeout_s", float, "seconds to wait for acknowledgements at exit (default 30)"),
    "connect_timeout": ("connect_timeout_s", float, "seconds to wait for the broker at start (default 10)"),
    "stall_timeout": (
        "stall_timeout_s",
        float,
        "give up when the broker takes nothing this long (default 60)",
    ),
}
_FAULTS = {
    "gap": "fraction of messages never sent (ledger only)",
    "duplicate": "fraction of messages sent twice",
    "delayed": "fraction of messages sent late, after later ones",
    "malformed": "fraction of messages replaced by invalid bytes",
    "abandon": "fraction of sessions abandoned without an end message",
    "delay_ms": "mean delay of delayed messages and duplicate copies, ms (default 200)",
    "delay_max_ms": "longest delay, ms (default 2000)",
}


def build_parser() -> argparse.ArgumentParser:
    """The ``sotw simulate`` argument parser."""
    parser = argparse.ArgumentParser(
        prog="sotw simulate",
        description="Run a fleet of sensors that publish snapshots and row updates to Kafka, inject faults, "
        "and record a ledger of ground truth under the run directory.",
    )
    parser.add_argument("--scenario", type=Path, metavar="FILE", help="TOML scenario; flags override it")
    parser.add_argument(
        "--profile", metavar="NAME", help="a [profiles.NAME] table of the scenario (its simulator table)"
    )
    parser.add_argument(
        "--run-dir",
        type=Path,
        metavar="DIR",
        help="where ledger/, truth/ and run.json go (default runs/<id>)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no live progress line")
    fleet = parser.add_argument_group("fleet and load")
    for dest, (_, typ, text) in _FIELDS.items():
        fleet.add_argument(f"--{dest.replace('_', '-')}", dest=dest, type=typ, default=None, help=text)
    fleet.add_argument(
        "--keep-open", action="store_true", help="do not send end messages for open sessions at the end"
    )
    faults = parser.add_argument_group("faults (fractions 0..1, for every sensor)")
    for name, text in _FAULTS.items():
        faults.add_argument(
            f"--{name.replace('_', '-')}", dest=f"fault_{name}", type=float, default=None, help=text
        )
    faults.add_argument(
        "--sensor-fault",
        action="append",
        default=[],
        metavar="SENSOR:KEY=VALUE[,KEY=VALUE]",
        help="fault rates for one sensor, e.g. 0003:malformed=0.2,gap=0.05 (repeatable)",
    )
    parser.add_argument(
        "-P",
        "--producer",
        dest="producer_settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka producer tuning over the simulator's defaults (repeatable)",
    )
    parser.add_argument(
        "--producer-path",
        choices=PRODUCER_PATHS,
        default=None,
        help="how to reach librdkafka: direct (its C API, the fast path), client (confluent-kafka's Producer) "
        "or auto (direct where it loads, else client with a warning; default)",
    )
    add_kafka_args(parser)
    add_logging_args(parser)
    return parser


def _number(text: str, where: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise SimulatorError(f"{where} must be a number, got {text!r}") from None


def config_from_args(args: argparse.Namespace) -> SimulatorConfig:
    """Scenario file (if any), then flags, into one validated ``SimulatorConfig``."""
    if args.profile and not args.scenario:
        raise SimulatorError("--profile needs --scenario FILE")
    base = load_scenario(args.scenario, args.profile) if args.scenario else SimulatorConfig()
    changes: dict[str, Any] = {}
    for dest, (name, _, _) in _FIELDS.items():
        value = getattr(args, dest)
        if value is not None:
            changes[name] = value
    if changes.get("duration_s") == 0:
        changes["duration_s"] = None
    if "max_messages" in changes and "duration_s" not in changes and not args.scenario:
        changes["duration_s"] = None  # a message count alone means "until the count"
    if args.keep_open:
        changes["close_on_stop"] = False
    if args.producer_path is not None:
        changes["producer_path"] = args.producer_path
    fault_changes = {
        name: getattr(args, f"fault_{name}") for name in _FAULTS if getattr(args, f"fault_{name}") is not None
    }
    if fault_changes:
        changes["faults"] = dataclasses.replace(base.faults, **fault_changes)
    if args.sensor_fault:
        per = dict(base.sensor_faults)
        for spec in args.sensor_fault:
            sensor, sep, pairs = spec.partition(":")
            if not sep or not sensor:
                raise SimulatorError(f"--sensor-fault must be SENSOR:KEY=VALUE[,...], got {spec!r}")
            values: dict[str, float] = {}
            for pair in pairs.split(","):
                key, eq, text = pair.partition("=")
                if not eq:
                    raise SimulatorError(f"--sensor-fault {spec!r}: {pair!r} is not KEY=VALUE")
                values[key.strip()] = _number(text, f"--sensor-fault {sensor} {key.strip()}")
            per[sensor] = FaultConfig.from_mapping(values, f"sensor_faults.{sensor}")
        changes["sensor_faults"] = per
    if args.producer_settings:
        try:
            changes["producer"] = {**base.producer, **parse_settings(args.producer_settings)}
        except ValueError as exc:
            raise SimulatorError(str(exc)) from None
    try:
        return base.replace(**changes)
    except TypeError as exc:
        raise SimulatorError(f"bad configuration: {exc}") from None


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f} ms"


def progress_line(stats: SimulatorStats) -> str:
    """One line: rate, sent, acked, faults, lateness."""
    faults = sum(stats.faults.values())
    return (
        f"{stats.elapsed_s:6.1f}s  {stats.rate:10,.0f} msg/s  sent {stats.sent:,}  acked {stats.acked:,}  "
        f"failed {stats.failed:,}  faults {faults:,}  late p50 {_fmt_ms(stats.lateness_p50_ms)} "
        f"p99 {_fmt_ms(stats.lateness_p99_ms)}  sensors {stats.sensors}"
    )


def summary_table(summary: RunSummary) -> str:
    """The closing summary as an aligned two-column table."""
    s = summary.stats
    secs = max(1e-9, (summary.ended_ms - summary.started_ms) / 1000.0)
    rows = [
        ("run", summary.run_id),
        ("run directory", str(summary.run_dir)),
        ("duration", f"{secs:,.1f} s"),
        ("planned messages", f"{s.planned:,}"),
        ("sent (incl. duplicate copies)", f"{s.sent:,}"),
        ("acknowledged", f"{s.acked:,}"),
        ("failed", f"{s.failed:,}"),
        ("never acknowledged", f"{summary.unacknowledged:,}"),
        ("average rate", f"{s.sent / secs:,.0f} msg/s"),
        *[(f"fault: {k}", f"{v:,}") for k, v in s.faults.items()],
        (
            "lateness p50 / p99 / max",
            f"{_fmt_ms(s.lateness_p50_ms)} / {_fmt_ms(s.lateness_p99_ms)} / {_fmt_ms(s.lateness_max_ms)}",
        ),
        ("backpressure waits", f"{s.backpressure_waits:,}"),
        ("sessions", f"{s.sessions:,}"),
        ("topics", f"{len(summary.topics):,}"),
        ("ledger rows", f"{summary.ledger_rows:,}"),
        ("interrupted", "yes" if summary.interrupted else "no"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"  {k:<{width}}  {v}" for k, v in rows)


class _Progress(threading.Thread):
    """Samples ``Simulator.stats`` once a second and redraws one line (or logs a line every 10 s)."""

    def __init__(self, sim: Simulator, out: TextIO) -> None:
        super().__init__(name="sotw-progress", daemon=True)
        self.sim = sim
        self.out = out
        self.done = threading.Event()
        self.tty = out.isatty()

    def run(self) -> None:
        last = 0.0
        while not self.done.wait(1.0):
            line = progress_line(self.sim.stats())
            if self.tty:
                self.out.write("\r\033[K" + line)
                self.out.flush()
            elif time.monotonic() - last >= 10:
                last = time.monotonic()
                print(line, file=self.out, flush=True)

    def stop(self) -> None:
        self.done.set()
        self.join(2)
        if self.tty:
            self.out.write("\r\033[K")
            self.out.flush()


@contextlib.contextmanager
def _graceful_sigint(stop: threading.Event) -> Iterator[None]:
    """First Ctrl-C asks the run to stop cleanly; a second one interrupts at once."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        print("\nstopping: closing sessions and flushing (Ctrl-C again to cut short)", file=sys.stderr)
        stop.set()

    old_int = signal.signal(signal.SIGINT, handler)
    old_term = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)


def default_run_dir() -> Path:
    """``runs/<UTC timestamp>-<random>``: a fresh run id every time."""
    import uuid

    return Path("runs") / (time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + uuid.uuid4().hex[:6])


def main(argv: Sequence[str]) -> int:
    """Run ``sotw simulate``; return 0 when every sent message was acknowledged, 1 otherwise."""
    parser = build_parser()
    args = parser.parse_args(list(argv))
    setup_logging(args)
    config = config_from_args(args)
    run_dir = args.run_dir or default_run_dir()
    with contextlib.ExitStack() as stack:
        if args.bootstrap:
            try:
                kafka = kafka_config(args)
            except ValueError as exc:
                raise SimulatorError(str(exc)) from None
        else:
            broker = stack.enter_context(local_broker())
            print(f"local Apache Kafka broker at {broker.bootstrap} (for this run only)", file=sys.stderr)
            try:
                kafka = kafka_config(args, broker.bootstrap)
            except ValueError as exc:
                raise SimulatorError(str(exc)) from None
        sim = Simulator(config, kafka, run_dir)
        stop = threading.Event()
        progress = None if args.no_progress else _Progress(sim, sys.stderr)
        with _graceful_sigint(stop):
            if progress:
                progress.start()
            try:
                summary = sim.run(stop)
            finally:
                if progress:
                    progress.stop()
    print(f"sotw simulate: run {summary.run_id} finished")
    print(summary_table(summary))
    if summary.unacknowledged or summary.stats.failed:
        print(
            f"sotw simulate: {summary.unacknowledged + summary.stats.failed} messages were not acknowledged",
            file=sys.stderr,
        )
        return 1
    return 0
