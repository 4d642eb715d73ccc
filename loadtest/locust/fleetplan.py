"""How a Locust run maps onto the sensor fleet: users to load, processes to sensors, and the run's settings.

One Locust **user** is a share of the profile's 1x load: ``users_per_x`` users (10 by default) make 1x, so
100 users are 10x, and a spawn rate of 10 users/s raises the load by 1x a second. Users never create
sensors: the fleet is the profile's, whatever the load, as in ``sotw run --load 10x`` (the same sensors
sending faster). Each Locust process that has users (the only one, or each worker) runs one simulator over
sensors of its own and sends at the profile's rate times its own users over ``users_per_x``; the processes'
rates add up to the whole load. With workers the fleet is split between them, each worker's sensor ids
starting at its own block of ``SENSOR_BLOCK`` (worker 0 at 0000, worker 1 at 10000, ...), so no two
processes ever write one sensor's sessions, and each writes its own ledger under ``<run>/parts/<name>``.

``LiveConfig`` is what the Locust side tells the harness process (``loadtest.locust.live``); it lives here so that
the Locust side can build it without importing the harness process's own modules.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loadtest.errors import HarnessError
from loadtest.run.job import JobSpec
from loadtest.run.profile import Profile, load_profile
from simulator.config import SimulatorConfig
from sotw.clientfiles import hand_over, take_over

#: Users that make the profile's 1x load, unless ``--users-per-x`` says otherwise.
USERS_PER_X = 10
#: Sensor ids of worker ``k`` start at ``k * SENSOR_BLOCK``.
SENSOR_BLOCK = 10_000
#: The rate a process keeps while it has no users (msg/s): its sessions stay alive and the simulator takes a
#: control within a tenth of a second (it takes them between blocks of at least one message).
IDLE_RATE = 10.0
#: How often a simulator closes its ledger file and writes its closed sessions, for the live verifier (s).
RECORD_EVERY_S = 1.0


def load_of(users: int, users_per_x: float) -> float:
    """The load factor ``users`` make."""
    return users / users_per_x


def users_for(load: float, users_per_x: float) -> int:
    """Users that make ``load`` (at least one)."""
    return max(1, round(load * users_per_x))


def process_factor(users: int, users_per_x: float, rate: float) -> float:
    """The load factor of one process's simulator: its users' share, or the idle trickle without users."""
    return max(load_of(users, users_per_x), IDLE_RATE / rate)


def part_config(profile: Profile, prefix: str, index: int, of: int, factor: float) -> SimulatorConfig:
    """The simulator of process ``index`` of ``of``: its share of the fleet, its own ids and seed.

    A lone process runs the profile's fleet exactly (same ids and seed as ``sotw run``); the run's topics
    start with ``prefix``.
    """
    sim = profile.simulator
    if sim.rate <= 0:
        raise HarnessError(
            f"profile {profile.name} has rate {sim.rate:g}: Locust users are shares of a rate, so give "
            "simulator.rate > 0"
        )
    if of <= 1:
        sensors, first, seed = sim.sensors, 0, sim.seed
    else:
        sensors = max(1, sim.sensors // of + (1 if index < sim.sensors % of else 0))
        first, seed = index * SENSOR_BLOCK, sim.seed + index
    return sim.replace(
        topic_prefix=prefix,
        sensors=sensors,
        first_sensor=first,
        seed=seed,
        load_factor=factor,
        duration_s=None,
        max_messages=None,
        record_every_s=RECORD_EVERY_S,
    )


@dataclass(frozen=True)
class LiveConfig:
    """What the harness process of a Locust session runs: the profile, the broker and the pipeline.

    Parameters
    ----------
    session_dir
        Where the session writes: the broker's and the pipeline's files, and one directory per run.
    profile, scenario
        The profile and the scenario file it is read from (None: the shipped one).
    policy, warmup_s, steady_s, min_judged, source
        Overrides of the profile's policy, phase lengths, verdict floor and Kafka reader, as ``sotw run`` takes
        them.
    bootstrap, kafka_settings
        A running cluster; None starts a local broker.
    broker
        The local broker: ``kafka`` (one Apache Kafka node) or ``kafka-3`` (``sotw.broker.BROKERS``).
    security
        The local broker's security (``sotw.broker.SECURITY_MODES``); its admin's settings reach every client
        of this process. Refused with ``bootstrap``.
    netns
        The local broker's nodes and the pipeline each in a network namespace (``loadtest.run.hostnet``), for
        the panel's network incidents. Refused with ``bootstrap``.
    job
        The job under test when it is not sotw's pipeline, or how its output is read, as ``sotw run`` takes it
        (``--pipeline-cmd``, ``--attach``, ``--contract``, ...; ``loadtest.run.job.JobSpec``): a team's
        command is started for each run, a job attached to is watched by every run.
    pipeline
        Start sotw's own pipeline, once for the session, when ``job`` has no command of its own. False with
        no ``job`` either: nothing is watched, so lag and correctness are not measured.
    tag
        Part of every topic name of the session, so sessions sharing a cluster never read each other.
    verify_every_s
        Seconds between two passes of the live verifier.
    master_pid
        The Locust process, whose CPU the samples report as the harness's.
    """

    session_dir: str
    profile: str = "baseline"
    scenario: str | None = None
    policy: str | None = None
    warmup_s: float | None = None
    steady_s: float | None = None
    min_judged: float | None = None
    source: str | None = None
    bootstrap: str | None = None
    kafka_settings: Mapping[str, str] = field(default_factory=dict)
    broker: str = "kafka"
    security: str = "plaintext"
    netns: bool = False
    job: JobSpec | None = None
    pipeline: bool = True
    tag: str = ""
    verify_every_s: float = 5.0
    master_pid: int = 0

    def load_profile(self) -> Profile:
        """The profile with this config's overrides."""
        profile = load_profile(self.profile, Path(self.scenario) if self.scenario else None)
        run = profile.run
        if self.warmup_s is not None:
            run = dataclasses.replace(run, warmup_s=self.warmup_s)
        if self.steady_s is not None:
            run = dataclasses.replace(run, steady_s=self.steady_s)
        if self.min_judged is not None:
            run = dataclasses.replace(run, min_judged=self.min_judged)
        pipeline = profile.pipeline
        if self.policy is not None:
            pipeline = dataclasses.replace(pipeline, policy=self.policy)
        if self.source is not None:
            pipeline = dataclasses.replace(pipeline, source=self.source)
        return dataclasses.replace(profile, run=run, pipeline=pipeline)

    def base_prefix(self, profile: Profile) -> str:
        """The prefix of every topic of the session."""
        return f"{profile.simulator.topic_prefix}{self.tag}-" if self.tag else profile.simulator.topic_prefix

    def write(self, path: Path) -> Path:
        """Write as JSON to ``path``; returns it.

        Secret settings stay out of the JSON: they go to a file of their own beside it (mode 0600), which
        ``read`` deletes once it has read it (``sotw.clientfiles.hand_over``).
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        data = dataclasses.asdict(dataclasses.replace(self, job=None))
        data["job"] = self.job.to_dict() if self.job is not None else None
        data["kafka_settings"], data["kafka_secrets_file"] = hand_over(
            self.kafka_settings, path.with_name(path.stem + "-secrets.properties")
        )
        path.write_text(json.dumps(data, indent=1))
        return path

    @classmethod
    def read(cls, path: Path) -> LiveConfig:
        """Read what ``write`` wrote (and delete its secrets' file)."""
        data: dict[str, Any] = json.loads(path.read_text())
        job = data.pop("job", None)
        data["kafka_settings"] = take_over(data["kafka_settings"], data.pop("kafka_secrets_file", None))
        return cls(**data, job=JobSpec.from_dict(job) if job else None)
