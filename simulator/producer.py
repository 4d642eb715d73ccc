"""The simulator's public facade: ``Simulator`` runs a fleet of sensors against Kafka, open loop, with a ledger.

``Simulator`` is the programmatic API the CLI, the load-test harness and the Locust UI share. It takes live
controls from other threads (fault rates, the load factor), reports counters (``stats``), and runs the loop
that ties the parts together, each in a module of its own:

- ``simulator.planner.Planner``: the schedule in blocks, churn, sessions, each message's fault, the tables'
  updates and the encoding;
- ``simulator.injector.FaultInjector``: gaps, malformed messages, and the delayed messages and duplicate
  copies it holds back;
- ``simulator.sender.Sender``: pacing, producing, backpressure, and the delivery reports that fill the
  ledger (``simulator.ledger``), through the direct producer path (``simulator.rdkafka``) or the client one
  (``simulator.client``);
- ``simulator.record.RunRecord``: ``run.json``.

The loop is open loop: every message has an intended send time from the schedule, the loop sleeps when it
is ahead (waking at most once a tick to send everything due) and never skips when behind, and lateness
(sent minus intended) is measured, so a slow broker shows up as lateness rather than as a lower rate nobody
asked for (coordinated omission). Per-message Python work is kept to its share of a few compiled calls per
run of updates; everything else is done per block or off the hot path.
"""

from __future__ import annotations

import bisect
import dataclasses
import gc
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from simulator.client import MessageProducer, open_producer
from simulator.config import DEFAULT_PRODUCER, FAULT_KINDS, FaultConfig, SimulatorConfig, SimulatorError
from simulator.faults import FAULT_NAMES, FaultTable
from simulator.fleet import Fleet
from simulator.injector import FaultInjector
from simulator.ledger import Ledger
from simulator.planner import MIN_RUN, Block, Planned, Planner, UpdateRun
from simulator.record import RunRecord
from simulator.sender import Sender
from simulator.truth import Truth
from sotw.broker import wait_for_kafka
from sotw.kafka import KafkaConfig, ensure_topics

log = logging.getLogger(__name__)

Clock = Callable[[], float]

#: How often the open chunk of the ledger is sealed (and sealed chunks written), and the most rows it takes.
SEAL_EVERY_S = 0.5
SEAL_ROWS = 250_000
#: The shortest time between two wakes of the loop while it waits for the schedule: each wake sends all
#: that is due. Shorter costs more CPU (a wake is a sleep, a poll and a few clock reads), longer adds up to
#: as much lateness.
TICK_S = 0.002


