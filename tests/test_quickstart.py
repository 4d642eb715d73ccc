"""The five quick paths of docs/quickstart.md, run as the page shows them on a fresh clone.

Each path is a section of the page: its commands are the section's ``sh`` block, its excerpt the ``text`` block
after it. The slow test runs the commands in a fresh clone (with this environment's ``sotw``) and checks that
their output has what the excerpt shows: the stable parts below, each of which must also be in the page's
excerpt, so neither the page nor this test can drift from the other. A ``sotw locust`` command without
``--headless`` serves Locust's web UI: it is started, and stopped once the UI answers and its harness is ready.
Each command's output and wall time go to ``build/test-artifacts/<test>/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "quickstart.md"
SOTW = Path(sys.executable).parent / "sotw"
#: Locust's web UI address when the command does not name another (sotw binds it to 127.0.0.1).
WEB_UI = "http://127.0.0.1:8089"


@dataclass(frozen=True)
class QuickPath:
    """What the test knows of one path: its section, each command's exit code, what its output must have."""

    heading: str
    #: Each command's exit code, in the page's order; None for the web UI, which is stopped by the test.
    exits: tuple[int | None, ...]
    #: Stable parts of the output (no times, ids or figures): in the page's excerpt and in the real output.
    shows: tuple[str, ...]
    #: Time limit for the whole path, seconds.
    limit_s: float


PATHS = {
    "game-day": QuickPath(
        "1. ",
        (0, 0),
        (
            "shipped drills (sotw drill NAME):",
            "drill pipeline-kill-1x: kill -9 of the pipeline at 1x, restarted 5 s later",
            "ok  recover_s (pipeline_kill)  <= 45 s",
            "4 of 4 expectations met: PASS",
            "report: runs/drill-pipeline-kill-1x-",
        ),
        900,
    ),
    "locust": QuickPath(
        "2. ",
        (None, 0),
        (
            "Starting web interface at http://127.0.0.1:8089",
            "ready: broker 127.0.0.1:",
            "run 1: PASS; report ",
        ),
        900,
    ),
    "nightly": QuickPath(
        "3. ",
        (0,),
        (
            ", side by side",
            "no regression",
            "/runs/nightly/trend.html",
        ),
        1500,
    ),
    "capacity": QuickPath(
        "4. ",
        (0,),
        (
            "## Capacity (1x)",
            "| max sustained rate | 16,000 msg/s |",
            "capacity: 16,000 msg/s (8x), ",
            "report: runs/capacity-",
        ),
        1200,
    ),
    "own-job": QuickPath(
        "5. ",
        (1,),
        (
            "**1x: FAIL**",
            "- correctness: ",
            "_row | ",
            "| pipeline |",
            "report: runs/run-",
        ),
        900,
    ),
}


# ----------------------------------------------------------------------------------------- the page


def section(text: str, heading: str) -> str:
    """The text of the ``## <heading>...`` section (a path's heading is numbered; an excerpt may hold ``## ``)."""
    parts = re.split(r"^## (?=\d+\. )", text, flags=re.MULTILINE)
    found = [p for p in parts[1:] if p.startswith(heading)]
    assert len(found) == 1, f"docs/quickstart.md has no one section '## {heading}...'"
    return found[0]


def blocks(text: str, language: str) -> list[str]:
    """The fenced blocks of ``language`` in a text, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def commands(text: str) -> list[list[str]]:
    """The commands of a section's ``sh`` blocks: one per line (``\\`` goes on), comments left out."""
    out = []
    for block in blocks(text, "sh"):
        for line in re.sub(r"\\\n", " ", block).splitlines():
            words = shlex.split(line, comments=True)
            if words:
                out.append(words)
    return out


def excerpt(text: str) -> str:
    """A section's excerpts (its ``text`` blocks) as one text."""
    return "\n".join(blocks(text, "text"))


@pytest.fixture(scope="module")
def page() -> str:
    return PAGE.read_text()


@pytest.mark.parametrize("name", PATHS)
def test_each_path_has_commands_an_excerpt_with_what_the_test_checks_and_its_time(
    name: str, page: str
) -> None:
    path = PATHS[name]
    text = section(page, path.heading)
    found = commands(text)
    assert len(found) == len(path.exits), [shlex.join(c) for c in found]
    assert all(c[0] == "sotw" for c in found), "a quick path runs sotw commands only"
    shown = excerpt(text)
    assert [s for s in path.shows if s not in shown] == []
    assert re.search(r"\*\*Took [^*]+ here\*\*", text), "the section says how long the path took here"
    assert "**Next**" in text


# ------------------------------------------------------------------------------------------ running


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A fresh clone of this repository (its last commit: the page and the code run are the working tree's)."""
    directory = tmp_path / "sotw"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(directory)], check=True, timeout=300)
    return directory


def environment() -> dict[str, str]:
    """This process's environment, with this environment's ``sotw`` first on PATH and Locust's patch back."""
    env = {k: v for k, v in os.environ.items() if k != "LOCUST_SKIP_MONKEY_PATCH"}
    env["PATH"] = f"{SOTW.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def serves_web_ui(words: list[str]) -> bool:
    return words[:2] == ["sotw", "locust"] and "--headless" not in words and "--worker" not in words


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - the local web UI
        return json.loads(response.read())


def harness_ready() -> bool:
    try:
        state = get_json(f"{WEB_UI}/sotw/state")
    except OSError:
        return False
    return any("ready: broker" in line for line in state.get("log", []))


def run(words: list[str], cwd: Path, log: Path, limit_s: float) -> tuple[int | None, float, str]:
    """Run one command of the page as its user would (the web UI until it is ready); exit code, seconds, output."""
    argv = [str(SOTW), *words[1:]]
    started = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=environment(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            if serves_web_ui(words):
                deadline = time.monotonic() + min(limit_s, 300)
                while not harness_ready():
                    assert proc.poll() is None, f"the web UI exited ({proc.returncode})"
                    assert time.monotonic() < deadline, "the web UI's harness was not ready within 300 s"
                    time.sleep(1)
                proc.send_signal(signal.SIGTERM)  # as locust_process.stop: Locust quits, stopping its harness
                proc.wait(180)
                code: int | None = None
            else:
                code = proc.wait(limit_s)
        finally:
            with contextlib.suppress(ProcessLookupError):  # whatever of its process group is left
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    return code, time.monotonic() - started, log.read_text(errors="replace")


@pytest.mark.slow
@pytest.mark.system
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("name", PATHS)
def test_the_quick_path_runs_on_a_fresh_clone_as_the_page_shows(
    name: str, page: str, clone: Path, artifact_dir: Path
) -> None:
    path = PATHS[name]
    outputs = []
    times = []
    for i, words in enumerate(commands(section(page, path.heading))):
        code, seconds, output = run(words, clone, artifact_dir / f"{i + 1}.log", path.limit_s)
        times.append(f"{seconds:.0f} s: {shlex.join(words)} (exit {code})")
        (artifact_dir / "times.txt").write_text("\n".join(times) + "\n")
        outputs.append(output)
        expected = path.exits[i]
        assert expected is None or code == expected, f"`{shlex.join(words)}` exited {code}:\n{output[-3000:]}"
    missing = [s for s in path.shows if not any(s in o for o in outputs)]
    assert missing == [], f"the output lacks what docs/quickstart.md shows; see {artifact_dir}"
