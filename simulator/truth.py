"""The truth: each session's final table as the sensor held it, its snapshot, and the session list.

This is what a perfect pipeline must reconstruct. ``SESSIONS_SCHEMA``, ``TABLES_SCHEMA`` and ``SENSORS_SCHEMA``
are the one definition of ``<run_dir>/truth/sessions.parquet``, ``truth/tables/*.parquet`` (and
``truth/snapshots/*.parquet``, the same columns) and ``truth/sensors.parquet``. Tables are written as
sessions close, snapshots as they start, in files of bounded size. The snapshots are what seq 0 carried: a
session that lost later messages is judged against the table its delivered messages build
(``loadtest.correctness.contracts``), and a snapshot's change rows against the rows it sent (``loadtest.correctness.verify``). A run
that is verified while it goes on also gets ``truth/closed/part-NNNNN.parquet``: the sessions closed since
the part before (``Truth.write_closed``), with the columns of ``sessions.parquet``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

SESSIONS_SCHEMA = pa.schema(
    [
        pa.field("sensor", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("session", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # ended | abandoned | open
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("digest", pa.string(), nullable=False),
        pa.field("last_seq", pa.int64(), nullable=False),
        pa.field("started_ms", pa.int64(), nullable=False),
        pa.field("ended_ms", pa.int64()),  # null while open
    ]
)

TABLES_SCHEMA = pa.schema(
    [
        pa.field("sensor", pa.string(), nullable=False),
        pa.field("session", pa.string(), nullable=False),
        pa.field("id", pa.int64(), nullable=False),
        pa.field("values", pa.string(), nullable=False),  # sotw.wire.canonical_row of the row
    ]
)

SENSORS_SCHEMA = pa.schema(
    [
        pa.field("sensor", pa.string(), nullable=False),
        pa.field("topic", pa.string(), nullable=False),
        pa.field("site", pa.string(), nullable=False),
        pa.field("model", pa.string(), nullable=False),
        pa.field("serial", pa.string(), nullable=False),
        pa.field("joined_ms", pa.int64(), nullable=False),
        pa.field("retired_ms", pa.int64()),
    ]
)


class _RowFiles:
    """Rows of ``TABLES_SCHEMA`` buffered and written as ``part-NNNNN.parquet`` files of bounded size."""

    def __init__(self, directory: Path, rows_per_file: int) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.rows_per_file = rows_per_file
        self._cols: tuple[list[str], list[str], list[int], list[str]] = ([], [], [], [])
        self._files = 0

    def add(self, sensor: str, session: str, table: list[tuple[int, str]]) -> None:
        """Buffer one session's rows (``(id, row text)``); write a file once enough are buffered."""
        sensors, sessions, ids, values = self._cols
        for rid, text in table:
            sensors.append(sensor)
            sessions.append(session)
            ids.append(rid)
            values.append(text)
        if len(ids) >= self.rows_per_file:
            self.flush()

    def flush(self) -> None:
        """Write what is buffered as the next file."""
        if not self._cols[0]:
            return
        table = pa.Table.from_arrays([pa.array(c) for c in self._cols], schema=TABLES_SCHEMA)
        pq.write_table(table, self.directory / f"part-{self._files:05d}.parquet", compression="zstd")
        self._files += 1
        self._cols = ([], [], [], [])

    def close(self) -> None:
        """Write the rest; an empty file when nothing was ever written, so the dataset stays readable."""
        self.flush()
        if self._files == 0:
            pq.write_table(TABLES_SCHEMA.empty_table(), self.directory / "part-00000.parquet")
            self._files = 1


class Truth:
    """Collects closed sessions and their tables and writes them under ``<run_dir>/truth``.

    Parameters
    ----------
    directory
        ``<run_dir>/truth``.
    rows_per_file
        Table rows buffered before a ``tables/part-NNNNN.parquet`` file is written.
    """

    def __init__(self, directory: Path, rows_per_file: int = 200_000) -> None:
        self.directory = directory
        self.rows_per_file = rows_per_file
        self.sessions: list[dict[str, Any]] = []
        self.sensors: list[dict[str, Any]] = []
        self._tables = _RowFiles(directory / "tables", rows_per_file)
        self._snapshots = _RowFiles(directory / "snapshots", rows_per_file)
        self._closed_written = 0  # sessions already in a closed/ part
        self._closed_parts = 0

    def session(
        self,
        *,
        sensor: str,
        topic: str,
        session: str,
        status: str,
        table: list[tuple[int, str]],
        digest: str,
        last_seq: int,
        started_ms: int,
        ended_ms: int | None,
    ) -> None:
        """Record one session and its final table (``(id, canonical_row)`` sorted by id)."""
        self.sessions.append(
            {
                "sensor": sensor,
                "topic": topic,
                "session": session,
                "status": status,
                "rows": len(table),
                "digest": digest,
                "last_seq": last_seq,
                "started_ms": started_ms,
                "ended_ms": ended_ms,
            }
        )
        self._tables.add(sensor, session, table)

    def snapshot(self, *, sensor: str, session: str, rows: list[tuple[int, str]]) -> None:
        """Record the rows a session's snapshot carried (``(id, row as JSON)``, sorted by id)."""
        self._snapshots.add(sensor, session, rows)

    def write_closed(self) -> None:
        """Write the sessions recorded since the last call to the next ``closed/part-NNNNN.parquet``.

        Each part is written under a temporary name and renamed into place, so a reader never sees half
        of one.
        """
        new = self.sessions[self._closed_written :]
        if not new:
            return
        folder = self.directory / "closed"
        folder.mkdir(exist_ok=True)
        path = folder / f"part-{self._closed_parts:05d}.parquet"
        partial = folder / f".{path.name}.tmp"
        pq.write_table(pa.Table.from_pylist(new, schema=SESSIONS_SCHEMA), partial)
        partial.replace(path)
        self._closed_written += len(new)
        self._closed_parts += 1

    def close(self) -> None:
        """Write the remaining tables and snapshots, ``sessions.parquet`` and ``sensors.parquet``."""
        self._tables.close()
        self._snapshots.close()
        pq.write_table(
            pa.Table.from_pylist(self.sessions, schema=SESSIONS_SCHEMA), self.directory / "sessions.parquet"
        )
        pq.write_table(
            pa.Table.from_pylist(self.sensors, schema=SENSORS_SCHEMA), self.directory / "sensors.parquet"
        )
