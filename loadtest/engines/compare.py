"""``sotw compare-engines``: each engine's job through the same runs and drills, and the table that puts them side by side.

A team choosing an engine, or defending one, wants the same load, the same faults and the same verdict for
each candidate. Each engine (``loadtest/engines/engines.toml``, or a file of the team's own) runs the profile
at each load, then each drill, then optionally a capacity search, each as the ``sotw`` command a user would
type with the engine's options. Everything the comparison checks (the engines file, each engine's options
against each command's parser, the drills, the loads) is checked before the first run, so a typo costs
seconds, not the hour the runs take.
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loadtest.engines.catalog import SHIPPED, Engine, check_args, choose, load_engines
from loadtest.engines.steps import Comparison, Outcome, Plan, Step, run_all, verdict_of
from loadtest.engines.table import as_json, chart, engine_rows, headline, runs_table
from loadtest.errors import HarnessError
from loadtest.gameday.drills import load_drill
from loadtest.reports.pages import CSS, html_table, md_table
from loadtest.reports.results import EXIT_CODES, Results
from loadtest.run.profile import load_profile, parse_load

#: The drills each engine runs unless others are named: its own process killed, and the broker restarted under it.
DRILLS = ("pipeline-kill-1x", "broker-restart")


def build_parser() -> argparse.ArgumentParser:
    """The ``sotw compare-engines`` argument parser."""
    p = argparse.ArgumentParser(
        prog="sotw compare-engines",
        description="Each engine's job through the same runs (the profile at each load), drills and, with "
        "--capacity, a capacity search; one table side by side: verdicts, rows wrong, recovery, end-to-end p99, "
        "the highest rate sustained, CPU and memory per message (docs/engines.md). Exit 0 only if every run "
        "PASSes.",
    )
    p.add_argument(
        "--engines",
        type=Path,
        default=SHIPPED,
        help="engines file (default: the shipped one, docs/engines.md)",
    )
    p.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="NAME",
        help="compare only this engine of the file (repeatable; default all)",
    )
    p.add_argument(
        "--profile", default="baseline", help="profile of the runs and the capacity search (baseline)"
    )
    p.add_argument(
        "--scenario",
        type=Path,
        default=None,
        help="scenario TOML of the profile (default: the shipped scenarios.toml)",
    )
    p.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="LOAD",
        help="a run at this load (repeatable; default 1x and 10x)",
    )
    p.add_argument(
        "--drill",
        action="append",
        default=[],
        metavar="DRILL",
        help="a drill each engine runs: a shipped drill's name or a drill file (repeatable; default pipeline-kill-1x "
        "and broker-restart)",
    )
    p.add_argument("--no-drills", action="store_true", help="run no drill")
    p.add_argument(
        "--capacity",
        action="store_true",
        help="also search each engine's highest sustained rate (sotw capacity)",
    )
    p.add_argument(
        "--budget",
        type=float,
        default=240.0,
        help="seconds of each capacity search (240, as sotw capacity's)",
    )
    p.add_argument(
        "--limit",
        type=float,
        default=1800.0,
        help="seconds a run may take before it is stopped as hung (1800)",
    )
    p.add_argument("--run-dir", type=Path, default=None, help="where to write (default runs/engines-<time>)")
    p.add_argument("--list", action="store_true", help="list the engines of the file and exit")
    p.add_argument(
        "--table-from",
        type=Path,
        default=None,
        metavar="DIR",
        help="rebuild the table and pages of an earlier comparison from its directory, running nothing",
    )
    return p


def _once(what: str, values: Sequence[str]) -> tuple[str, ...]:
    """The values in order; one given twice is refused (its runs would share a directory)."""
    twice = [v for i, v in enumerate(values) if v in values[:i]]
    if twice:
        raise HarnessError(f"{what}: {twice[0]} is given twice")
    return tuple(values)


def _drill(name_or_path: str) -> str:
    """A shipped drill's name as given, a drill file as its absolute path (the runs start in sotw's directory)."""
    load_drill(name_or_path)
    return str(Path(name_or_path).resolve()) if Path(name_or_path).suffix else name_or_path


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _say(message: str) -> None:
    print(message, flush=True)


def _page(title: str, tables: Sequence[tuple[str, str]], png: bytes | None) -> str:
    parts = [f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title><style>{CSS}</style>"]
    parts.append(f"<h1>{html.escape(title)}</h1>")
    if png is not None:
        parts.append(
            f"<img alt='end-to-end p99 and CPU per message' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        )
    parts += [f"<h2>{html.escape(name)}</h2>{table}" for name, table in tables]
    return "\n".join(parts) + "\n"


def write_pages(
    out_dir: Path,
    profile: str,
    engines: Sequence[Engine],
    found: Comparison,
    loads: Sequence[str],
    drills: Sequence[str],
) -> None:
    """``engines.md``, ``.html``, ``.json`` and ``.png`` in ``out_dir``; the table printed with where they are."""
    rows = engine_rows(engines, found.outcomes, found.left_out)
    table = headline(rows, loads, drills)
    per_run = runs_table(found.outcomes)
    png = chart(rows, loads)
    data = {"profile": profile, "loads": list(loads), "drills": list(drills), **as_json(rows, found.left_out)}
    (out_dir / "engines.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    notes = "".join(f"\n- {name} was left out: {why}" for name, why in found.left_out.items())
    if found.interrupted:
        notes += "\n- interrupted: the runs after the last one listed did not run"
    title = f"Engines compared: profile {profile}"
    (out_dir / "engines.md").write_text(
        f"# {title}\n\n{md_table(table)}{notes}\n\n## Each run\n\n{md_table(per_run)}", encoding="utf-8"
    )
    if png is not None:
        (out_dir / "engines.png").write_bytes(png)
    (out_dir / "engines.html").write_text(
        _page(title, [("Side by side", html_table(table)), ("Each run", html_table(per_run))], png),
        encoding="utf-8",
    )
    print()
    print(md_table(table) + notes)
    print(
        f"\npage: {out_dir / 'engines.html'}\ntable: {out_dir / 'engines.md'}\ndata: {out_dir / 'engines.json'}"
    )


def _scanned(out_dir: Path) -> dict[str, Any]:
    """What ``engines.json`` would hold, read from the run directories of a comparison killed before its table.

    Each engine's runs are in the order their results were written; a run's exit code is the one its verdict
    gives (``sotw run`` and ``sotw drill`` exit so), its time the run's own, from start to end.
    """
    engines = []
    for engine_dir in sorted((p for p in out_dir.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime):
        written = [p / "results.json" for p in engine_dir.iterdir() if (p / "results.json").is_file()]
        runs = []
        for path in sorted(written, key=lambda p: p.stat().st_mtime):
            results = Results.from_json(path)
            name = path.parent.name
            runs.append(
                {
                    "run": name if name == "capacity" else name.replace("-", " ", 1),
                    "directory": str(path.parent),
                    "exit_code": EXIT_CODES.get(verdict_of(results), 1),
                    "seconds": (results.run.ended_ms - results.run.started_ms) / 1000,
                }
            )
        if runs:
            engines.append({"engine": engine_dir.name, "runs": runs})
    if not engines:
        raise HarnessError(f"{out_dir} holds no comparison: no engines.json, no ENGINE/RUN/results.json")
    return {"engines": engines}


def table_again(out_dir: Path) -> int:
    """The pages of an earlier comparison rebuilt from its ``engines.json`` and each run's results, running nothing.

    For a comparison whose table an older sotw wrote, or one killed before it wrote any (then its run
    directories say what ran).
    """
    try:
        data = json.loads((out_dir / "engines.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        data = _scanned(out_dir)
    except (OSError, json.JSONDecodeError) as exc:
        raise HarnessError(f"cannot read {out_dir / 'engines.json'}: {exc}") from None
    engines, found = [], Comparison(left_out={})
    labels: list[str] = []
    for entry in data["engines"]:
        engine = Engine(entry["engine"], entry.get("description", ""), tuple(entry.get("args", [])))
        engines.append(engine)
        if entry.get("left_out"):
            found.left_out[engine.name] = entry["left_out"]
        for run in entry["runs"]:
            kind, _, what = run["run"].partition(" ")
            step = Step(engine, kind, what, Path(run["directory"]))
            results_file = step.directory / "results.json"
            results = Results.from_json(results_file) if results_file.is_file() else None
            log = step.directory.parent / f"{step.directory.name}.log"
            found.outcomes.append(
                Outcome(step, run["exit_code"], run["seconds"], results, log, run.get("problem") or "")
            )
            labels.append(run["run"])
    loads = data.get("loads") or list(
        dict.fromkeys(label[4:] for label in labels if label.startswith("run "))
    )
    drills = data.get("drills") or list(
        dict.fromkeys(label[6:] for label in labels if label.startswith("drill "))
    )
    profile = data.get("profile") or next(
        (o.results.run.profile_name for o in found.outcomes if o.results and o.step.kind == "run"), "?"
    )
    write_pages(out_dir, profile, engines, found, loads, drills)
    return 0 if not found.left_out and all(o.passed for o in found.outcomes) else 1


def main(argv: Sequence[str]) -> int:
    """Run the comparison; print the table and where the pages are. Exit 0 only if every run PASSed."""
    args = build_parser().parse_args(list(argv))
    if args.table_from is not None:
        return table_again(args.table_from.resolve())
    engines = load_engines(args.engines.resolve())
    if args.list:
        for e in engines:
            print(f"  {e.name:<18} {e.description}")
        return 0
    engines = choose(engines, args.engine)
    loads = _once("--load", args.load or ["1x", "10x"])
    for load in loads:
        parse_load(load)
    drills = () if args.no_drills else _once("--drill", [_drill(d) for d in args.drill or DRILLS])
    _once("drill file names", [Path(d).stem for d in drills])  # each drill's directory is named after it
    scenario = args.scenario.resolve() if args.scenario else None
    load_profile(args.profile, scenario)  # a profile the file lacks is named now, not at the first run
    plan = Plan(args.profile, scenario, loads, drills, args.capacity, args.budget, args.limit)
    for engine in engines:
        check_args(engine, plan.commands())
    out_dir = (args.run_dir or Path("runs") / f"engines-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        raise HarnessError(f"{out_dir} is not empty (an earlier comparison's?): give a new --run-dir")
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = len(loads) + len(drills) + int(args.capacity)
    _say(f"compare-engines: {len(engines)} engines x {runs} runs into {out_dir}")

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        found = run_all(engines, plan, out_dir, _say)
    finally:
        signal.signal(signal.SIGTERM, previous)

    write_pages(out_dir, args.profile, engines, found, loads, drills)
    if found.interrupted:
        return 130
    passed = not found.left_out and all(o.passed for o in found.outcomes)
    return 0 if passed else 1
