"""The ledger: one Parquet row per message the simulator meant to send and per copy it sent.

``LEDGER_SCHEMA`` is the one definition of the ledger's columns. The hot path adds rows a block at a time as
typed arrays (``add_block``); rows added one at a time off it are tuples, turned into columns in order. A chunk
is sealed twice a second and written as one Parquet row group once every message in it has its delivery
report, so memory stays bounded by what is in flight. Delivery reports arrive per session in the order the messages were
produced (one session = one key = one partition, and the producer is idempotent), so each session keeps a
FIFO of its ledger row numbers and the report pops the oldest. A report appends two ints to a log (row number,
offset) and nothing else; the log is scattered into the sealed chunks' columns with numpy. Acknowledgement
times are not read per report: the loop calls ``mark`` with the clock after each ``poll``, and every report
served by that poll gets that time (see ``mark``).
"""

from __future__ import annotations

import binascii
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from simulator.config import SimulatorError
from simulator.faults import DELAYED, DUPLICATE, FAULT_NAMES
from simulator.native import Digests

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
        pa.field("offset", pa.int64()),  # from the delivery report; null if not delivered
        pa.field("delivered", pa.bool_(), nullable=False),
        pa.field("error", pa.string()),  # delivery error text, if any
        pa.field("value_sha256", pa.string()),  # hex SHA-256 of the bytes sent; null if never sent
        pa.field(
            "acked_ts", pa.int64()
        ),  # epoch ms when the delivery report was served; null if not delivered
    ]
)

KIND_NAMES = ("snapshot", "update", "end")
SNAPSHOT, UPDATE, END = range(3)
_ZERO_DIGEST = bytes(32)
#: (session code, seq, kind, fault, intended_ms, sent_s or -1); the partition is the session's, looked up when
#: the chunk is written, and the row's SHA-256 digest goes to the chunk's digest buffer (32 bytes a row).
Row = tuple[int, int, int, int, int, float]
_CHUNK_DTYPE = np.dtype(
    [
        ("session", np.int32),
        ("seq", np.int64),
        ("kind", np.int8),
        ("fault", np.int8),
        ("intended", np.int64),
        ("sent", np.float64),
    ]
)
NOT_ACKNOWLEDGED = "not acknowledged before exit"


class LatenessHistogram:
    """Lateness against the schedule (ms) in log-spaced buckets: percentiles without keeping every value."""

    EDGES = np.concatenate([[-np.inf, 0.0], np.geomspace(0.05, 3_600_000.0, 600), [np.inf]])

    def __init__(self) -> None:
        self.counts = np.zeros(len(self.EDGES) - 1, dtype=np.int64)
        self.max = 0.0

    def add(self, lateness_ms: np.ndarray) -> None:
        """Count a batch of lateness values."""
        if lateness_ms.size:
            self.counts += np.histogram(lateness_ms, self.EDGES)[0]
            self.max = max(self.max, float(lateness_ms.max()))

    def percentile(self, q: float) -> float | None:
        """The ``q``-th percentile (upper edge of its bucket), or None before any value."""
        total = int(self.counts.sum())
        if total == 0:
            return None
        k = int(np.searchsorted(np.cumsum(self.counts), q / 100.0 * total, side="left"))
        return float(min(max(self.EDGES[k + 1], 0.0), self.max))


