"""Once-a-second measurements of a running system, each probe a small class with ``sample() -> dict``.

The sampler thread merges the probes' readings into one row per second (``samples.jsonl``), which the report
turns into throughput, lag and resource charts. Probes read what the parts already publish (the simulator's
counters, Kafka's end offsets, the pipeline's checkpoint, progress log and commit markers, ``/proc``), so the
system under test is not slowed by being watched; the sampler's own CPU time is measured and reported.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import psutil
from confluent_kafka import TopicPartition

from pipeline.progress import input_messages
from sotw.kafka import EndOffsets, KafkaConfig

log = logging.getLogger(__name__)


class Probe(Protocol):
    """Anything that can be read once a second."""

    def sample(self) -> dict[str, Any]:
        """Return this probe's readings, flat ``name -> number``."""
        ...


def checkpoint_position(checkpoint: Path) -> dict[tuple[str, int], int]:
    """The source offsets of the last batch the pipeline committed: where it will read next.

    Spark writes ``offsets/<batch>`` (version line, metadata line, one JSON line per source) before a
    batch and ``commits/<batch>`` after it; the committed batch's end offsets are the pipeline's position.
    """
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return {}
    done = sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    if not done:
        return {}
    try:
        lines = (checkpoint / "offsets" / str(done[-1])).read_text().splitlines()
        offsets = json.loads(lines[2])
    except (OSError, IndexError, ValueError):
        return {}
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


class KafkaLagProbe:
    """Offsets behind the latest (total, max per partition) and the age of the oldest unprocessed message.

    Parameters
    ----------
    kafka
        Cluster to read end offsets and timestamps from.
    pattern
        The pipeline's topic regex.
    checkpoint
        The pipeline's checkpoint (its position).
    """

    def __init__(self, kafka: KafkaConfig, pattern: str, checkpoint: Path, max_age_probes: int = 64) -> None:
        self._regex = re.compile(pattern)
        self._checkpoint = checkpoint
        self._ends = EndOffsets(kafka)
        self._peek = kafka.consumer()
        self._partitions: list[tuple[str, int]] = []
        self._listed = 0.0
        self._max_age_probes = max_age_probes

    def _topic_partitions(self) -> list[tuple[str, int]]:
        if time.monotonic() - self._listed > 5.0:
            # Listed on the client the offsets are read with: its metadata cache finds new partitions' leaders.
            meta = self._ends.admin.list_topics(timeout=10)
            self._partitions = sorted(
                (name, p)
                for name, topic in meta.topics.items()
                if self._regex.fullmatch(name)
                for p in topic.partitions
            )
            self._listed = time.monotonic()
        return self._partitions

    def close(self) -> None:
        """Close the probe's Kafka consumer."""
        self._peek.close()

    def sample(self) -> dict[str, Any]:
        """Lag totals now."""
        parts = self._topic_partitions()
        ends = self._ends(parts)
        position = checkpoint_position(self._checkpoint)
        behind = {tp: max(0, end - max(position.get(tp, low), low)) for tp, (low, end) in ends.items()}
        lagging = sorted((tp for tp, n in behind.items() if n > 0), key=lambda tp: -behind[tp])
        return {
            "lag_offsets": sum(behind.values()),
            "lag_max_partition": max(behind.values(), default=0),
            "lag_age_s": self._oldest_age(lagging[: self._max_age_probes], position, ends),
            "topics": len({t for t, _ in parts}),
            "end_offsets_total": sum(end for _, end in ends.values()),
        }

    def _oldest_age(
        self,
        lagging: list[tuple[str, int]],
        position: Mapping[tuple[str, int], int],
        ends: Mapping[tuple[str, int], tuple[int, int]],
    ) -> float:
        """Seconds since the oldest unprocessed message was produced (Kafka timestamp of the next record)."""
        if not lagging:
            return 0.0
        self._peek.assign(
            [
                TopicPartition(t, p, max(position.get((t, p), ends[(t, p)][0]), ends[(t, p)][0]))
                for t, p in lagging
            ]
        )
        oldest: float | None = None
        pending = set(lagging)
        deadline = time.monotonic() + 0.5
        try:
            while pending and time.monotonic() < deadline:
                for msg in self._peek.consume(num_messages=len(pending) * 50, timeout=0.1):
                    tp = (msg.topic(), msg.partition())
                    if msg.error() or tp not in pending:
                        continue
                    pending.discard(tp)
                    ts = msg.timestamp()[1] / 1000.0
                    oldest = ts if oldest is None else min(oldest, ts)
        finally:
            self._peek.unassign()
        return 0.0 if oldest is None else max(0.0, time.time() - oldest)


