"""The engines file: each engine's name, what it is, how its job is built and the options that make it the job under test.

An engine is the same snapshot/update job in another stream processor. What makes it the job under test is a
list of sotw's own options (``--source``, or ``--pipeline-cmd`` with ``--contract``/``--format``/``--lag-from``),
given to each of its runs as they would be typed, so one file reads like the commands it runs and every option
is checked by the parser of each command it reaches before the first run starts, not forty minutes later.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from loadtest.errors import HarnessError
from sotw.tomlfile import read_toml

#: The engines file shipped with sotw: its Spark pipeline with each source, Kafka Streams and quixstreams.
SHIPPED = Path(__file__).with_name("engines.toml")

#: Options the comparison sets for every run itself, so an engine may not (by their argparse names).
OWNED = {
    "profile": "--profile",
    "scenario": "--scenario",
    "load": "--load",
    "run_dir": "--run-dir",
    "bootstrap": "--bootstrap",
    "attach": "--attach",
}


@dataclass(frozen=True)
class Engine:
    """One engine under comparison: ``args`` go to each of its runs; ``prepare`` builds its job first."""

    name: str
    description: str
    args: tuple[str, ...]
    prepare: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.name in ("", ".", "..") or any(c.isspace() or c == "/" for c in self.name):
            raise HarnessError(
                f"engine name {self.name!r}: give a name without spaces or '/' (its directory's)"
            )


def _refuse(engine: str, command: str) -> Any:
    def error(message: str) -> NoReturn:
        raise HarnessError(f"engine {engine}: its args are not options of sotw {command}: {message}")

    return error


def check_args(engine: Engine, commands: Sequence[str]) -> None:
    """Parse the engine's args with the parser of each command it will be given to, and make its job of them.

    The parsed options are compared with the defaults, so an option the comparison owns is refused however it
    is spelt (argparse takes ``--run`` for ``--run-dir``), and the job is made as a run makes it, so a
    template's unknown placeholder is named now rather than at the engine's first run.

    Raises
    ------
    HarnessError
        Naming the engine, the command and what is wrong (an unknown option, a bad choice, a bad template).
    """
    from loadtest.cli import parser
    from loadtest.run.jobargs import job_from_args

    for command in commands:
        p: argparse.ArgumentParser = parser(command)
        p.error = _refuse(engine.name, command)  # type: ignore[method-assign]
        first = ["pipeline-kill-1x"] if command == "drill" else []
        given, default = p.parse_args([*first, *engine.args]), p.parse_args(first)
        for dest, flag in OWNED.items():
            if getattr(given, dest, None) != getattr(default, dest, None):
                raise HarnessError(
                    f"engine {engine.name}: {flag} is set by sotw compare-engines for every run; "
                    "leave it out of the engine's args"
                )
        try:
            job_from_args(given)
        except HarnessError as exc:
            raise HarnessError(f"engine {engine.name}: {exc}") from None


def _strings(engine: str, key: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise HarnessError(
            f"engine {engine}: {key} must be a list of strings, as a command is typed word by word"
        )
    return tuple(value)


def engine_from_mapping(name: str, doc: Mapping[str, Any]) -> Engine:
    """One ``[engines.NAME]`` table as an ``Engine``; unknown keys are refused by name."""
    if not isinstance(doc, dict):
        raise HarnessError(
            f"engine {name}: give it as a table, [engines.{name}], with args (and description, prepare)"
        )
    unknown = sorted(set(doc) - {"description", "args", "prepare"})
    if unknown:
        raise HarnessError(f"engine {name}: unknown key {unknown[0]!r} (description, args, prepare)")
    return Engine(
        name,
        str(doc.get("description", "")),
        _strings(name, "args", doc.get("args", [])),
        _strings(name, "prepare", doc.get("prepare", [])),
    )


def load_engines(path: Path = SHIPPED) -> list[Engine]:
    """Every engine of an engines file, in the file's order.

    Raises
    ------
    HarnessError
        If the file cannot be read, is not TOML, has no ``[engines.NAME]`` table or an engine is malformed.
    """
    doc = read_toml(path, "engines file", HarnessError)
    tables = doc.get("engines")
    if not isinstance(tables, dict) or not tables:
        raise HarnessError(f"engines file {path} has no [engines.NAME] table")
    return [engine_from_mapping(name, table) for name, table in tables.items()]


def choose(engines: Sequence[Engine], names: Sequence[str]) -> list[Engine]:
    """The engines named (in the order named), or all of them; an unknown name is refused with the known ones."""
    if not names:
        return list(engines)
    known = {e.name: e for e in engines}
    missing = [n for n in names if n not in known]
    if missing:
        raise HarnessError(f"no engine {missing[0]!r} in the engines file (it has {', '.join(known)})")
    return [known[n] for n in names]
