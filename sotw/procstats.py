"""CPU time and resident memory of process trees, and CPU time of this process's threads, via psutil.

The pipeline's progress log (memory of its driver, JVM and Python workers), the load-test harness (CPU and
memory of the broker, the pipeline and itself, and its own threads' CPU) and the benchmarks ask the same
questions of ``/proc``; they are answered here once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

KINDS = ("broker", "jvm", "python_source_planner", "python_workers", "driver_python")


@dataclass(frozen=True)
class ProcessReading:
    """One process at one moment: its kind (see ``kind_of``), CPU seconds so far (user + system), RSS bytes."""

    pid: int
    kind: str
    cpu_s: float
    rss: int


def kind_of(cmdline: Sequence[str]) -> str:
    """What a process of the system is, from its command line: one of ``KINDS``.

    A broker is a JVM running Kafka's main class ``kafka.Kafka`` (anywhere in the line: the JVM's options come
    first); Spark's JVM is ``java``; Spark's Python processes are its streaming source planner and its
    workers (``pyspark.daemon``); anything else is a driver (``sotw pipeline``, a benchmark).
    """
    text = " ".join(cmdline[:6])
    if "kafka.Kafka" in cmdline:
        return "broker"
    if "java" in text:
        return "jvm"
    if "streaming_source_runner" in text or "data_source" in text:
        return "python_source_planner"
    if "pyspark" in text:
        return "python_workers"
    return "driver_python"


def family(pid: int | None = None, children: bool = True) -> list[psutil.Process]:
    """The process ``pid`` (this one by default) and, with ``children``, all its descendants; [] if gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)] if children else [root]
    except psutil.NoSuchProcess:
        return []


def read_processes(processes: Iterable[psutil.Process], kinds: bool = False) -> dict[int, ProcessReading]:
    """CPU seconds and RSS of each process still running, by pid.

    ``kinds`` classifies each process (``kind_of``): one more read of ``/proc`` per process, so off unless
    needed.
    """
    out: dict[int, ProcessReading] = {}
    for proc in processes:
        try:
            with proc.oneshot():
                times = proc.cpu_times()
                rss = proc.memory_info().rss
                kind = kind_of(proc.cmdline()) if kinds else ""
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue  # exited since it was listed
        out[proc.pid] = ProcessReading(proc.pid, kind, times.user + times.system, rss)
    return out


def read_tree(
    pid: int | None = None, children: bool = True, kinds: bool = False
) -> dict[int, ProcessReading]:
    """``read_processes`` of the tree of ``pid`` (this process by default; with its descendants)."""
    return read_processes(family(pid, children), kinds)


def rss_by_kind(reading: Mapping[int, ProcessReading]) -> dict[str, int]:
    """Resident bytes per kind of process in one ``read_tree(kinds=True)`` reading."""
    out: dict[str, int] = {}
    for r in reading.values():
        out[r.kind] = out.get(r.kind, 0) + r.rss
    return out


def cpu_between(
    before: Mapping[int, ProcessReading], after: Mapping[int, ProcessReading]
) -> dict[int, float]:
    """CPU seconds each process of ``after`` spent since ``before`` (all of it for a process started since).

    A process that exited in between is missed: its last CPU seconds are gone with it.
    """
    return {pid: r.cpu_s - (before[pid].cpu_s if pid in before else 0.0) for pid, r in after.items()}


def cpu_by_kind(
    before: Mapping[int, ProcessReading], after: Mapping[int, ProcessReading]
) -> dict[str, float]:
    """CPU seconds spent between two ``read_tree(kinds=True)`` readings, per kind of process."""
    out: dict[str, float] = {}
    for pid, cpu in cpu_between(before, after).items():
        kind = after[pid].kind
        out[kind] = out.get(kind, 0.0) + cpu
    return out


def thread_names() -> dict[int, str]:
    """Name of each thread of this process, by native id: the Python name, else the kernel's (``rdk:main``).

    Threads started by C libraries (librdkafka names its own ``rdk:main``, ``rdk:broker1``, ...) are known
    only to the kernel, which keeps their name in ``/proc/self/task/<tid>/comm``.
    """
    names: dict[int, str] = {}
    tasks = Path("/proc/self/task")
    if tasks.is_dir():
        for task in tasks.iterdir():
            try:
                names[int(task.name)] = (task / "comm").read_text().strip()
            except (OSError, ValueError):
                continue  # the thread ended while listed
    for thread in threading.enumerate():
        if thread.native_id is not None:
            names[thread.native_id] = thread.name
    return names


def thread_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of each live thread of this process, by native id."""
    return {t.id: t.user_time + t.system_time for t in psutil.Process().threads()}


def process_cpu() -> float:
    """CPU seconds (user + system) of this process, all its threads, live or ended."""
    times = psutil.Process().cpu_times()
    return times.user + times.system
