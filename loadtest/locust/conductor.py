"""The Locust master's (or the only Locust process's) side of a run: the harness, the fleet, the verdict.

``Conductor`` starts the harness process (``loadtest.locust.live``: broker, pipeline, sampler, live verifier,
incidents, verdict) when Locust starts, and for each Locust run:

- at the start, asks the harness for a run directory and topic prefix and tells each process with users
  which sensors are its own (``loadtest.locust.fleetplan.part_config``): itself when it runs alone, else every
  worker (custom message ``sotw:assign``);
- while it runs, passes the fleet's counters and the load its users make to the harness once a second,
  keeps what the harness measures for the web UI (``loadtest.locust.webui``), passes incidents' and the UI's
  simulator controls on to the processes, and gives the load shape its clock (the steady phase's);
- at the end, stops the simulators (each closes its sessions and writes its ledger), has the harness drain,
  settle, verify and write the verdict, and judges the run by the ``--check-*`` thresholds.

It runs on Locust's gevent and does nothing heavy itself: everything it waits for, it waits for as a
greenlet, and none of Locust's events waits in its listeners (``test_start`` asks the harness for a run and
returns; after Stop the verification goes on in a greenlet while Locust's runner is already STOPPED, and
``RunView.progress`` says how far it is). A Start while the last run is still being verified is refused
(``start_refusal``): the verdict of a run comes before the next run's load.

It stays one module over 500 lines: ``Conductor`` is one object driven by Locust's events and the harness's,
whose handlers share its state (the run under way, the parts, the greenlets that wait); split by handler, each
part would reach back into that state.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gevent
from gevent.event import AsyncResult
from locust.runners import STATE_RUNNING, STATE_SPAWNING

from loadtest.correctness.liveverify import fault_rows
from loadtest.errors import HarnessError
from loadtest.gameday.incidents import incident_from_mapping
from loadtest.locust import commands
from loadtest.locust.driver import ProcessSide
from loadtest.locust.fleetplan import load_of, part_config, users_for
from loadtest.locust.headless import add_to_html, exit_code_of, write_csvs
from loadtest.locust.lines import Child, plain
from loadtest.locust.runview import Part, RunView
from loadtest.locust.settings import LocustSettings
from loadtest.locust.shapes import Shape
from loadtest.reports.results import Results
from loadtest.run.controls import AddSensors, Control, SetFaults, SetLoad, from_wire, to_wire
from simulator.config import FAULT_KINDS, FaultConfig

log = logging.getLogger(__name__)

#: Custom messages between the master and its workers.
ASSIGN, CONTROL, STOP, STOPPED, STATS = (
    "sotw:assign",
    "sotw:control",
    "sotw:stop",
    "sotw:stopped",
    "sotw:stats",
)
#: A simulator whose last report is this much older than the newest is left out of the counters' clock.
STALE_REPORT_S = 3.0
#: Counters that add up over the processes' simulators.
_SUMMED = (
    "planned",
    "sent",
    "acked",
    "failed",
    "in_flight",
    "rate",
    "sensors",
    "sessions",
    "backpressure_waits",
)


class Conductor:
    """The master's (or lone process's) part: see the module docstring.

    Parameters
    ----------
    environment
        Locust's environment.
    settings
        The sotw options.
    side
        This process's own users and simulator when it runs users itself (no workers); None on a master.
    shape
        The load shape, if one was chosen.
    """

    def __init__(
        self, environment: Any, settings: LocustSettings, side: ProcessSide | None, shape: Shape | None
    ) -> None:
        self.env = environment
        self.settings = settings
        self.side = side
        self.shape = shape
        self.profile = settings.live.load_profile()
        self.session_dir = Path(settings.live.session_dir)
        self.live: Child | None = None
        self.ready = AsyncResult()
        self.info: dict[str, Any] = {}
        self.run: RunView | None = None
        self.results: Results | None = None
        self.parts: dict[str, Part] = {}
        self.log: deque[str] = deque(maxlen=100)
        #: The harness's answer to the last ``begin``: the run's view, or the error that refused it.
        self._announced: AsyncResult = AsyncResult()
        self._announced.set(None)
        self._forwarder: gevent.Greenlet | None = None

    # ------------------------------------------------------------------------------------------- start

    def say(self, line: str) -> None:
        """A line for the log and the UI's messages."""
        log.info("%s", line)
        self.log.append(f"{time.strftime('%H:%M:%S')} {line}")

    def start(self, timeout: float | None = None) -> None:
        """Start the harness process and wait until its broker and pipeline are ready.

        Raises
        ------
        HarnessError
            If the harness fails to start them (its message says why) or takes longer than ``timeout``.
        """
        path = self.settings.live.write(self.session_dir / "live.json")
        self.say(f"starting the harness in {self.session_dir}")
        self.live = Child("loadtest.locust.live", [str(path)], self._on_live, self.session_dir / "live.log")
        limit = timeout or self.profile.run.pipeline_start_timeout_s + 120.0
        gevent.spawn(self._watch_live)
        try:
            self.info = self.ready.get(timeout=limit)
        except gevent.Timeout:
            raise HarnessError(
                f"the harness did not start within {limit:g} s; see {self.session_dir / 'live.log'}"
            ) from None
        self.say(f"ready: broker {self.info['bootstrap']}, topics {self.info['prefix']}*")
        self._forwarder = gevent.spawn(self._forward)

    def _watch_live(self) -> None:
        assert self.live is not None
        self.live.exited.wait()
        if not self.ready.ready():
            self.ready.set_exception(
                HarnessError(f"the harness exited while starting; see {self.session_dir / 'live.log'}")
            )

    # ----------------------------------------------------------------------------------------- events

    def _on_live(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        run = self.run
        if kind == "ready":
            self.ready.set(event)
        elif kind == "starting":
            self.say(f"starting {event.get('what')}")
        elif kind == "run":
            # The run's view exists before its first phase event, which follows on the same stream.
            self.run = RunView(
                int(event["index"]), str(event["run_dir"]), str(event["prefix"]), int(time.time() * 1000)
            )
            self._assign_all()
            self._announced.set(self.run)
        elif kind == "phase" and run is not None:
            run.phase = str(event["name"])
            if run.phase == "steady":
                run.steady_started = time.monotonic()
            self.say(f"run {run.index}: {run.phase}")
        elif kind == "progress" and run is not None:
            fields = {k: v for k, v in event.items() if k not in ("event", "step", "detail")}
            run.note_progress(str(event.get("step")), str(event.get("detail") or ""), **fields)
        elif kind == "sample" and run is not None:
            run.samples.append(dict(event["row"]))
            run.topics = list(event.get("topics") or [])
        elif kind == "correctness" and run is not None:
            run.correctness = dict(event["live"])
            run.latency = list(event.get("latency") or [])
        elif kind == "fleet":
            self.fleet(event)
        elif kind in ("note", "incident"):
            self.say(str(event.get("message")))
        elif kind == "pipeline_failed" and run is not None:
            self.say(str(event.get("message")))
            gevent.spawn(self._end_runner)
        elif kind == "results" and run is not None:
            self._on_results(event)
        elif kind == "error":
            message = str(event.get("message"))
            self.say(f"harness error: {message}")
            if event.get("fatal") and not self.ready.ready():
                self.ready.set_exception(HarnessError(message))
            failed = commands.OPS.get(str(event.get("op")))  # the command the error is about, if any
            if failed is commands.Begin and not self._announced.ready():
                self._announced.set_exception(HarnessError(message))
                self.say("the run did not start: stopping Locust's users")
                gevent.spawn(self.env.runner.stop)
            elif failed is commands.Finish and run is not None and not run.finished.is_set():
                # The verification failed: the UI says so (and why) instead of waiting for a verdict.
                run.error = message
                run.phase = "failed"
                run.finished.set()

    def _end_runner(self) -> None:
        runner = self.env.runner
        if self.settings.headless:
            runner.quit()
        else:
            runner.stop()

    def _on_results(self, event: Mapping[str, Any]) -> None:
        run = self.run
        assert run is not None
        run.verdict = dict(event)
        try:
            self.results = Results.from_json(Path(str(event["results"])))
        except (OSError, ValueError) as exc:
            self.say(f"cannot read the results: {exc}")
            self.results = None
        run.gate_failures = self.settings.gates.failures(self.results)
        self.say(f"run {run.index}: {event.get('verdict')}; report {event.get('report')}")
        for failure in run.gate_failures:
            self.say(f"threshold: {failure}")
        run.phase = "done"
        run.note_progress("done", f"verdict {event.get('verdict')}")
        run.finished.set()

    # ------------------------------------------------------------------------------------------ a run

    def start_refusal(self) -> str | None:
        """Why a new run cannot start now (the last one has no verdict yet), or None if it can.

        A start while Locust runs changes the running run's users (the UI's Edit): never refused.
        """
        runner = self.env.runner
        if runner is not None and runner.state in (STATE_RUNNING, STATE_SPAWNING):
            return None
        if not self._announced.ready():
            return "the last Start is still being set up by the harness; try again in a moment"
        run = self.run
        if run is None or run.finished.is_set():
            return None
        step = run.progress.get("step") or "stopping the simulators"
        where = f"{step}: {run.progress['detail']}" if run.progress.get("detail") else step
        return (
            f"run {run.index} is still being verified after its stop ({where}); "
            "start the next run once its verdict shows in the Correctness tab"
        )

    def begin(self) -> None:
        """A Locust run starts: ask the harness for a run directory and topics, and return at once.

        The harness answers with a ``run`` event, which gives every process its sensors (users that start
        before then join their process's simulator as it starts). Nothing here waits: this is Locust's
        ``test_start`` listener, and a Stop must find the run started.
        """
        if self.live is None:
            raise HarnessError("the harness is not running")
        refusal = self.start_refusal()
        if refusal is not None:
            # The UI's Start is refused before it gets here (loadtest.locust.webui); any other start is stopped.
            self.say(f"Start refused: {refusal}")
            gevent.spawn(self.env.runner.stop)
            return
        self.results = None
        self._announced = AsyncResult()
        self.live.send_message(commands.to_wire(commands.Begin()))

    def _assign_all(self) -> None:
        """The harness announced a run: sensors for every process (this one, or every connected worker)."""
        assert self.run is not None
        self.parts = {}
        runner = self.env.runner
        if self.side is not None:
            self._assign(Part("local", None), 0, 1)
        else:
            workers = sorted(c.id for c in runner.clients.all if c.state != "missing")
            for client_id in workers:
                self._assign_worker(client_id, len(workers))
        self.say(f"run {self.run.index} started in {self.run.run_dir}: {len(self.parts)} simulator(s)")

    def _assign_worker(self, client_id: str, of: int) -> None:
        index = int(self.env.runner.get_worker_index(client_id))
        self._assign(Part(f"worker-{index}", client_id), index, of)

    def worker_joined(self, client_id: str) -> None:
        """A worker connected while a run goes on: it gets sensors of its own too."""
        run = self.run
        if run is None or run.finishing or any(p.client_id == client_id for p in self.parts.values()):
            return
        self._assign_worker(client_id, max(1, len(self.parts)))

    def assignment(self, name: str, index: int, of: int) -> dict[str, Any]:
        """What process ``index`` of ``of`` runs: its simulator, where, and its share of the fleet."""
        assert self.run is not None
        config = part_config(self.profile, self.run.prefix, index, of, 1.0)
        return {
            "part": name,
            "share": config.sensors / self.profile.simulator.sensors,
            "users_per_x": self.settings.users_per_x,
            "rate": self.profile.simulator.rate,
            "simulator": config.to_dict(),
            "bootstrap": self.info["bootstrap"],
            # Over the network a worker is told which secrets the cluster needs, never their values: it has
            # them from its own --kafka-config (ProcessSide.assign).
            "kafka_settings": self.info.get("kafka_settings") or {},
            "kafka_secrets": self.info.get("kafka_secrets") or [],
            "run_dir": str(Path(self.run.run_dir) / "parts" / name),
        }

    def _assign(self, part: Part, index: int, of: int) -> None:
        self.parts[part.name] = part
        assignment = self.assignment(part.name, index, of)
        if part.client_id is None:  # this process: its own settings, secrets included, never on the wire
            assert self.side is not None
            self.side.assign({**assignment, "kafka_settings": dict(self.settings.live.kafka_settings)})
        else:
            self.env.runner.send_message(ASSIGN, assignment, client_id=part.client_id)

    def worker_stats(self, client_id: str, data: Mapping[str, Any]) -> None:
        """A worker's simulator counters (custom message ``sotw:stats``)."""
        part = self.parts.get(str(data.get("part")))
        if part is not None and part.client_id == client_id:
            part.stats = dict(data.get("stats") or {})
            part.faults = dict(data.get("faults") or {})
            part.users = int(data.get("users") or 0)

    def worker_stopped(self, client_id: str, data: Mapping[str, Any]) -> None:
        """A worker's simulator has ended and written its ledger (custom message ``sotw:stopped``)."""
        part = self.parts.get(str(data.get("part")))
        if part is not None:
            part.stopped.set()

    def users_load(self) -> float:
        """The load the users make now."""
        return load_of(int(self.env.runner.user_count), self.settings.users_per_x)

    def fleet_stats(self) -> dict[str, Any]:
        """The fleet's counters: every process's simulator's, added up."""
        if self.side is not None and "local" in self.parts:
            self.parts["local"].stats = self.side.stats
            self.parts["local"].faults = self.side.faults
        total: dict[str, Any] = dict.fromkeys(_SUMMED, 0)
        faults = dict.fromkeys(FAULT_KINDS, 0)
        lateness: list[float] = []
        for part in self.parts.values():
            for key in _SUMMED:
                total[key] += part.stats.get(key) or 0
            for kind, n in (part.stats.get("faults") or {}).items():
                faults[kind] = faults.get(kind, 0) + int(n)
            if part.stats.get("lateness_p99_ms") is not None:
                lateness.append(float(part.stats["lateness_p99_ms"]))
        total["faults"] = faults
        total["lateness_p99_ms"] = max(lateness) if lateness else None
        # When the counters were read: they reach the harness a hop or two later, which a rate must not count.
        # Only simulators still reporting count: a stopped or silent one's counters stand still, not its clock.
        stamps = (p.stats.get("taken_s") for p in self.parts.values() if not p.stopped.is_set())
        taken = [float(t) for t in stamps if t is not None]
        fresh = [t for t in taken if t >= max(taken, default=0.0) - STALE_REPORT_S]
        total["taken_s"] = sum(fresh) / len(fresh) if fresh else None
        return total

    def _forward(self) -> None:
        """Once a second: the fleet's counters and the users' load to the harness."""
        while self.live is not None and not self.live.exited.is_set():
            run = self.run
            if run is not None and not run.finished.is_set():
                pids = [self.side.feeder.pid] if self.side is not None and self.side.feeder else []
                fleet = commands.UpdateFleet(
                    self.users_load(), int(self.env.runner.user_count), self.fleet_stats(), tuple(pids)
                )
                self.live.send_message(commands.to_wire(fleet))
            gevent.sleep(1.0)

    # -------------------------------------------------------------------------------------- controls

    def fleet(self, command: Mapping[str, Any]) -> None:
        """A simulator control (from an incident, or the UI) for every process's simulator."""
        control = from_wire(command)
        if isinstance(control, SetLoad) and control.factor is not None:
            # Back to what the users make: no override. Anything else holds until the incident ends it.
            same = abs(control.factor - self.users_load()) < 1e-9
            self._to_parts(SetLoad(None) if same else control)
        elif isinstance(control, AddSensors):
            names = list(self.parts) or ["local"]
            each, extra = divmod(control.count, len(names))
            for i, name in enumerate(names):
                if each + (i < extra):
                    self._to_part(name, AddSensors(each + (i < extra)))
        else:
            self._to_parts(control)

    def _to_part(self, name: str, control: Control) -> None:
        part = self.parts.get(name)
        if part is None:
            return
        if part.client_id is None:
            assert self.side is not None
            self.side.control(control)
        else:
            self.env.runner.send_message(CONTROL, to_wire(control), client_id=part.client_id)

    def _to_parts(self, control: Control) -> None:
        for name in self.parts:
            self._to_part(name, control)

    def set_faults(self, rates: Mapping[str, Any]) -> FaultConfig:
        """Change every simulator's default fault rates now (the UI's control); returns them.

        Raises
        ------
        SimulatorError
            If a rate is not a number between 0 and 1 (the message names it).
        """
        base = dataclasses.asdict(self.profile.simulator.faults)
        faults = FaultConfig.from_mapping({**base, **{k: float(v) for k, v in rates.items()}})
        self._to_parts(SetFaults(faults))
        shown = ", ".join(
            f"{k}={getattr(faults, k):g}" for k in ("gap", "duplicate", "delayed", "malformed", "abandon")
        )
        self.say(f"fault rates set from the UI: {shown}")
        return faults

    def fire(self, spec: Mapping[str, Any]) -> None:
        """Start an incident now (the UI's control).

        Raises
        ------
        HarnessError
            If no run goes on, or the incident's kind or parameters are wrong (named).
        """
        incident_from_mapping({**spec, "at_s": 0.0}, where="incident")  # refused here, with its reason
        if self.live is None or self.run is None or self.run.finishing:
            raise HarnessError("incidents need a run going on: start one first")
        self.live.send_message(commands.to_wire(commands.FireIncident(dict(spec))))
        self.say(f"incident {spec.get('kind')} fired from the UI")

    # ---------------------------------------------------------------------------------------- shape

    def shape_tick(self) -> tuple[int, float] | None:
        """The users the shape asks for now and how fast to get there; None once it is over."""
        shape = self.shape
        if shape is None:
            return None
        run = self.run
        load: float | None = shape.first_load
        if run is not None and run.steady_started is not None:
            load = shape.load_at(time.monotonic() - run.steady_started)
        if load is None:
            return None
        users = users_for(load, self.settings.users_per_x)
        return users, float(max(1, users))  # every change within about a second

    # ------------------------------------------------------------------------------------------- end

    def stopping(self) -> None:
        """Locust is about to stop the users: the run's load is the one they made until now.

        The harness takes its commands in order, so a run it has not announced yet gets this too.
        """
        pending = not self._announced.ready()
        if self.live is not None and (pending or (self.run is not None and not self.run.finishing)):
            self.live.send_message(commands.to_wire(commands.StopLoad()))

    def finish(self, interrupted: bool = False, wait: bool = True) -> None:
        """The run is over: stop the simulators, then drain, settle and verify (in the harness).

        With ``wait`` it returns once the verdict is in (a headless run's outputs need it); without, once
        the harness has been told to verify, while ``RunView.progress`` follows it. Either way it runs in a
        greenlet of its own or in a headless run's end, never while Locust's runner waits for it.
        """
        try:
            self._announced.get(timeout=self._begin_limit())  # a run that was starting: its view first
        except (HarnessError, gevent.Timeout):
            self.say("the harness did not start the run: there is nothing to verify")
            return
        run = self.run
        if run is None or self.live is None:
            return
        if run.finishing:
            if wait:
                run.finished.wait(self._finish_limit())
            return
        self.stopping()
        run.finishing = True
        run.stopped_ms = int(time.time() * 1000)
        run.note_progress(
            "stopping the simulators", "each closes its sessions, flushes and writes its ledger"
        )
        self.say(f"run {run.index}: stopping the simulators")
        self._stop_parts()
        run.note_progress("drain", "the simulators have stopped; the harness drains the pipeline")
        self.live.send_message(commands.to_wire(commands.Finish(interrupted, self.settings.command)))
        if wait:
            if not run.finished.wait(self._finish_limit()):
                self.say("the verdict did not come in time")

    def _begin_limit(self) -> float:
        """How long the harness may take to announce a run: a team's job starts first (``--pipeline-cmd``)."""
        return self.profile.run.pipeline_start_timeout_s + 60.0

    def _finish_limit(self) -> float:
        p = self.profile
        return (
            p.run.drain_max_s + (p.pipeline.session_timeout_ms + 3 * p.pipeline.trigger_ms) / 1000.0 + 600.0
        )

    def _stop_parts(self) -> None:
        waits = []
        for part in self.parts.values():
            if part.client_id is None:
                assert self.side is not None
                self.side.stop()
                part.stopped.set()
            else:
                self.env.runner.send_message(STOP, {"part": part.name}, client_id=part.client_id)
                waits.append(part.stopped)
        deadline = time.monotonic() + self.profile.simulator.flush_timeout_s + 60.0
        for stopped in waits:
            if not stopped.wait(max(0.0, deadline - time.monotonic())):
                self.say("a worker's simulator did not report its end in time; verifying without waiting")
                break
        if self.side is not None:
            self.parts.get("local", Part("local", None)).stats = self.side.stats

    def quit(self) -> None:
        """Locust is quitting: finish a run still going, write sotw's outputs, set the exit code, stop the harness."""
        try:
            self._announced.get(
                timeout=self._begin_limit()
            )  # a run that was starting is finished like any other
        except (HarnessError, gevent.Timeout):
            pass
        if self.run is not None and not self.run.finished.is_set():
            self.finish(interrupted=not self.run.finishing, wait=True)
        self.write_outputs()
        if self.run is not None and self.settings.gates.any:
            failures = (
                self.run.gate_failures if self.results is not None else self.settings.gates.failures(None)
            )
            if failures:
                self.env.process_exit_code = exit_code_of(failures, self.results)
        if self.live is not None:
            self.live.send_message(commands.to_wire(commands.Quit()))
            self.live.end(timeout=120.0)
            self.live = None
        # The harness deletes its secrets' file once read; one it never read goes now (LiveConfig.write).
        (self.session_dir / "live-secrets.properties").unlink(missing_ok=True)

    # ------------------------------------------------------------------------------------- outputs

    def write_outputs(self) -> None:
        """Write the run's figures beside Locust's ``--csv`` files, and into its ``--html`` report."""
        results, run = self.results, self.run
        if results is None or run is None:
            return
        if self.settings.csv_prefix:
            write_csvs(results, Path(run.run_dir), run.latency, self.settings.csv_prefix)
        if self.settings.html_file and Path(self.settings.html_file).is_file():
            report = Path(run.verdict["report"]) if run.verdict.get("report") else None
            add_to_html(Path(self.settings.html_file), results, run.topics, run.latency, report)

    # ------------------------------------------------------------------------------------------- UI

    def state(self) -> dict[str, Any]:
        """Everything the web UI shows, JSON-ready."""
        run = self.run
        fleet = self.fleet_stats()
        users = int(self.env.runner.user_count) if self.env.runner is not None else 0
        load = self.users_load() if self.env.runner is not None else 0.0
        faults_now = next((p.faults for p in self.parts.values() if p.faults), {})
        out: dict[str, Any] = {
            "profile": {
                "name": self.profile.name,
                "rate": self.profile.simulator.rate,
                "sensors": self.profile.simulator.sensors,
                "policy": self.profile.pipeline.policy,
                "faults": dataclasses.asdict(self.profile.simulator.faults),
            },
            "users_per_x": self.settings.users_per_x,
            "shape": self.shape.name if self.shape else None,
            "users": users,
            "load": load,
            "target_rate": load * self.profile.simulator.rate,
            "fleet": fleet,
            "faults_now": faults_now,
            "parts": {n: {"users": p.users, "sent": p.stats.get("sent", 0)} for n, p in self.parts.items()},
            "log": list(self.log),
            "incident_kinds": INCIDENT_DEFAULTS,
            "run": None,
        }
        if run is not None:
            out["run"] = {
                "index": run.index,
                "run_dir": run.run_dir,
                "prefix": run.prefix,
                "phase": run.phase,
                "samples": list(run.samples),
                "topics": run.topics,
                "latency": run.latency,
                "correctness": run.correctness,
                "faults": fault_rows(run.correctness, fleet["faults"]),
                "verdict": run.verdict,
                "verification": run.verification(),
                "gate_failures": run.gate_failures,
            }
        return dict(plain(out))


#: The incidents the UI offers, with the parameters it starts from (``loadtest.gameday.incidents`` has them all).
INCIDENT_DEFAULTS: dict[str, dict[str, Any]] = {
    "pipeline_kill": {"restart_after_s": 5.0},
    "broker_pause": {"duration_s": 10.0},
    "load": {"factor": 3.0, "duration_s": 20.0},
    "sensor_storm": {"sensors": 10},
    "pipeline_restart": {"downtime_s": 2.0},
    "broker_restart": {"downtime_s": 5.0},
    "cpu_hog": {"duration_s": 20.0, "cores": 1},
    "checkpoint_stall": {"duration_s": 10.0},
    # On a session started with --netns (loadtest.gameday.network_incidents):
    "partition": {"side_a": "pipeline", "side_b": "brokers", "duration_s": 30.0},
    "flaky_link": {"percent": 5, "hosts": "all", "duration_s": 30.0},
    "link_cap": {"host": "pipeline", "rate": "1mbit", "duration_s": 30.0},
}
