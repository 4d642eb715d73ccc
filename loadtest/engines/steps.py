"""The runs each engine gets (a run per load, each drill, a capacity search), each a ``sotw`` command of its own.

Each run is the command a user would type, started as a process of its own with its own local broker: every
engine meets the same fresh cluster, no engine's topics or consumer groups are left for the next, and each
run's SparkSession (or JVM, or Python process) is its own, as the one-session-per-process rule needs.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.engines.catalog import Engine
from loadtest.errors import HarnessError
from loadtest.reports.results import Results
from sotw.processgroup import TIMED_OUT, run_limited

#: sotw's own directory: the engines' commands (``prepare``, the job's template) run from it.
ROOT = Path(__file__).resolve().parents[2]
#: How long a stopped command gets to end after SIGTERM before it is killed.
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class Plan:
    """What every engine is put through: the profile's runs at each load, the drills, optionally a capacity search."""

    profile: str = "baseline"
    scenario: Path | None = None
    loads: tuple[str, ...] = ("1x", "10x")
    drills: tuple[str, ...] = ("pipeline-kill-1x", "broker-restart")
    capacity: bool = False
    capacity_budget_s: float = 240.0
    limit_s: float = 1800.0

    def commands(self) -> tuple[str, ...]:
        """The sotw commands the plan gives an engine's args to."""
        return ("run", *(["drill"] if self.drills else []), *(["capacity"] if self.capacity else []))


def drill_name(drill: str) -> str:
    """A shipped drill's name, or a drill file's name without its directory and ``.toml``."""
    return Path(drill).stem if Path(drill).suffix else drill


@dataclass(frozen=True)
class Step:
    """One run of one engine: ``kind`` run, drill or capacity; ``what`` its load or drill name."""

    engine: Engine
    kind: str
    what: str
    directory: Path

    @property
    def label(self) -> str:
        """How the step is named in progress lines and tables: ``run 10x``, ``drill pipeline-kill-1x``."""
        if self.kind == "capacity":
            return self.kind
        return f"drill {drill_name(self.what)}" if self.kind == "drill" else f"run {self.what}"

    def argv(self, plan: Plan) -> list[str]:
        """The ``sotw`` command line of the step (this interpreter's sotw)."""
        sotw = [sys.executable, "-m", "sotw", self.kind]
        where = ["--run-dir", str(self.directory), "-q"]
        if self.kind == "drill":  # a drill names its own profile
            return [*sotw, self.what, *where, *self.engine.args]
        profile = ["--profile", plan.profile, *(["--scenario", str(plan.scenario)] if plan.scenario else [])]
        if self.kind == "run":
            return [*sotw, *profile, "--load", self.what, *where, *self.engine.args]
        budget = ["--budget", f"{plan.capacity_budget_s:g}"]
        return [*sotw, *profile, *budget, *where, *self.engine.args]


def steps(engine: Engine, plan: Plan, out_dir: Path) -> list[Step]:
    """The engine's runs in the order they run, each with its own directory under ``out_dir/ENGINE``."""
    base = out_dir / engine.name
    out = [Step(engine, "run", load, base / f"run-{load}") for load in plan.loads]
    out += [Step(engine, "drill", drill, base / f"drill-{drill_name(drill)}") for drill in plan.drills]
    if plan.capacity:
        out.append(Step(engine, "capacity", "", base / "capacity"))
    return out


def verdict_of(results: Results) -> str:
    """A run's verdict, or a drill's: its scorecard's (every expectation met), not only its run's."""
    return results.drill_verdict or results.verdict.verdict


@dataclass(frozen=True)
class Outcome:
    """What a step came to: its exit code, how long it took, its results (None if it wrote none), its log."""

    step: Step
    exit_code: int
    seconds: float
    results: Results | None
    log: Path
    problem: str = ""

    @property
    def verdict(self) -> str:
        """The step's verdict, or why it has none."""
        if self.results is None:
            return f"no results (exit {self.exit_code}{': ' + self.problem if self.problem else ''})"
        return verdict_of(self.results)

    @property
    def passed(self) -> bool:
        """PASS, with the command's own exit code saying so too."""
        return self.exit_code == 0 and self.results is not None and verdict_of(self.results) == "PASS"


