"""Exactly-once Delta Lake output (``sotw pipeline --format delta``): the four datasets as Delta tables.

The stateful step writes its Parquet files into the batch's staging directory exactly as for the Parquet
output (``pipeline.sinks``); the driver moves them into the dataset's table directory and commits them to
the table's log as one transaction per dataset and batch, without rewriting them. Each commit records the
Delta transaction identifier of the query and batch (``txn``: application id = the query id, version = the
batch id), the mechanism Spark's Delta sink and ``foreachBatch`` writers use for idempotent streaming writes:
a batch that Spark replays after a crash is committed again only to the tables whose recorded version is
below it. A file moved in but not committed (a kill in between) is invisible to every Delta reader and is
removed when its batch is replayed; ``compact`` removes any others with the table's vacuum. The commits of a
batch in which the strict policy stopped the query also record that stop (``pipeline.sinks``), so that the
replay of that batch stops again.

The tables are written with delta-rs (the ``deltalake`` package), so no JVM jar is needed; any Delta reader
(``deltalake``, Polars, DuckDB's delta extension, Spark with delta-spark) reads them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from pipeline.errors import PipelineError

log = logging.getLogger(__name__)

LOG_DIR = "_delta_log"
BATCH_ID = "sotw.batch_id"
"""The ``commitInfo`` key of each commit that names the batch it committed."""
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


def is_table(path: Path) -> bool:
    """True if ``path`` holds a Delta table."""
    return (path / LOG_DIR).is_dir() and any((path / LOG_DIR).glob("*.json"))


@dataclass(frozen=True)
class StagedFile:
    """A data file already moved into its table directory, waiting to be committed."""

    path: Path
    rows: int


class DeltaTables:
    """The Delta tables of one output root, written by one query (``app_id``, its query id).

    Parameters
    ----------
    output
        The output root; dataset ``name`` is the table ``output/name``.
    app_id
        The application id of the transactions this writer records (the streaming query's id).
    partitions
        ``{dataset: partition columns}`` (strings; a null value is Hive's default partition).
    """

    def __init__(self, output: Path, app_id: str, partitions: dict[str, tuple[str, ...]]) -> None:
        self.output = output
        self.app_id = app_id
        self.partitions = partitions
        self._tables: dict[str, Any] = {}

    def _table(self, dataset: str) -> Any | None:
        from deltalake import DeltaTable

        table = self._tables.get(dataset)
        if table is None and is_table(self.output / dataset):
            table = DeltaTable(str(self.output / dataset))
            self._tables[dataset] = table
        elif table is not None:
            # The handle keeps the snapshot it last read: read the commits since (ours, or a compaction's),
            # or the next commit would claim a version that exists.
            table.update_incremental()
        return table

    def committed(self, dataset: str) -> int:
        """The last batch this query committed to ``dataset`` (-1 if none)."""
        table = self._table(dataset)
        if table is None:
            return -1
        version = table.transaction_version(self.app_id)
        return -1 if version is None else int(version)

    def last_batch(self) -> int:
        """The last batch committed to any of the tables (-1 if none)."""
        return max((self.committed(name) for name in self.partitions), default=-1)

    def metadata(self, dataset: str, batch_id: int) -> dict[str, str]:
        """The custom metadata of the commit that recorded ``batch_id`` to ``dataset``; empty if none did.

        Reads the table's history, so it is meant for a replayed batch, not for every batch.
        """
        table = self._table(dataset)
        if table is None:
            return {}
        for info in table.history():  # newest first
            if info.get(BATCH_ID) == str(batch_id):
                return {k: str(v) for k, v in info.items() if k.startswith("sotw.")}
        return {}

    def commit(
        self,
        dataset: str,
        batch_id: int,
        files: Iterable[StagedFile],
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """Commit ``files`` (already in the table directory) to ``dataset`` as batch ``batch_id``, once.

        A table that has recorded ``batch_id`` (or a later batch) for this query is left alone. ``metadata``
        (keys starting ``sotw.``) is recorded in the commit's ``commitInfo`` beside ``sotw.batch_id``, where
        ``metadata`` reads it back.
        """
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.transaction import AddAction, RemoveAction

        files = list(files)
        if not files or self.committed(dataset) >= batch_id:
            return
        root = self.output / dataset
        keys = self.partitions[dataset]
        schema = _table_schema(files[0].path, keys)
        table = self._table(dataset)
        if table is None:
            table = DeltaTable.create(str(root), schema, partition_by=list(keys), mode="ignore")
            self._tables[dataset] = table
        actions: list[AddAction | RemoveAction] = []
        for staged in files:
            relative = staged.path.relative_to(root)
            info = staged.path.stat()
            actions.append(
                AddAction(
                    path=quote(relative.as_posix(), safe="/="),
                    size=info.st_size,
                    partition_values=_partition_values(relative, keys),
                    modification_time=int(info.st_mtime * 1000),
                    data_change=True,
                    stats=json.dumps({"numRecords": staged.rows}),
                )
            )
        table.create_write_transaction(
            actions,
            mode="append",
            schema=schema,
            partition_by=list(keys),
            commit_properties=CommitProperties(
                app_transactions=[Transaction(self.app_id, batch_id)],
                custom_metadata={**(metadata or {}), BATCH_ID: str(batch_id)},
            ),
        )


def _table_schema(sample: Path, keys: tuple[str, ...]) -> Any:
    """A dataset's table schema: its files' columns, then the partition columns as strings."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(sample).remove_metadata()
    for key in keys:
        if key not in schema.names:
            schema = schema.append(pa.field(key, pa.string()))
    return schema


def _partition_values(relative: Path, keys: tuple[str, ...]) -> dict[str, str | None]:
    """The partition values a file's Hive directories name (``key=value``; the default partition is null)."""
    values: dict[str, str | None] = {}
    for part in relative.parts[:-1]:
        key, sep, value = part.partition("=")
        if sep and key in keys:
            values[key] = None if value == HIVE_NULL else unquote(value)
    missing = [k for k in keys if k not in values]
    if missing:
        raise PipelineError(f"{relative} is not under a {'/'.join(k + '=...' for k in keys)} directory")
    return values


@dataclass(frozen=True)
class CompactResult:
    """What ``compact`` did to one table."""

    table: str
    files_removed: int
    files_added: int
    vacuumed: int


def compact(path: Path, retention_hours: int = 168, vacuum: bool = True) -> list[CompactResult]:
    """Compact the small files of the Delta table(s) at ``path`` and apply the retention.

    ``path`` is a table, or an output root whose datasets are tables. Each table's small files (one per
    session and batch) are rewritten into larger ones (``optimize.compact``, a commit that changes no data,
    so readers and the idempotent writer are unaffected), then files no longer referenced for
    ``retention_hours`` are deleted (``vacuum``) and log entries past the table's log retention removed.
    Safe while the pipeline runs: Delta's optimistic concurrency retries or refuses a conflicting commit.

    Raises
    ------
    PipelineError
        If ``path`` holds no Delta table.
    """
    from deltalake import DeltaTable

    tables = [path] if is_table(path) else sorted(p for p in path.iterdir() if p.is_dir() and is_table(p))
    if not tables:
        raise PipelineError(
            f"{path} holds no Delta table: point at an output written with `sotw pipeline --format delta`, or at one of its tables"
        )
    results = []
    for table_path in tables:
        table = DeltaTable(str(table_path))
        metrics = table.optimize.compact()
        removed = (
            table.vacuum(retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False)
            if vacuum
            else []
        )
        table.cleanup_metadata()
        results.append(
            CompactResult(
                table_path.name,
                int(metrics.get("numFilesRemoved", 0)),
                int(metrics.get("numFilesAdded", 0)),
                len(removed),
            )
        )
        log.info("compacted %s: %s", table_path, metrics)
    return results
