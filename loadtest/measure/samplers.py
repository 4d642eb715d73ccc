"""Measurements of a running system about once a second, each probe a small class with ``sample() -> dict``.

The sampler thread merges the probes' readings into one row about every second (``samples.jsonl``), which the report
turns into throughput, lag and resource charts. Probes read what the parts already publish (the simulator's
counters, Kafka's end offsets, the pipeline's checkpoint or its consumer group's offsets, its progress log,
commit markers or Delta log, ``/proc``), so the system under test is not slowed by being watched and need
not cooperate (a team's own job has no sotw progress log); the sampler's own CPU time is measured and
reported.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import psutil

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
    """Calls every probe about once per ``interval`` seconds and keeps (and appends to ``path``) one row per call.

    The gaps between rows are drawn between half and one and a half ``interval`` (from a seeded generator, so
    a run's gaps are the same each time): at a fixed second, every row would meet the pipeline's one-second
    trigger at the same point of its cycle, the lag age would read about the same all through a run, and a
    steady phase's lag figures would tell which point of the cycle the run started at rather than how far
    behind the pipeline is. Varied gaps sample the whole cycle. A failing probe is logged and skipped for that
    row; it must not end the run. Each probe's CPU time in this thread is added up in the row as
    ``probe_cpu_s_<name>``.
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
        self._gaps = random.Random(0)

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
                next_at += self._interval * self._gaps.uniform(0.5, 1.5)
                now = time.monotonic()
                if next_at < now:
                    # A slow sample (a broker that does not answer) must not be followed by a burst of samples
                    # catching up: skip the missed ticks.
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
