"""The planner: which message each sensor sends when, with which fault, decided in blocks on the schedule's clock.

``Planner`` owns the run's generator and everything drawn from it: the schedule's slots (up to ``MAX_BLOCK``
messages or ``BLOCK_SPAN_S`` of schedule at a time), which sensor each slot goes to, churn, session starts
and ends, each message's fault and delay, and the tables' updates. It also encodes what it plans, and
records each closed session's true table. It sends nothing: it hands out ``Planned`` messages and runs
of updates (``UpdateRun``), in schedule order, and the caller (``simulator.producer.Simulator``) sends them
when they are due. Because the generator is drawn from in the order things are planned, the same seed and
config give the same messages, however fast the broker takes them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from simulator.config import SimulatorConfig
from simulator.faults import ABANDONED, NONE, FaultTable, decide
from simulator.fleet import Fleet, Sensor, Session
from simulator.ledger import DELETE, END, NO_OP, SNAPSHOT, UPDATE, UPSERT
from simulator.model import STATUSES, BlockUpdate, FinalTable, TableStore, stable_order
from simulator.native import Values
from simulator.truth import Truth
from sotw import wire

log = logging.getLogger(__name__)

#: The most messages a block plans at once, and the most schedule it covers.
MAX_BLOCK = 8192
BLOCK_SPAN_S = 0.1
#: Shorter stretches of updates between session starts and ends are planned one message at a time: a run
#: has a fixed cost of about 100 us.
MIN_RUN = 48

#: Stands in for the session of a sensor between sessions when a run builds per-sensor arrays.
_NO_SESSION = Session(-1, "", "-", "", -1, 0)
#: Each status's JSON text, by index into ``simulator.model.STATUSES``.
_STATUS_JSON = np.array([wire.encode_row(s) for s in STATUSES], dtype=object)


@dataclass(frozen=True, slots=True)
class Message:
    """One planned message: its session, seq, kind (``ledger.SNAPSHOT``, ``UPDATE``, ``END``), time and value.

    ``value`` is empty for a message that is never sent (an abandoned session's end). An update also names
    the row it touches and its op (``ledger.UPSERT`` or ``DELETE``), which the ledger keeps.
    """

    session: Session
    seq: int
    kind: int
    intended_ms: int
    value: bytes = b""
    row_id: int = -1
    op: int = NO_OP


@dataclass(frozen=True, slots=True)
class Planned:
    """A message with the fault decided for it (``faults.NONE`` for none).

    ``delay_ms`` is how long a delayed message or a duplicate copy is held back; ``draw`` is the uniform the
    fault was decided by, which also picks a malformed message's variant.
    """

    message: Message
    fault: int = NONE
    delay_ms: int = 0
    draw: float = 0.0


@dataclass
class Block:
    """The next slots of the schedule, one message each, in order, with every draw they need.

    Parameters
    ----------
    due_ms, due_ms_array
        Each slot's intended send time, epoch ms, as a list (read one at a time) and as an array.
    last_s
        The last slot's intended time, epoch seconds (where the next block's schedule goes on).
    sensors
        The active sensors when the block was planned.
    sensor_index
        Each slot's sensor, as an index into ``sensors``.
    faults, delays_ms, fault_draws
        Each slot's fault code, hold-back delay and the uniform that decided its fault.
    op_draws, row_draws, normals
        Each slot's draws for its table update (see ``simulator.model.TableStore.update_block``).
    abandon
        Each sensor's chance to abandon its session, by index into ``sensors``.
    closing
        The last messages of the sessions of sensors retired at the block's start (due before its slots).
    joined
        Sensors that joined at the block's start (their topics are to be created before their first message).
    """

    due_ms: list[int]
    due_ms_array: np.ndarray
    last_s: float
    sensors: list[Sensor]
    sensor_index: np.ndarray
    faults: list[int]
    delays_ms: np.ndarray
    fault_draws: np.ndarray
    op_draws: np.ndarray
    row_draws: np.ndarray
    normals: np.ndarray
    abandon: np.ndarray
    closing: list[Planned]
    joined: list[Sensor]

    def __len__(self) -> int:
        return len(self.due_ms)


@dataclass
class UpdateRun:
    """Planned updates inside their sessions, one entry per message, in schedule order, encoded in one buffer.

    Parameters
    ----------
    sessions
        The block's sensors' sessions (a stand-in for a sensor between sessions, which no message refers to).
    session_index
        Each message's session, as an index into ``sessions``.
    seqs
        Each message's seq.
    due_ms, due_ms_array
        Each message's intended send time, epoch ms, as a list and as an array.
    values
        The encoded messages.
    faults, delays_ms, fault_draws
        Each message's fault code, hold-back delay and fault uniform.
    row_ids, deletes
        The row each message touches, and whether it deletes it.
    """

    sessions: list[Session]
    session_index: np.ndarray
    seqs: np.ndarray
    due_ms: list[int]
    due_ms_array: np.ndarray
    values: Values
    faults: list[int]
    delays_ms: np.ndarray
    fault_draws: np.ndarray
    row_ids: np.ndarray
    deletes: np.ndarray

    def __len__(self) -> int:
        return len(self.due_ms)

    def fault_positions(self) -> list[int]:
        """Where the messages with a fault are, in order."""
        return [j for j, c in enumerate(self.faults) if c] if any(self.faults) else []

    def planned(self, i: int) -> Planned:
        """Message ``i`` with its fault, for the per-message path (a message with a fault goes there)."""
        message = Message(
            self.sessions[self.session_index[i]],
            int(self.seqs[i]),
            UPDATE,
            self.due_ms[i],
            self.values.value(i),
            int(self.row_ids[i]),
            DELETE if self.deletes[i] else UPSERT,
        )
        return Planned(message, self.faults[i], int(self.delays_ms[i]), float(self.fault_draws[i]))


def encode_run_in_python(
    store: TableStore,
    sessions: list[Session],
    session_index: np.ndarray,
    seqs: np.ndarray,
    due_ms: np.ndarray,
    update: BlockUpdate,
) -> Values:
    """``simulator.native.RunEncoder.encode`` in Python: the run's values.

    All values are made by one bytes formatting of the run's templates (session head + row template per
    message), each ended by a newline, which JSON text never contains raw.
    """
    m = len(session_index)
    heads = np.empty((len(sessions), 2), dtype=object)
    heads[:] = [sess.heads for sess in sessions]
    parts = np.empty((m, 3), dtype=object)
    parts[:, 0] = heads[session_index, update.delete.astype(np.int64)]
    parts[:, 1] = update.template
    parts[:, 2] = b"}\n"
    holes, numeric = store.holes, store.numeric
    args = np.empty((m, 2 + len(holes)), dtype=object)
    args[:, 0] = seqs
    args[:, 1] = due_ms
    if numeric:
        frags = np.array(wire.encode_floats(update.values.ravel()), dtype=object).reshape(m, len(numeric))
    for j, col in enumerate(holes):
        args[:, 2 + j] = _STATUS_JSON[update.status] if col == "status" else frags[:, numeric.index(col)]
    text = np.frombuffer(b"".join(parts.ravel().tolist()) % tuple(args.ravel().tolist()), dtype=np.uint8)
    bounds = np.zeros(m + 1, dtype=np.int64)
    bounds[1:] = np.flatnonzero(text == 10) + 1
    return Values(text.copy(), bounds)


class Planner:
    """Plans the run's messages in schedule order; see the module docstring.

    Parameters
    ----------
    config
        The run's configuration.
    rng
        The run's generator (the fleet draws from it too: one order of draws for the whole run).
    fleet
        The sensors, their tables and sessions.
    faults
        The fault rates, which the caller may change between blocks (then call ``faults_changed``).
    truth
        Where closed sessions' tables are recorded.
    clock
        Epoch seconds: the intended time of an unthrottled block's messages (rate 0) is when it is planned.
    """

    def __init__(
        self,
        config: SimulatorConfig,
        rng: np.random.Generator,
        fleet: Fleet,
        faults: FaultTable,
        truth: Truth,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.rng = rng
        self.fleet = fleet
        self.faults = faults
        self.truth = truth
        self.clock = clock
        self._encoder = fleet.tables.encoder()
        # The fault bands of the active sensors, kept until the sensors or the rates change.
        self._edges_for: tuple[str, ...] | None = None
        self._edges: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def warm_up(self) -> None:
        """Compile the kernels (or load them from numba's cache) before the schedule starts."""
        self._encoder.warm_up()
        self.fleet.tables.warm_up()
        self.fleet.pick(np.zeros(0))

    def faults_changed(self) -> None:
        """The fault rates changed: decide the next block's faults with the new ones."""
        self._edges_for = None

    def _fault_edges(self, sensors: list[Sensor]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        key = tuple(s.id for s in sensors)
        if key != self._edges_for or self._edges is None:
            self._edges = self.faults.edges(list(key))
            self._edges_for = key
        return self._edges

    def next_block(
        self, rate: float, sched_s: float, end_s: float, left: float, joins: int = 0
    ) -> Block | None:
        """Plan the slots after ``sched_s`` (None when the run is over).

        ``rate`` is the current rate (0: as fast as possible, every slot due now), ``end_s`` the end of the
        schedule and ``left`` how many messages may still be planned; ``joins`` sensors join besides the
        churn's. Churn happens at the block's start: the sessions of retiring sensors end there
        (``Block.closing``), joining sensors get their tables.
        """
        if rate > 0:
            n = int(min(MAX_BLOCK, max(1.0, rate * BLOCK_SPAN_S)))
            ts = sched_s + np.arange(1, n + 1, dtype=np.float64) / rate
            if ts[-1] > end_s:
                ts = ts[ts <= end_s]
        else:
            ts = np.full(MAX_BLOCK, max(self.clock(), sched_s))
        if left < ts.size:
            ts = ts[: max(0, int(left))]
        n = int(ts.size)
        if n == 0:
            return None
        due_ms_array = np.floor(ts * 1000.0).astype(np.int64)
        due_ms = due_ms_array.tolist()
        rng, fleet = self.rng, self.fleet
        churned, leaving = fleet.churn(float(ts[-1] - sched_s))
        joins += churned
        closing: list[Planned] = []
        for sensor in leaving:
            if sensor.session is not None:
                abandoned = bool(rng.random() < self.faults.for_sensor(sensor.id).abandon)
                closing.append(self.end_session(sensor, due_ms[0], abandoned))
            fleet.retire(sensor, due_ms[0])
        joined = [fleet.join(due_ms[0]) for _ in range(joins)]
        active = list(fleet.active)
        sensor_index = fleet.pick(rng.random(n)) if len(active) > 1 else np.zeros(n, dtype=np.int64)
        draws = rng.random((4, n))
        normals = rng.standard_normal(n)
        bands, abandon, delay_mean, delay_cap = self._fault_edges(active)
        faults = decide(draws[0], bands[sensor_index]).tolist() if bands[:, -1].any() else [NONE] * n
        delays = np.minimum(-np.log1p(-draws[3]) * delay_mean[sensor_index], delay_cap[sensor_index])
        return Block(
            due_ms=due_ms,
            due_ms_array=due_ms_array,
            last_s=float(ts[-1]),
            sensors=active,
            sensor_index=sensor_index,
            faults=faults,
            delays_ms=delays.astype(np.int64),
            fault_draws=draws[0],
            op_draws=draws[1],
            row_draws=draws[2],
            normals=normals,
            abandon=abandon,
            closing=closing,
            joined=joined,
        )

    def session_cuts(self, block: Block, start: int) -> np.ndarray:
        """Slots from ``start`` on where a sensor's session starts or ends, in order (as the sessions stand now)."""
        ends = np.array([s.session_end_ms for s in block.sensors])
        index = block.sensor_index[start:]
        return start + np.flatnonzero(block.due_ms_array[start:] >= ends[index])

    def plan_run(self, block: Block, start: int, stop: int) -> UpdateRun:
        """Plan slots ``start:stop`` of a block as a run of updates, with per-run rather than per-message work.

        Every sensor of the slots must have an open session that does not end before ``stop``
        (``session_cuts``). The tables apply the whole run at once (``TableStore.update_block``); the values
        are encoded in one compiled call (``simulator.native``), or in Python when it declines.
        """
        active = block.sensors
        index = block.sensor_index[start:stop]
        due_ms_array = block.due_ms_array[start:stop]
        m = len(index)
        store = self.fleet.tables
        sessions: list[Session] = [s.session or _NO_SESSION for s in active]
        update = store.update_block(
            np.array([s.table.index for s in active])[index],
            block.op_draws[start:stop],
            block.row_draws[start:stop],
            block.normals[start:stop],
        )
        # Each sensor's seqs continue from its session's; its messages keep their order.
        order = stable_order(index)
        sorted_index = index[order]
        first = np.ones(m, dtype=bool)
        first[1:] = sorted_index[1:] != sorted_index[:-1]
        rank = np.arange(m) - np.maximum.accumulate(np.where(first, np.arange(m), 0))
        seqs = np.empty(m, dtype=np.int64)
        seqs[order] = np.array([sess.seq for sess in sessions])[sorted_index] + rank + 1
        counts = np.bincount(index, minlength=len(active)).tolist()
        for sess, c in zip(sessions, counts, strict=True):
            sess.seq += c
        values = self._encoder.encode(
            [sess.prefix for sess in sessions],
            index,
            seqs,
            due_ms_array,
            update.delete,
            update.rid,
            update.values,
            update.status,
        )
        if values is None:
            values = encode_run_in_python(store, sessions, index, seqs, due_ms_array, update)
        return UpdateRun(
            sessions=sessions,
            session_index=index,
            seqs=seqs,
            due_ms=block.due_ms[start:stop],
            due_ms_array=due_ms_array,
            values=values,
            faults=block.faults[start:stop],
            delays_ms=block.delays_ms[start:stop],
            fault_draws=block.fault_draws[start:stop],
            row_ids=update.rid,
            deletes=update.delete,
        )

    def plan_message(self, block: Block, i: int) -> Planned:
        """Plan slot ``i`` of a block on its own: a session start or end, or one update."""
        k = int(block.sensor_index[i])
        sensor = block.sensors[k]
        due = block.due_ms[i]
        fault, delay, draw = block.faults[i], int(block.delays_ms[i]), float(block.fault_draws[i])
        # A sensor without a session has a past end, so one comparison covers both cases.
        if due >= sensor.session_end_ms:
            if sensor.session is None:
                return Planned(self._start_session(sensor, due), fault, delay, draw)
            return self.end_session(sensor, due, draw < float(block.abandon[k]))
        sess = sensor.session
        assert sess is not None
        op, row = sensor.table.update(
            float(block.op_draws[i]), float(block.row_draws[i]), float(block.normals[i])
        )
        seq = sess.seq + 1
        sess.seq = seq
        value = sess.templates[op] % (seq, due, wire.encode_row(row))
        message = Message(sess, seq, UPDATE, due, value, int(row["id"]), DELETE if op == "delete" else UPSERT)
        return Planned(message, fault, delay, draw)

    def _start_session(self, sensor: Sensor, due_ms: int) -> Message:
        sess = self.fleet.new_session(sensor, due_ms, first=sensor.sessions == 0)
        sess.seq = 0
        rows = sensor.table.snapshot_rows()
        value = wire.encode_snapshot(sensor.id, sess.id, 0, due_ms, rows)
        # The rows' keys are sorted (``TableStore.row``): each text is the row as the message carries it.
        self.truth.snapshot(
            sensor=sensor.id, session=sess.id, rows=[(r["id"], wire.encode_row(r).decode()) for r in rows]
        )
        return Message(sess, 0, SNAPSHOT, due_ms, value)

    def end_session(self, sensor: Sensor, due_ms: int, abandoned: bool) -> Planned:
        """End the sensor's session: its ``end`` message (or the record of one abandoned), truth recorded."""
        sess = sensor.session
        assert sess is not None
        seq = sess.seq + 1
        sess.seq = seq
        final = sensor.table.final()
        if abandoned:
            planned = Planned(Message(sess, seq, END, due_ms), ABANDONED)
        else:
            rows = len(final.canonical)
            value = wire.encode_end(sensor.id, sess.id, seq, due_ms, rows, final.digest)
            planned = Planned(Message(sess, seq, END, due_ms, value))
        sess.closed = True
        self._record_session(sensor, sess, "abandoned" if abandoned else "ended", seq, due_ms, final)
        sensor.session = None
        sensor.session_end_ms = 0.0  # due at once: its next slot opens a new session
        return planned

    def close_all(self, due_ms: int) -> list[Planned]:
        """End every open session (the run's stop), in the sensors' order."""
        return [
            self.end_session(sensor, due_ms, abandoned=False)
            for sensor in self.fleet.active
            if sensor.session is not None
        ]

    def _record_session(
        self,
        sensor: Sensor,
        sess: Session,
        status: str,
        last_seq: int,
        ended_ms: int | None,
        final: FinalTable,
    ) -> None:
        self.truth.session(
            sensor=sensor.id,
            topic=sensor.topic,
            session=sess.id,
            status=status,
            table=final.canonical,
            digest=final.digest,
            last_seq=last_seq,
            started_ms=sess.started_ms,
            ended_ms=ended_ms,
        )

    def record_the_rest(self) -> None:
        """Record what is still open at the end (sessions not closed) and every sensor of the run."""
        fleet = self.fleet
        for sensor in fleet.active:
            if sensor.session is not None:
                self._record_session(
                    sensor, sensor.session, "open", sensor.session.seq, None, sensor.table.final()
                )
        for s in fleet.all:
            self.truth.sensors.append(
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
