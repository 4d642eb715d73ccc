"""The ledger: one Parquet row per message the simulator meant to send and per copy it sent.

``LEDGER_SCHEMA`` is the one definition of the ledger's columns. The hot path adds rows a block at a time as
typed arrays (``add_block``); rows added one at a time off it are tuples, turned into columns in order. A chunk
is sealed twice a second and written as one Parquet row group once every message in it has its delivery
report, so memory stays bounded by what is in flight and by ``WRITE_BACKLOG`` chunks waiting to be written.
Every message is produced with its ledger row number, and its delivery report gives it back
(``simulator.rdkafka``): the loop hands the reports of each ``poll`` to ``acknowledge`` as arrays, dated by
the clock read after that poll, and they are scattered into the sealed chunks' columns with numpy.
"""

from __future__ import annotations

import binascii
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hdrh.histogram import HdrHistogram

from simulator.config import SimulatorError
from simulator.faults import DELAYED, DUPLICATE, FAULT_NAMES
from simulator.native import Values

log = logging.getLogger(__name__)

#: Columns with few distinct values, which Parquet's dictionary encoding shrinks. The others (seqs, offsets,
#: times and the SHA-256 hex) are left out of it: building their dictionaries made writing a row cost 0.53
#: instead of 0.41 us of CPU, on the writer thread, and the file 8 % larger (a 170,000-row chunk).
_DICTIONARY_COLUMNS = ["sensor", "topic", "session", "kind", "fault", "partition", "delivered", "error"]

