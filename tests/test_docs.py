"""Every ``sotw ...`` and ``make ...`` command in the docs parses with the real CLI and names a real Makefile target.

The commands come from the fenced shell blocks and the inline code spans of README.md, docs/*.md and
docker/README.md. Each ``sotw`` command runs through ``sotw.cli.main`` with argparse stopped right after it parsed
(nothing else runs), so an unknown subcommand, an unknown flag or a missing required flag fails here, naming the
page, the line and argparse's message. ``sotw locust`` is checked against Locust's parser with sotw's options.
"""

from __future__ import annotations

import argparse
import re
import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docker" / "README.md"]
#: Fenced blocks whose lines are shell; a plain block's line counts only when it starts with the command.
SHELL = {"sh", "bash", "shell", "console"}
#: Words that stand for a value the reader fills in: FILE, HOST:PORT, <dir>, $BOOTSTRAP, ...
PLACEHOLDER = re.compile(r"^([A-Z][A-Z0-9_:.-]*|.*<[^>]*>.*|\.\.\.|.*\$\{?[A-Za-z_]+\}?.*)$")
SEPARATORS = {"|", "||", "&&", ";", "&"}


@dataclass(frozen=True)
class Command:
    """One command found in a page: where it is and its words (``sotw ...`` or ``make ...``)."""

    doc: str
    line: int
    words: tuple[str, ...]
    #: From an inline code span rather than a fenced block.
    inline: bool = False
    #: An inline mention without flags (`sotw plan`) names a command rather than invoking it.
    mention: bool = False
    #: Why the words could not be read (an unbalanced quote), if they could not.
    unreadable: str = ""

    def where(self) -> str:
        return f"{self.doc}:{self.line}: `{shlex.join(self.words)}`"


# ------------------------------------------------------------------------------------------ extraction


def commands(text: str, doc: str) -> list[Command]:
    """The ``sotw``/``make`` commands of a Markdown text: fenced blocks and inline code spans."""
    found: list[Command] = []
    fence: str | None = None
    pending: list[str] = []
    prose: list[str] = []  # the text outside fences, a blank line for each fenced one
    start = 0
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = None if fence is not None else stripped[3:].strip().lower()
            prose.append("")
            continue
        prose.append(line if fence is None else "")
        if fence is None or (fence not in SHELL and fence != ""):
            continue
        if not pending:
            start = number
        pending.append(line.rstrip())
        if line.rstrip().endswith("\\"):
            continue  # a shell continuation: the command goes on on the next line
        joined = " ".join(part.removesuffix("\\") for part in pending)
        pending = []
        if fence == "" and not re.match(r"\s*(\$ )?(\S*/)?(sotw|make)\b", joined):
            continue  # a plain block (a diagram, an output) unless the line is a command
        found += _segments(joined, doc, start, inline=False)
    # A code span may go on on the next line of its paragraph.
    joined_prose = "\n".join(prose)
    for span in re.finditer(r"`([^`\n]+(?:\n[^`\n]+)?)`", joined_prose):
        words = span.group(1).replace("\n", " ")
        if re.match(r"(\S*/)?(sotw|make) ", words + " "):
            number = joined_prose.count("\n", 0, span.start()) + 1
            found += _segments(words.replace("\\|", "|"), doc, number, inline=True)
    return found


def _segments(line: str, doc: str, number: int, inline: bool) -> list[Command]:
    """The sotw/make commands of one shell line, split at pipes, ``&&``, ``;`` and ``&``."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    lexer.commenters = "" if inline else "#"
    try:
        words = list(lexer)
    except ValueError as exc:  # an unbalanced quote
        return [Command(doc, number, (line.strip(),), inline, unreadable=f"not a shell command line: {exc}")]
    out: list[Command] = []
    segment: list[str] = []
    for word in [*words, ";"]:
        if word not in SEPARATORS:
            segment.append(word)
            continue
        command = _command(segment)
        if command:
            has_flag = any(w.startswith("-") for w in command[1:])
            out.append(Command(doc, number, tuple(command), inline, mention=inline and not has_flag))
        segment = []
    return out


def _command(words: list[str]) -> list[str]:
    """``sotw ...`` or ``make ...`` from a segment, past a prompt, variables and wrappers (time, docker run)."""
    for i, word in enumerate(words):
        name = word.rsplit("/", 1)[-1]
        if name == "sotw" and not word.startswith("-"):
            return ["sotw", *words[i + 1 :]]
        if name == "make" and all(_assignment(w) for w in words[:i]):
            return ["make", *words[i + 1 :]]
    return []


def _assignment(word: str) -> bool:
    return re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", word) is not None or word == "$"


# --------------------------------------------------------------------------------------------- checking


class Parsed(Exception):  # noqa: N818 - a signal, not an error: argparse accepted the command line
    """Raised in place of returning from ``parse_args``, so that the command itself never runs."""


class Rejected(Exception):
    """argparse's error message for a command line it refused."""


