"""The running system as incidents see it: simulator, pipeline process, broker and checkpoint of one run.

``RunStage`` implements ``loadtest.gameday.incidents.Stage`` for the runner. It also remembers whether the pipeline is
down on purpose (an incident killed or stopped it), so the runner can tell a pipeline that an incident took
down from one that stopped on its own. The broker is controlled through ``LocalControl`` (the local
broker's own methods) or ``CommandControl`` (commands a user gives for a real cluster).
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from loadtest.errors import HarnessError
from loadtest.gameday.incident import BrokerControl, ClusterControl
from loadtest.run.cluster import LocalWorkers
from loadtest.run.processes import PipelineProcess
from loadtest.run.profile import PipelineSettings, Profile
from simulator.config import FaultConfig
from sotw.broker import LocalBroker, PartitionState
from sotw.errors import SotwError
from sotw.network import Network

log = logging.getLogger(__name__)


class LocalControl:
    """``BrokerControl`` over a broker the harness started (``sotw.broker.local_broker``).

    For a broker of several nodes it is the ``ClusterControl`` of node incidents too.
    """

    def __init__(self, broker: LocalBroker) -> None:
        self.broker = broker

    @property
    def cluster(self) -> ClusterControl | None:
        """Itself when the broker has several nodes."""
        return self if len(self.broker.node_ids) > 1 else None

    @property
    def network(self) -> Network | None:
        """The network the nodes (and the pipeline) are hosts of, for a run with ``--netns``."""
        return self.broker.network

    @property
    def node_ids(self) -> list[int]:
        """The nodes' ids."""
        return self.broker.node_ids

    def partitions(self) -> list[PartitionState]:
        """Every partition but the internal topics', as the metadata shows it now."""
        return self.broker.partitions()

    def under_replicated(self) -> int:
        """Partitions of every topic with fewer replicas in sync than assigned."""
        return len(self.broker.under_replicated())

    def active_controller(self) -> int | None:
        """The node leading the controller quorum now (None during an election)."""
        return self.broker.active_controller()

    @property
    def down_nodes(self) -> list[int]:
        """Nodes stopped by an incident and not started again."""
        return self.broker.down_nodes

    def stop_node(self, node: int, kill: bool) -> None:
        """Stop one node (SIGKILL with ``kill``, else a controlled shutdown)."""
        self._act(lambda: self.broker.stop_node(node, kill=kill))

    def start_node(self, node: int) -> None:
        """Start a stopped node; return once it serves."""
        self._act(lambda: self.broker.start_node(node))

    def pause_node(self, node: int) -> None:
        """SIGSTOP one node."""
        self._act(lambda: self.broker.pause(node))

    def resume_nodes(self) -> None:
        """SIGCONT every frozen node."""
        self.broker.resume()

    def restore(self) -> None:
        """Thaw what is frozen, start what is stopped."""
        self.broker.resume()
        if self.broker.down_nodes:
            self._act(lambda: self.broker.start_node(None))

    def _act(self, action: Callable[[], None]) -> None:
        try:
            action()
        except SotwError as exc:
            raise HarnessError(str(exc)) from None

    def pause(self) -> None:
        """SIGSTOP the broker."""
        self.broker.pause()

    def resume(self) -> None:
        """SIGCONT the broker."""
        self.broker.resume()

    def restart(self, downtime_s: float, lose_data: bool) -> None:
        """Restart the broker: gracefully when it keeps its data, as a crash when it loses it."""
        try:
            self.broker.restart(downtime_s=downtime_s, kill=lose_data, lose_data=lose_data)
        except SotwError as exc:
            raise HarnessError(str(exc)) from None


@dataclass(frozen=True)
class BrokerCommands:
    """Shell commands that stop, start, freeze and thaw a real cluster's broker (``--broker-*-cmd``)."""

    stop: str | None = None
    start: str | None = None
    pause: str | None = None
    resume: str | None = None


class CommandControl:
    """``BrokerControl`` for a cluster the harness did not start: it runs the commands the user gave."""

    def __init__(self, commands: BrokerCommands) -> None:
        self.commands = commands

    @property
    def cluster(self) -> ClusterControl | None:
        """None: single nodes of a cluster given by commands are out of reach."""
        return None

    @property
    def network(self) -> Network | None:
        """None: a cluster given by commands is on a network sotw does not own."""
        return None

    def _run(self, which: str) -> None:
        text = getattr(self.commands, which)
        if not text:
            raise HarnessError(
                f"this incident needs --broker-{which}-cmd for a cluster given with --bootstrap"
            )
        done = subprocess.run(shlex.split(text), capture_output=True, text=True, check=False, timeout=300)
        if done.returncode != 0:
            raise HarnessError(f"`{text}` exited with {done.returncode}: {done.stderr.strip()[-300:]}")

    def pause(self) -> None:
        """Run the pause command."""
        self._run("pause")

    def resume(self) -> None:
        """Run the resume command."""
        self._run("resume")

    def restart(self, downtime_s: float, lose_data: bool) -> None:
        """Run the stop command, wait, run the start command."""
        if lose_data:
            raise HarnessError(
                "broker_data_loss needs a local broker (its data is wiped): "
                "a cluster given with --bootstrap keeps its data"
            )
        self._run("stop")
        time.sleep(downtime_s)
        self._run("start")


