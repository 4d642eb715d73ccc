"""The truth: each session's final table as the sensor held it, and the session list.

This is what a perfect pipeline must reconstruct. ``SESSIONS_SCHEMA``, ``TABLES_SCHEMA`` and ``SENSORS_SCHEMA``
are the one definition of ``<run_dir>/truth/sessions.parquet``, ``truth/tables/*.parquet`` and
``truth/sensors.parquet``. Tables are written as sessions close, in files of bounded size. A run that is
verified while it goes on also gets ``truth/closed/part-NNNNN.parquet``: the sessions closed since the part
before (``Truth.write_closed``), with the columns of ``sessions.parquet``.
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
        (directory / "tables").mkdir(parents=True, exist_ok=True)
        self.rows_per_file = rows_per_file
        self.sessions: list[dict[str, Any]] = []
        self.sensors: list[dict[str, Any]] = []
        self._table_cols: tuple[list[str], list[str], list[int], list[str]] = ([], [], [], [])
        self._files = 0
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
        sensors, sessions, ids, values = self._table_cols
        for rid, canon in table:
            sensors.append(sensor)
            sessions.append(session)
            ids.append(rid)
            values.append(canon)
        if len(ids) >= self.rows_per_file:
            self._flush_tables()

    def _flush_tables(self) -> None:
        if not self._table_cols[0]:
            return
        table = pa.Table.from_arrays([pa.array(c) for c in self._table_cols], schema=TABLES_SCHEMA)
        pq.write_table(
            table, self.directory / "tables" / f"part-{self._files:05d}.parquet", compression="zstd"
        )
        self._files += 1
        self._table_cols = ([], [], [], [])

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
        """Write the remaining tables, ``sessions.parquet`` and ``sensors.parquet``."""
        self._flush_tables()
        if self._files == 0:  # keep the dataset readable even when no session closed
            pq.write_table(TABLES_SCHEMA.empty_table(), self.directory / "tables" / "part-00000.parquet")
            self._files = 1
        pq.write_table(
            pa.Table.from_pylist(self.sessions, schema=SESSIONS_SCHEMA), self.directory / "sessions.parquet"
        )
        pq.write_table(
            pa.Table.from_pylist(self.sensors, schema=SENSORS_SCHEMA), self.directory / "sensors.parquet"
        )
