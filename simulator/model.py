"""The sensor model: each sensor's table of rows whose measurements move as random walks.

A ``SensorTable`` is the state a real sensor holds: the truth a perfect pipeline must rebuild. Updates are
applied in numpy blocks (``SensorTable.update_block``): a message depends only on earlier messages to the
same slot of the table, so a block is resolved per slot with sorts, running maxima and cumulative sums.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from faker import Faker

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
    """What a block of updates did to one table, one entry per message in the order given.

    Parameters
    ----------
    delete
        True where the update deletes its row (an upsert otherwise: of a new row, or of a live one).
    rid
        The row each update touches.
    template
        Each message's row as ``sotw.wire.row_template`` with ``SensorTable.holes`` left open; a delete's is
        ``{"id":N}`` followed by empty holes (``%.0b``) so that every message takes the same arguments.
    values
        The numeric columns (``SensorTable.numeric``) after each update, shape ``(n, len(numeric))``.
    status
        Index into ``STATUSES`` of each row's status after the update.
    """

    delete: np.ndarray
    rid: np.ndarray
    template: np.ndarray
    values: np.ndarray
    status: np.ndarray


class TableStore:
    """The slots of every table of a fleet in one set of numpy arrays, so one block updates them all at once.

    Each table (``SensorTable``) owns ``capacity`` consecutive slots. An update picks a slot of its table with
    its uniform: a live slot's row is upserted (one measurement moves by a random-walk step) or, with
    probability ``p_delete``, deleted; an empty slot gets a new row (an insert, which is an upsert of a new
    id). Because a message only depends on earlier messages to the same slot, a block of updates to any
    tables is computed at once (``update_block``) instead of one Python call per message, and each table's
    size stays near ``rows`` by construction: at equilibrium inserts and deletes are each about
    ``(insert_ratio + delete_ratio) / 2`` of the updates. Each measurement's walk is kept unrounded (its
    *level*); what a message carries and the truth holds is the level rounded to 3 decimals.

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
        #: Columns a message fills in, in row order: the numeric ones and ``status``.
        self.holes = [c for c in self.names if c in self.numeric or c == "status"]
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
        self.templates = np.zeros(0, dtype=object)
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
        self.templates = np.concatenate([self.templates, np.full(cap, None, dtype=object)])
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
            self.templates[slot] = self.template(rid)
        return index

    def row(self, rid: int, values: Any, status: int) -> dict[str, Any]:
        """The row ``rid`` with these numeric values and status, as a dict for the wire."""
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
        return row

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
        """One update, as ``update_block`` would apply it alone: ``(delete, rid, values, status)``.

        The per-message path (faults, short runs) uses it; it is plain Python over the same arrays, computed in
        the same order of float operations as a one-message block, so both give the same doubles.
        """
        cap = self.capacity
        k = len(self.numeric)
        slot = table * cap + min(int(u_row * cap), cap - 1)
        if self.live[slot]:
            rid = int(self.ids[slot])
            if u_op < self.p_delete:
                self.live[slot] = False
                self.ids[slot] = -1
                self.templates[slot] = None
                return True, rid, self.values[slot].tolist(), int(self.status[slot])
            level = self.level[slot].tolist()
            if k:
                col = int(u_row * cap * 7919.0) % k if k > 1 else 0
                inc = float(self.step[slot, col]) * z
                level = [x + 0.0 - 0.0 for x in level]
                level[col] = self.level[slot, col] + (0.0 + inc) - 0.0
            if self.has_status and u_op >= _STATUS_FROM:
                self.status[slot] = int(u_row * cap * 997.0) % len(STATUSES)
        else:
            rid = int(self.next_id[table])
            self.next_id[table] += 1
            level = [10.0 * z] * k
            self.step[slot] = 0.1
            if self._value_col >= 0:
                level[self._value_col] = float(_LEVEL_ARR[rid % _NM]) + float(_SPREAD_ARR[rid % _NM]) * z
                self.step[slot, self._value_col] = STEPS[rid % _NM]
            level = [x + 0.0 - 0.0 for x in level]
            self.live[slot] = True
            self.ids[slot] = rid
            self.status[slot] = 0
            self.templates[slot] = self.template(rid)
        self.level[slot] = level
        values = [(x * 1000.0 + 0.5) // 1.0 / 1000.0 for x in level]  # milli()
        self.values[slot] = values
        return False, rid, values, int(self.status[slot])

    def update_block(
        self, table: np.ndarray, u_op: np.ndarray, u_row: np.ndarray, z: np.ndarray
    ) -> BlockUpdate:
        """Apply a block of updates, in order, as if one at a time; return what each message carries.

        ``table`` is each message's table index, ``u_op`` and ``u_row`` uniforms in [0, 1) and ``z`` standard
        normals. Messages are grouped by slot (a stable sort keeps their order inside a slot) and each slot's
        sequence is resolved with running maxima and cumulative sums: the state before a message is fixed by
        the last message to the slot that did not delete (after it the slot is live) and how many
        deletes-or-inserts alternate since; a row's level is its insert's level (or the slot's level at the
        block's start) plus the steps of the upserts since.
        """
        m = len(u_op)
        cap = self.capacity
        k = len(self.numeric)
        slot = table * cap + np.minimum((u_row * cap).astype(np.int64), cap - 1)
        order = stable_order(slot)
        sl = slot[order]
        uo, ur, zs = u_op[order], u_row[order], z[order]
        dl = uo < self.p_delete
        idx = np.arange(m)
        first = np.ones(m, dtype=bool)
        first[1:] = sl[1:] != sl[:-1]
        gs = np.maximum.accumulate(np.where(first, idx, 0))
        # After a message that does not delete, its slot is live; a run of would-be deletes after it
        # alternates delete, insert, delete...
        reset = np.zeros(m, dtype=np.int64)
        reset[1:] = np.where(~dl[:-1], idx[1:], 0)
        since = np.maximum(np.maximum.accumulate(reset), gs)
        live_before = np.where(since > gs, True, self.live[sl]) ^ ((idx - since) & 1).astype(bool)
        ins = ~live_before
        dele = live_before & dl
        ups = live_before & ~dl
        fresh = np.zeros(m, dtype=bool)
        last_ins = np.full(m, -1, dtype=np.int64)
        rid = self.ids[sl]
        if ins.any():
            # New ids, per table in message order.
            where = np.flatnonzero(ins)
            msg_pos = order[where]
            by_msg = stable_order(msg_pos)
            tab = table[msg_pos[by_msg]]
            by_tab = stable_order(tab)
            tsorted = tab[by_tab]
            tfirst = np.ones(len(tsorted), dtype=bool)
            tfirst[1:] = tsorted[1:] != tsorted[:-1]
            n_ins = len(tsorted)
            rank = np.arange(n_ins) - np.maximum.accumulate(np.where(tfirst, np.arange(n_ins), 0))
            new_ids = np.empty(n_ins, dtype=np.int64)
            new_ids[by_msg[by_tab]] = self.next_id[tsorted] + rank
            np.add.at(self.next_id, tsorted, 1)
            new_id = np.zeros(m, dtype=np.int64)
            new_id[where] = new_ids
            last_ins = np.maximum.accumulate(np.where(ins, idx, -1))
            fresh = last_ins >= gs
            rid = np.where(fresh, new_id[np.maximum(last_ins, 0)], rid)
        # Levels: a new row's starting level, or the slot's, plus the steps of the upserts since.
        kind = rid % _NM
        step = self.step[sl]
        vc = self._value_col
        if fresh.any():
            step[fresh] = 0.1
            if vc >= 0:
                step[fresh, vc] = _STEP_ARR[kind[fresh]]
        col = (ur * cap * 7919.0).astype(np.int64) % k if k > 1 else np.zeros(m, dtype=np.int64)
        inc = np.zeros((m + 1, k))
        if k:
            up = np.flatnonzero(ups)
            inc[up + 1, col[up]] = step[up, col[up]] * zs[up]
        cum = np.cumsum(inc, axis=0)
        start = self.level[sl]
        base = gs
        if fresh.any():
            where = np.flatnonzero(ins)
            init = 10.0 * np.repeat(zs[where, None], k, axis=1)
            if vc >= 0:
                init[:, vc] = _LEVEL_ARR[kind[where]] + _SPREAD_ARR[kind[where]] * zs[where]
            start_ins = np.zeros((m, k))
            start_ins[where] = init
            start = np.where(fresh[:, None], start_ins[np.maximum(last_ins, 0)], start)
            base = np.where(fresh, last_ins + 1, gs)
        level = start + cum[idx + 1] - cum[base]
        values = _milli(level)
        # Status: an insert sets "ok", an upsert sometimes another; otherwise the slot's stays.
        status = self.status[sl]
        changes = ups & (uo >= _STATUS_FROM) if self.has_status else np.zeros(m, dtype=bool)
        if changes.any() or fresh.any():
            new_status = np.where(ins, 0, (ur * cap * 997.0).astype(np.int64) % len(STATUSES))
            last_st = np.maximum.accumulate(np.where(ins | changes, idx, -1))
            status = np.where(last_st >= gs, new_status[np.maximum(last_st, 0)], status)
        # Each message's row template: a new row's is made once, at its insert.
        templates = self.templates[sl]
        if fresh.any():
            made = np.empty(m, dtype=object)
            for i, r in zip(np.flatnonzero(ins).tolist(), rid[ins].tolist(), strict=True):
                made[i] = self.template(r)
            fi = np.flatnonzero(fresh)
            templates[fi] = made[last_ins[fi]]
        if dele.any():
            pieces = self._delete_pieces
            templates[dele] = [str(r).encode("ascii").join(pieces) for r in rid[dele].tolist()]
        # The tables after the block: each slot as its last message left it.
        last = np.ones(m, dtype=bool)
        last[:-1] = first[1:]
        g = np.flatnonzero(last)
        gslot = sl[g]
        alive = ~dele[g]
        self.live[gslot] = alive
        self.ids[gslot] = np.where(alive, rid[g], -1)
        self.level[gslot] = level[g]
        self.values[gslot] = values[g]
        self.step[gslot] = step[g]
        self.status[gslot] = status[g]
        kept = templates[g]
        kept[~alive] = None
        self.templates[gslot] = kept
        out_dele = np.empty(m, dtype=bool)
        out_dele[order] = dele
        out_rid = np.empty(m, dtype=np.int64)
        out_rid[order] = rid
        out_tpl = np.empty(m, dtype=object)
        out_tpl[order] = templates
        out_val = np.empty((m, k))
        out_val[order] = values
        out_st = np.empty(m, dtype=np.int64)
        out_st[order] = status
        return BlockUpdate(out_dele, out_rid, out_tpl, out_val, out_st)


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