class Ledger:
    """Collects ledger rows on the hot path and writes them as Parquet row groups.

    Parameters
    ----------
    directory
        ``<run_dir>/ledger``; files are ``part-00000.parquet``, ``part-00001.parquet``...
    rows_per_file
        Start a new file after this many rows.
    clock
        The run's clock (epoch seconds), used to date delivery reports that no ``mark`` dated yet.
    """

    def __init__(
        self, directory: Path, rows_per_file: int = 2_000_000, clock: Callable[[], float] = time.time
    ) -> None:
        self.directory = directory
        self.clock = clock
        directory.mkdir(parents=True, exist_ok=True)
        self.rows_per_file = rows_per_file
        # Session code -> names; the hot path stores only the code.
        self.session_names: list[str] = []
        self.session_sensor: list[str] = []
        self.session_topic: list[str] = []
        self.session_partition: list[int] = []
        self.fifos: list[deque[int]] = []
        # Delivery report log since the last drain: acknowledged row numbers and their offsets; and the marks
        # (log length, clock) taken after each poll, which date the reports.
        self._ack_rows: list[int] = []
        self._ack_offsets: list[int] = []
        self._mark_n: list[int] = []
        self._mark_t: list[float] = []
        self.errors: dict[int, str] = {}
        self.failed = 0
        self.base = 0  # ledger row number of the first row in the open chunk
        self.lateness = LatenessHistogram()
        self.rows_written = 0
        # Sealed chunks waiting for their reports: (base, rows, digests, offsets, acked epoch ms), -1 = none yet.
        self._sealed: list[tuple[int, np.ndarray, list[bytearray | Digests], np.ndarray, np.ndarray]] = []
        self._writer: pq.ParquetWriter | None = None
        self._file_rows = 0
        self._files = 0
        self._failure: Exception | None = None
        self._queue: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
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
        # thread (``Digests``); rows added one at a time put their raw digest (zeros for a row never sent) in
        # a buffer, so that 300,000 small bytes objects a second do not live until the chunk is written.
        self._digests: list[bytearray | Digests] = []
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
        digests: Digests,
    ) -> int:
        """Append a block of sent rows at once (the hot path); returns the first one's row number.

        The arrays have one entry per row; ``digests`` are the SHA-256 digests of their values, in order.
        """
        n = len(seq)
        if len(digests) != n:
            raise SimulatorError(f"ledger block has {n} rows but {len(digests)} digests")
        self._flush_rows()
        index = self.next_index
        piece = np.empty(n, dtype=_CHUNK_DTYPE)
        piece["session"] = session
        piece["seq"] = seq
        piece["kind"] = kind
        piece["fault"] = fault
        piece["intended"] = intended_ms
        piece["sent"] = sent_s
        self._pieces.append(piece)
        self._piece_rows += n
        if self._ready:
            self._digests.append(self._ready)
            self._ready = bytearray()
        self._digests.append(digests)
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

    def add_session(
        self, session: str, sensor: str, topic: str, partition: int
    ) -> tuple[int, deque[int], Callable[[Any, Any], None]]:
        """Register a session; return its code, its FIFO of in-flight rows and its delivery callback."""
        code = len(self.session_names)
        self.session_names.append(session)
        self.session_sensor.append(sensor)
        self.session_topic.append(topic)
        self.session_partition.append(partition)
        fifo: deque[int] = deque()
        self.fifos.append(fifo)
        popleft = fifo.popleft
        ack_row, ack_offset = self._ack_rows.append, self._ack_offsets.append
        errors = self.errors

        # Called by confluent-kafka for every message, so it does the least it can: two appends.
        def on_delivery(err: Any, msg: Any) -> None:
            if err is None:
                ack_row(popleft())
                ack_offset(msg.offset())
            else:
                errors[popleft()] = err.str()
                self.failed += 1

        return code, fifo, on_delivery

    def mark(self, now_s: float) -> None:
        """Date the delivery reports served so far: call it with the clock right after each ``poll``/``flush``.

        A report's ``acked_ts`` is the first mark taken after it was served, so it is the time the report
        reached the simulator, late by at most the time between the poll's return and the mark (the reports'
        callbacks). Reports not yet marked when the ledger drains them get the drain's clock.
        """
        self._mark_n.append(len(self._ack_rows))
        self._mark_t.append(now_s)

    def add_row(
        self,
        session: int,
        seq: int,
        kind: int,
        fault: int,
        intended_ms: int,
        sent_s: float = -1.0,
        digest: bytes | None = None,
    ) -> int:
        """Append one row off the hot path; returns its row number."""
        index = self.next_index
        self.rows.append((session, seq, kind, fault, intended_ms, sent_s))
        self._ready += _ZERO_DIGEST if digest is None else digest
        self._digest_rows += 1
        return index

    def outstanding(self) -> int:
        """Messages produced and not yet reported on."""
        return sum(len(f) for f in list(self.fifos))

    def seal(self) -> None:
        """Close the open chunk (it is written once all its rows have delivery reports)."""
        self._flush_rows()
        if not self._pieces:
            return
        chunk = self._pieces[0] if len(self._pieces) == 1 else np.concatenate(self._pieces)
        sent, fault = chunk["sent"], chunk["fault"]
        on_time = (sent >= 0) & (fault != DELAYED) & (fault != DUPLICATE)
        if on_time.any():
            self.lateness.add(sent[on_time] * 1000.0 - chunk["intended"][on_time])
        n = len(chunk)
        if self._digest_rows != n:
            raise SimulatorError(f"ledger chunk has {n} rows but {self._digest_rows} digests")
        digests = [*self._digests, self._ready] if self._ready else self._digests
        self._sealed.append((self.base, chunk, digests, np.full(n, -1, np.int64), np.full(n, -1, np.int64)))
        self.base += n
        self._new_chunk()

    def _drain(self, now_s: float) -> None:
        """Move the delivery report log into the sealed chunks' offset and acknowledgement columns."""
        if not self._ack_rows:
            return
        rows = np.array(self._ack_rows, dtype=np.int64)
        offsets = np.array(self._ack_offsets, dtype=np.int64)
        marks_n = np.array(self._mark_n, dtype=np.int64)
        marks_t = np.array(self._mark_t + [now_s], dtype=np.float64)
        # Report k was served before the first mark whose log length exceeds k.
        acked_s = marks_t[np.searchsorted(marks_n, np.arange(len(rows)), side="right")]
        acked = np.floor(acked_s * 1000.0).astype(np.int64)
        self._ack_rows.clear()
        self._ack_offsets.clear()
        self._mark_n.clear()
        self._mark_t.clear()
        placed = np.zeros(len(rows), dtype=bool)
        for base, chunk, _, off, ack in self._sealed:
            inside = (rows >= base) & (rows < base + len(chunk))
            if inside.any():
                off[rows[inside] - base] = offsets[inside]
                ack[rows[inside] - base] = acked[inside]
                placed |= inside
        if not placed.all():
            # Reports of rows not sealed yet (only if a caller drains between seals): keep them for later,
            # marked as served now.
            keep = ~placed
            self._ack_rows.extend(rows[keep].tolist())
            self._ack_offsets.extend(offsets[keep].tolist())
            self._mark_n.append(len(self._ack_rows))
            self._mark_t.append(float(acked_s[keep].max()))

    def write_ready(self, final: bool = False) -> None:
        """Write every sealed chunk whose rows all have delivery reports (all of them when ``final``)."""
        if not self._sealed:
            return
        self._drain(self.clock())
        oldest = self.next_index
        if not final:
            live = [f for f in self.fifos if f]
            if live:
                oldest = min(f[0] for f in live)
        while self._sealed and (final or self._sealed[0][0] + len(self._sealed[0][1]) <= oldest):
            base, chunk, digests, off, ack = self._sealed.pop(0)
            n = len(chunk)
            errors: list[str | None] | None = None
            if self.errors or final:
                errors = [None] * n
                for i in [i for i in self.errors if base <= i < base + n]:
                    errors[i - base] = self.errors.pop(i)
            self.rows_written += n
            # Arrow and Parquet work happens on the writer thread (much of it outside the GIL).
            self._queue.put(_Work(chunk, digests, off, ack, errors, final))

    def close(self) -> None:
        """Seal and write everything; rows still without a delivery report are marked not delivered."""
        self.seal()
        self.write_ready(final=True)
        self._queue.put(None)
        self._thread.join()
        self.fifos = [f for f in self.fifos if f]
        if self._failure is not None:
            raise SimulatorError(f"could not write the ledger in {self.directory}: {self._failure}")

    def _write_files(self) -> None:
        while (work := self._queue.get()) is not None:
            if self._failure is not None:
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
        chunk, off, ack = work.chunk, work.offsets, work.acked
        n = len(chunk)
        # Sessions registered later only append to these lists, so a copy taken now covers the chunk.
        names, sensors = pa.array(self.session_names[:]), pa.array(self.session_sensor[:])
        topics, partitions = pa.array(self.session_topic[:]), pa.array(self.session_partition[:], pa.int32())
        sess = pa.array(chunk["session"])
        sent = chunk["sent"]
        unsent = sent < 0
        delivered = off >= 0
        errors: pa.Array = pa.nulls(n, pa.string())
        if work.errors is not None:
            texts = work.errors
            if work.final:
                for k in np.flatnonzero(~unsent & ~delivered).tolist():
                    if texts[k] is None:
                        texts[k] = NOT_ACKNOWLEDGED
            errors = pa.array(texts, type=pa.string())
        # Every sent row has a digest; unsent rows hold zeros, masked to null below.
        hexed = binascii.hexlify(b"".join(d.resolve() if isinstance(d, Digests) else d for d in work.digests))
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
                pa.array(off, mask=~delivered),
                pa.array(delivered),
                errors,
                sha_text,
                pa.array(ack, mask=~delivered),
            ],
            schema=LEDGER_SCHEMA,
        )
        return table


@dataclass
class _Work:
    """One sealed chunk with its delivery results, on its way to the writer thread."""

    chunk: np.ndarray
    digests: list[bytearray | Digests]
    offsets: np.ndarray
    acked: np.ndarray
    errors: list[str | None] | None
    final: bool