class SimulatorControls(Protocol):
    """The live controls incidents use: ``simulator.producer.Simulator``'s, or a Locust run's fleet of them."""

    def set_load_factor(self, factor: float) -> None:
        """Change the load factor."""

    def set_faults(self, faults: FaultConfig, sensor: str | None = None) -> None:
        """Change fault rates."""

    def clear_faults(self, sensor: str | None = None) -> None:
        """Drop per-sensor fault rates."""

    def add_sensors(self, count: int) -> None:
        """Have ``count`` sensors join."""

    def recreate_topics(self) -> None:
        """Create the sensors' topics again."""


class RunStage:
    """The parts of one run that incidents act on (``loadtest.gameday.incidents.Stage``).

    Parameters
    ----------
    simulator
        The running simulator (or anything with its live controls).
    pipeline
        The pipeline process.
    broker
        The broker's controls, or None when the run cannot touch its broker.
    profile, load_factor
        What the run was asked for: incidents return to its load and fault rates.
    topic_prefix
        The prefix of the run's topics (node incidents choose a node by the run's partitions).
    """

    def __init__(
        self,
        simulator: SimulatorControls,
        pipeline: PipelineProcess,
        broker: BrokerControl | None,
        profile: Profile,
        load_factor: float,
        topic_prefix: str = "",
    ) -> None:
        self.simulator = simulator
        self.pipeline = pipeline
        self._broker = broker
        self.profile = profile
        self.load_factor = load_factor
        self._topic_prefix = topic_prefix
        self.pipeline_down_on_purpose = False
        self._hogs: list[subprocess.Popen[bytes]] = []
        self._spark: LocalWorkers | None = None

    @property
    def broker(self) -> BrokerControl | None:
        """The broker's controls."""
        return self._broker

    @property
    def checkpoint(self) -> Path:
        """The pipeline's checkpoint."""
        return self.pipeline.config.checkpoint

    @property
    def topic_prefix(self) -> str:
        """The prefix of the run's topics."""
        return self._topic_prefix

    @property
    def base_load_factor(self) -> float:
        """The run's own load factor."""
        return self.load_factor

    def set_load_factor(self, factor: float) -> None:
        """Change the simulator's load factor."""
        self.simulator.set_load_factor(factor)

    def set_faults(self, faults: FaultConfig | None, sensor: str | None = None) -> None:
        """Change fault rates; None gives ``sensor`` the profile's rates back."""
        if faults is None:
            self.simulator.clear_faults(sensor)
        else:
            self.simulator.set_faults(faults, sensor)

    def profile_faults(self) -> FaultConfig:
        """The profile's global fault rates."""
        return self.profile.simulator.faults

    def add_sensors(self, count: int) -> None:
        """Have ``count`` sensors join now."""
        self.simulator.add_sensors(count)

    def recreate_topics(self) -> None:
        """Have the simulator create its topics again (after the broker lost its data)."""
        self.simulator.recreate_topics()

    def kill_pipeline(self) -> None:
        """SIGKILL the pipeline's whole process tree."""
        self.pipeline_down_on_purpose = True
        self.pipeline.kill()

    def stop_pipeline(self) -> int | None:
        """A graceful stop (SIGTERM)."""
        self.pipeline_down_on_purpose = True
        return self.pipeline.stop()

    def start_pipeline(self, changes: Mapping[str, Any]) -> None:
        """Start the pipeline again on the same checkpoint and output, with ``changes`` to its settings."""
        known = {f.name for f in dataclasses.fields(PipelineSettings)}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise HarnessError(
                f"pipeline_restart: settings has no {unknown[0]!r} (pipeline settings: {', '.join(sorted(known))})"
            )
        config = self.pipeline.config
        settings = dataclasses.replace(config.settings, **changes)
        self.pipeline.config = dataclasses.replace(config, settings=settings)
        self.pipeline.start()
        self.pipeline_down_on_purpose = False

    def start_cpu_hogs(self, count: int) -> None:
        """Start ``count`` processes that each keep one core busy."""
        for _ in range(count):
            self._hogs.append(
                subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL)
            )

    def stop_cpu_hogs(self) -> None:
        """Stop every busy process."""
        while self._hogs:
            hog = self._hogs.pop()
            hog.kill()
            hog.wait(10)

    def kill_spark(self, worker: bool) -> str:
        """SIGKILL the executors (with ``worker``, the workers too) of the cluster the pipeline runs on."""
        master = self.pipeline.config.settings.master or ""
        if not master.startswith("spark://"):
            raise HarnessError(
                f"worker_kill needs the pipeline on a standalone cluster (--master spark://HOST:PORT), not {master or 'local[2]'}"
            )
        self._spark = self._spark or LocalWorkers(master)
        if worker:
            return f"{self._spark.kill_workers()} Spark worker(s) killed with their executors (SIGKILL)"
        return f"{self._spark.kill_executors()} executor JVM(s) killed (SIGKILL); the worker starts new ones"

    def restart_spark_workers(self) -> str:
        """Start the killed workers again."""
        started = self._spark.restart_workers() if self._spark else 0
        return f"{started} Spark worker(s) started again"
