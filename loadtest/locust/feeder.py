"""One simulator, driven from a Locust process: ``python -m loadtest.locust.feeder CONFIG.json``.

Each Locust process that has users (the only one, or each worker) starts one feeder for the sensors it owns.
The feeder runs ``simulator.producer.Simulator`` exactly as ``sotw simulate`` does (same sessions, faults and
ledger) in a process of its own, outside Locust's gevent, and takes the simulator's live controls as JSON
lines on its standard input (``loadtest.run.controls``: ``{"op": "load", "factor": 2.0}``, ``faults``, ...,
``stop``). Once a second it writes one ``stats`` event on its standard output: the
simulator's counters, and the publish acknowledgements since the last event as a histogram of milliseconds
(from the ledger files the simulator closes as it goes), which the Locust side turns into a few request
events. A closed standard input (the Locust process is gone) stops it cleanly.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from loadtest.locust.lines import Events, commands
from loadtest.run.controls import SetFaults, StopFeeding, carry_out, from_wire
from simulator.config import SimulatorConfig
from simulator.producer import Simulator
from sotw.clientfiles import hand_over, take_over
from sotw.errors import SotwError
from sotw.kafka import KafkaConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FeederConfig:
    """What a feeder runs, written by the Locust side as JSON.

    Parameters
    ----------
    simulator
        ``SimulatorConfig.to_dict()`` of the sensors this feeder owns.
    bootstrap, kafka_settings
        The cluster and its librdkafka settings.
    run_dir
        The simulator's run directory (its ledger and truth).
    report_every_s
        Seconds between two ``stats`` events.
    """

    simulator: Mapping[str, Any]
    bootstrap: str
    kafka_settings: Mapping[str, str] = field(default_factory=dict)
    run_dir: str = "."
    report_every_s: float = 1.0

    def write(self, path: Path) -> Path:
        """Write as JSON to ``path``; returns it.

        Secret settings go to a file of their own beside it (mode 0600), which ``read`` deletes once read.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        data = dataclasses.asdict(self)
        data["kafka_settings"], data["kafka_secrets_file"] = hand_over(
            self.kafka_settings, path.with_name(path.stem + "-secrets.properties")
        )
        path.write_text(json.dumps(data, indent=1))
        return path

    @classmethod
    def read(cls, path: Path) -> FeederConfig:
        """Read what ``write`` wrote (and delete its secrets' file)."""
        data = json.loads(path.read_text())
        data["kafka_settings"] = take_over(data["kafka_settings"], data.pop("kafka_secrets_file", None))
        return cls(**data)


class AckReader:
    """Publish acknowledgements read from a running simulator's ledger, file by file as the files close.

    The simulator closes its ledger's open file every ``record_every_s``; a file still being written cannot
    be read yet (its Parquet footer is missing) and is read the next time.
    """

    COLUMNS = ["sent_ts", "acked_ts", "delivered", "error"]

    def __init__(self, ledger_dir: Path) -> None:
        self._dir = ledger_dir
        self._read: set[str] = set()

    def read_new(self) -> tuple[Counter[int], Counter[str]]:
        """Acknowledgements since the last call as ``{publish ms: count}``, and failures as ``{error: count}``."""
        acks: Counter[int] = Counter()
        failures: Counter[str] = Counter()
        for path in sorted(self._dir.glob("part-*.parquet")):
            if path.name in self._read:
                continue
            try:
                table = pq.read_table(path, columns=self.COLUMNS)
            except (OSError, pa.ArrowInvalid):
                continue  # still being written
            self._read.add(path.name)
            sent = table.column("sent_ts").to_numpy(zero_copy_only=False)
            acked = table.column("acked_ts").to_numpy(zero_copy_only=False)
            delivered = table.column("delivered").to_numpy(zero_copy_only=False).astype(bool)
            was_sent = ~np.isnan(sent.astype(np.float64))
            ok = delivered & was_sent
            if ok.any():
                ms = np.maximum(0, acked[ok].astype(np.int64) - sent[ok].astype(np.int64))
                values, counts = np.unique(ms, return_counts=True)
                acks.update(dict(zip(values.tolist(), counts.tolist(), strict=True)))
            lost = was_sent & ~delivered
            if lost.any():
                errors = table.column("error").to_pylist()
                failures.update(str(errors[i] or "no delivery report") for i in np.flatnonzero(lost))
        return acks, failures


