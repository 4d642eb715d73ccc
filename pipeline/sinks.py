"""Exactly-once Parquet outputs for the four datasets, written from ``foreachBatch``.

Spark's file sink gives exactly-once for one dataset per query; sotw needs four (changes, sessions, integrity,
dead letters) from one stateful step, so ``OutputWriter`` does the same job by hand:

1. every file a batch writes carries the batch id in its name (``b<batch>-...``);
2. ``_commits/<batch>.json`` is written last, atomically (write to a temporary name, then rename);
3. the marker records the offsets the batch was planned up to (its entry in the checkpoint's offset log; it
   starts where the batch before ended), so a replayed batch whose marker exists is skipped only if Spark planned it over the
   same offsets again; a replay over other offsets (a checkpoint restored from before the batch, while new
   data arrived) is refused, because skipping it would silently lose the records in between;
4. before a batch is (re)written its leftovers from an earlier, interrupted attempt are removed: ``_publishing/<batch>.json`` names every file the batch is about to
   move into the datasets, written before the first move and removed after the marker, so an interrupted
   publication is undone from that list (the cost is the batch's own files, not a walk of the output, which
   grows all run long);
5. a batch in which the strict policy stopped a session is published like any other (the violation's
   integrity record is one of its rows), its marker records the stop (``stop``), and only then does the
   writer raise the ``IntegrityViolation`` that fails the query; Spark never commits that batch, so a restart
   replays it, finds the stop in the marker and raises it again instead of going past it.

Spark replays an uncommitted batch with the same offsets after a crash, so each batch lands exactly once
whether the process died before, during or after the write. The stateful step writes each group's records
to Parquet itself, into the batch's staging directory (``write_records``, called by
``pipeline.reconstruct.SessionFunction``), and hands Spark only the names of the files; the driver publishes
the files of the task attempts that succeeded. No record goes through the JVM, and nothing is cached.
What is read of Spark's checkpoint is in ``pipeline.checkpoint``; the check before a query starts
(``check_consistency``) and the way back to an earlier batch (``rollback``) in ``pipeline.recovery``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from pipeline.checkpoint import checkpoint_query_id, offset_changes, planned_offsets
from pipeline.delta import DeltaTables, StagedFile
from pipeline.errors import IntegrityViolation, PipelineError

log = logging.getLogger(__name__)

DATASETS = ("changes", "sessions", "integrity", "dead_letters")
OWNER_FILE = "_sotw.json"
COMMITS = "_commits"
STAGING = "_staging"
PUBLISHING = "_publishing"
ROLLBACK = "_rollback.json"
RETAIN_EMPTY_MARKERS = 100
"""How many of the latest batches keep their marker although they wrote nothing (Spark's own
``minBatchesToRetain`` default). With a session timeout Spark runs a batch every trigger even when no data
arrives; a marker per idle trigger would pile up about 86,000 files a day. Markers of batches that wrote rows
are kept: they make those rows visible and date them."""
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
"""How a Hive partition directory names a null value (pyarrow's default ``null_fallback``)."""

# The columns of each dataset, in order; `sensor`/`date` are the partition columns (see docs/pipeline-outputs.md).
COLUMNS: dict[str, tuple[str, ...]] = {
    "changes": (
        "session", "seq", "row_id", "op", "values", "event_ms", "topic", "partition", "offset",
    ),
    "sessions": (
        "session", "topic", "status", "closed_by", "row_count", "digest", "expected_rows", "expected_digest",
        "first_seq", "last_seq", "messages", "gaps", "duplicates", "reordered", "malformed", "digest_mismatches",
        "missing_snapshot", "degraded_from_seq", "event_ms", "partition", "offset",
    ),
    "integrity": (
        "session", "violation", "seq", "expected_seq", "got_seq", "missing_from", "missing_to", "detail",
        "event_ms", "topic", "partition", "offset",
    ),
    "dead_letters": ("sensor", "session", "topic", "partition", "offset", "key", "value", "detail"),
}  # fmt: skip
# The stateful step's `record` value that goes to each dataset.
RECORD_OF = {
    "changes": "change",
    "sessions": "session",
    "integrity": "integrity",
    "dead_letters": "dead_letter",
}
PARTITIONS: dict[str, tuple[str, ...]] = {
    "changes": ("sensor", "date"),
    "sessions": ("sensor", "date"),
    "integrity": ("sensor", "date"),
    "dead_letters": ("date",),
}


# What the stateful step reports per group when it writes its own records (``reconstruct`` with ``output``):
# one row per file written, and one row (no dataset, no path) with the Kafka messages the group consumed and
# the batch's processing time. When the strict policy stopped the group's session, that row's ``stop`` holds
# the violation as JSON (``IntegrityViolation.as_dict``); it is null on every other row.
WRITTEN_DDL = (
    "`dataset` string, `path` string, `rows` bigint, `messages` bigint, `processed_ms` bigint, `stop` string"
)
STOP_METADATA = "sotw.stop"
"""The Delta commit metadata key under which a batch the strict policy stopped records its stop (JSON)."""


def write_records(
    table: Any, staging: str, basename: str, batch_id: int, processed_ms: int
) -> list[tuple[str, str, int]]:
    """Write one table of records (``pipeline.records.ARROW_SCHEMA``) into a batch's staging directory.

    Each dataset gets the records of its kind, with ``batch_id`` and ``processed_ms`` added, as one Parquet
    file ``basename`` per partition directory under ``staging/<dataset>/`` (Hive style, as
    ``pyarrow.dataset`` writes and reads them); ``basename`` must be unique within the batch. Returns
    ``(dataset, path, rows)`` per file written, for the driver to publish.
    """
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    n = table.num_rows
    if n == 0:
        return []
    when = pc.coalesce(table["event_ms"], pa.scalar(processed_ms, pa.int64()))
    table = table.append_column("batch_id", pa.array([batch_id] * n, pa.int64()))
    table = table.append_column("processed_ms", pa.array([processed_ms] * n, pa.int64()))
    date = pc.cast(pc.cast(pc.cast(when, pa.timestamp("ms")), pa.date32()), pa.string())
    table = table.append_column("date", date)
    kinds = set(table["record"].unique().to_pylist())
    out: list[tuple[str, str, int]] = []
    for dataset in DATASETS:
        if RECORD_OF[dataset] not in kinds:
            continue
        part = table if len(kinds) == 1 else table.filter(pc.equal(table["record"], RECORD_OF[dataset]))
        keys = PARTITIONS[dataset]
        cols = [c for c in dict.fromkeys([*COLUMNS[dataset], "batch_id", "processed_ms"]) if c not in keys]
        for values, rows in _partitioned(part, keys):
            directory = os.path.join(staging, dataset, *map(_hive_segment, keys, values))
            os.makedirs(directory, exist_ok=True)
            path = os.path.join(directory, basename)
            pq.write_table(rows.select(cols), path)
            out.append((dataset, path, rows.num_rows))
    return out


def _partitioned(table: Any, keys: tuple[str, ...]) -> list[tuple[tuple[Any, ...], Any]]:
    """``table``'s rows per distinct value of the ``keys`` columns (usually one: a session's sensor and day)."""
    columns = [table[k].unique() for k in keys]
    if all(len(c) == 1 for c in columns):
        return [(tuple(c[0].as_py() for c in columns), table)]
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, values in enumerate(zip(*(table[k].to_pylist() for k in keys), strict=True)):
        groups.setdefault(values, []).append(i)
    return [(values, table.take(rows)) for values, rows in groups.items()]


def _hive_segment(key: str, value: Any) -> str:
    """A Hive partition directory name, encoded exactly as ``pyarrow.dataset``'s hive partitioning does."""
    return f"{key}={HIVE_NULL if value is None else quote(str(value), safe='')}"


def atomic_write_json(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` as JSON to ``path`` so that a reader finds the old file or the whole new one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=1, sort_keys=True))
    os.replace(tmp, path)


def committed_batches(output: Path) -> list[int]:
    """Batch ids whose commit marker exists, ascending.

    Every batch that wrote rows keeps its marker; of the batches that wrote nothing only the latest
    ``RETAIN_EMPTY_MARKERS`` do.
    """
    folder = output / COMMITS
    if not folder.is_dir():
        return []
    return sorted(int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit())


def _read_marker(path: Path) -> dict[str, Any]:
    """A commit marker's content; markers are written atomically, so a readable file is a whole one."""
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PipelineError(f"commit marker {path} cannot be read ({exc}); the output is damaged") from None
    return content if isinstance(content, dict) else {}


def _first_stop(rows: Iterable[Any]) -> IntegrityViolation | None:
    """The strict stop a batch's ``WRITTEN_DDL`` rows report first in Kafka order; None if none stopped.

    Each session the strict policy stopped in the batch reports its own stop (and wrote its violation's
    record); the query stops naming the one at the lowest (topic, partition, offset).
    """
    stops = [IntegrityViolation.from_dict(json.loads(row.stop)) for row in rows if row.stop is not None]
    return min(stops, key=lambda stop: stop.record.at, default=None)


def _refuse_repeated(batch_id: int, moves: list[tuple[Path, Path]]) -> None:
    """Stop before moving anything if two task outputs name one file: one of them was overwritten.

    Publishing such a batch would lose the overwritten file's rows (or fail half-way on the second move), so
    the batch is refused whole and Spark retries or stops the query; nothing of it becomes visible.
    """
    seen: set[Path] = set()
    for src, _ in moves:
        if src in seen:
            raise PipelineError(
                f"batch {batch_id}: two task outputs name the same staging file {src}; one overwrote the other, "
                "so the batch is not published (a bug in the stateful step's file naming; please report it)"
            )
        seen.add(src)


@dataclass
class BatchStats:
    """What one micro-batch wrote, per dataset."""

    batch_id: int
    rows: dict[str, int]
    committed_ms: int
    messages: int = 0


class OutputWriter:
    """The ``foreachBatch`` function: writes one micro-batch's records to the four datasets exactly once.

    Parameters
    ----------
    output
        The output root.
    checkpoint
        The query's checkpoint; its query id is recorded in the output on the first batch.
    drop_batches
        Batches committed without writing their records (``--drop-batch``, the harness's self-test).
    retain_empty
        How many of the latest batches keep their marker although they wrote nothing.
    output_format
        ``parquet`` (the datasets as Parquet directories with ``_commits`` markers) or ``delta`` (Delta
        tables committed with the query's transaction identifier, ``pipeline.delta``).
    """

    def __init__(
        self,
        output: Path,
        checkpoint: Path,
        drop_batches: frozenset[int] = frozenset(),
        retain_empty: int = RETAIN_EMPTY_MARKERS,
        output_format: str = "parquet",
    ) -> None:
        self.output = output
        self.checkpoint = checkpoint
        self.drop_batches = drop_batches
        self.retain_empty = retain_empty
        self.output_format = output_format
        self._delta: DeltaTables | None = None
        self.last: BatchStats | None = None
        self._messages: dict[int, int] = {}
        self._owner_checked = False
        self._searched = False

    def messages_of(self, batch_id: int) -> int | None:
        """Kafka messages batch ``batch_id`` consumed (for the progress log); None if not known here."""
        return self._messages.get(batch_id)

    def _remember(self, batch_id: int, messages: int) -> None:
        self._messages[batch_id] = messages
        for old in [b for b in self._messages if b < batch_id - 100]:
            del self._messages[old]

    def _claim(self) -> None:
        query_id = checkpoint_query_id(self.checkpoint)
        owner = self.output / OWNER_FILE
        if owner.is_file():
            recorded = json.loads(owner.read_text()).get("query_id")
            if recorded != query_id:
                raise PipelineError(f"output {self.output} belongs to query {recorded}, not {query_id}")
        else:
            self.output.mkdir(parents=True, exist_ok=True)
            atomic_write_json(owner, {"query_id": query_id, "checkpoint": str(self.checkpoint.resolve())})
        if self.output_format == "delta":
            self._delta = DeltaTables(self.output, str(query_id), PARTITIONS)
        self._owner_checked = True

    def _journal(self, batch_id: int) -> Path:
        return self.output / PUBLISHING / f"{batch_id}.json"

    def _clear_attempt(self, batch_id: int, keep: frozenset[str] = frozenset()) -> None:
        """Remove what an interrupted attempt of ``batch_id`` left: its staging and the files it published.

        Files of the datasets in ``keep`` stay: their Delta tables committed them.
        """
        shutil.rmtree(self.output / STAGING / str(batch_id), ignore_errors=True)
        journal = self._journal(batch_id)
        if journal.is_file():
            for name in json.loads(journal.read_text())["files"]:
                if Path(name).parts[0] not in keep:
                    (self.output / name).unlink(missing_ok=True)
            journal.unlink()
        elif not self._searched:
            # The first batch after a start is the only one that can be a replay, and an output written by a
            # sotw from before the journal has none: search the datasets for the batch's files once. A batch
            # replayed after its Delta commits has no journal either: its committed files are not leftovers.
            for dataset in DATASETS:
                root = self.output / dataset
                if root.is_dir() and dataset not in keep:
                    for stale in root.rglob(f"b{batch_id}-*"):
                        stale.unlink()
        self._searched = True

    def _check_replay(self, batch_id: int, marker: dict[str, Any], planned: list[Any] | None) -> None:
        """Refuse to skip a batch already in the output that Spark now plans over other offsets."""
        recorded = marker.get("offsets")
        if recorded is None or planned is None:
            log.warning(
                "batch %d is already in the output but its offsets cannot be compared (a marker from an "
                "older sotw, or no offset log entry); not written again",
                batch_id,
            )
            return
        if recorded != planned:
            raise PipelineError(
                f"batch {batch_id} is already in the output {self.output}, but the checkpoint {self.checkpoint} "
                f"now plans it over other offsets ({offset_changes(recorded, planned)}): the checkpoint was "
                "restored from before that batch while new data arrived. Skipping the batch would silently lose "
                "the records in between, and writing it again would repeat rows. Restore the checkpoint that "
                f"belongs with this output, or take the output back with `sotw pipeline rollback {self.output} "
                f"--to-batch {batch_id - 1}` and start again"
            )

    def __call__(self, batch_df: Any, batch_id: int) -> None:
        """Publish the files ``batch_df`` (the stateful step's ``WRITTEN_DDL`` rows) names, unless already done."""
        if not self._owner_checked:
            self._claim()
        if self._delta is not None:
            self._publish_delta(self._delta, batch_df, batch_id)
            return
        marker = self.output / COMMITS / f"{batch_id}.json"
        planned = planned_offsets(self.checkpoint, batch_id)
        if marker.exists():
            # Replayed after a crash between our commit and Spark's: the rows are already in the output, if
            # Spark planned the batch over the same offsets as before. The batch must still run to the end so
            # the state store commits this version (Spark checks it), unless the strict policy stopped it.
            previous = _read_marker(marker)
            self._check_replay(batch_id, previous, planned)
            recorded = previous.get("stop")
            if recorded is None:
                log.info("batch %d already in the output; not written again", batch_id)
                batch_df.write.format("noop").mode("overwrite").save()
            shutil.rmtree(self.output / STAGING / str(batch_id), ignore_errors=True)
            # Killed after the marker, before the journal was removed: the files are the batch's, keep them.
            self._journal(batch_id).unlink(missing_ok=True)
            self._remember(batch_id, int(previous.get("messages", 0)))
            if recorded is not None:
                # The strict policy stopped the query in this batch, which Spark therefore never committed: a
                # restart replays it and must stop at the same violation again, never go past it.
                log.info("batch %d stopped the query under the strict policy; stopping again", batch_id)
                raise IntegrityViolation.from_dict(recorded)
            return
        self._clear_attempt(batch_id)
        staging = (self.output / STAGING / str(batch_id)).absolute()
        counts = dict.fromkeys(DATASETS, 0)
        messages = 0
        processed_ms: int | None = None
        # The stateful step writes its records into the staging directory itself (``reconstruct`` with
        # ``output``); the rows say which files the successful task attempts wrote.
        moves: list[tuple[Path, Path]] = []
        written = batch_df.collect()
        for row in written:
            messages += row.messages or 0
            processed_ms = row.processed_ms if processed_ms is None else processed_ms
            if row.dataset is not None:
                counts[row.dataset] += row.rows
            if row.path is not None and batch_id not in self.drop_batches:
                src = Path(row.path)
                dest = self.output / row.dataset / src.parent.relative_to(staging / row.dataset)
                moves.append((src, dest / f"b{batch_id}-{src.name}"))
        stop = _first_stop(written)
        _refuse_repeated(batch_id, moves)
        journal = self._journal(batch_id)
        if moves:
            journal.parent.mkdir(exist_ok=True)
            atomic_write_json(journal, {"files": [str(d.relative_to(self.output)) for _, d in moves]})
        for src, dest in moves:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(src, dest)
        shutil.rmtree(staging, ignore_errors=True)
        committed_ms = int(time.time() * 1000)
        (self.output / COMMITS).mkdir(parents=True, exist_ok=True)
        rows = counts
        content: dict[str, Any] = {
            "batch_id": batch_id,
            "processed_ms": processed_ms if processed_ms is not None else committed_ms,
            "committed_ms": committed_ms,
            "rows": rows,
            "messages": messages,
            "offsets": planned,
        }
        if stop is not None:
            content["stop"] = stop.as_dict()
        atomic_write_json(marker, content)
        journal.unlink(missing_ok=True)
        self._remember(batch_id, messages)
        self.last = BatchStats(batch_id, rows, committed_ms, messages)
        self._forget_empty(batch_id - self.retain_empty)
        if stop is not None:
            # Published with every other session's rows of the batch, the violation's record among them; the
            # query now fails as a strict stop does (``pipeline.query.explain_failure``).
            raise stop

    def _publish_delta(self, tables: DeltaTables, batch_df: Any, batch_id: int) -> None:
        """Commit the batch's files to each dataset's Delta table whose transaction version is below it.

        Every dataset is its own transaction, so a kill between two commits leaves the others to the replay;
        files moved into a table but never committed are removed from the journal then (no reader sees
        them meanwhile).
        """
        done = frozenset(d for d in DATASETS if tables.committed(d) >= batch_id)
        self._clear_attempt(batch_id, keep=done)
        # A replay of a batch the strict policy stopped: a table that committed it recorded the stop.
        recorded = next(
            (found for d in sorted(done) if (found := tables.metadata(d, batch_id).get(STOP_METADATA))), None
        )
        staging = (self.output / STAGING / str(batch_id)).absolute()
        counts = dict.fromkeys(DATASETS, 0)
        messages = 0
        files: dict[str, list[tuple[Path, Path, int]]] = {d: [] for d in DATASETS}
        written = batch_df.collect()
        for row in written:
            messages += row.messages or 0
            dataset = row.dataset
            if dataset is None:
                continue
            counts[dataset] += row.rows
            if row.path is not None and batch_id not in self.drop_batches and dataset not in done:
                src = Path(row.path)
                dest = (
                    self.output
                    / dataset
                    / src.parent.relative_to(staging / dataset)
                    / f"b{batch_id}-{src.name}"
                )
                files[dataset].append((src, dest, row.rows))
        stop = IntegrityViolation.from_dict(json.loads(recorded)) if recorded else _first_stop(written)
        metadata = {} if stop is None else {STOP_METADATA: json.dumps(stop.as_dict(), sort_keys=True)}
        _refuse_repeated(batch_id, [(src, dest) for moves in files.values() for src, dest, _ in moves])
        moved = [dest for moves in files.values() for _, dest, _ in moves]
        journal = self._journal(batch_id)
        if moved:
            journal.parent.mkdir(exist_ok=True)
            atomic_write_json(journal, {"files": [str(d.relative_to(self.output)) for d in moved]})
        for dataset, moves in files.items():
            for src, dest, _ in moves:
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dest)
            tables.commit(
                dataset, batch_id, [StagedFile(dest, rows) for _, dest, rows in moves], metadata=metadata
            )
        shutil.rmtree(staging, ignore_errors=True)
        journal.unlink(missing_ok=True)
        if done:
            log.info("batch %d already in %s; not written again", batch_id, ", ".join(sorted(done)))
        self._remember(batch_id, messages)
        self.last = BatchStats(batch_id, counts, int(time.time() * 1000), messages)
        if stop is not None:
            # As for Parquet: published first, every table's commit of the batch records the stop, then the
            # query fails; a restart replays the batch and stops again at the recorded violation.
            raise stop

    def _forget_empty(self, batch_id: int) -> None:
        """Remove ``batch_id``'s marker if that batch wrote nothing: only recent markers matter for recovery."""
        old = self.output / COMMITS / f"{batch_id}.json"
        try:
            content = json.loads(old.read_text())
        except (OSError, ValueError):
            return
        if not any((content.get("rows") or {}).values()):
            old.unlink(missing_ok=True)
