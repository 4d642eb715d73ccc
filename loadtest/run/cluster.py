"""A real Spark standalone cluster on this machine: one master and its workers, from the installed PySpark.

Users outgrow one machine by moving the pipeline to a cluster (``sotw pipeline --master spark://...``), so the
harness, the capacity measurements and the tests run it on a real one: the Master and Worker JVMs that
``spark-class`` starts, as ``sbin/start-master.sh`` would, bound to the loopback address on free ports. Every
JVM is a member of a ``sotw.processgroup.ProcessGroup``, so a crashed test or harness never leaves one
running. The workers' executors are the JVMs a game day kills (``loadtest.gameday.incidents.WorkerKill``).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from loadtest.errors import HarnessError
from sotw.broker import free_port
from sotw.processgroup import ProcessGroup, stop_process

log = logging.getLogger(__name__)

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"

# The cluster JVMs' own settings: no REST submission server (it takes the fixed port 6066) and a short
# executor-loss detection, so a killed executor is replaced in seconds rather than a minute.
_DAEMON_SETTINGS = {
    "spark.master.rest.enabled": "false",
    "spark.worker.cleanup.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
}


def spark_home() -> Path:
    """The installed PySpark's directory, which holds ``bin/spark-class`` and Spark's jars."""
    import pyspark

    return Path(pyspark.__file__).parent


@dataclass(frozen=True)
class ClusterConfig:
    """How to start a standalone cluster.

    Parameters
    ----------
    python
        The interpreter executors start Python workers with (``PYSPARK_PYTHON``): it must have sotw installed.
    base_env
        The environment the JVMs start from (``PATH`` to find ``java``, ``JAVA_HOME``); the CLI passes its
        own, and ``SPARK_HOME``, ``PYSPARK_PYTHON`` and ``SPARK_LOCAL_IP`` are set on top.
    workers
        Worker JVMs, each offering ``cores`` cores and ``memory`` to executors.
    host
        The address everything binds to.
    start_timeout_s
        How long the master and the workers may take to come up.
    home
        Spark's home; default: the installed PySpark's directory.
    """

    python: str
    base_env: Mapping[str, str] = field(default_factory=dict)
    workers: int = 1
    cores: int = 2
    memory: str = "2g"
    host: str = "127.0.0.1"
    start_timeout_s: float = 90.0
    home: Path | None = None

    def __post_init__(self) -> None:
        if self.workers < 1 or self.cores < 1:
            raise HarnessError(
                f"a standalone cluster needs at least one worker with one core, got {self.workers} x {self.cores}"
            )


class StandaloneCluster:
    """A running master and workers; use as a context manager, or ``start()`` and ``stop()``.

    Parameters
    ----------
    config
        What to start.
    work_dir
        Logs, the properties file and the workers' work directories (executors' stdout and stderr).
    """

    def __init__(self, config: ClusterConfig, work_dir: Path) -> None:
        self.config = config
        self.work_dir = work_dir
        self.home = config.home or spark_home()
        self.master_port = 0
        self.ui_port = 0
        self._group: ProcessGroup | None = None
        self.master: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes] | None] = [None] * config.workers
        self._properties = work_dir / "spark-daemon.conf"

    @property
    def master_url(self) -> str:
        """``spark://HOST:PORT`` of the master."""
        return f"spark://{self.config.host}:{self.master_port}"

    def _env(self) -> dict[str, str]:
        env = dict(self.config.base_env)
        env.update(
            SPARK_HOME=str(self.home),
            PYSPARK_PYTHON=self.config.python,
            SPARK_LOCAL_IP=self.config.host,
            SPARK_LOG_DIR=str(self.work_dir),
        )
        return env

    def _spark_class(self, cls: str, *args: str) -> list[str]:
        return [
            str(self.home / "bin" / "spark-class"),
            cls,
            *args,
            "--properties-file",
            str(self._properties),
        ]

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once every worker has registered.

        Raises
        ------
        HarnessError
            If a JVM exits while starting or the cluster is not up within ``start_timeout_s``.
        """
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self._properties.write_text("".join(f"{k} {v}\n" for k, v in _DAEMON_SETTINGS.items()))
        self._group = ProcessGroup()
        try:
            self.master_port, self.ui_port = free_port(self.config.host), free_port(self.config.host)
            self.master = self._group.spawn(
                self._spark_class(
                    MASTER_CLASS,
                    "--host",
                    self.config.host,
                    "--port",
                    str(self.master_port),
                    "--webui-port",
                    str(self.ui_port),
                ),
                self._env(),
                self.work_dir / "master.log",
            )
            for i in range(self.config.workers):
                self.start_worker(i, wait=False)
            self._wait_workers(self.config.workers)
        except BaseException:
            self.stop()
            raise
        log.info("standalone cluster up: %s, %d worker(s)", self.master_url, self.config.workers)
        return self

    def start_worker(self, index: int, wait: bool = True) -> None:
        """Start worker ``index`` (again, after ``kill_worker``); with ``wait``, until the master lists it."""
        if self._group is None or self.master is None:
            raise HarnessError("the cluster is not started")
        cfg = self.config
        work = self.work_dir / f"worker-{index}"
        work.mkdir(parents=True, exist_ok=True)
        self.workers[index] = self._group.spawn(
            self._spark_class(
                WORKER_CLASS,
                "--host",
                cfg.host,
                "--port",
                str(free_port(cfg.host)),
                "--webui-port",
                str(free_port(cfg.host)),
                "--cores",
                str(cfg.cores),
                "--memory",
                cfg.memory,
                "--work-dir",
                str(work),
                self.master_url,
            ),
            self._env(),
            self.work_dir / f"worker-{index}.log",
        )
        if wait:
            self._wait_workers(sum(1 for w in self.workers if w is not None and w.poll() is None))

    def state(self) -> dict[str, object]:
        """The master's own view (its web UI's ``/json``): workers, cores, running applications."""
        url = f"http://{self.config.host}:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 - our own master on loopback
            data: dict[str, object] = json.load(reply)
        return data

    def alive_workers(self) -> int:
        """Workers the master counts as alive."""
        try:
            return int(str(self.state().get("aliveworkers", 0)))
        except (OSError, ValueError):
            return 0

    def _wait_workers(self, count: int) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        while self.alive_workers() < count:
            for name, proc in [
                ("master", self.master),
                *[(f"worker-{i}", w) for i, w in enumerate(self.workers)],
            ]:
                if proc is not None and proc.poll() is not None:
                    raise HarnessError(
                        f"the Spark {name} exited with code {proc.returncode} while starting; see "
                        f"{self.work_dir / (name + '.log')}"
                    )
            if time.monotonic() > deadline:
                raise HarnessError(
                    f"the standalone cluster at {self.master_url} did not have {count} worker(s) within "
                    f"{self.config.start_timeout_s:g} s; see the logs in {self.work_dir}"
                )
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the workers, then the master; whatever is left of the group is killed."""
        for i, worker in enumerate(self.workers):
            if worker is not None:
                stop_process(worker, grace_s=10)
                self.workers[i] = None
        if self.master is not None:
            stop_process(self.master, grace_s=10)
            self.master = None
        if self._group is not None:
            self._group.close()
            self._group = None

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class _Killed:
    """What it takes to start a killed worker again: its command line, environment, directory and log."""

    cmdline: list[str]
    environ: dict[str, str]
    cwd: str
    pgid: int
    log: str | None


