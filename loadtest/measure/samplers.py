"""Once-a-second measurements of a running system, each probe a small class with ``sample() -> dict``.

The sampler thread merges the probes' readings into one row per second (``samples.jsonl``), which the report
turns into throughput, lag and resource charts. Probes read what the parts already publish (the simulator's
counters, Kafka's end offsets, the pipeline's checkpoint or its consumer group's offsets, its progress log,
commit markers or Delta log, ``/proc``), so the system under test is not slowed by being watched and need
not cooperate (a team's own job has no sotw progress log); the sampler's own CPU time is measured and
reported.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from loadtest.correctness.contracts import parquet_files
from loadtest.correctness.delta import read_commits
from pipeline.progress import input_messages
from sotw.kafka import EndOffsets, KafkaConfig
from sotw.procstats import (
    ProcessReading,
    cpu_between,
    family,
    process_cpu,
    read_processes,
    thread_cpu,
    thread_names,
)

log = logging.getLogger(__name__)


class Probe(Protocol):
    """Anything that can be read once a second."""

    def sample(self) -> dict[str, Any]:
        """Return this probe's readings, flat ``name -> number``."""
        ...


def checkpoint_position(checkpoint: Path) -> dict[tuple[str, int], int]:
    """The source offsets of the last batch the query committed: where it will read next.

    Spark writes ``offsets/<batch>`` (version line, metadata line, one line per source) before a batch and
    ``commits/<batch>`` after it; the committed batch's end offsets are the query's position. A Kafka
    source's line, sotw's or Spark's own, is ``{"topic": {"partition": offset}}``; a query with several
    sources has one line each (all are merged), and a line that is not such an object (``-`` for a source
    without offsets yet, another kind of source) is skipped.
    """
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return {}
    done = sorted(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    if not done:
        return {}
    try:
        lines = (checkpoint / "offsets" / str(done[-1])).read_text().splitlines()
    except OSError:
        return {}
    position: dict[tuple[str, int], int] = {}
    for line in lines[2:]:
        try:
            offsets = json.loads(line)
        except ValueError:
            continue
        if not isinstance(offsets, dict):
            continue
        for topic, parts in offsets.items():
            if isinstance(parts, dict):
                for part, offset in parts.items():
                    if str(part).lstrip("-").isdigit() and isinstance(offset, int):
                        position[(str(topic), int(part))] = offset
    return position


class LagSource(Protocol):
    """Where a job's position (the next offset it will read, per partition) is read from."""

    def position(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The job's position on ``partitions`` (a partition it has not started on may be absent)."""
        ...


class CheckpointLag:
    """The position of any Spark Structured Streaming query, from its checkpoint (``checkpoint_position``)."""

    def __init__(self, checkpoint: Path) -> None:
        self.checkpoint = checkpoint

    def position(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The last committed batch's end offsets."""
        return checkpoint_position(self.checkpoint)

    def describe(self) -> str:
        """For logs and the report."""
        return f"checkpoint {self.checkpoint}"


class GroupLag:
    """The position of a consumer that commits its offsets to Kafka (Kafka Streams, Flink, a plain consumer).

    Reads the group's committed offsets (OffsetFetch) with a consumer that never joins the group, so the
    job's own consumers are not rebalanced by being watched.
    """

    def __init__(self, kafka: KafkaConfig, group: str, timeout: float = 10.0) -> None:
        self.group = group
        self._consumer = kafka.consumer(**{"group.id": group, "enable.auto.commit": False})
        self._timeout = timeout

    def position(self, partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The committed offsets (a partition without one is absent)."""
        from confluent_kafka import TopicPartition

        if not partitions:
            return {}
        committed = self._consumer.committed(
            [TopicPartition(t, p) for t, p in partitions], timeout=self._timeout
        )
        return {(tp.topic, tp.partition): int(tp.offset) for tp in committed if tp.offset >= 0}

    def describe(self) -> str:
        """For logs and the report."""
        return f"consumer group {self.group}"

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()


class AppendTimes:
    """When each offset of one partition reached the broker, estimated from its end offset seen over time.

    Each end offset is kept with the first and the last time it was seen; the offsets from one end to the
    next were appended between the last time the first was seen and the first time the next was, and are
    dated by linear interpolation (the load is open-loop and steady within a second). This dates a
    partition's oldest unprocessed message without fetching it, as Kafka lag exporters estimate lag in time
    from an offset-time table. Entries the position has passed are dropped.
    """

    def __init__(self) -> None:
        self._points: deque[list[float]] = deque()  # [first seen, last seen, end offset]

    def seen(self, when: float, end: int) -> None:
        """The partition's end offset was ``end`` at ``when`` (epoch seconds)."""
        if self._points and end == self._points[-1][2]:
            self._points[-1][1] = when
        elif not self._points or end > self._points[-1][2]:
            self._points.append([when, when, end])

    def appended_at(self, offset: int) -> float | None:
        """When the record at ``offset`` was appended (epoch seconds), or None if not yet seen.

        A record below the first end seen is dated at the first sample: it was there then, and an age
        measured from it is a lower bound.
        """
        points = self._points
        while len(points) >= 2 and points[1][2] <= offset:
            points.popleft()  # the position has passed this entry for good
        if not points or points[-1][2] <= offset:
            return None
        first, _, end = points[0]
        if end > offset:
            return first
        _, since, start = points[0]
        until, _, end = points[1]
        return since + (until - since) * (offset + 1 - start) / (end - start)


class KafkaLagProbe:
    """Offsets behind the latest (total, max per partition) and the age of the oldest unprocessed message.

    The end of a partition is its high watermark (``sotw.kafka.EndOffsets``). The age is dated from the end
    offsets this probe reads anyway (``AppendTimes``), so no record is fetched.
    A partition that appears between two topic listings is dated from the earlier listing, when it did not
    exist yet.

    Parameters
    ----------
    kafka
        Cluster to read end offsets from.
    pattern
        The pipeline's topic regex.
    checkpoint
        The pipeline's checkpoint (its position), or another ``LagSource`` (``GroupLag``).
    list_every_s
        How often topics are listed again (new sensors' topics).
    report_consumed
        Also report ``consumed``, the offsets the job has passed on the run's topics (for a job without
        sotw's progress log; the run's topics are new, so they start at offset 0).

    Attributes
    ----------
    topics
        The last sample per topic: ``{topic: (offsets behind, age of its oldest unprocessed message, s)}``.
    """

    def __init__(
        self,
        kafka: KafkaConfig,
        pattern: str,
        checkpoint: Path | LagSource,
        list_every_s: float = 5.0,
        report_consumed: bool = False,
    ) -> None:
        self._regex = re.compile(pattern)
        self._source = CheckpointLag(checkpoint) if isinstance(checkpoint, Path) else checkpoint
        self._report_consumed = report_consumed
        self._ends = EndOffsets(kafka)
        self._partitions: list[tuple[str, int]] = []
        self._list_every_s = list_every_s
        self._listed: float | None = None  # epoch seconds of the last listing
        self._appended: dict[tuple[str, int], AppendTimes] = {}
        self.topics: dict[str, tuple[int, float]] = {}

    def _topic_partitions(self) -> list[tuple[str, int]]:
        now = time.time()
        if self._listed is None or now - self._listed > self._list_every_s:
            # Listed on the client the offsets are read with: its metadata cache finds new partitions' leaders.
            meta = self._ends.admin.list_topics(timeout=10)
            self._partitions = sorted(
                (name, p)
                for name, topic in meta.topics.items()
                if self._regex.fullmatch(name)
                for p in topic.partitions
            )
            for tp in self._partitions:
                if tp not in self._appended:
                    self._appended[tp] = AppendTimes()
                    if self._listed is not None:
                        self._appended[tp].seen(self._listed, 0)
            self._listed = now
        return self._partitions

    def sample(self) -> dict[str, Any]:
        """Lag totals now."""
        parts = self._topic_partitions()
        position = self._source.position(parts)
        ends = self._ends(parts)
        now = time.time()
        behind: dict[tuple[str, int], int] = {}
        oldest = now
        per_topic: dict[str, tuple[int, float]] = {}
        for tp, (low, end) in ends.items():
            at = max(position.get(tp, low), low)
            behind[tp] = max(0, end - at)
            appended = self._appended.setdefault(tp, AppendTimes())
            appended.seen(now, end)
            offsets, topic_oldest = per_topic.get(tp[0], (0, now))
            if behind[tp]:
                since = appended.appended_at(at) or now
                oldest, topic_oldest = min(oldest, since), min(topic_oldest, since)
            per_topic[tp[0]] = (offsets + behind[tp], topic_oldest)
        self.topics = {t: (n, round(now - since, 3)) for t, (n, since) in sorted(per_topic.items())}
        row = {
            "lag_offsets": sum(behind.values()),
            "lag_max_partition": max(behind.values(), default=0),
            "lag_age_s": round(now - oldest, 3),
            "topics": len({t for t, _ in parts}),
            "end_offsets_total": sum(end for _, end in ends.values()),
        }
        if self._report_consumed:
            row["consumed"] = sum(position.get(tp, 0) for tp in ends)
        return row

    def close(self) -> None:
        """Close the lag source's client, if it has one."""
        close = getattr(self._source, "close", None)
        if close is not None:
            close()


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


class CheckpointProbe:
    """Batches and the last batch's duration of any Structured Streaming query, from its checkpoint.

    Spark writes ``offsets/<batch>`` when a batch is planned and ``commits/<batch>`` when it is done, so
    the time between the two files is the batch's duration, read without the job's cooperation.
    """

    def __init__(self, checkpoint: Path) -> None:
        self._checkpoint = checkpoint

    def sample(self) -> dict[str, Any]:
        """Batches committed so far and the last one's duration."""
        commits = self._checkpoint / "commits"
        done = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
        if not done:
            return {"batches": 0}
        last = max(done)
        try:
            took = (commits / str(last)).stat().st_mtime - (
                self._checkpoint / "offsets" / str(last)
            ).stat().st_mtime
        except OSError:
            took = 0.0
        return {"batches": last + 1, "batch_duration_ms": max(0, int(took * 1000))}


class DeltaOutputProbe:
    """Rows committed to Delta tables, from their commit files (each read once).

    Parameters
    ----------
    tables
        ``{dataset: table path}``; each dataset's rows are reported as ``written_<dataset>``.
    """

    def __init__(self, tables: Mapping[str, Path]) -> None:
        self._tables = dict(tables)
        self._version = dict.fromkeys(self._tables, -1)
        self.rows = dict.fromkeys(self._tables, 0)

    def sample(self) -> dict[str, Any]:
        """Cumulative rows written per dataset."""
        for name, table in self._tables.items():
            for commit in read_commits(table, after=self._version[name]):
                self._version[name] = commit.version
                self.rows[name] += commit.rows
        return {"written_" + k: v for k, v in self.rows.items()}


class FilesOutputProbe:
    """Rows in a directory of Parquet files, and when each file was first seen (the commit time of last resort).

    ``close`` writes ``{file: first seen, epoch ms}`` to ``seen_path`` for the verifier's latency figures.
    """

    def __init__(self, root: Path, seen_path: Path, dataset: str = "changes") -> None:
        self._root = root
        self._seen_path = seen_path
        self._dataset = dataset
        self.first_seen: dict[str, int] = {}
        self.rows = 0

    def sample(self) -> dict[str, Any]:
        """Cumulative rows in the files seen so far."""
        now = int(time.time() * 1000)
        for path in parquet_files(self._root):
            name = str(path.relative_to(self._root))
            if name in self.first_seen:
                continue
            try:
                rows = pq.ParquetFile(path).metadata.num_rows
            except (OSError, ValueError, pa.ArrowException):
                continue  # still being written; next second
            self.first_seen[name] = now
            self.rows += int(rows)
        return {f"written_{self._dataset}": self.rows}

    def close(self) -> None:
        """Write the first-seen times."""
        self._seen_path.parent.mkdir(parents=True, exist_ok=True)
        self._seen_path.write_text(json.dumps(self.first_seen))


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

    Finding a tree's members means reading the parent of every process on the machine, so the members are
    looked up every ``refresh_s`` seconds and only read in between; a process that starts in between is
    counted from the next look-up on.

    Parameters
    ----------
    pids
        ``component -> callable returning the root pid, or several`` (None while the component is not
        running); a component's children (the pipeline's JVM and Python workers) are counted with it, and
        a component of several roots (the nodes of a Kafka cluster) is their sum.
    alone
        Components measured without their children (the harness, whose children are the other components).
    refresh_s
        How often each tree's members are looked up again.
    """

    def __init__(
        self,
        pids: Mapping[str, Callable[[], int | list[int] | None]],
        alone: Iterable[str] = (),
        refresh_s: float = 5.0,
    ) -> None:
        self._pids = dict(pids)
        self._alone = frozenset(alone)
        self._refresh_s = refresh_s
        self._members: dict[str, tuple[tuple[int, ...], float, list[psutil.Process]]] = {}
        self._last: dict[str, tuple[float, dict[int, ProcessReading]]] = {}

    def _family(self, name: str, roots: tuple[int, ...]) -> list[psutil.Process]:
        known = self._members.get(name)
        if known is None or known[0] != roots or time.monotonic() - known[1] > self._refresh_s:
            members = [p for root in roots for p in family(root, children=name not in self._alone)]
            known = (roots, time.monotonic(), members)
            self._members[name] = known
        return known[2]

    def sample(self) -> dict[str, Any]:
        """CPU and memory per component."""
        row: dict[str, Any] = {}
        for name, get_pid in self._pids.items():
            root = get_pid()
            roots = () if root is None else (root,) if isinstance(root, int) else tuple(root)
            now = time.monotonic()
            reading = read_processes(self._family(name, roots)) if roots else {}
            before = self._last.get(name)
            cpu = 0.0
            if before is not None and now > before[0]:
                spent = cpu_between(before[1], reading)
                # A process first seen now has no earlier reading to measure from: counted from the next.
                cpu = 100.0 * sum(v for pid, v in spent.items() if pid in before[1]) / (now - before[0])
            self._last[name] = (now, reading)
            row[f"cpu_{name}"] = round(cpu, 1)
            row[f"rss_mb_{name}"] = round(sum(r.rss for r in reading.values()) / 2**20, 1)
        return row


GROUPS = ("simulator", "sampler", "other")


class ThreadCpuProbe:
    """CPU seconds of the harness process's threads, cumulative, in groups: simulator, sampler, other.

    The simulator runs in the harness process (thread ``simulator_thread``); its ledger writer and its
    producer's librdkafka threads (``rdk:*``) start after it, so the Python and librdkafka threads first seen
    once the simulator thread runs are counted as the simulator's, except the sampler's own. librdkafka
    threads that were there before belong to the probes' Kafka clients and count as the sampler's, and so
    does the CPU of threads that lived and ended between two samples (short-lived Kafka clients, such as a
    checkpoint's or a group's position read; sample this probe last, after they are closed). A thread
    that ends keeps its group for the CPU it had at its last sample; what it spent after that is counted
    with the short-lived ones.

    Parameters
    ----------
    simulator_thread, sampler_thread
        The Python names of the simulator's and the sampler's threads.
    """

    def __init__(
        self, simulator_thread: str = "sotw-simulator", sampler_thread: str = "sotw-sampler"
    ) -> None:
        self._simulator = simulator_thread
        self._sampler = sampler_thread
        self._group: dict[int, str] = {}
        self._simulator_seen = False
        self._cpu: dict[int, float] = {}  # each live thread's CPU seconds at the last sample
        self._gone = dict.fromkeys(GROUPS, 0.0)  # CPU seconds of threads that ended, by group
        self._unseen = 0.0  # CPU seconds of ended threads never sampled (or after their last sample)
        self._classify(thread_names())

    def _classify(self, names: Mapping[int, str]) -> None:
        python = {t.native_id: t.name for t in threading.enumerate()}
        self._simulator_seen = self._simulator_seen or self._simulator in python.values()
        for tid, name in names.items():
            if tid in self._group:
                continue
            if name == self._sampler:
                group = "sampler"
            elif name.startswith("rdk:"):
                group = "simulator" if self._simulator_seen else "sampler"
            elif self._simulator_seen and tid in python and name != "MainThread":
                group = "simulator"
            else:
                group = "other"
            self._group[tid] = group

    def sample(self) -> dict[str, Any]:
        """Cumulative CPU seconds per group, and of the whole process."""
        process = process_cpu()
        cpu = thread_cpu()
        if any(tid not in self._group for tid in cpu):
            self._classify(thread_names())
        for tid in set(self._cpu) - set(cpu):
            self._gone[self._group.get(tid, "other")] += self._cpu[tid]
        self._cpu = cpu
        totals = dict(self._gone)
        for tid, seconds in cpu.items():
            totals[self._group.get(tid, "other")] += seconds
        # Threads that lived and ended between two samples are in the process's CPU but never in a listing.
        self._unseen = max(self._unseen, process - sum(totals.values()))
        totals["sampler"] += self._unseen
        return {f"threads_cpu_s_{k}": round(v, 4) for k, v in totals.items()} | {
            "threads_cpu_s_process": round(process, 4)
        }


class Sampler(threading.Thread):
    """Calls every probe once per ``interval`` seconds and keeps (and appends to ``path``) one row per call.

    A failing probe is logged and skipped for that second; it must not end the run. Each probe's CPU time
    in this thread is added up in the row as ``probe_cpu_s_<name>``.
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
        self.probe_cpu_s = dict.fromkeys(self._probes, 0.0)
        self._t0 = time.time()
        self._first = threading.Event()

    def run(self) -> None:
        """Sample until stopped."""
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with self._path.open("a") as out:
            next_at = time.monotonic()
            while not self._halt.is_set():
                row: dict[str, Any] = {
                    "t": round(time.time() - self._t0, 3),
                    "ts": time.time(),
                    "phase": self._phase(),
                }
                for name, probe in self._probes.items():
                    cpu0 = time.thread_time()
                    try:
                        row.update(probe.sample())
                    except Exception as exc:  # a probe hiccup must not end the run
                        log.debug("probe %s failed: %s", name, exc)
                    self.probe_cpu_s[name] += time.thread_time() - cpu0
                row.update({f"probe_cpu_s_{k}": round(v, 4) for k, v in self.probe_cpu_s.items()})
                self.rows.append(row)
                self._first.set()
                out.write(json.dumps(row) + "\n")
                out.flush()
                next_at += self._interval
                now = time.monotonic()
                if next_at < now:
                    # A slow sample (a broker that does not answer) must not be followed by a burst of samples
                    # catching up: skip the missed ticks, one row per interval.
                    next_at += ((now - next_at) // self._interval + 1) * self._interval
                self._halt.wait(max(0.0, next_at - now))

    def wait_first_row(self, timeout: float) -> bool:
        """Wait until the first row is taken (at most ``timeout`` seconds); True if it was."""
        return self._first.wait(timeout)

    def stop(self) -> None:
        """Stop after the current sample."""
        self._halt.set()
        if self.is_alive():
            self.join(10)
        for probe in self._probes.values():
            close = getattr(probe, "close", None)
            if close is not None:
                close()
