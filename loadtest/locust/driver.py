"""A Locust process's share of the load: its users, its simulator (``loadtest.locust.feeder``) and its request events.

Every Locust process that runs users (the only one, or each worker) has one ``ProcessSide``. Its users join
and leave it (``loadtest/locust/locustfile.py``'s ``SensorLoad``); once the run tells it which sensors are its own
(``assign``) it starts a feeder for them and keeps the feeder's load at what its users make
(``loadtest.locust.fleetplan.process_factor``), unless an incident asked for another load.

The feeder reports publish acknowledgements as a histogram once a second. They become Locust request events
(``kafka`` / ``publish ack``), one per bucket of Locust's own rounding of response times, each carrying the
number of messages it stands for in its context; ``count_aggregated`` adds the rest to Locust's statistics.
So at 20,000 msg/s Locust handles tens of events a second, not twenty thousand, and its statistics still
count every message.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gevent.event import Event
from locust.stats import StatsError, bucket_response_time

from loadtest.errors import HarnessError
from loadtest.locust.feeder import FeederConfig
from loadtest.locust.fleetplan import process_factor
from loadtest.locust.lines import Child
from loadtest.run.controls import Control, SetLoad, StopFeeding, to_wire

log = logging.getLogger(__name__)

REQUEST_TYPE = "kafka"
ACK_NAME = "publish ack"


def count_aggregated(environment: Any) -> Any:
    """A ``request`` listener that counts the messages an aggregated event stands for, beyond the first.

    Locust logs each event once; an event whose context says ``messages: n`` stands for ``n`` messages with
    the same response time (or the same error), so the other ``n - 1`` are added to its entry and the total
    here, in the fields Locust's own ``log`` and ``log_error`` update.
    """

    def listener(
        request_type: str,
        name: str,
        response_time: float,
        response_length: int,
        exception: Any = None,
        context: Mapping[str, Any] | None = None,
        **_: Any,
    ) -> None:
        extra = int((context or {}).get("messages", 1)) - 1
        if extra <= 0:
            return
        stats = environment.stats
        second = int(time.time())
        for entry in (stats.get(name, request_type), stats.total):
            entry.num_requests += extra
            entry.num_reqs_per_sec[second] += extra
            entry.total_content_length += response_length * extra
            if response_time is not None:
                entry.total_response_time += response_time * extra
                entry.response_times[bucket_response_time(response_time)] += extra
            if exception is not None:
                entry.num_failures += extra
                entry.num_fail_per_sec[second] += extra
        if exception is not None:
            error = stats.errors.get(StatsError.create_key(request_type, name, exception))
            if error is not None:
                error.occurrences += extra

    return listener


def fire_acks(environment: Any, acks: list[list[Any]], failures: list[list[Any]]) -> int:
    """Request events for a feeder's report: one per bucket of publish time, one per error; returns events fired."""
    buckets: Counter[int] = Counter()
    for ms, n in acks:
        buckets[bucket_response_time(ms)] += int(n)
    fired = 0
    for ms, n in sorted(buckets.items()):
        environment.events.request.fire(
            request_type=REQUEST_TYPE,
            name=ACK_NAME,
            response_time=ms,
            response_length=0,
            exception=None,
            context={"messages": n},
        )
        fired += 1
    for error, n in failures:
        environment.events.request.fire(
            request_type=REQUEST_TYPE,
            name=ACK_NAME,
            response_time=None,
            response_length=0,
            exception=RuntimeError(str(error)),
            context={"messages": int(n)},
        )
        fired += 1
    return fired


