"""The simulator's run loop: plan messages in numpy blocks, encode them, produce them on schedule.

``Simulator`` is the programmatic API the CLI, the load-test harness and the Locust UI share. Its loop is
open-loop: every message has an intended send time from the schedule, the loop waits for it when ahead and
never skips when behind, and lateness (sent minus intended) is measured, so a slow broker shows up as
lateness rather than as a lower rate nobody asked for (coordinated omission). Per-message Python work is kept
to its share of a few compiled calls per run (table updates, encoding, producing: ``simulator.native``,
``simulator.rdkafka``); everything else is done per block or off the hot path.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import functools
import hashlib
import heapq
import itertools
import json
import logging
import math
import platform
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from simulator.config import DEFAULT_PRODUCER, FAULT_KINDS, FaultConfig, SimulatorConfig, SimulatorError
from simulator.faults import (
    ABANDONED,
    DELAYED,
    DUPLICATE,
    FAULT_NAMES,
    GAP,
    MALFORMED,
    NONE,
    FaultTable,
    decide,
    malform,
)
from simulator.fleet import Fleet, Sensor, Session
from simulator.ledger import END, KIND_NAMES, SNAPSHOT, UPDATE, Ledger
from simulator.model import STATUSES, BlockUpdate, TableStore, stable_order
from simulator.native import Values
from simulator.rdkafka import MSG_SIZE_TOO_LARGE, QUEUE_FULL, DirectProducer, error_text
from simulator.truth import Truth
from sotw import wire
from sotw.broker import wait_for_kafka
from sotw.kafka import KafkaConfig, ensure_topics

log = logging.getLogger(__name__)

#: Stands in for the session of a sensor between sessions when the fast path builds per-sensor arrays.
_NO_SESSION = Session(-1, "", "-", "", -1, 0)
#: Each status's JSON text, by index into ``simulator.model.STATUSES``.
_STATUS_JSON = np.array([wire.encode_row(s) for s in STATUSES], dtype=object)

Clock = Callable[[], float]

MAX_BLOCK = 8192
BLOCK_SPAN_S = 0.1
SEAL_EVERY_S = 0.5
SEAL_ROWS = 250_000
MIN_RUN = 48  # shorter runs of fast-path messages go one by one: ``_fast`` has a fixed cost of ~100 us
SLICE = 256  # messages produced between two polls at full speed (each slice: one compiled call, one poll)


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


@dataclass
class _Run:
    """A planned run of updates: one entry per message, in schedule order (see ``Simulator._fast``)."""

    sessions: list[Session]  # by index into the block's active sensors
    sidx: np.ndarray  # each message's index into ``sessions``
    seqs: np.ndarray
    codes: np.ndarray
    tsm: list[int]
    tsm_a: np.ndarray  # ``tsm`` as an array, for the ledger block
    values: Values
    # Per message: its topic's producer handle and its partition; its key is ``keys[key_at[s]:key_at[s + 1]]``
    # for its session ``s``; ``rows`` gets its ledger row number before it is produced, ``sent`` its send time
    # (-1 until it is).
    topics: np.ndarray
    partitions: np.ndarray
    keys: np.ndarray
    key_at: np.ndarray
    rows: np.ndarray
    sent: np.ndarray


def _encode_run(
    store: TableStore,
    sessions: list[Session],
    sidx: np.ndarray,
    seqs: np.ndarray,
    tsm: np.ndarray,
    b: BlockUpdate,
) -> Values:
    """``simulator.native.RunEncoder.encode`` in Python: the run's values.

    All values are made by one bytes formatting of the run's templates (session head + row template per
    message), each ended by a newline, which JSON text never contains raw.
    """
    m = len(sidx)
    heads = np.empty((len(sessions), 2), dtype=object)
    heads[:] = [sess.heads for sess in sessions]
    parts = np.empty((m, 3), dtype=object)
    parts[:, 0] = heads[sidx, b.delete.astype(np.int64)]
    parts[:, 1] = b.template
    parts[:, 2] = b"}\n"
    holes, numeric = store.holes, store.numeric
    args = np.empty((m, 2 + len(holes)), dtype=object)
    args[:, 0] = seqs
    args[:, 1] = tsm
    if numeric:
        frags = np.array(wire.encode_floats(b.values.ravel()), dtype=object).reshape(m, len(numeric))
    for j, col in enumerate(holes):
        args[:, 2 + j] = _STATUS_JSON[b.status] if col == "status" else frags[:, numeric.index(col)]
    text = np.frombuffer(b"".join(parts.ravel().tolist()) % tuple(args.ravel().tolist()), dtype=np.uint8)
    bounds = np.zeros(m + 1, dtype=np.int64)
    bounds[1:] = np.flatnonzero(text == 10) + 1
    return Values(text.copy(), bounds)


def _versions() -> dict[str, str]:
    import confluent_kafka
    import pyarrow

    import sotw

    return {
        "sotw": sotw.__version__,
        "python": platform.python_version(),
        "confluent_kafka": confluent_kafka.version()[0],
        "librdkafka": confluent_kafka.libversion()[0],
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
    }


def _iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=UTC).isoformat(timespec="milliseconds")


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
        (the loop waits on the broker, not on the clock). Defaults to ``time.time``.

    Notes
    -----
    ``set_faults``, ``set_load_factor`` and ``stats`` may be called from other threads while ``run`` is
    running; changes take effect at the next block (at most about 0.1 s of schedule).
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
        self._lock = threading.Lock()
        self._controls: list[tuple[FaultConfig | None, str | None]] = []
        self._load_factor = config.load_factor
        self._faults = FaultTable(config.faults, config.sensor_faults)
        self._started = False
        self._start_s = 0.0
        self._sched = 0.0  # intended time of the last planned slot, epoch seconds
        self._planned = 0
        self._sent = 0
        self._fault_counts = [0] * len(FAULT_NAMES)
        self._bp_waits = 0
        self._rate_samples: deque[tuple[float, int]] = deque(maxlen=64)
        self._ledger: Ledger | None = None
        self._fleet: Fleet | None = None
        self._heap: list[tuple[Any, ...]] = []
        self._order = itertools.count()
        self._edges_key: tuple[str, ...] | None = None
        self._throttled = False

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
            self._controls.append((faults, sensor))

    def clear_faults(self, sensor: str | None = None) -> None:
        """Drop the fault rates of one sensor, or of every sensor that has its own: they follow the default."""
        with self._lock:
            self._controls.append((None, sensor))

    def set_load_factor(self, factor: float) -> None:
        """Change the load factor (multiplier of ``config.rate``) while running."""
        if not isinstance(factor, int | float) or not math.isfinite(factor) or factor <= 0:
            raise SimulatorError(f"load_factor must be a number > 0, got {factor!r}")
        with self._lock:
            self._load_factor = float(factor)

    def stats(self) -> SimulatorStats:
        """A consistent-enough snapshot of the run's counters (cheap; call it once a second)."""
        with self._lock:
            ledger, fleet = self._ledger, self._fleet
            samples = list(self._rate_samples)
            now = time.monotonic()
            rate = 0.0
            if len(samples) >= 2:
                recent = [s for s in samples if now - s[0] <= 1.5] or samples[-2:]
                first, last = (recent[0], samples[-1]) if len(recent) >= 2 else (samples[-2], samples[-1])
                if last[0] > first[0]:
                    rate = (last[1] - first[1]) / (last[0] - first[0])
            in_flight = ledger.outstanding() if ledger else 0
            failed = ledger.failed if ledger else 0
            p50, p99 = ledger.lateness.percentiles(50, 99) if ledger else (None, None)
            return SimulatorStats(
                elapsed_s=(self.clock() - self._start_s) if self._started else 0.0,
                planned=self._planned,
                sent=self._sent,
                acked=max(0, self._sent - failed - in_flight),
                failed=failed,
                in_flight=in_flight,
                faults={FAULT_NAMES[c]: self._fault_counts[c] for c in range(1, len(FAULT_NAMES))},
                rate=rate,
                lateness_p50_ms=p50,
                lateness_p99_ms=p99,
                lateness_max_ms=ledger.lateness.max_ms if ledger else None,
                sensors=len(fleet.active) if fleet else 0,
                sessions=len(ledger.session_names) if ledger else 0,
                load_factor=self._load_factor,
                backpressure_waits=self._bp_waits,
            )

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
        producer = self._make_producer()  # first: a bad setting is refused before anything is written
        try:
            return self._run(producer, ledger_dir, stop)
        finally:
            producer.close()  # its threads and connections end with the run, however it ends

    def _run(self, producer: DirectProducer, ledger_dir: Path, stop: threading.Event | None) -> RunSummary:
        """``run`` with its producer made (``run`` closes it, however this ends)."""
        cfg = self.config
        self.run_dir.mkdir(parents=True, exist_ok=True)
        ledger = Ledger(ledger_dir)
        truth = Truth(self.run_dir / "truth")
        rng = np.random.default_rng(cfg.seed)
        fleet = Fleet(cfg, rng, self.run_id, ledger)
        for _ in range(cfg.sensors):
            fleet.join(0)
        ensure_topics(self.kafka, {s.topic: cfg.partitions for s in fleet.active})
        store = fleet.tables
        self._encoder = store.encoder()
        self._encoder.warm_up()
        store.warm_up()
        # The schedule starts only now, so building the fleet, creating topics and loading the compiled kernels
        # are not counted as lateness.
        self._started = True
        self._start_s = start_s = self.clock()
        start_ms = int(start_s * 1000)
        for sensor in fleet.active:
            sensor.joined_ms = start_ms
        with self._lock:
            self._ledger, self._fleet = ledger, fleet
        self._producer, self._rng, self._truth = producer, rng, truth
        self._write_run_json(start_s, None, None, fleet)
        log.info(
            "simulating %d sensors at %s msg/s x%g into %s*, run %s",
            cfg.sensors,
            cfg.rate or "max",
            self._load_factor,
            cfg.topic_prefix,
            self.run_id,
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
                self._close_all(int(math.floor(self._sched * 1000.0)))
                self._release(math.inf, force=True)
        finally:
            try:
                # Whatever was still held back was planned: record it as never sent.
                for item in self._heap:
                    _, _, sess, seq, kind, fault, intended, _ = item
                    ledger.add_row(sess.code, seq, kind, fault, intended)
                self._heap.clear()
                try:
                    unacked = self._flush(producer)
                except KeyboardInterrupt:
                    # Cut short again while flushing: give up on acknowledgements but still write the ledger.
                    interrupted = True
                    with contextlib.suppress(Exception):
                        producer.purge()
                        self._serve(0.5)
                    unacked = ledger.outstanding()
                for sensor in fleet.active:
                    if sensor.session is not None:
                        self._record_session(sensor, sensor.session, "open", sensor.session.seq, None)
                for s in fleet.all:
                    truth.sensors.append(
                        {
                            "sensor": s.id,
                            "topic": s.topic,
                            "site": s.info.site,
                            "model": s.info.model,
                            "serial": s.info.serial,
                            "joined_ms": s.joined_ms,
                            "retired_ms": fleet.retired_ms.get(s.id),
                        }
                    )
                ledger.close()
                truth.close()
            finally:
                end_s = self.clock()
                self._publish()
                final = self.stats()
                summary = RunSummary(
                    run_id=self.run_id,
                    run_dir=self.run_dir,
                    started_ms=start_ms,
                    ended_ms=int(end_s * 1000),
                    stats=final,
                    unacknowledged=unacked,
                    ledger_rows=ledger.rows_written,
                    topics=tuple(s.topic for s in fleet.all),
                    interrupted=interrupted,
                )
                self._write_run_json(start_s, end_s, summary, fleet)
        return summary

    def _make_producer(self) -> DirectProducer:
        tuned = {**DEFAULT_PRODUCER, **self.config.producer}
        return DirectProducer(
            self.kafka.client(**{k: v for k, v in tuned.items() if k not in self.kafka.settings})
        )

    def _serve(self, timeout_s: float = 0.0) -> None:
        """Poll the producer (waiting up to ``timeout_s``) and record the delivery reports it served."""
        self._producer.poll(timeout_s)
        self._record_reports()

    def _record_reports(self) -> None:
        """Hand the reports served since the last call to the ledger, dated by the clock read now."""
        ledger = self._ledger
        assert ledger is not None
        now = self.clock()
        ledger.acknowledge(*self._producer.take(), now, error_text)  # nothing between: see _produce_stretch

    def _apply_controls(self) -> float:
        with self._lock:
            controls, self._controls = self._controls, []
            factor = self._load_factor
        for faults, sensor in controls:
            if faults is None:
                self._faults.clear(sensor)
            else:
                self._faults.set(faults, sensor)
        if controls:
            self._edges_key = None
        return factor

    def _publish(self) -> None:
        with self._lock:
            self._rate_samples.append((time.monotonic(), self._sent))

    def _loop(self, stop: threading.Event | None) -> None:
        cfg = self.config
        rng, fleet, ledger = self._rng, self._fleet, self._ledger
        assert fleet is not None and ledger is not None
        clock = self.clock
        end_s = self._start_s + cfg.duration_s if cfg.duration_s is not None else math.inf
        max_planned = cfg.max_messages if cfg.max_messages is not None else math.inf
        sched = self._sched = self._start_s
        last_seal = time.monotonic()
        self._edges_key = None
        edges: Any = None
        while True:
            factor = self._apply_controls()
            if (stop is not None and stop.is_set()) or sched >= end_s or self._planned >= max_planned:
                break
            rate = cfg.rate * factor
            throttled = self._throttled = rate > 0
            if throttled:
                n = int(min(MAX_BLOCK, max(1.0, rate * BLOCK_SPAN_S)))
                ts = sched + np.arange(1, n + 1, dtype=np.float64) / rate
                if ts[-1] > end_s:
                    ts = ts[ts <= end_s]
                    if ts.size == 0:
                        break
            else:
                ts = np.full(MAX_BLOCK, max(clock(), sched))
            if self._planned + ts.size > max_planned:
                ts = ts[: max(0, int(max_planned - self._planned))]
            n = int(ts.size)
            if n == 0:
                break
            tsm_a = np.floor(ts * 1000.0).astype(np.int64)
            tsm = tsm_a.tolist()
            # Churn happens at block boundaries, at the block's first intended time.
            joins, leaving = fleet.churn(float(ts[-1] - sched))
            for sensor in leaving:
                if sensor.session is not None:
                    self._end_session(sensor, tsm[0], bool(rng.random() < self._abandon_rate(sensor)))
                    self._planned += 1
                fleet.retire(sensor, tsm[0])
            if joins:
                new = [fleet.join(tsm[0]) for _ in range(joins)]
                ensure_topics(self.kafka, {s.topic: cfg.partitions for s in new})
                log.info("sensors joined: %s", ", ".join(s.id for s in new))
            active = fleet.active
            sidx = (
                rng.choice(len(active), size=n, p=fleet.weights())
                if len(active) > 1
                else np.zeros(n, dtype=np.int64)
            )
            u = rng.random((4, n))
            z = rng.standard_normal(n)
            key = tuple(s.id for s in active)
            if key != self._edges_key:
                edges = self._faults.edges(list(key))
                self._edges_key = key
            band, abandon, dmean, dcap = edges
            codes = decide(u[0], band[sidx]).tolist() if band[:, -1].any() else [NONE] * n
            # Kept as arrays: only faulty messages and the per-message path read single entries of these.
            delays = np.minimum(-np.log1p(-u[3]) * dmean[sidx], dcap[sidx]).astype(np.int64)
            uf, uop, urow, zl = u[0], u[1], u[2], z
            last_t = float(ts[-1])
            del ts

            # The block is cut at every session start or end; the runs between go through ``_fast`` whole
            # (faults and held-back messages included), unless too short to pay for its fixed cost.
            bounds = np.zeros(0, dtype=np.int64)
            sessions_changed = True
            pos = 0
            while pos < n:
                if sessions_changed:
                    ends = np.array([s.session_end_ms for s in active])
                    bounds = pos + np.flatnonzero(tsm_a[pos:] >= ends[sidx[pos:]])
                    sessions_changed = False
                k = int(np.searchsorted(bounds, pos))
                cut = int(bounds[k]) if k < len(bounds) else n
                if cut - pos >= MIN_RUN:
                    self._fast(
                        active,
                        sidx[pos:cut],
                        tsm[pos:cut],
                        tsm_a[pos:cut],
                        uop[pos:cut],
                        urow[pos:cut],
                        zl[pos:cut],
                        codes[pos:cut],
                        uf[pos:cut],
                        delays[pos:cut],
                    )
                    pos = cut
                if pos < n:
                    # One message on the per-message path (a session start or end, or a short run's).
                    j = pos
                    s = active[int(sidx[j])]
                    session = s.session
                    self._one(
                        s,
                        tsm[j],
                        codes[j],
                        float(uop[j]),
                        float(urow[j]),
                        float(zl[j]),
                        float(uf[j]),
                        int(delays[j]),
                        float(abandon[sidx[j]]),
                    )
                    sessions_changed = s.session is not session
                    pos += 1
            self._planned += n
            sched = last_t if throttled else max(sched, last_t)
            self._sched = sched
            self._serve()
            mono = time.monotonic()
            if mono - last_seal >= SEAL_EVERY_S or ledger.open_rows >= SEAL_ROWS:
                last_seal = mono
                ledger.seal()
                ledger.write_ready()
            self._publish()

    def _wait_until(self, t_ms: int) -> None:
        """Ahead of schedule: wait for ``t_ms``, serving delivery reports meanwhile."""
        clock = self.clock
        now_ms = clock() * 1000.0
        while t_ms > now_ms:
            self._serve(min((t_ms - now_ms) / 1000.0, 0.05))
            now_ms = clock() * 1000.0

    def _one(
        self,
        s: Sensor,
        t_ms: int,
        fault: int,
        u_op: float,
        u_row: float,
        z: float,
        uf: float,
        delay: int,
        abandon: float,
    ) -> None:
        """One message on the per-message path: faults, session starts and ends, held-back messages."""
        if self._throttled:
            self._wait_until(t_ms)
        heap = self._heap
        if heap and heap[0][0] <= t_ms:
            self._release(t_ms)
        # A sensor without a session has a past end, so one comparison covers both cases.
        if t_ms >= s.session_end_ms:
            if s.session is None:
                self._start_session(s, t_ms, fault, uf, delay)
            else:
                self._end_session(s, t_ms, uf < abandon)
            return
        sess = s.session
        assert sess is not None
        op, row = s.table.update(u_op, u_row, z)
        seq = sess.seq + 1
        sess.seq = seq
        value = sess.templates[op] % (seq, t_ms, wire.encode_row(row))
        if fault:
            self._fault(sess, seq, UPDATE, fault, t_ms, value, delay, uf)
        else:
            self._send(sess, seq, UPDATE, NONE, t_ms, value)

    def _fast(
        self,
        active: list[Sensor],
        sidx: np.ndarray,
        tsm: list[int],
        tsm_a: np.ndarray,
        u_op: np.ndarray,
        u_row: np.ndarray,
        z: np.ndarray,
        codes: list[int],
        uf: np.ndarray,
        delays: np.ndarray,
    ) -> None:
        """Plan and send a run of updates inside their sessions, with per-run rather than per-message work.

        The tables apply the whole run at once (``TableStore.update_block``); the values and their digests are
        then made in one compiled call (``simulator.native``), or in Python (``_encode_run``) when it declines.
        Sending walks the run: stretches of fault-free messages go through ``_produce_stretch``; a message with
        a fault, and held-back messages falling due, take the per-message path in between, in schedule order.
        """
        ledger, fleet = self._ledger, self._fleet
        assert ledger is not None and fleet is not None
        m = len(sidx)
        store = fleet.tables
        # Every sensor of the run has an open session (``_loop`` cuts runs at session ends); others may not.
        none = _NO_SESSION
        sessions: list[Session] = [s.session or none for s in active]
        b = store.update_block(np.array([s.table.index for s in active])[sidx], u_op, u_row, z)
        # Each sensor's seqs continue from its session's; its messages keep their order.
        order = stable_order(sidx)
        ss = sidx[order]
        first = np.ones(m, dtype=bool)
        first[1:] = ss[1:] != ss[:-1]
        rank = np.arange(m) - np.maximum.accumulate(np.where(first, np.arange(m), 0))
        seqs = np.empty(m, dtype=np.int64)
        seqs[order] = np.array([sess.seq for sess in sessions])[ss] + rank + 1
        counts = np.bincount(sidx, minlength=len(active)).tolist()
        for sess, c in zip(sessions, counts, strict=True):
            sess.seq += c
        values = self._encoder.encode(
            [sess.prefix for sess in sessions], sidx, seqs, tsm_a, b.delete, b.rid, b.values, b.status
        )
        if values is None:
            values = _encode_run(store, sessions, sidx, seqs, tsm_a, b)
        topic = self._producer.topic
        key_at = np.zeros(len(sessions) + 1, dtype=np.int64)
        key_at[1:] = np.cumsum([len(sess.key) for sess in sessions])
        run = _Run(
            sessions=sessions,
            sidx=sidx,
            seqs=seqs,
            codes=np.array([sess.code for sess in sessions], dtype=np.int32)[sidx],
            tsm=tsm,
            tsm_a=tsm_a,
            values=values,
            topics=np.array([topic(sess.topic) if sess.code >= 0 else 0 for sess in sessions], np.int64)[
                sidx
            ],
            partitions=np.array([sess.partition for sess in sessions], dtype=np.int32)[sidx],
            keys=np.frombuffer(b"".join(sess.key for sess in sessions) + b"\0", dtype=np.uint8).copy(),
            key_at=key_at,
            rows=np.zeros(m, dtype=np.int64),
            sent=np.full(m, -1.0),
        )
        faults = [j for j, c in enumerate(codes) if c] if any(codes) else []
        heap = self._heap
        i = f = 0
        while i < m:
            nxt = faults[f] if f < len(faults) else m
            due = bisect.bisect_left(tsm, heap[0][0], i, nxt) if heap else m
            cut = min(nxt, due)
            if cut > i:
                self._produce_stretch(run, i, cut)
                i = cut
            if i == m:
                break
            if self._throttled:
                self._wait_until(tsm[i])
            if heap and heap[0][0] <= tsm[i]:
                self._release(tsm[i])
            if i == nxt:
                sess = sessions[sidx[i]]
                self._fault(
                    sess,
                    int(seqs[i]),
                    UPDATE,
                    codes[i],
                    tsm[i],
                    values.value(i),
                    int(delays[i]),
                    float(uf[i]),
                )
                i += 1
                f += 1

    def _produce_stretch(self, run: _Run, i: int, j: int) -> None:
        """Send messages ``i:j`` of a planned run (no faults) and record their ledger rows.

        Whatever stops it (a Ctrl-C, a refused message, a stalled broker), the messages already produced
        get their rows: nothing reaches the topics that the ledger lacks.
        """
        ledger = self._ledger
        assert ledger is not None
        sidx, seqs = run.sidx[i:j], run.seqs[i:j]
        run.rows[i:j] = np.arange(ledger.next_index, ledger.next_index + (j - i))
        # Each session's highest seq sent in order (the delayed messages of ``_release`` wait for it).
        last = np.full(len(run.sessions), -1, dtype=np.int64)
        np.maximum.at(last, sidx, seqs)
        for k in np.flatnonzero(last >= 0).tolist():
            run.sessions[k].hi = int(last[k])
        sent = run.sent[i:j]
        try:
            self._produce_run(run, i, j)
        finally:
            done = int(np.count_nonzero(sent >= 0))  # produced in order: a prefix
            if done:
                ledger.add_block(
                    run.codes[i : i + done],
                    seqs[:done],
                    UPDATE,
                    NONE,
                    run.tsm_a[i : i + done],
                    sent[:done],
                    run.values[i : i + done],
                )
                self._sent += done

    def _produce_run(self, run: _Run, start: int, stop: int) -> None:
        """Produce messages ``start:stop`` of a run in slices, serving reports after each.

        A slice holds at most ``SLICE`` messages, and only messages already due (a throttled run waits for
        the next one); ``run.sent`` gets each produced message's send time, set as it is produced: the clock
        read before its slice, as the ledger's ``sent_ts`` promises.
        """
        producer, clock, due_ms = self._producer, self.clock, run.tsm
        args = (
            run.topics,
            run.partitions,
            run.values.text,
            run.values.bounds,
            run.keys,
            run.key_at,
            run.sidx,
            run.rows,
            run.sent,
        )
        throttled = self._throttled
        now = clock()
        i = start
        while i < stop:
            if throttled:
                if due_ms[i] > now * 1000.0:
                    self._wait_until(due_ms[i])
                    now = clock()
                j = bisect.bisect_right(due_ms, now * 1000.0, i, min(stop, i + SLICE))
            else:
                j = min(stop, i + SLICE)
            k = i
            while k < j:
                k, err = producer.produce_run(args, k, j, now)
                if err:
                    topic = run.sessions[run.sidx[k]].topic
                    size = int(run.values.bounds[k + 1] - run.values.bounds[k] - 1)
                    self._produce_or_wait(
                        functools.partial(self._produce_one, args, k, now), topic, size, err
                    )
                    k += 1
            i = j
            self._serve()
            now = clock()

    # ---- off the hot path ----------------------------------------------------------------------------

    def _abandon_rate(self, sensor: Sensor) -> float:
        return self._faults.for_sensor(sensor.id).abandon

    def _produce_one(self, args: tuple[np.ndarray, ...], k: int, now: float) -> int:
        """Message ``k`` of a run (``_produce_run``'s arguments): 0, or librdkafka's error."""
        return self._producer.produce_run(args, k, k + 1, now)[1]

    def _send(self, sess: Session, seq: int, kind: int, fault: int, intended_ms: int, value: bytes) -> None:
        producer, ledger = self._producer, self._ledger
        assert ledger is not None
        row, topic = ledger.next_index, producer.topic(sess.topic)
        now, digest = self.clock(), hashlib.sha256(value).digest()
        self._produce_or_wait(
            functools.partial(producer.produce, topic, sess.partition, value, sess.key, row),
            sess.topic,
            len(value),
        )
        ledger.add_row(sess.code, seq, kind, fault, intended_ms, now, digest)  # at once: see _produce_stretch
        self._sent += 1
        if fault in (NONE, MALFORMED) and seq > sess.hi:
            sess.hi = seq

    def _produce_or_wait(
        self, produce: Callable[[], int], topic: str, size: int, err: int | None = None
    ) -> None:
        """Produce one message (``produce`` returns librdkafka's error code), waiting while the queue is full.

        ``err`` is the error of a try already made. A full local queue is served until the message goes in
        (never dropped; ``backpressure_waits``); if it stays full ``stall_timeout_s``, or the client refuses
        the message outright, the run stops with an error saying why.
        """
        if err is None:
            err = produce()
        if err == QUEUE_FULL:
            self._bp_waits += 1
            deadline = time.monotonic() + self.config.stall_timeout_s
            while err == QUEUE_FULL:
                if time.monotonic() > deadline:
                    raise SimulatorError(
                        f"the broker at {self.kafka.bootstrap} took no messages for "
                        f"{self.config.stall_timeout_s:g} s (producer queue full); is it still running?"
                    )
                self._serve(0.01)
                err = produce()
        if err:
            hint = (
                " (fewer --rows or columns, or a larger message.max.bytes via -P and on the broker)"
                if err == MSG_SIZE_TOO_LARGE
                else ""
            )
            raise SimulatorError(
                f"the producer refused a {size:,}-byte message for {topic}: {error_text(err)}{hint}"
            )

    def _fault(
        self, sess: Session, seq: int, kind: int, fault: int, t_ms: int, value: bytes, delay: int, u: float
    ) -> None:
        ledger = self._ledger
        assert ledger is not None
        self._fault_counts[fault] += 1
        if fault == GAP:
            ledger.add_row(sess.code, seq, kind, GAP, t_ms)
        elif fault == MALFORMED:
            variant = int(u * 1_000_003) % 3
            self._send(sess, seq, kind, MALFORMED, t_ms, malform(value, KIND_NAMES[kind], seq, variant))
        elif fault == DELAYED:
            heapq.heappush(
                self._heap, (t_ms + max(delay, 1), next(self._order), sess, seq, kind, DELAYED, t_ms, value)
            )
        elif fault == DUPLICATE:
            self._send(sess, seq, kind, NONE, t_ms, value)
            heapq.heappush(
                self._heap, (t_ms + delay, next(self._order), sess, seq, kind, DUPLICATE, t_ms, value)
            )

    def _release(self, upto_ms: float, force: bool = False) -> None:
        """Send held-back messages that are due; a delayed one also waits until a later seq went out."""
        heap = self._heap
        while heap and heap[0][0] <= upto_ms:
            item = heapq.heappop(heap)
            _, _, sess, seq, kind, fault, intended, value = item
            if fault == DELAYED and not force and sess.hi <= seq and not sess.closed:
                # Check again a little later on the schedule; the session's next message will pass it.
                heapq.heappush(heap, (int(upto_ms) + 10, next(self._order), *item[2:]))
                continue
            self._send(sess, seq, kind, fault, intended, value)

    def _start_session(self, sensor: Sensor, t_ms: int, fault: int, u: float, delay: int) -> None:
        fleet = self._fleet
        assert fleet is not None
        sess = fleet.new_session(sensor, t_ms, first=sensor.sessions == 0)
        sess.seq = 0
        value = wire.encode_snapshot(sensor.id, sess.id, 0, t_ms, sensor.table.snapshot_rows())
        if fault:
            self._fault(sess, 0, SNAPSHOT, fault, t_ms, value, delay, u)
        else:
            self._send(sess, 0, SNAPSHOT, NONE, t_ms, value)

    def _end_session(self, sensor: Sensor, t_ms: int, abandoned: bool) -> None:
        sess = sensor.session
        assert sess is not None and self._ledger is not None
        seq = sess.seq + 1
        sess.seq = seq
        if abandoned:
            self._fault_counts[ABANDONED] += 1
            self._ledger.add_row(sess.code, seq, END, ABANDONED, t_ms)
        else:
            value = wire.encode_end(sensor.id, sess.id, seq, t_ms, len(sensor.table), sensor.table.digest())
            self._send(sess, seq, END, NONE, t_ms, value)
        sess.closed = True
        self._record_session(sensor, sess, "abandoned" if abandoned else "ended", seq, t_ms)
        sensor.session = None
        sensor.session_end_ms = 0.0  # due at once: its next slot opens a new session

    def _record_session(
        self, sensor: Sensor, sess: Session, status: str, last_seq: int, ended: int | None
    ) -> None:
        self._truth.session(
            sensor=sensor.id,
            topic=sensor.topic,
            session=sess.id,
            status=status,
            table=sensor.table.canonical(),
            digest=sensor.table.digest(),
            last_seq=last_seq,
            started_ms=sess.started_ms,
            ended_ms=ended,
        )

    def _close_all(self, t_ms: int) -> None:
        fleet = self._fleet
        assert fleet is not None
        if not self.config.close_on_stop:
            return
        for sensor in fleet.active:
            if sensor.session is not None:
                self._end_session(sensor, t_ms, abandoned=False)
                self._planned += 1

    def _flush(self, producer: DirectProducer) -> int:
        """Wait for outstanding acknowledgements; purge what is left so its reports say so."""
        remaining = self._flush_marked(producer, self.config.flush_timeout_s)
        if remaining:
            log.warning(
                "%d messages not acknowledged after %g s; purging them",
                remaining,
                self.config.flush_timeout_s,
            )
            with contextlib.suppress(Exception):
                producer.purge()
            self._flush_marked(producer, 2.0)
        ledger = self._ledger
        return remaining if ledger is None else max(remaining, ledger.outstanding())

    def _flush_marked(self, producer: DirectProducer, timeout_s: float) -> int:
        """``producer.flush`` in short slices, dating the delivery reports of each slice for ``acked_ts``."""
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = producer.flush(max(0.0, min(0.02, deadline - time.monotonic())))
            self._record_reports()
            if remaining == 0 or time.monotonic() >= deadline:
                return remaining

    def _write_run_json(
        self, start_s: float, end_s: float | None, summary: RunSummary | None, fleet: Fleet
    ) -> None:
        doc: dict[str, Any] = {
            "run_id": self.run_id,
            "seed": self.config.seed,
            "session_token": fleet.token,
            "config": self.config.to_dict(),
            "kafka": {"bootstrap": self.kafka.bootstrap, "settings": sorted(self.kafka.settings)},
            "versions": _versions(),
            "started_ms": int(start_s * 1000),
            "started": _iso(start_s),
            "ended_ms": None if end_s is None else int(end_s * 1000),
            "ended": None if end_s is None else _iso(end_s),
        }
        if summary is not None:
            doc["summary"] = {
                "stats": summary.stats.to_dict(),
                "unacknowledged": summary.unacknowledged,
                "ledger_rows": summary.ledger_rows,
                "topics": list(summary.topics),
                "interrupted": summary.interrupted,
                # Encoded HdrHistogram (``hdrh.histogram.HdrHistogram.decode``), lateness in us.
                "lateness_hdr": self._ledger.lateness.encode() if self._ledger else None,
            }
        path = self.run_dir / "run.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(doc, indent=2, default=str) + "\n", encoding="utf-8")
        tmp.replace(path)