class OutputProbe:
    """Rows committed to the pipeline's output, from its ``_commits`` markers (read once each)."""

    def __init__(self, output: Path) -> None:
        self._commits = output / "_commits"
        self._seen: set[str] = set()
        self.rows: dict[str, int] = {}
        self.batches = 0

    def sample(self) -> dict[str, Any]:
        """Cumulative rows written per dataset."""
        if self._commits.is_dir():
            for path in self._commits.glob("*.json"):
                if path.name in self._seen:
                    continue
                try:
                    marker = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue  # being renamed into place; next second
                self._seen.add(path.name)
                self.batches += 1
                for name, n in marker.get("rows", {}).items():
                    self.rows[name] = self.rows.get(name, 0) + int(n)
        return {"written_" + k: v for k, v in self.rows.items()} | {"batches": self.batches}


class ProgressProbe:
    """The pipeline's consumed rows and last batch duration, tailing its progress log."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._pos = 0
        self.consumed = 0
        self.last_duration_ms = 0
        self.state_rows = 0

    def sample(self) -> dict[str, Any]:
        """Cumulative input rows consumed by the pipeline."""
        if self._path.is_file():
            with self._path.open() as f:
                f.seek(self._pos)
                for line in f:
                    if not line.endswith("\n"):
                        break  # partial line: read it next time
                    self._pos += len(line.encode())
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    self.consumed += input_messages(rec)
                    self.last_duration_ms = int((rec.get("durationMs") or {}).get("triggerExecution", 0))
                    ops = rec.get("stateOperators") or [{}]
                    self.state_rows = int(ops[0].get("numRowsTotal", 0))
        return {
            "consumed": self.consumed,
            "batch_duration_ms": self.last_duration_ms,
            "state_rows": self.state_rows,
        }


class ResourceProbe:
    """CPU (% of one core) and resident memory of named process trees.

    Parameters
    ----------
    pids
        ``component -> callable returning the root pid`` (None while the component is not running); a
        component's children (the pipeline's JVM and Python workers) are counted with it.
    alone
        Components measured without their children (the harness, whose children are the other components).
    """

    def __init__(self, pids: Mapping[str, Callable[[], int | None]], alone: Iterable[str] = ()) -> None:
        self._pids = dict(pids)
        self._alone = frozenset(alone)
        self._procs: dict[int, psutil.Process] = {}

    def _tree(self, pid: int, children: bool = True) -> Iterable[psutil.Process]:
        try:
            root = psutil.Process(pid)
            family = [root, *root.children(recursive=True)] if children else [root]
        except psutil.NoSuchProcess:
            return []
        out = []
        for p in family:
            # Keep one Process object per pid so cpu_percent() measures since the previous sample.
            out.append(self._procs.setdefault(p.pid, p))
        return out

    def sample(self) -> dict[str, Any]:
        """CPU and memory per component."""
        row: dict[str, Any] = {}
        for name, get_pid in self._pids.items():
            pid = get_pid()
            cpu = rss = 0.0
            if pid is not None:
                for p in self._tree(pid, children=name not in self._alone):
                    try:
                        cpu += p.cpu_percent(None)
                        rss += p.memory_info().rss
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        continue
            row[f"cpu_{name}"] = round(cpu, 1)
            row[f"rss_mb_{name}"] = round(rss / 2**20, 1)
        return row


class Sampler(threading.Thread):
    """Calls every probe once per ``interval`` seconds and keeps (and appends to ``path``) one row per call.

    A failing probe is logged and skipped for that second; it must not end the run.
    """

    def __init__(
        self,
        probes: Mapping[str, Probe],
        path: Path,
        interval: float = 1.0,
        phase: Callable[[], str] = lambda: "",
    ) -> None:
        super().__init__(name="sotw-sampler", daemon=True)
        self._probes = dict(probes)
        self._path = path
        self._interval = interval
        self._phase = phase
        self._halt = threading.Event()
        self.rows: list[dict[str, Any]] = []
        self.cpu_seconds = 0.0
        self._t0 = time.time()

    def run(self) -> None:
        """Sample until stopped."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with self._path.open("a") as out:
            next_at = time.monotonic()
            while not self._halt.is_set():
                cpu0 = time.thread_time()
                row: dict[str, Any] = {
                    "t": round(time.time() - self._t0, 3),
                    "ts": time.time(),
                    "phase": self._phase(),
                }
                for name, probe in self._probes.items():
                    try:
                        row.update(probe.sample())
                    except Exception as exc:  # a probe hiccup must not end the run
                        log.debug("probe %s failed: %s", name, exc)
                self.cpu_seconds += time.thread_time() - cpu0
                row["harness_cpu_s"] = round(self.cpu_seconds, 4)
                self.rows.append(row)
                out.write(json.dumps(row) + "\n")
                out.flush()
                next_at += self._interval
                self._halt.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        """Stop after the current sample."""
        self._halt.set()
        if self.is_alive():
            self.join(10)
        for probe in self._probes.values():
            close = getattr(probe, "close", None)
            if close is not None:
                close()