class ProcessSide:
    """A Locust process's users, its feeder once assigned, and the feeder's latest report.

    Parameters
    ----------
    environment
        The Locust environment (its events receive the request events).
    """

    def __init__(self, environment: Any, kafka_settings: Mapping[str, str] | None = None) -> None:
        self.environment = environment
        #: This process's own librdkafka settings (its --kafka-config): where a worker's secrets come from.
        self.kafka_settings = dict(kafka_settings or {})
        self.users = 0
        self.part = ""
        self.share = 1.0
        self.users_per_x = 10.0
        self.rate = 1.0
        self.override: float | None = None  # a load incident's total load, while it lasts
        self.feeder: Child | None = None
        self.stats: dict[str, Any] = {}
        self.faults: dict[str, Any] = {}
        self.errors: list[str] = []
        self.done = Event()
        self._factor: float | None = None

    # ------------------------------------------------------------------------------------------- users

    def join(self) -> None:
        """A user started."""
        self.users += 1
        self._apply()

    def leave(self) -> None:
        """A user stopped."""
        self.users = max(0, self.users - 1)
        self._apply()

    def factor(self) -> float:
        """The load factor this process's simulator should run at now."""
        if self.override is not None:
            return max(self.override * self.share, process_factor(0, self.users_per_x, self.rate))
        return process_factor(self.users, self.users_per_x, self.rate)

    def _apply(self) -> None:
        factor = self.factor()
        if self.feeder is not None and factor != self._factor:
            self._factor = factor
            self.feeder.send_message(to_wire(SetLoad(factor)))

    # ------------------------------------------------------------------------------------------ feeder

    @property
    def running(self) -> bool:
        """Whether a feeder runs."""
        return self.feeder is not None and not self.feeder.exited.is_set()

    def assign(self, assignment: Mapping[str, Any]) -> None:
        """Start the feeder for the sensors this process owns (``Conductor.assignment`` says which)."""
        if self.running:
            log.warning("%s: a feeder already runs; ignoring another assignment", self.part)
            return
        self.part = str(assignment["part"])
        self.share = float(assignment["share"])
        self.users_per_x = float(assignment["users_per_x"])
        self.rate = float(assignment["rate"])
        self.override = None
        self.stats, self.faults, self.errors = {}, {}, []
        self.done = Event()
        simulator = dict(assignment["simulator"])
        simulator["load_factor"] = self.factor()
        self._factor = simulator["load_factor"]
        run_dir = Path(assignment["run_dir"])
        config = FeederConfig(
            simulator=simulator,
            bootstrap=str(assignment["bootstrap"]),
            kafka_settings=self.settings_for(assignment),
            run_dir=str(run_dir),
        )
        path = config.write(run_dir / "feeder.json")
        self.feeder = Child("loadtest.locust.feeder", [str(path)], self._on_event, run_dir / "feeder.log")
        log.info("%s: simulator started (pid %d) in %s", self.part, self.feeder.pid, run_dir)
        self._apply()  # users that joined while it was starting

    def settings_for(self, assignment: Mapping[str, Any]) -> dict[str, str]:
        """The feeder's librdkafka settings: the assignment's, with the secrets it names from our own settings.

        A master sends the names of the cluster's secret settings, never their values (its assignments cross
        the network in clear); a worker takes the values from its own ``--kafka-config``.

        Raises
        ------
        HarnessError
            Naming the secrets this process was not given.
        """
        settings = dict(assignment.get("kafka_settings") or {})
        names = [str(n) for n in assignment.get("kafka_secrets") or []]
        missing = [n for n in names if n not in settings and n not in self.kafka_settings]
        if missing:
            raise HarnessError(
                f"{self.part}: the cluster needs {', '.join(missing)}, which the master never sends over the network: "
                "start this worker with --kafka-config FILE holding them (a copy of the master's file, mode 0600)"
            )
        settings.update({n: self.kafka_settings[n] for n in names if n not in settings})
        return settings

    def control(self, control: Control) -> None:
        """Set or clear the load an incident asked for (``SetLoad``), or pass any other control to the feeder."""
        if isinstance(control, SetLoad):
            self.override = control.factor
            self._apply()
        elif self.feeder is not None:
            self.feeder.send_message(to_wire(control))

    def stop(self, timeout: float = 120.0) -> None:
        """Stop the feeder: it closes its sessions, flushes and writes its ledger; wait until it has."""
        feeder = self.feeder
        if feeder is None:
            return
        feeder.send_message(to_wire(StopFeeding()))
        feeder.end(timeout)
        self.feeder = None

    def _on_event(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "stats":
            self.stats = dict(event.get("stats") or {})
            self.faults = dict(event.get("faults") or {})
            fire_acks(self.environment, event.get("acks") or [], event.get("failures") or [])
        elif kind == "done":
            self.done.set()
        elif kind == "error":
            message = str(event.get("message"))
            self.errors.append(message)
            log.error("%s simulator: %s", self.part, message)