class Feeder:
    """A running simulator with its controls and its reports.

    Parameters
    ----------
    config
        What to run.
    events
        Where the events go.
    """

    def __init__(self, config: FeederConfig, events: Events) -> None:
        self.config = config
        self.events = events
        self.sim_config = SimulatorConfig.from_mapping(dict(config.simulator), where="feeder")
        run_dir = Path(config.run_dir)
        self.simulator = Simulator(
            self.sim_config, KafkaConfig(config.bootstrap, config.kafka_settings), run_dir
        )
        self.acks = AckReader(run_dir / "ledger")
        self.stop = threading.Event()
        self.faults = self.sim_config.faults  # the default rates as last set, reported with the counters
        self._ended = threading.Event()

    def apply(self, command: Mapping[str, Any]) -> None:
        """Carry out one command; a bad one is reported as an ``error`` event and changes nothing."""
        try:
            control = from_wire(command)
            if isinstance(control, StopFeeding):
                self.stop.set()
                return
            carry_out(control, self.simulator, base_load=self.sim_config.load_factor)
            if isinstance(control, SetFaults) and control.sensor is None:
                self.faults = control.faults
        except (SotwError, ValueError) as exc:
            self.events.send("error", message=f"{command.get('op')}: {exc}", fatal=False)

    def report(self) -> None:
        """One ``stats`` event: the counters, the current default fault rates, acknowledgements since the last."""
        acks, failures = self.acks.read_new()
        self.events.send(
            "stats",
            stats={**self.simulator.stats().to_dict(), "taken_s": time.time()},
            faults=dataclasses.asdict(self.faults),
            acks=sorted(acks.items()),
            failures=sorted(failures.items()),
        )

    def _report_until_ended(self) -> None:
        while not self._ended.wait(self.config.report_every_s):
            try:
                self.report()
            except Exception as exc:  # a report that fails must not end the simulation
                log.warning("report failed: %s", exc)

    def _listen(self) -> None:
        for command in commands():
            self.apply(command)
        self.stop.set()  # standard input closed: the Locust process is gone

    def run(self) -> int:
        """Run the simulator until stopped; 0 when it ended cleanly."""
        threading.Thread(target=self._listen, name="sotw-feeder-commands", daemon=True).start()
        reporter = threading.Thread(target=self._report_until_ended, name="sotw-feeder-reports", daemon=True)
        reporter.start()
        try:
            summary = self.simulator.run(self.stop)
        except (SotwError, OSError) as exc:
            self.events.send("error", message=str(exc), fatal=True)
            return 1
        finally:
            self._ended.set()
            reporter.join(10)
        self.report()  # the last acknowledgements, from the files closed at the end
        self.events.send(
            "done",
            run_id=summary.run_id,
            ledger_rows=summary.ledger_rows,
            unacknowledged=summary.unacknowledged,
            interrupted=summary.interrupted,
            topics=len(summary.topics),
        )
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m loadtest.locust.feeder CONFIG.json``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m loadtest.locust.feeder CONFIG.json", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s feeder %(levelname)s %(name)s: %(message)s")
    # The Locust process decides when to stop (a Ctrl-C in its terminal reaches this process too): sessions
    # are closed and the ledger written on its stop command or when its end of the pipe closes.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    events = Events()
    try:
        feeder = Feeder(FeederConfig.read(Path(args[0])), events)
    except (SotwError, OSError, TypeError, ValueError) as exc:
        events.send("error", message=f"cannot start the simulator: {exc}", fatal=True)
        return 1
    signal.signal(signal.SIGTERM, lambda *_: feeder.stop.set())
    return feeder.run()


if __name__ == "__main__":
    sys.exit(main())