LEDGER_SCHEMA = pa.schema(
    [
        pa.field("sensor", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("session", pa.string(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # snapshot | update | end
        pa.field(
            "fault", pa.string(), nullable=False
        ),  # none | gap | duplicate | delayed | malformed | abandoned
        pa.field(
            "intended_ts", pa.int64(), nullable=False
        ),  # epoch ms, the schedule; equals the message's ts
        pa.field("sent_ts", pa.int64()),  # epoch ms when handed to the producer; null if never sent
        pa.field("partition", pa.int32()),  # null if never sent
        pa.field("offset", pa.int64()),  # from the delivery report; null if not delivered or not reported
        pa.field("delivered", pa.bool_(), nullable=False),
        pa.field("error", pa.string()),  # delivery error text, if any
        pa.field("value_sha256", pa.string()),  # hex SHA-256 of the bytes sent; null if never sent
        pa.field(
            "acked_ts", pa.int64()
        ),  # epoch ms when the delivery report was served; null if not delivered
        pa.field("row_id", pa.int64()),  # the row an update touches; null for a snapshot or an end
        pa.field("op", pa.string()),  # an update's op: upsert | delete; null for a snapshot or an end
    ]
)

KIND_NAMES = ("snapshot", "update", "end")
SNAPSHOT, UPDATE, END = range(3)
#: An update's op as the ledger keeps it (``NO_OP`` for a snapshot or an end), and its name.
OP_NAMES = (None, "upsert", "delete")
NO_OP, UPSERT, DELETE = range(3)
_ZERO_DIGEST = bytes(32)
#: (session code, seq, kind, fault, intended_ms, sent_s or -1, row id or -1, op); the partition is the
#: session's, looked up when the chunk is written, and the row's SHA-256 digest goes to the chunk's digest
#: buffer (32 bytes a row).
Row = tuple[int, int, int, int, int, float, int, int]
_CHUNK_DTYPE = np.dtype(
    [
        ("session", np.int32),
        ("seq", np.int64),
        ("kind", np.int8),
        ("fault", np.int8),
        ("intended", np.int64),
        ("sent", np.float64),
        ("row", np.int64),
        ("op", np.int8),
    ]
)
NOT_ACKNOWLEDGED = "not acknowledged before exit"
# A sealed chunk's ``acked`` column: epoch ms of the delivery report, or one of these.
_WAITING, _FAILED = -1, -2
#: Sealed chunks that may wait for the writer thread, besides the one it is writing.
WRITE_BACKLOG = 2
#: Queued after the chunks that belong in the open file: the writer closes it (``Ledger.roll``).
_ROLL = "roll"


class Lateness:
    """Lateness against the schedule (sent minus intended) in an HdrHistogram of microseconds.

    HdrHistogram keeps 3 significant digits from 1 us to an hour in fixed memory, and histograms of several
    runs or processes merge (``histogram.add``) and travel encoded (``histogram.encode``) without losing
    anything. A block of values is counted with numpy straight into the histogram's counts: one
    ``record_value`` call per value would cost the loop about 5 us each. That reaches into the histogram's
    layout (its ``counts`` array, bucket geometry and ``set_internal_tacking_values``), which hdrh does not
    promise; ``_layout_known`` checks it once against hdrh's own ``get_counts_array_index``, and where it does
    not hold the histogram is filled value by value (slower, the same figures), said once.
    """

    #: Highest lateness counted, us (an hour); anything later is counted as this.
    HIGHEST_US = 3_600_000_000
    _warned = False

    def __init__(self) -> None:
        self.histogram = HdrHistogram(1, self.HIGHEST_US, 3)
        #: The largest lateness counted, ms (at least 0), exactly; None before any.
        self.max_ms: float | None = None
        self._lock = threading.Lock()  # the loop adds while another thread reads percentiles
        self._fast = self._layout_known()
        if self._fast:
            h = self.histogram
            self._counts = np.ctypeslib.as_array(h.counts)
            self._mask = h.sub_bucket_mask
            self._shift = h.sub_bucket_half_count_magnitude
            self._unit = h.unit_magnitude
            self._half = h.sub_bucket_half_count
        elif not Lateness._warned:
            Lateness._warned = True
            log.warning(
                "lateness: this hdrh's histogram layout is not the one sotw counts into with numpy; "
                "values are recorded one by one (more CPU per message, the same percentiles)"
            )

    def _layout_known(self) -> bool:
        """Whether the numpy index of a value is hdrh's own, over values from 0 to the highest."""
        h = self.histogram
        try:
            self._mask, self._shift = h.sub_bucket_mask, h.sub_bucket_half_count_magnitude
            self._unit, self._half = h.unit_magnitude, h.sub_bucket_half_count
            if len(np.ctypeslib.as_array(h.counts)) != h.counts_len or not callable(
                h.set_internal_tacking_values
            ):
                return False
            probe = np.unique(
                np.r_[0, 1, np.geomspace(1, self.HIGHEST_US, 400).astype(np.int64), self.HIGHEST_US]
            )
            return bool(np.array_equal(self._index(probe), [h.get_counts_array_index(int(v)) for v in probe]))
        except (AttributeError, TypeError, ValueError):
            return False

    def _index(self, us: np.ndarray) -> np.ndarray:
        # HdrHistogram's own index of each value (``get_counts_array_index``), for a whole array at once.
        bits = np.frexp((us | self._mask).astype(np.float64))[1]  # bit length: exact below 2**53
        bucket = bits - self._unit - (self._shift + 1)
        index: np.ndarray = ((bucket + 1) << self._shift) + (us >> (bucket + self._unit)) - self._half
        return index

    def add(self, lateness_ms: np.ndarray) -> None:
        """Count a batch of lateness values, ms (a negative one as 0)."""
        if not lateness_ms.size:
            return
        top = max(0.0, float(lateness_ms.max()))
        us = np.clip(np.rint(lateness_ms * 1000.0), 0, self.HIGHEST_US).astype(np.int64)
        if not self._fast:
            with self._lock:
                for value in us.tolist():
                    self.histogram.record_value(value)
                self.max_ms = top if self.max_ms is None else max(self.max_ms, top)
            return
        added = np.bincount(self._index(us), minlength=len(self._counts)).astype(np.uint64)
        with self._lock:
            self._counts += added
            filled = np.flatnonzero(self._counts)
            self.histogram.set_internal_tacking_values(
                int(filled[0]), int(filled[-1]), self.histogram.get_total_count() + len(us)
            )
            self.max_ms = top if self.max_ms is None else max(self.max_ms, top)

    @property
    def count(self) -> int:
        """Values counted."""
        return int(self.histogram.get_total_count())

    def percentiles(self, *qs: float) -> list[float | None]:
        """The ``q``-th percentiles, ms (the upper end of their bucket, at most the maximum); None before any value."""
        h = self.histogram
        with self._lock:
            if self.max_ms is None:
                return [None] * len(qs)
            if not self._fast:
                return [min(h.get_value_at_percentile(q) / 1000.0, self.max_ms) for q in qs]
            # HdrHistogram's ``get_value_at_percentile``, with numpy: its loop over the 23,552 counts in
            # Python costs about 2 ms a percentile.
            filled = np.cumsum(self._counts)
            out: list[float | None] = []
            for q in qs:
                index = int(np.searchsorted(filled, h.get_target_count_at_percentile(q), side="left"))
                value = h.get_highest_equivalent_value(h.get_value_from_index(index))
                out.append(min(value / 1000.0, self.max_ms))
            return out

    def encode(self) -> str:
        """The histogram in HdrHistogram's compressed, base64 form (``HdrHistogram.decode`` reads it)."""
        with self._lock:
            return str(self.histogram.encode().decode("ascii"))


class Ledger:
    """Collects ledger rows on the hot path and writes them as Parquet row groups.

    Parameters
    ----------
    directory
        ``<run_dir>/ledger``; files are ``part-00000.parquet``, ``part-00001.parquet``...
    rows_per_file
        Start a new file after this many rows.
    """

    def __init__(self, directory: Path, rows_per_file: int = 2_000_000) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.rows_per_file = rows_per_file
        # Session code -> names; the hot path stores only the code.
        self.session_names: list[str] = []
        self.session_sensor: list[str] = []
        self.session_topic: list[str] = []
        self.session_partition: list[int] = []
        # Delivery reports since the last drain: (rows, offsets, acknowledgement epoch ms) of delivered
        # messages; failed ones go to ``errors`` at once.
        self._acks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.errors: dict[int, str] = {}
        self.failed = 0
        self.sent = 0  # rows sent (handed to the producer)
        self.reported = 0  # of those, rows with a delivery report
        self.base = 0  # ledger row number of the first row in the open chunk
        self.lateness = Lateness()
        self.rows_written = 0
        # Sealed chunks waiting for their delivery reports, oldest first.
        self._sealed: list[_Sealed] = []
        self._writer: pq.ParquetWriter | None = None
        self._file_rows = 0
        self._files = 0
        self._failure: Exception | None = None
        # Bounded: when writing falls behind publishing (the simulator at full speed on two cores), the loop
        # waits here rather than holding ever more chunks (about 250 bytes a row, with its value's text).
        self._queue: queue.Queue[_Work | str | None] = queue.Queue(maxsize=WRITE_BACKLOG)
        self._thread = threading.Thread(target=self._write_files, name="sotw-ledger-writer", daemon=True)
        self._thread.start()
        self._new_chunk()
        # Arrow's compute kernels load on first use (about a second): pay that now, not mid-run.
        pc.if_else(pa.array([True]), pa.array(["a"]).take(pa.array([0])), pa.scalar(None, pa.string()))

    def _new_chunk(self) -> None:
        # Rows added one at a time (off the hot path) as tuples, and whole blocks of the hot path as typed
        # arrays; ``_pieces`` keeps both in row order (pending tuples are converted before a block goes in).
        self.rows: list[Row] = []
        self._pieces: list[np.ndarray] = []
        self._piece_rows = 0
        # The digests of the open chunk's rows, in row order: a block's are computed later, on the writer
        # thread (``Values``); rows added one at a time put their raw digest (zeros for a row never sent) in
        # a buffer, so that 300,000 small bytes objects a second do not live until the chunk is written.
        self._digests: list[bytearray | Values] = []
        self._ready = bytearray()
        self._digest_rows = 0

    def _flush_rows(self) -> None:
        if self.rows:
            self._pieces.append(np.array(self.rows, dtype=_CHUNK_DTYPE))
            self._piece_rows += len(self.rows)
            self.rows = []

    def add_block(
        self,
        session: np.ndarray,
        seq: np.ndarray,
        kind: int,
        fault: int,
        intended_ms: np.ndarray,
        sent_s: np.ndarray,
        values: Values,
        row_ids: np.ndarray,
        deletes: np.ndarray,
    ) -> int:
        """Append a block of sent updates at once (the hot path); returns the first one's row number.

        The arrays have one entry per row; ``values`` are what was sent, in order (their SHA-256 digests are
        computed on the writer thread); ``row_ids`` the rows the updates touch, ``deletes`` True for a delete.
        """
        n = len(seq)
        if len(values) != n:
            raise SimulatorError(f"ledger block has {n} rows but {len(values)} values")
        self._flush_rows()
        index = self.next_index
        piece = np.empty(n, dtype=_CHUNK_DTYPE)
        piece["session"] = session
        piece["seq"] = seq
        piece["kind"] = kind
        piece["fault"] = fault
        piece["intended"] = intended_ms
        piece["sent"] = sent_s
        piece["row"] = row_ids
        piece["op"] = np.where(deletes, DELETE, UPSERT)
        self._pieces.append(piece)
        self._piece_rows += n
        self.sent += int(np.count_nonzero(sent_s >= 0))
        if self._ready:
            self._digests.append(self._ready)
            self._ready = bytearray()
        self._digests.append(values)
        self._digest_rows += n
        return index

    @property
    def open_rows(self) -> int:
        """Rows in the open chunk."""
        return self._piece_rows + len(self.rows)

    @property
    def next_index(self) -> int:
        """Ledger row number the next appended row gets."""
        return self.base + self._piece_rows + len(self.rows)

    def add_session(self, session: str, sensor: str, topic: str, partition: int) -> int:
        """Register a session; return its code."""
        code = len(self.session_names)
        self.session_names.append(session)
        self.session_sensor.append(sensor)
        self.session_topic.append(topic)
        self.session_partition.append(partition)
        return code

    def acknowledge(
        self,
        rows: np.ndarray,
        offsets: np.ndarray,
        errors: np.ndarray,
        now_s: float,
        describe: Callable[[int], str],
    ) -> None:
        """Record delivery reports served by one ``poll``: each row's offset, or its error code (0: none).

        ``now_s`` is the clock read right after the poll: the time the reports reached the simulator, late
        by at most the poll's own work. ``describe`` gives an error code's text.
        """
        if errors.any():
            bad = errors != 0
            failed = rows[bad]
            for row, code in zip(failed.tolist(), errors[bad].tolist(), strict=True):
                self.errors[row] = describe(code)
            self._acks.append(
                (failed, np.full(len(failed), -1, np.int64), np.full(len(failed), _FAILED, np.int64))
            )
            self.failed += len(failed)
            self.reported += len(failed)
            rows, offsets = rows[~bad], offsets[~bad]
        if len(rows):
            self._acks.append((rows, offsets, np.full(len(rows), int(np.floor(now_s * 1000.0)), np.int64)))
            self.reported += len(rows)

    def add_row(
        self,
        session: int,
        seq: int,
        kind: int,
        fault: int,
        intended_ms: int,
        sent_s: float = -1.0,
        digest: bytes | None = None,
        row_id: int = -1,
        op: int = NO_OP,
    ) -> int:
        """Append one row off the hot path; returns its row number.

        ``row_id`` and ``op`` (``UPSERT`` or ``DELETE``) say what an update does to its table.
        """
        index = self.next_index
        self.rows.append((session, seq, kind, fault, intended_ms, sent_s, row_id, op))
        if sent_s >= 0:
            self.sent += 1
        self._ready += _ZERO_DIGEST if digest is None else digest
        self._digest_rows += 1
        return index

    def unsend_last(self) -> None:
        """Record the row just added as never sent: the client refused its message after all."""
        session, seq, kind, fault, intended_ms, sent_s, row_id, op = self.rows[-1]
        if sent_s >= 0:
            self.rows[-1] = (session, seq, kind, fault, intended_ms, -1.0, row_id, op)
            self.sent -= 1

    def outstanding(self) -> int:
        """Messages produced and not yet reported on.

        A report may come back before its row is added (a block's rows are added once it is produced), so
        the difference can dip below zero for a moment: it is read as none.
        """
        return max(0, self.sent - self.reported)

    def seal(self) -> None:
        """Close the open chunk (it is written once all its rows have delivery reports).

        Its pieces stay apart until the writer thread joins them: one array of a chunk's rows is a fresh
        10 MB at full speed, whose copy and page faults cost the loop about 0.05 us a row. The loop reads only
        what it needs of them: the lateness of on-schedule rows, and which rows were sent.
        """
        self._flush_rows()
        pieces = self._pieces
        if not pieces:
            return
        n = self._piece_rows
        if self._digest_rows != n:
            raise SimulatorError(f"ledger chunk has {n} rows but {self._digest_rows} digests")
        late = []
        for piece in pieces:
            sent, fault = piece["sent"], piece["fault"]
            on_time = (sent >= 0) & (fault != DELAYED) & (fault != DUPLICATE)
            late.append(sent[on_time] * 1000.0 - piece["intended"][on_time])
        lateness = late[0] if len(late) == 1 else np.concatenate(late)
        if lateness.size:
            self.lateness.add(lateness)
        sent_rows = [piece["sent"] >= 0 for piece in pieces]
        digests = [*self._digests, self._ready] if self._ready else self._digests
        self._sealed.append(
            _Sealed(
                base=self.base,
                rows=n,
                pieces=pieces,
                sent=sent_rows[0] if len(sent_rows) == 1 else np.concatenate(sent_rows),
                digests=digests,
                offsets=np.full(n, -1, np.int64),
                acked=np.full(n, _WAITING, np.int64),
            )
        )
        self.base += n
        self._new_chunk()

    def _drain(self) -> None:
        """Move the delivery reports into the sealed chunks' offset and acknowledgement columns.

        A report's ``acked`` is its time, or ``_FAILED``: a chunk is ready when no sent row is ``_WAITING``.
        Offsets are not the test: librdkafka reports some deliveries without one (-1001, e.g. an idempotent
        producer's retry the broker had already written).
        """
        if not self._acks:
            return
        acks = self._acks
        rows, offsets, acked = (np.concatenate([a[k] for a in acks]) for k in range(3))
        acks.clear()
        placed = np.zeros(len(rows), dtype=bool)
        for chunk in self._sealed:
            inside = (rows >= chunk.base) & (rows < chunk.base + chunk.rows)
            if inside.any():
                chunk.offsets[rows[inside] - chunk.base] = offsets[inside]
                chunk.acked[rows[inside] - chunk.base] = acked[inside]
                placed |= inside
        # Reports of rows not sealed yet (a block's reports can come back before its rows are added): kept for
        # the next drain. Rows before those (never expected) have no chunk left to go to.
        keep = ~placed & (rows >= self.base)
        if keep.any():
            acks.append((rows[keep], offsets[keep], acked[keep]))

    def write_ready(self, final: bool = False) -> None:
        """Write every sealed chunk whose rows all have delivery reports (all of them when ``final``)."""
        if not self._sealed:
            return
        self._drain()
        while self._sealed and (final or self._sealed[0].reported()):
            chunk = self._sealed[0]
            base, n = chunk.base, chunk.rows
            errors: list[str | None] | None = None
            rows = [i for i in self.errors if base <= i < base + n]
            if rows or final:
                errors = [None] * n
                for i in rows:
                    errors[i - base] = self.errors[i]
            # Arrow and Parquet work happens on the writer thread (much of it outside the GIL). ``put`` may
            # wait for it (the queue is bounded): the chunk leaves ``_sealed`` only once queued, so a Ctrl-C
            # while waiting loses nothing.
            self._queue.put(_Work(chunk.pieces, chunk.digests, chunk.offsets, chunk.acked, errors, final))
            self._sealed.pop(0)
            for i in rows:
                del self.errors[i]
            self.rows_written += n

    def roll(self) -> None:
        """Close the open file once the chunks queued so far are in it: a reader can then read them.

        Parquet is readable once its footer is written, at the file's close; the next chunk starts a new
        file. A reader of a running ledger reads the files it can and skips the one still open.
        """
        self._queue.put(_ROLL)

    def close(self) -> None:
        """Seal and write everything; rows still without a delivery report are marked not delivered."""
        self.seal()
        self.write_ready(final=True)
        self._queue.put(None)
        self._thread.join()
        if self._failure is not None:
            raise SimulatorError(f"could not write the ledger in {self.directory}: {self._failure}")

    def _write_files(self) -> None:
        while (work := self._queue.get()) is not None:
            if self._failure is not None:
                continue
            if isinstance(work, str):  # _ROLL
                if self._writer is not None:
                    self._writer.close()
                    self._writer = None
                continue
            try:
                table = self._to_table(work)
                if self._writer is None or self._file_rows >= self.rows_per_file:
                    if self._writer is not None:
                        self._writer.close()
                    path = self.directory / f"part-{self._files:05d}.parquet"
                    self._files += 1
                    self._file_rows = 0
                    self._writer = pq.ParquetWriter(
                        path, LEDGER_SCHEMA, compression="zstd", use_dictionary=_DICTIONARY_COLUMNS
                    )
                self._writer.write_table(table)
                self._file_rows += table.num_rows
            except Exception as exc:  # noqa: BLE001 - any failure here must reach close(), not end the thread
                self._failure = exc
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _to_table(self, work: _Work) -> pa.Table:
        pieces, off, ack = work.pieces, work.offsets, work.acked
        chunk = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
        n = len(chunk)
        # Sessions registered later only append to these lists, so a copy taken now covers the chunk.
        names, sensors = pa.array(self.session_names[:]), pa.array(self.session_sensor[:])
        topics, partitions = pa.array(self.session_topic[:]), pa.array(self.session_partition[:], pa.int32())
        sess = pa.array(chunk["session"])
        sent = chunk["sent"]
        unsent = sent < 0
        delivered = ack >= 0
        errors: pa.Array = pa.nulls(n, pa.string())
        if work.errors is not None:
            texts = work.errors
            if work.final:
                for k in np.flatnonzero(~unsent & ~delivered).tolist():
                    if texts[k] is None:
                        texts[k] = NOT_ACKNOWLEDGED
            errors = pa.array(texts, type=pa.string())
        # Every sent row has a digest; unsent rows hold zeros, masked to null below.
        hexed = binascii.hexlify(b"".join(d.digests() if isinstance(d, Values) else d for d in work.digests))
        # A string array over the hex text as it is: every value is 64 characters, so its offsets are a range.
        offsets = pa.py_buffer(np.arange(0, 64 * n + 1, 64, dtype=np.int32))
        sha_text = pa.StringArray.from_buffers(n, offsets, pa.py_buffer(hexed))
        if unsent.any():
            sha_text = pc.if_else(pa.array(~unsent), sha_text, pa.scalar(None, pa.string()))
        partition = partitions.take(sess)
        if unsent.any():
            partition = pc.if_else(pa.array(~unsent), partition, pa.scalar(None, pa.int32()))
        table = pa.Table.from_arrays(
            [
                sensors.take(sess),
                topics.take(sess),
                names.take(sess),
                pa.array(chunk["seq"]),
                pa.array(KIND_NAMES).take(pa.array(chunk["kind"])),
                pa.array(FAULT_NAMES).take(pa.array(chunk["fault"])),
                pa.array(chunk["intended"]),
                pa.array(np.floor(sent * 1000.0).astype(np.int64), mask=unsent),
                partition,
                pa.array(off, mask=off < 0),  # null if not delivered, or delivered without one (see _drain)
                pa.array(delivered),
                errors,
                sha_text,
                pa.array(ack, mask=~delivered),
                pa.array(chunk["row"], mask=chunk["row"] < 0),
                pa.array(OP_NAMES, pa.string()).take(pa.array(chunk["op"])),
            ],
            schema=LEDGER_SCHEMA,
        )
        return table


@dataclass
class _Sealed:
    """A sealed chunk of the ledger, waiting for its rows' delivery reports.

    ``pieces`` are its rows in order (``_CHUNK_DTYPE`` arrays), ``sent`` says which rows were sent,
    ``digests`` are the rows' digests to be (``Values`` are hashed by the writer thread), and ``offsets``
    and ``acked`` are filled from the reports: ``acked`` holds each report's epoch ms, or ``_WAITING`` until
    one comes, or ``_FAILED``.
    """

    base: int
    rows: int
    pieces: list[np.ndarray]
    sent: np.ndarray
    digests: list[bytearray | Values]
    offsets: np.ndarray
    acked: np.ndarray

    def reported(self) -> bool:
        """Whether every sent row has its delivery report."""
        return not np.count_nonzero(self.sent & (self.acked == _WAITING))


@dataclass
class _Work:
    """One sealed chunk (its rows in pieces) with its delivery results, on its way to the writer thread."""

    pieces: list[np.ndarray]
    digests: list[bytearray | Values]
    offsets: np.ndarray
    acked: np.ndarray
    errors: list[str | None] | None
    final: bool
