"""The sensor model: each sensor's table of rows whose measurements move as random walks.

A ``SensorTable`` is the state a real sensor holds: the truth a perfect pipeline must rebuild. The tables of
a fleet live in one ``TableStore`` of numpy arrays, and updates are applied to them a block at a time by
compiled code (``simulator.native.update_run``), one message after the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
from faker import Faker

from simulator import native
from sotw import wire

# (measurement, unit, typical level, spread of the level across rows, random-walk step)
MEASUREMENTS: tuple[tuple[str, str, float, float, float], ...] = (
    ("temperature", "C", 21.0, 6.0, 0.05),
    ("pressure", "kPa", 101.3, 3.0, 0.02),
    ("humidity", "%", 45.0, 12.0, 0.1),
    ("vibration", "mm/s", 2.5, 1.0, 0.03),
    ("flow", "l/min", 120.0, 30.0, 0.5),
    ("voltage", "V", 230.0, 4.0, 0.2),
)
STATUSES = ("ok", "ok", "ok", "warn", "alarm", "offline")
BASE_COLUMNS = ("value", "status", "name", "unit")
STATUS_CHANGE = 0.02
STEPS = tuple(m[4] for m in MEASUREMENTS)
_NM = len(MEASUREMENTS)
#: Rows are of this many kinds (a row's kind is its id modulo it): each kind has its own name and unit.
KINDS = _NM
_STATUS_FROM = 1.0 - STATUS_CHANGE
_STEP_ARR = np.array(STEPS)
_SENTINEL = 918_273_645_546_372_810  # divisible by 6, and digits no name or unit contains
_LEVEL_ARR = np.array([m[2] for m in MEASUREMENTS])
_SPREAD_ARR = np.array([m[3] for m in MEASUREMENTS])


def stable_order(a: np.ndarray) -> np.ndarray:
    """``np.argsort(a, kind="stable")`` for non-negative ints, faster when they are small.

    Below 65,536 they are sorted as uint16, which numpy radix-sorts: about six times faster than its timsort
    of int64 on the simulator's blocks (44 against 273 us for 8,192 sensor indices).
    """
    if a.size and int(a.max()) < 65536:
        a = a.astype(np.uint16)
    return np.argsort(a, kind="stable")


def _milli(x: np.ndarray) -> np.ndarray:
    """``milli`` over an array: the same doubles."""
    return np.floor(x * 1000.0 + 0.5) / 1000.0


def milli(x: float) -> float:
    """Round to 3 decimals the fast way: the nearest double to k/1000 prints as at most 3 decimals.

    ``round(x, 3)`` goes through correctly-rounded decimal conversion and costs about a microsecond; float
    floor division (``// 1.0``) is ``math.floor`` without the call and the int it returns, and gives the same
    double.
    """
    return (x * 1000.0 + 0.5) // 1.0 / 1000.0


def column_names(columns: int) -> list[str]:
    """The measurement columns of a table with ``columns`` columns besides ``id``."""
    names = list(BASE_COLUMNS[: min(columns, len(BASE_COLUMNS))])
    names += [f"x{k}" for k in range(1, columns - len(BASE_COLUMNS) + 1)]
    return names


@dataclass(frozen=True)
class SensorInfo:
    """A sensor's identity and the metadata Faker gives it (recorded in ``truth/sensors.parquet``)."""

    sensor: str
    topic: str
    site: str
    model: str
    serial: str


def sensor_info(sensor: str, topic: str, fake: Faker) -> SensorInfo:
    """Invent site, model and serial for a sensor from a seeded Faker."""
    return SensorInfo(
        sensor=sensor,
        topic=topic,
        site=f"{fake.city()} {fake.random_element(('plant', 'depot', 'yard', 'station'))}",
        model=fake.bothify("SX-###?").upper(),
        serial=fake.bothify("########"),
    )


def skew_weights(n: int, skew: float) -> np.ndarray:
    """Share of the total rate for each of ``n`` sensors: Zipf weights ``(k+1)**-skew``, normalised."""
    w = np.arange(1, n + 1, dtype=np.float64) ** -float(skew)
    w /= w.sum()
    return w


@dataclass(frozen=True)
class BlockUpdate:
    """What a block of updates did to the tables, one entry per message in the order given.

    Parameters
    ----------
    delete
        True where the update deletes its row (an upsert otherwise: of a new row, or of a live one).
    rid
        The row each update touches.
    values
        The numeric columns (``SensorTable.numeric``) after each update, shape ``(n, len(numeric))``.
    status
        Index into ``STATUSES`` of each row's status after the update.
    store
        The tables' store, which makes the templates.
    """

    delete: np.ndarray
    rid: np.ndarray
    values: np.ndarray
    status: np.ndarray
    store: TableStore

    @property
    def template(self) -> np.ndarray:
        """Each message's row as ``sotw.wire.row_template`` with ``TableStore.holes`` left open.

        A delete's is ``{"id":N}`` followed by empty holes (``%.0b``), so every message takes the same
        arguments. Made on demand: only the Python encoder (runs the compiled one declines) needs them.
        """
        store = self.store
        return np.array(
            [
                store.delete_template(r) if d else store.template(r)
                for d, r in zip(self.delete.tolist(), self.rid.tolist(), strict=True)
            ],
            dtype=object,
        )


class TableStore:
    """The slots of every table of a fleet in one set of numpy arrays, so one block updates them all at once.

    Each table (``SensorTable``) owns ``capacity`` consecutive slots. An update picks a slot of its table with
    its uniform: a live slot's row is upserted (one measurement moves by a random-walk step) or, with
    probability ``p_delete``, deleted; an empty slot gets a new row (an insert, which is an upsert of a new
    id). A block of updates to any tables is applied in one compiled call (``update_block``) instead of one
    Python call per message, and each table's size stays near ``rows`` by construction: at equilibrium
    inserts and deletes are each about ``(insert_ratio + delete_ratio) / 2`` of the updates. Each
    measurement's walk is kept unrounded (its *level*); what a message carries and the truth holds is the
    level rounded to 3 decimals.

    Parameters
    ----------
    rows
        Rows per table at the start and on average.
    columns
        Measurement columns besides ``id`` (see ``column_names``).
    insert_ratio, delete_ratio
        Share of updates that insert or delete a row; only their mean matters (see above).
    """

    def __init__(self, rows: int, columns: int, insert_ratio: float, delete_ratio: float) -> None:
        self.rows = rows
        self.names = column_names(columns)
        self.numeric = [c for c in self.names if c == "value" or c.startswith("x")]
        self.has_status = "status" in self.names
        #: Columns a message fills in, in row order (``row`` sorts a row's keys): the numeric ones and ``status``.
        self.holes = [c for c in sorted(self.names) if c in self.numeric or c == "status"]
        churn = min(0.5, (insert_ratio + delete_ratio) / 2.0)
        self.capacity = max(rows, int(round(rows / (1.0 - churn))), 1)
        self.p_delete = churn / (1.0 - churn)
        k = len(self.numeric)
        self.live = np.zeros(0, dtype=bool)
        self.ids = np.zeros(0, dtype=np.int64)
        self.level = np.zeros((0, k))
        self.values = np.zeros((0, k))
        self.step = np.zeros((0, k))
        self.status = np.zeros(0, dtype=np.int64)
        self.next_id = np.zeros(0, dtype=np.int64)
        self._value_col = self.numeric.index("value") if "value" in self.numeric else -1
        # A delete's row is ``{"id":N}``; it takes (and prints nothing of) the holes an upsert fills.
        self._delete_pieces = (wire.row_template({"id": _SENTINEL}) + b"%.0b" * len(self.holes)).split(
            str(_SENTINEL).encode("ascii")
        )
        self._pieces: list[list[bytes] | None] = [None] * _NM

    def add_table(self, rng: np.random.Generator) -> int:
        """Add a table of ``rows`` rows with values from ``rng``; return its index."""
        index = len(self.next_id)
        cap, k = self.capacity, len(self.numeric)
        self.live = np.concatenate([self.live, np.zeros(cap, dtype=bool)])
        self.ids = np.concatenate([self.ids, np.full(cap, -1, dtype=np.int64)])
        self.level = np.concatenate([self.level, np.zeros((cap, k))])
        self.values = np.concatenate([self.values, np.zeros((cap, k))])
        self.step = np.concatenate([self.step, np.zeros((cap, k))])
        self.status = np.concatenate([self.status, np.zeros(cap, dtype=np.int64)])
        self.next_id = np.append(self.next_id, self.rows)
        z = rng.standard_normal((self.rows, 1 + k))
        for rid in range(self.rows):
            slot = index * cap + rid
            _, _, level, spread, _ = MEASUREMENTS[rid % _NM]
            start = 10.0 * z[rid, 1:]
            if self._value_col >= 0:
                start[self._value_col] = level + spread * z[rid, 0]
            self.live[slot] = True
            self.ids[slot] = rid
            self.level[slot] = start
            self.values[slot] = _milli(start)
            self.step[slot] = 0.1
            if self._value_col >= 0:
                self.step[slot, self._value_col] = STEPS[rid % _NM]
        return index

    def row(self, rid: int, values: Any, status: int) -> dict[str, Any]:
        """The row ``rid`` with these numeric values and status, as a dict for the wire, keys sorted.

        Sorted keys make a row's text in a message its canonical form (``sotw.wire.canonical_row``): the
        verifier rebuilds an update's message from the row a pipeline wrote and checks it against the digest
        the ledger kept of what was sent.
        """
        name, unit = MEASUREMENTS[rid % _NM][:2]
        row: dict[str, Any] = {"id": rid}
        j = 0
        for col in self.names:
            if col == "status":
                row[col] = STATUSES[status]
            elif col == "name":
                row[col] = f"{name}-{rid}"
            elif col == "unit":
                row[col] = unit
            else:
                row[col] = float(values[j])
                j += 1
        return dict(sorted(row.items()))

    def template(self, rid: int) -> bytes:
        """Row ``rid``'s ``wire.row_template`` with ``holes`` open."""
        return str(rid).encode("ascii").join(self.row_pieces(rid % _NM))

    def row_pieces(self, kind: int) -> list[bytes]:
        """The template of a row of this kind (its id modulo ``KINDS``), cut where the row's id goes."""
        # The template of a row with a sentinel id of the same kind, cut where the id's digits are: a row's
        # template is then one join (its id and name are the only places the id appears; values are holes).
        pieces = self._pieces[kind]
        if pieces is None:
            sentinel = _SENTINEL + kind
            text = wire.row_template(self.row(sentinel, np.zeros(len(self.numeric)), 0), self.holes)
            pieces = self._pieces[kind] = text.split(str(sentinel).encode("ascii"))
        return pieces

    def update_one(
        self, table: int, u_op: float, u_row: float, z: float
    ) -> tuple[bool, int, list[float], int]:
        """One update, as ``update_block`` applies it: ``(delete, rid, values, status)`` (the per-message path)."""
        b = self.update_block(np.array([table]), np.array([u_op]), np.array([u_row]), np.array([z]))
        return bool(b.delete[0]), int(b.rid[0]), b.values[0].tolist(), int(b.status[0])

    def update_block(
        self, table: np.ndarray, u_op: np.ndarray, u_row: np.ndarray, z: np.ndarray
    ) -> BlockUpdate:
        """Apply a block of updates, in order; return what each message carries.

        ``table`` is each message's table index, ``u_op`` and ``u_row`` uniforms in [0, 1) and ``z`` standard
        normals. The updates are applied one after the other by compiled code (``simulator.native``).
        """
        m = len(u_op)
        k = len(self.numeric)
        # The kernel checks no index: hold its inputs to what keeps every slot inside the store.
        if m and not (0 <= int(table.min()) and int(table.max()) < len(self.next_id)):
            raise ValueError(f"table index out of range 0..{len(self.next_id) - 1}")
        if m and not (0.0 <= float(u_row.min()) and float(u_row.max()) < 1.0):
            raise ValueError("u_row must be uniforms in [0, 1)")
        delete = np.empty(m, dtype=bool)
        rid = np.empty(m, dtype=np.int64)
        values = np.empty((m, k))
        status = np.empty(m, dtype=np.int64)
        native.update_run(
            np.ascontiguousarray(table, dtype=np.int64),
            np.ascontiguousarray(u_op, dtype=np.float64),
            np.ascontiguousarray(u_row, dtype=np.float64),
            np.ascontiguousarray(z, dtype=np.float64),
            self.capacity,
            self.p_delete,
            self._value_col,
            _STATUS_FROM if self.has_status else 2.0,
            len(STATUSES),
            self.live,
            self.ids,
            self.level,
            self.values,
            self.step,
            self.status,
            self.next_id,
            _LEVEL_ARR,
            _SPREAD_ARR,
            _STEP_ARR,
            delete,
            rid,
            values,
            status,
        )
        return BlockUpdate(delete, rid, values, status, self)

    def encoder(self) -> native.RunEncoder:
        """The compiled encoder of these tables' updates (their row kinds, holes and statuses)."""
        return native.RunEncoder(
            [self.row_pieces(k) for k in range(KINDS)], self.holes, self.numeric, STATUSES
        )

    def warm_up(self) -> None:
        """Compile the update kernel, or load it from numba's cache, now rather than in a run's schedule."""
        none = np.zeros(0)
        self.update_block(np.zeros(0, dtype=np.int64), none, none, none)

    def delete_template(self, rid: int) -> bytes:
        """A delete's row, ``{"id":N}``, with empty holes (``%.0b``) so that it takes an upsert's arguments."""
        return str(rid).encode("ascii").join(self._delete_pieces)


class SensorTable:
    """One sensor's rows: its slots in a ``TableStore`` (shared with the fleet's other tables, or its own).

    Parameters
    ----------
    rows
        Rows at the start; inserts and deletes keep the size near it.
    columns
        Measurement columns besides ``id`` (see ``column_names``).
    rng
        Source of the initial values.
    insert_ratio, delete_ratio
        Share of updates that insert or delete a row (see ``TableStore``).
    store
        The fleet's store, which must have been made with the same ``rows``, ``columns`` and ratios; a
        table of its own when None.
    """

    def __init__(
        self,
        rows: int,
        columns: int,
        rng: np.random.Generator,
        insert_ratio: float,
        delete_ratio: float,
        store: TableStore | None = None,
    ) -> None:
        self.store = store if store is not None else TableStore(rows, columns, insert_ratio, delete_ratio)
        self.index = self.store.add_table(rng)
        self.names = self.store.names
        self.numeric = self.store.numeric
        self.holes = self.store.holes

    def _slots(self) -> slice:
        cap = self.store.capacity
        return slice(self.index * cap, (self.index + 1) * cap)

    def __len__(self) -> int:
        return int(self.store.live[self._slots()].sum())

    def update(self, u_op: float, u_row: float, z: float) -> tuple[str, dict[str, Any]]:
        """Apply one update and return ``(op, row)`` for the wire (the per-message path)."""
        delete, rid, values, status = self.store.update_one(self.index, u_op, u_row, z)
        if delete:
            return "delete", {"id": rid}
        return "upsert", self.store.row(rid, values, status)

    def update_block(self, u_op: np.ndarray, u_row: np.ndarray, z: np.ndarray) -> BlockUpdate:
        """Apply a block of updates to this table (see ``TableStore.update_block``)."""
        return self.store.update_block(np.full(len(u_op), self.index), u_op, u_row, z)

    @property
    def rows(self) -> dict[int, dict[str, Any]]:
        """The live rows by id (built on demand: for snapshots and the truth, not the hot path)."""
        st, sl = self.store, self._slots()
        live = np.flatnonzero(st.live[sl]) + sl.start
        return {
            int(st.ids[i]): st.row(int(st.ids[i]), st.values[i], int(st.status[i])) for i in live.tolist()
        }

    def snapshot_rows(self) -> list[dict[str, Any]]:
        """The rows in id order (a copy, safe to keep)."""
        rows = self.rows
        return [rows[i] for i in sorted(rows)]

    def digest(self) -> str:
        """The table digest as ``sotw.wire.table_digest`` defines it."""
        return wire.table_digest(self.rows.values())

    def canonical(self) -> list[tuple[int, str]]:
        """``(id, canonical_row)`` for every row, sorted by id: the truth table's content."""
        rows = self.rows
        return [(i, wire.canonical_row(rows[i])) for i in sorted(rows)]

    def final(self) -> FinalTable:
        """What a closing session records of the table: ``canonical()`` and ``digest()`` from one reading.

        Each of those reads every row again (about 3 us a row) and writes its canonical text (about 10 us),
        and a session's end needs both: the digest is made from the canonical texts written once. At a run's
        end every session closes at once, before the last messages go out.
        """
        rows = self.rows
        canonical = [(i, wire.canonical_row(rows[i])) for i in sorted(rows)]
        return FinalTable(canonical=canonical, digest=wire.canonical_digest(text for _, text in canonical))


class FinalTable(NamedTuple):
    """A table as a session closing left it: ``SensorTable.canonical()`` and ``digest()``."""

    canonical: list[tuple[int, str]]
    digest: str