@dataclass(frozen=True)
class SimulatorStats:
    """Cumulative counters of a run, safe to sample from another thread once a second.

    Parameters
    ----------
    elapsed_s
        Wall-clock seconds since the run started.
    planned
        Messages planned (one per schedule slot, plus closing ``end`` messages); duplicate copies excluded.
    sent
        Messages handed to the producer, duplicate copies included.
    acked
        Messages the broker acknowledged.
    failed
        Messages whose delivery report carried an error.
    in_flight
        Messages sent and not yet reported on.
    faults
        Injected faults by kind (``gap``, ``duplicate``, ``delayed``, ``malformed``, ``abandoned``).
    rate
        Messages sent per second over about the last second.
    lateness_p50_ms, lateness_p99_ms, lateness_max_ms
        Send time minus intended time over on-schedule messages (delayed and duplicate copies excluded);
        None until the first ledger chunk is sealed (about one second).
    sensors
        Sensors currently publishing.
    sessions
        Sessions opened so far.
    load_factor
        The current load factor.
    backpressure_waits
        Times the producer queue was full and the loop waited for the broker.
    """

    elapsed_s: float = 0.0
    planned: int = 0
    sent: int = 0
    acked: int = 0
    failed: int = 0
    in_flight: int = 0
    faults: Mapping[str, int] = field(default_factory=lambda: dict.fromkeys(FAULT_KINDS, 0))
    rate: float = 0.0
    lateness_p50_ms: float | None = None
    lateness_p99_ms: float | None = None
    lateness_max_ms: float | None = None
    sensors: int = 0
    sessions: int = 0
    load_factor: float = 1.0
    backpressure_waits: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able dict."""
        out = dataclasses.asdict(self)
        out["faults"] = dict(self.faults)
        return out


@dataclass(frozen=True)
class RunSummary:
    """What a finished run did and where its records are.

    Parameters
    ----------
    run_id
        The run directory's name, mixed into every session id.
    run_dir
        Where ``ledger/``, ``truth/`` and ``run.json`` are.
    started_ms, ended_ms
        Wall-clock start and end, epoch ms.
    stats
        Final counters.
    unacknowledged
        Messages sent but never acknowledged (flush timed out or the broker refused them).
    ledger_rows
        Rows written to the ledger.
    topics
        Every sensor topic of the run.
    interrupted
        True if the run was cut short by Ctrl-C (sessions left open, pending delayed messages not sent).
    producer_path
        The producer path the run took: ``direct`` or ``client`` (``SimulatorConfig.producer_path``).
    """

    run_id: str
    run_dir: Path
    started_ms: int
    ended_ms: int
    stats: SimulatorStats
    unacknowledged: int
    ledger_rows: int
    topics: tuple[str, ...]
    interrupted: bool = False
    producer_path: str = ""


@dataclass(frozen=True)
class _FaultChange:
    """A live change of the fault rates, applied between blocks: set to ``faults``, or cleared (None)."""

    faults: FaultConfig | None
    sensor: str | None

    def apply(self, table: FaultTable) -> None:
        if self.faults is None:
            table.clear(self.sensor)
        else:
            table.set(self.faults, self.sensor)


class Simulator:
    """A fleet of sensors publishing snapshots and updates to Kafka, with faults and a ledger.

    Parameters
    ----------
    config
        Everything about the fleet, the load and the faults.
    kafka
        Where the brokers are; its settings override the producer defaults and ``config.producer``.
    run_dir
        Directory for ``ledger/``, ``truth/`` and ``run.json``; its name is the run id.
    clock
        Returns epoch seconds; the schedule starts at its first reading. It must advance with real time
        (the loop sleeps in real time while it waits for the schedule). Defaults to ``time.time``.

    Notes
    -----
    ``set_faults``, ``clear_faults``, ``set_load_factor``, ``add_sensors``, ``recreate_topics`` and ``stats``
    may be called from other threads while ``run`` is running; changes take effect at the next block (at most
    about 0.1 s of schedule).
    """

    def __init__(
        self, config: SimulatorConfig, kafka: KafkaConfig, run_dir: Path, clock: Clock | None = None
    ) -> None:
        if not isinstance(config, SimulatorConfig):
            raise SimulatorError(f"config must be a SimulatorConfig, got {type(config).__name__}")
        self.config = config
        self.kafka = kafka
        self.run_dir = Path(run_dir)
        self.run_id = self.run_dir.resolve().name
        self.clock: Clock = clock or time.time
        self._lock = threading.Lock()  # guards what other threads change or read: controls and parts
        self._fault_changes: list[_FaultChange] = []
        self._joins_asked = 0
        self._recreate_asked = False
        self._load_factor = config.load_factor
        self._faults = FaultTable(config.faults, config.sensor_faults)
        self._started = False
        self._start_s = 0.0
        self._sched_s = 0.0  # intended time of the last planned slot, epoch seconds
        self._paced = True  # whether the current block waits for its schedule (rate > 0)
        self._planned = 0
        self._rate_samples: deque[tuple[float, int]] = deque(maxlen=64)
        self._producer_path = ""
        # The parts of a run, made when it starts.
        self._ledger: Ledger | None = None
        self._fleet: Fleet | None = None
        self._planner: Planner | None = None
        self._sender: Sender | None = None
        self._injector: FaultInjector | None = None
        self._truth: Truth | None = None

    # ---- live controls -------------------------------------------------------------------------------

    def set_faults(self, faults: FaultConfig, sensor: str | None = None) -> None:
        """Change fault rates while running: of one sensor, or the default of every other sensor.

        A sensor's rates (from ``config.sensor_faults`` or set here) replace the default for it entirely and
        stay until ``clear_faults`` drops them: setting the default changes only sensors without rates of
        their own.
        """
        if not isinstance(faults, FaultConfig):
            raise SimulatorError(f"faults must be a FaultConfig, got {type(faults).__name__}")
        with self._lock:
            self._fault_changes.append(_FaultChange(faults, sensor))

    def clear_faults(self, sensor: str | None = None) -> None:
        """Drop the fault rates of one sensor, or of every sensor that has its own: they follow the default."""
        with self._lock:
            self._fault_changes.append(_FaultChange(None, sensor))

    def add_sensors(self, count: int) -> None:
        """Have ``count`` new sensors join at the next block, all at once (a sensor storm).

        They get the next ids, topics of their own (created before their first message) and the default fault
        rates, and share the rate with the others as sensors joining by churn do.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise SimulatorError(f"count must be a whole number >= 1, got {count!r}")
        with self._lock:
            self._joins_asked += count

    def recreate_topics(self) -> None:
        """Create the active sensors' topics again at the next block, as a client does after a data loss.

        The broker came back without them, and Kafka creates no topic on its own (the local broker's
        ``auto.create.topics.enable`` is off): until they exist, every message waits in the producer, and
        times out after ``message.timeout.ms``. The producer itself goes on: Kafka gives the idempotent
        producer a new id once it finds the old one unknown, so what it held is delivered to the new topics.
        """
        with self._lock:
            self._recreate_asked = True

    def set_load_factor(self, factor: float) -> None:
        """Change the load factor (multiplier of ``config.rate``) while running."""
        if not isinstance(factor, int | float) or not math.isfinite(factor) or factor <= 0:
            raise SimulatorError(f"load_factor must be a number > 0, got {factor!r}")
        with self._lock:
            self._load_factor = float(factor)

    def stats(self) -> SimulatorStats:
        """A consistent-enough snapshot of the run's counters (cheap; call it once a second)."""
        with self._lock:
            ledger, fleet, sender, injector = self._ledger, self._fleet, self._sender, self._injector
            samples = list(self._rate_samples)
            now = time.monotonic()
            rate = 0.0
            if len(samples) >= 2:
                recent = [s for s in samples if now - s[0] <= 1.5] or samples[-2:]
                first, last = (recent[0], samples[-1]) if len(recent) >= 2 else (samples[-2], samples[-1])
                if last[0] > first[0]:
                    rate = (last[1] - first[1]) / (last[0] - first[0])
            sent = sender.sent if sender else 0
            in_flight = ledger.outstanding() if ledger else 0
            failed = ledger.failed if ledger else 0
            p50, p99 = ledger.lateness.percentiles(50, 99) if ledger else (None, None)
            counts = injector.counts if injector else [0] * len(FAULT_NAMES)
            return SimulatorStats(
                elapsed_s=(self.clock() - self._start_s) if self._started else 0.0,
                planned=self._planned,
                sent=sent,
                acked=max(0, sent - failed - in_flight),
                failed=failed,
                in_flight=in_flight,
                faults={FAULT_NAMES[c]: counts[c] for c in range(1, len(FAULT_NAMES))},
                rate=rate,
                lateness_p50_ms=p50,
                lateness_p99_ms=p99,
                lateness_max_ms=ledger.lateness.max_ms if ledger else None,
                sensors=len(fleet.active) if fleet else 0,
                sessions=len(ledger.session_names) if ledger else 0,
                load_factor=self._load_factor,
                backpressure_waits=sender.backpressure_waits if sender else 0,
            )

    def _apply_controls(self) -> tuple[float, int]:
        """Apply the changes asked for since the last block; return the load factor and the sensors to add."""
        with self._lock:
            changes, self._fault_changes = self._fault_changes, []
            factor = self._load_factor
            joins, self._joins_asked = self._joins_asked, 0
            recreate, self._recreate_asked = self._recreate_asked, False
        for change in changes:
            change.apply(self._faults)
        if changes and self._planner is not None:
            self._planner.faults_changed()
        if recreate and self._fleet is not None:
            self._ensure_topics([s.topic for s in self._fleet.active])
        if self._sender is not None and self._sender.fatal:
            # After a fatal error (an unclean leader election put its sequence numbers out of step with a
            # partition's new leader) the producer refuses everything: a client makes a new one and goes on.
            self._sender.renew(self._open_producer()[0])
        return factor, joins

    def _ensure_topics(self, topics: list[str]) -> None:
        cfg = self.config
        isr = cfg.min_insync_replicas
        ensure_topics(
            self.kafka,
            dict.fromkeys(topics, cfg.partitions),
            replication_factor=cfg.replication_factor,
            topic_config={"min.insync.replicas": str(isr)} if isr is not None else None,
        )

    def _open_producer(self) -> tuple[MessageProducer, str]:
        """A new producer with the run's settings (its path, and the settings the ledger can use)."""
        cfg = self.config
        tuned = {**DEFAULT_PRODUCER, **cfg.producer}
        return open_producer(
            cfg.producer_path,
            self.kafka.client(**{k: v for k, v in tuned.items() if k not in self.kafka.settings}),
        )

    def _sample_rate(self) -> None:
        """Note the messages sent so far, for ``stats().rate``."""
        sent = self._sender.sent if self._sender else 0
        with self._lock:
            self._rate_samples.append((time.monotonic(), sent))

    # ---- the run -------------------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None) -> RunSummary:
        """Run until the duration or message count is reached or ``stop`` is set; block until flushed.

        Raises
        ------
        SimulatorError
            If the run directory already holds a ledger, the producer cannot be configured, or the broker
            stops taking messages for ``stall_timeout_s``.
        sotw.errors.BrokerError
            If the broker does not answer within ``connect_timeout_s``.
        """
        if self._started:
            raise SimulatorError("a Simulator runs once; create a new one for another run")
        cfg = self.config
        ledger_dir = self.run_dir / "ledger"
        if ledger_dir.exists() and any(ledger_dir.iterdir()):
            raise SimulatorError(f"run directory {self.run_dir} already has a ledger; choose a new --run-dir")
        wait_for_kafka(self.kafka.bootstrap, cfg.connect_timeout_s, dict(self.kafka.settings))
        # First: a bad setting is refused before anything is written.
        producer, path = self._open_producer()
        try:
            return self._run(producer, path, ledger_dir, stop)
        finally:
            # Its threads and connections end with the run, however it ends; so do a renewed one's.
            producer.close()
            if self._sender is not None:
                self._sender.producer.close()

    def _run(
        self, producer: MessageProducer, path: str, ledger_dir: Path, stop: threading.Event | None
    ) -> RunSummary:
        """``run`` with its producer made (``run`` closes it, however this ends)."""
        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ledger = Ledger(ledger_dir)
        truth = Truth(self.run_dir / "truth")
        rng = np.random.default_rng(cfg.seed)
        fleet = Fleet(cfg, rng, self.run_id, ledger)
        for _ in range(cfg.sensors):
            fleet.join(0)
        self._ensure_topics([s.topic for s in fleet.active])
        planner = Planner(cfg, rng, fleet, self._faults, truth, self.clock)
        planner.warm_up()
        sender = Sender(
            producer,
            ledger,
            self.clock,
            bootstrap=self.kafka.bootstrap,
            stall_timeout_s=cfg.stall_timeout_s,
            flush_timeout_s=cfg.flush_timeout_s,
            tick_s=TICK_S,
        )
        injector = FaultInjector(sender)
        record = RunRecord(self.run_dir, cfg, self.kafka)
        # The set-up (Faker, the tables, numba's kernels, Arrow) leaves hundreds of thousands of new objects,
        # enough that Python's next full collection would come early in the schedule: a 0.1-0.2 s stop of the
        # loop (lateness, and a fifth of a second of rate in a short run at full speed). Collected now, the
        # next is as far off as the run's own allocations make it.
        gc.collect()
        # The schedule starts only now, so building the fleet, creating topics and loading the compiled kernels
        # are not counted as lateness.
        self._started = True
        self._start_s = start_s = self.clock()
        start_ms = int(start_s * 1000)
        for sensor in fleet.active:
            sensor.joined_ms = start_ms
        with self._lock:
            self._ledger, self._fleet, self._planner, self._truth = ledger, fleet, planner, truth
            self._sender, self._injector, self._producer_path = sender, injector, path
        record.write(session_token=fleet.token, producer_path=path, started_s=start_s)
        log.info(
            "simulating %d sensors at %s msg/s x%g into %s*, run %s (%s producer path)",
            cfg.sensors,
            cfg.rate or "max",
            self._load_factor,
            cfg.topic_prefix,
            self.run_id,
            path,
        )
        interrupted = False
        unacked = 0
        try:
            try:
                self._loop(stop)
            except KeyboardInterrupt:
                interrupted = True
                log.warning("interrupted: flushing what was sent and writing the ledger")
            if not interrupted:
                # Closing ends are due when the schedule ends, so they are as reproducible as the rest.
                if cfg.close_on_stop:
                    closing = planner.close_all(int(math.floor(self._sched_s * 1000.0)))
                    for planned in closing:
                        self._dispatch(planned)
                    self._planned += len(closing)
                injector.release(math.inf, force=True)
        finally:
            try:
                injector.drop_held()  # whatever is still held back was planned: recorded as never sent
                try:
                    unacked = sender.flush()
                except KeyboardInterrupt:
                    # Cut short again while flushing: give up on acknowledgements but still write the ledger.
                    interrupted = True
                    unacked = sender.give_up()
                planner.record_the_rest()
                ledger.close()
                truth.close()
            finally:
                end_s = self.clock()
                self._sample_rate()
                summary = RunSummary(
                    run_id=self.run_id,
                    run_dir=self.run_dir,
                    started_ms=start_ms,
                    ended_ms=int(end_s * 1000),
                    stats=self.stats(),
                    unacknowledged=unacked,
                    ledger_rows=ledger.rows_written,
                    topics=tuple(s.topic for s in fleet.all),
                    interrupted=interrupted,
                    producer_path=path,
                )
                record.write(
                    session_token=fleet.token,
                    producer_path=path,
                    started_s=start_s,
                    ended_s=end_s,
                    summary={
                        "stats": summary.stats.to_dict(),
                        "unacknowledged": summary.unacknowledged,
                        "ledger_rows": summary.ledger_rows,
                        "topics": list(summary.topics),
                        "interrupted": summary.interrupted,
                        # Encoded HdrHistogram (``hdrh.histogram.HdrHistogram.decode``), lateness in us.
                        "lateness_hdr": ledger.lateness.encode(),
                    },
                )
        return summary

    def _loop(self, stop: threading.Event | None) -> None:
        """Plan and send block after block until the schedule, the message count or ``stop`` ends it."""
        cfg = self.config
        planner, sender, ledger = self._planner, self._sender, self._ledger
        assert planner is not None and sender is not None and ledger is not None
        end_s = self._start_s + cfg.duration_s if cfg.duration_s is not None else math.inf
        max_planned = cfg.max_messages if cfg.max_messages is not None else math.inf
        self._sched_s = self._start_s
        last_seal = last_record = time.monotonic()
        while True:
            factor, joins = self._apply_controls()
            if (stop is not None and stop.is_set()) or self._sched_s >= end_s or self._planned >= max_planned:
                break
            rate = cfg.rate * factor
            self._paced = rate > 0
            block = planner.next_block(rate, self._sched_s, end_s, max_planned - self._planned, joins)
            if block is None:
                break
            for planned in block.closing:
                self._dispatch(planned)
            self._planned += len(block.closing)
            if block.joined:
                self._ensure_topics([s.topic for s in block.joined])
                log.info("sensors joined: %s", ", ".join(s.id for s in block.joined))
            self._send_block(block)
            self._planned += len(block)
            self._sched_s = block.last_s if self._paced else max(self._sched_s, block.last_s)
            sender.serve()
            mono = time.monotonic()
            if mono - last_seal >= SEAL_EVERY_S or ledger.open_rows >= SEAL_ROWS:
                last_seal = mono
                ledger.seal()
                ledger.write_ready()
            if cfg.record_every_s is not None and mono - last_record >= cfg.record_every_s:
                last_record = mono
                self._record_so_far()
            self._sample_rate()

    def _record_so_far(self) -> None:
        """Make what the run has recorded so far readable by another process (``config.record_every_s``)."""
        assert self._ledger is not None and self._truth is not None
        self._ledger.roll()
        self._truth.write_closed()

    def _send_block(self, block: Block) -> None:
        """Plan and send a block's slots in order.

        The block is cut at every session start and end: the runs of updates between go out whole
        (``_send_run``), unless too short to pay for a run's fixed cost; the rest go one by one.
        """
        planner = self._planner
        assert planner is not None
        n = len(block)
        cuts = np.zeros(0, dtype=np.int64)
        sessions_changed = True
        pos = 0
        while pos < n:
            if sessions_changed:
                cuts = planner.session_cuts(block, pos)
                sessions_changed = False
            k = int(np.searchsorted(cuts, pos))
            cut = int(cuts[k]) if k < len(cuts) else n
            if cut - pos >= MIN_RUN:
                self._send_run(planner.plan_run(block, pos, cut))
                pos = cut
            if pos < n:
                sensor = block.sensors[int(block.sensor_index[pos])]
                session = sensor.session
                self._send_message(block, pos)
                sessions_changed = sensor.session is not session
                pos += 1

    def _send_run(self, run: UpdateRun) -> None:
        """Send a planned run in schedule order.

        Stretches without faults go at once (``Sender.send_stretch``); each message with a fault, and the
        held-back messages falling due, go one by one between them.
        """
        sender, injector = self._sender, self._injector
        assert sender is not None and injector is not None
        staged = sender.stage(run)
        due_ms, m = run.due_ms, len(run)
        faults = run.fault_positions()
        i = f = 0
        while i < m:
            fault_at = faults[f] if f < len(faults) else m
            held_due = injector.next_due_ms
            release_at = bisect.bisect_left(due_ms, held_due, i, fault_at) if held_due < math.inf else m
            cut = min(fault_at, release_at)
            if cut > i:
                sender.send_stretch(staged, i, cut, self._paced)
                i = cut
            if i == m:
                break
            if self._paced:
                sender.wait_until(due_ms[i])
            if injector.next_due_ms <= due_ms[i]:
                injector.release(due_ms[i])
            if i == fault_at:
                injector.inject(run.planned(i))
                i += 1
                f += 1

    def _send_message(self, block: Block, i: int) -> None:
        """Slot ``i`` of a block on its own: a session start or end, or an update of a short run."""
        planner, sender, injector = self._planner, self._sender, self._injector
        assert planner is not None and sender is not None and injector is not None
        due = block.due_ms[i]
        if self._paced:
            sender.wait_until(due)
        if injector.next_due_ms <= due:
            injector.release(due)
        self._dispatch(planner.plan_message(block, i))

    def _dispatch(self, planned: Planned) -> None:
        """Send a planned message now, or hand it to the fault injector."""
        assert self._sender is not None and self._injector is not None
        if planned.fault:
            self._injector.inject(planned)
        else:
            self._sender.send(planned.message)