class LocalWorkers:
    """The workers of a standalone cluster whose JVMs run on this machine, found by their command lines.

    A game day kills them as a node going down would: the executors alone (the worker starts new ones), or
    the worker with its executors, started again later from the same command line, environment and
    directory, into the same process group (so the group's owner still stops it).

    Parameters
    ----------
    master_url
        ``spark://HOST:PORT``: only workers registered with this master are touched.
    """

    def __init__(self, master_url: str) -> None:
        self.master_url = master_url
        self._killed: list[_Killed] = []

    def workers(self) -> list[psutil.Process]:
        """The Worker JVMs of this master."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info.get("cmdline") or []
            if WORKER_CLASS in cmdline and self.master_url in cmdline:
                found.append(proc)
        return found

    def executors(self) -> list[psutil.Process]:
        """The executor JVMs those workers started."""
        out = []
        for worker in self.workers():
            try:
                out += [c for c in worker.children(recursive=True) if EXECUTOR_CLASS in c.cmdline()]
            except psutil.Error:
                continue
        return out

    def kill_executors(self) -> int:
        """SIGKILL every executor JVM of the master's workers; return how many there were.

        Raises
        ------
        HarnessError
            If no worker of ``master_url`` runs on this machine, or it has no executor to kill.
        """
        if not self.workers():
            raise HarnessError(f"no Spark worker of {self.master_url} runs on this machine")
        victims = self.executors()
        if not victims:
            raise HarnessError(f"the workers of {self.master_url} run no executor: is the pipeline on it?")
        for proc in victims:
            _sigkill(proc.pid)
        return len(victims)

    def kill_workers(self) -> int:
        """SIGKILL every worker JVM of the master and its executors at once; return how many workers."""
        workers = self.workers()
        if not workers:
            raise HarnessError(f"no Spark worker of {self.master_url} runs on this machine")
        for worker in workers:
            try:
                children = worker.children(recursive=True)
                self._killed.append(
                    _Killed(
                        worker.cmdline(),
                        worker.environ(),
                        worker.cwd(),
                        os.getpgid(worker.pid),
                        _log_of(worker.pid),
                    )
                )
            except (psutil.Error, OSError) as exc:
                raise HarnessError(
                    f"cannot read Spark worker {worker.pid} to restart it later: {exc}"
                ) from None
            for proc in [worker, *children]:
                _sigkill(proc.pid)
        return len(workers)

    def restart_workers(self) -> int:
        """Start the killed workers again; return how many."""
        started = 0
        while self._killed:
            spec = self._killed.pop()
            with open(spec.log or os.devnull, "ab") as out:
                try:
                    subprocess.Popen(
                        spec.cmdline, env=spec.environ, cwd=spec.cwd, stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, process_group=spec.pgid,
                    )  # fmt: skip
                except PermissionError:
                    # The group it led is gone (a worker started on its own): it leads a new one.
                    subprocess.Popen(
                        spec.cmdline, env=spec.environ, cwd=spec.cwd, stdout=out, stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL, start_new_session=True,
                    )  # fmt: skip
            started += 1
        return started


def _sigkill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _log_of(pid: int) -> str | None:
    """The file a process writes its standard output to, if it is a file."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/1")
    except OSError:
        return None
    return target if target.startswith("/") and Path(target).is_file() else None