def _spawn(argv: list[str], log: Path, limit_s: float) -> int:
    """Run ``argv`` from sotw's directory (``run_limited``); past ``limit_s`` it is stopped and counts as 124."""
    code = run_limited(argv, os.environ, log, limit_s, STOP_GRACE_S, cwd=ROOT)
    if code == TIMED_OUT:
        with log.open("a") as out:
            out.write(f"\ncompare-engines: stopped at the limit of {limit_s:.0f} s\n")
    return code


def prepare(engine: Engine, out_dir: Path, limit_s: float) -> None:
    """Build what the engine's job needs (its ``prepare`` command), once, before its first run.

    Raises
    ------
    HarnessError
        If the command fails, naming it and the end of its output.
    """
    if not engine.prepare:
        return
    log = out_dir / engine.name / "prepare.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        code = _spawn(list(engine.prepare), log, limit_s)
    except OSError as exc:  # no such program, not executable
        raise HarnessError(
            f"engine {engine.name}: cannot start `{' '.join(engine.prepare)}`: {exc}"
        ) from None
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip()[-600:]
        raise HarnessError(f"engine {engine.name}: `{' '.join(engine.prepare)}` exited {code}: {tail}")


def execute(step: Step, plan: Plan) -> Outcome:
    """Run one step to its end; its results file if it wrote one (a run that crashed may not have).

    The step's directory must not exist yet (``sotw compare-engines`` refuses a run directory in use), so a
    results file found there is this run's, never an earlier comparison's.
    """
    step.directory.parent.mkdir(parents=True, exist_ok=True)
    log = step.directory.parent / f"{step.directory.name}.log"
    start = time.monotonic()
    code = _spawn(step.argv(plan), log, plan.limit_s)
    seconds = time.monotonic() - start
    found = step.directory / "results.json"
    if not found.is_file():
        return Outcome(step, code, seconds, None, log, f"see {log}")
    try:
        return Outcome(step, code, seconds, Results.from_json(found), log)
    except HarnessError as exc:  # cut short by a kill, or another schema
        return Outcome(step, code, seconds, None, log, str(exc))


@dataclass
class Comparison:
    """The outcomes of every step run, each engine left out with why, and whether a Ctrl-C cut it short."""

    outcomes: list[Outcome] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)
    interrupted: bool = False


def run_all(engines: list[Engine], plan: Plan, out_dir: Path, say: Callable[[str], None]) -> Comparison:
    """Every step of every engine, engine by engine; the outcomes and, per engine left out, why.

    An engine whose job cannot be built is left out with the reason, and the others still run. A Ctrl-C (or
    SIGTERM, as the CLI turns it into one) stops the step under way and ends the comparison with what ran so far.
    """
    found = Comparison()
    planned = {e.name: steps(e, plan, out_dir) for e in engines}
    total = sum(len(s) for s in planned.values())
    done = 0
    for engine in engines:
        try:
            prepare(engine, out_dir, plan.limit_s)
        except HarnessError as exc:
            found.left_out[engine.name] = str(exc)
            say(f"compare-engines: {exc}; {engine.name} is left out")
            done += len(planned[engine.name])
            continue
        for step in planned[engine.name]:
            done += 1
            say(f"compare-engines: [{done}/{total}] {engine.name} {step.label} ...")
            try:
                outcome = execute(step, plan)
            except KeyboardInterrupt:
                say(
                    f"compare-engines: interrupted during {engine.name} {step.label}; the table has the runs before it"
                )
                found.interrupted = True
                return found
            say(
                f"compare-engines: [{done}/{total}] {engine.name} {step.label}: {outcome.verdict} "
                f"(exit {outcome.exit_code}, {outcome.seconds:.0f} s, {step.directory})"
            )
            found.outcomes.append(outcome)
    return found