def _reject(message: str) -> Any:
    raise Rejected(message)


def _placeholder(word: str) -> bool:
    return PLACEHOLDER.match(word) is not None


@contextmanager
def parse_only() -> Iterator[None]:
    """Every ArgumentParser parses and then raises Parsed (or Rejected); placeholders pass any type check."""
    parse_args = argparse.ArgumentParser.parse_args
    get_value = argparse.ArgumentParser._get_value
    check_value = argparse.ArgumentParser._check_value

    def parse(self: argparse.ArgumentParser, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        parse_args(self, _elide(self, list(args or [])), namespace)
        raise Parsed

    def error(self: argparse.ArgumentParser, message: str) -> Any:
        _reject(message)

    def value(self: argparse.ArgumentParser, action: argparse.Action, word: str) -> Any:
        return word if _placeholder(word) else get_value(self, action, word)

    def check(self: argparse.ArgumentParser, action: argparse.Action, word: Any) -> None:
        if not (isinstance(word, str) and _placeholder(word)):
            check_value(self, action, word)

    with (
        mock.patch.object(argparse.ArgumentParser, "parse_args", parse),
        mock.patch.object(argparse.ArgumentParser, "error", error),
        mock.patch.object(argparse.ArgumentParser, "_get_value", value),
        mock.patch.object(argparse.ArgumentParser, "_check_value", check),
    ):
        yield


def _elide(parser: argparse.ArgumentParser, words: list[str]) -> list[str]:
    """Drop a ``...`` that stands for more words; keep one that stands for an option's value."""
    out: list[str] = []
    for word in words:
        if word == "...":
            action = parser._option_string_actions.get(out[-1]) if out else None
            if action is None or action.nargs == 0:
                continue
        out.append(word)
    return out


def check_sotw(command: Command) -> str | None:
    """None if the real parser accepts the command, else what is wrong."""
    from sotw.cli import COMMANDS
    from sotw.cli import main as sotw_main

    # `[--checkpoint C]` is an optional part: check it as if given.
    words = [w.removeprefix("[").removesuffix("]") for w in command.words[1:]]
    if words and "/" in words[0] and set(words[0].split("/")) <= set(COMMANDS):
        # `sotw run/bench/drill --source`: each of them takes it
        one = [
            check_sotw(
                Command(command.doc, command.line, ("sotw", c, *words[1:]), command.inline, command.mention)
            )
            for c in words[0].split("/")
        ]
        return next((p for p in one if p), None)
    if not words or words[0] in ("-h", "--help", "-V", "--version"):
        return None
    if _placeholder(words[0]):
        return None  # `sotw COMMAND --help`
    if words[0] not in COMMANDS:
        return f"unknown command {words[0]!r} (sotw has {', '.join(COMMANDS)})"
    if any(w in ("-h", "--help") for w in words):
        return None
    elided = "..." in words
    if words[0] == "locust":
        return _accepts(lambda: _parse_locust(words[1:]), command, elided)
    return _accepts(lambda: sotw_main(words), command, elided)


def _accepts(parse: Any, command: Command, elided: bool) -> str | None:
    try:
        with parse_only():
            parse()
    except Parsed:
        return None
    except Rejected as exc:
        message = str(exc)
        if message.startswith("the following arguments are required") and (command.mention or elided):
            return None  # a mention (`sotw plan`), or a command with `...` for the rest
        if message.endswith("expected one argument") and command.inline:
            return None  # an inline mention of a flag: `sotw run --pipeline-cmd`
        return message
    return "the command did not parse its arguments with argparse"


def _parse_locust(words: list[str]) -> None:
    from locust.argument_parser import get_empty_argument_parser, setup_parser_arguments

    from loadtest.locust.locust_cli import locust_argv
    from loadtest.locust.locustfile import add_options

    parser = get_empty_argument_parser()
    setup_parser_arguments(parser)
    add_options(parser)
    parser.error = _reject  # Locust's own error() exits instead of raising
    # Locust's parser (configargparse) has its own parse_args, which returns: stop here as the others do.
    parser.parse_args(_elide(parser, locust_argv(words)[3:]))  # past "python -m locust"
    raise Parsed


def makefile_targets(text: str) -> set[str]:
    """The targets a Makefile defines (not its pattern or file rules)."""
    return {m for m in re.findall(r"^([A-Za-z][A-Za-z0-9_-]*)\s*:(?!=)", text, re.MULTILINE)}


def check_make(command: Command, targets: set[str]) -> list[str]:
    """What is wrong with a ``make ...`` command: unknown targets, and the sotw flags in NIGHTLY_ARGS."""
    problems = []
    for word in command.words[1:]:
        if word.startswith("NIGHTLY_ARGS="):
            nightly = Command(
                command.doc, command.line, ("sotw", "nightly", *shlex.split(word.split("=", 1)[1]))
            )
            problem = check_sotw(nightly)
            if problem:
                problems.append(f"NIGHTLY_ARGS: {problem}")
        elif not _assignment(word) and not word.startswith("-") and word not in targets:
            problems.append(f"no target {word!r} in the Makefile")
    return problems


def problems(text: str, doc: str, targets: set[str]) -> list[str]:
    """Every command of a page the CLI or the Makefile refuses, as ``doc:line: `command`: why``."""
    out = []
    for command in commands(text, doc):
        if command.unreadable:
            found = [command.unreadable]
        elif command.words[0] == "make":
            found = check_make(command, targets)
        else:
            found = [check_sotw(command)]
        out += [f"{command.where()}: {p}" for p in found if p]
    return out


# ---------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def targets() -> set[str]:
    return makefile_targets((ROOT / "Makefile").read_text())


@pytest.mark.parametrize("page", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_in_the_page_parses_with_the_real_cli(page: Path, targets: set[str]) -> None:
    found = problems(page.read_text(), str(page.relative_to(ROOT)), targets)
    assert not found, "commands in the docs that the CLI refuses:\n" + "\n".join(found)


def test_the_pages_have_commands_to_check() -> None:
    found = [c for page in DOCS for c in commands(page.read_text(), page.name)]
    assert len(found) > 100
    assert {c.words[1] for c in found if c.words[0] == "sotw" and len(c.words) > 1} >= {
        "run",
        "drill",
        "plan",
    }


def test_a_wrong_flag_planted_in_a_page_fails_naming_the_page_line_and_flag(targets: set[str]) -> None:
    text = (ROOT / "docs" / "loadtest.md").read_text()
    planted = text.replace("sotw run --load 10x --steady 120", "sotw run --load 10x --stedy 120", 1)
    assert planted != text
    line = planted.splitlines().index(next(x for x in planted.splitlines() if "--stedy" in x)) + 1
    found = problems(planted, "docs/loadtest.md", targets)
    assert len(found) == 1 and found[0].startswith(f"docs/loadtest.md:{line}: ")
    assert "unrecognized arguments: --stedy 120" in found[0]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("```sh\nsotw plan --sensors 24 --rate 2000\n```", "required: --p99"),
        ("```sh\nsotw simulate \\\n    --gap-rate 0.01\n```", "unrecognized arguments: --gap-rate"),
        ("Run `sotw lint --fix` first.", "unknown command 'lint'"),
        ("```sh\nmake report && sotw demo\n```", "no target 'report'"),
        ("```sh\nmake nightly NIGHTLY_ARGS=--quik\n```", "unrecognized arguments: --quik"),
        ("```sh\nsotw locust --headless --shape wobble\n```", "invalid choice: 'wobble'"),
        ("```sh\nsotw drill --list | grep kill; sotw run --lod 2x\n```", "unrecognized arguments: --lod"),
        ("```sh\nsotw run --pipeline-cmd 'job.py --out {output}\n```", "No closing quotation"),
    ],
)
def test_the_checker_refuses_a_wrong_command(text: str, why: str, targets: set[str]) -> None:
    found = problems(text, "page.md", targets)
    assert len(found) == 1 and why in found[0], found


@pytest.mark.parametrize(
    "text",
    [
        "```sh\nsotw plan --sensors N --rate R --p99 SECONDS --measurements FILE\n```",
        "```sh\nsotw topics list --prefix sotw-sensor- --bootstrap ... --kafka-config <file>\n```",
        "`sotw plan` writes nothing; `sotw broker add-user NAME --topic-prefix P ...` adds a user",
        "```sh\nsotw COMMAND --help\nFOO=1 .venv/bin/sotw run --load 1x   # a comment --not-a-flag\n```",
        "```\n│ `sotw nonsense` in a diagram │\n```",
    ],
)
def test_the_checker_accepts_placeholders_elisions_and_mentions(text: str, targets: set[str]) -> None:
    assert problems(text, "page.md", targets) == []


def test_every_phony_target_of_the_makefile_exists(targets: set[str]) -> None:
    text = (ROOT / "Makefile").read_text()
    phony = set(re.search(r"^\.PHONY:(.*)$", text, re.MULTILINE).group(1).split())  # type: ignore[union-attr]
    assert phony - targets == set()