def main(argv: list[str]) -> int:
    """``sotw cluster``: start a standalone cluster on this machine, print its master URL, stop on Ctrl-C."""
    import argparse
    import sys
    import tempfile

    p = argparse.ArgumentParser(
        prog="sotw cluster",
        description="A Spark standalone cluster on this machine (a master and workers from the installed "
        "PySpark, on loopback, free ports) until Ctrl-C; pass its --master to sotw pipeline, run or capacity.",
    )
    p.add_argument("--workers", type=int, default=1, help="worker JVMs (1)")
    p.add_argument("--cores", type=int, default=2, help="cores each worker offers (2)")
    p.add_argument("--memory", default="2g", help="memory each worker offers (2g)")
    p.add_argument("--dir", type=Path, default=None, help="logs and work directories (a temporary one)")
    args = p.parse_args(argv)
    work = args.dir or Path(tempfile.mkdtemp(prefix="sotw-cluster-"))
    config = ClusterConfig(
        python=sys.executable,
        base_env=dict(os.environ),
        workers=args.workers,
        cores=args.cores,
        memory=args.memory,
    )
    with StandaloneCluster(config, work) as cluster:
        print(
            f"cluster ready: --master {cluster.master_url}   (web UI http://{config.host}:{cluster.ui_port}, logs {work})"
        )
        print("Ctrl-C stops it", flush=True)
        try:
            while cluster.master is not None and cluster.master.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0
