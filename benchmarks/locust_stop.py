"""How long Locust's Stop takes in the web UI: the time from pressing Stop to the runner's STOPPED state.

Usage::

    .venv/bin/python benchmarks/locust_stop.py [--runs 3] [--users 8] [--seconds 40] [--profile baseline]
                                               [--early-start] [--workers N]
                                               [--json runs/bench-locust-stop.json] [-- SOTW_LOCUST_ARGS...]

Starts ``sotw locust`` as a user would (the local Kafka broker and the pipeline unless the extra arguments say
otherwise), opens its web UI in headless Chromium (Debian's ``/usr/bin/chromium`` through Playwright, as the
browser test does), and ``--runs`` times: fills the start form with ``--users`` users (ramped up in a
second), presses Start, waits ``--seconds``, presses Stop, and measures

- **stop_logged_s**: Stop pressed to the conductor's "stopping the simulators" log line, which Locust's
  ``test_stop`` listener writes right after the runner has become STOPPED;
- **stopped_s**: Stop pressed to the first poll (every 0.1 s) of ``/stats/requests`` that says ``stopped``
  (before sotw's hook on that route, Locust cached the response for 2 s or more, so this read late);
- **ui_stopped_s**: Stop pressed to the UI's **New** button (shown once the UI has read ``stopped``; the UI
  polls every 2 s, so this is up to 2 s later);
- **states**: the runner states seen meanwhile (``cleanup``, ``stopping``), with their first time;
- **verdict_s**, **steps_after_stop** and **verdict**: Stop pressed to the run's verdict in ``/sotw/state``,
  and the verification's steps seen on the way (drain, settle, verify, report).

With ``--workers N`` it runs a ``--master`` with N ``--worker`` processes. Each run after the first starts
once the previous one has its verdict. With ``--early-start`` it also presses
New and Start as soon as a run is STOPPED, while its verification goes on, and records what the UI said (the
Start is refused, naming the verification's step). The figures are printed one line a run and, with
``--json``, written as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get_json(url: str, timeout: float = 10.0) -> Any:
    """GET ``url`` and parse its JSON body."""
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - the local Locust UI
        return json.loads(response.read())


class StateWatch:
    """Polls ``/stats/requests`` every 0.1 s in a thread; remembers when each runner state was first seen."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen: dict[str, float] = {}
        self.since = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def reset(self) -> None:
        """Forget what was seen; times count from now."""
        with self._lock:
            self.seen, self.since = {}, time.monotonic()

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            try:
                state = str(get_json(f"{self.url}/stats/requests", timeout=30)["state"])
            except (OSError, ValueError, KeyError):
                continue
            with self._lock:
                self.seen.setdefault(state, time.monotonic() - self.since)

    def first(self, state: str) -> float | None:
        """Seconds from the last reset to the first poll that saw ``state``."""
        with self._lock:
            return self.seen.get(state)

    def close(self) -> None:
        """Stop polling."""
        self._stop.set()
        self._thread.join(5)


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    """Poll ``predicate`` until truthy; raise naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise SystemExit(f"{what} within {timeout:g} s")


def stop_logged(log: Path, after: float) -> float | None:
    """Seconds from ``after`` (a ``time.time()``) to the conductor's "stopping the simulators" log line.

    Locust's runner fires ``test_stop``, whose listener logs that line, right after it has become STOPPED.
    """
    for line in reversed(log.read_text(errors="replace").splitlines()):
        if "stopping the simulators" in line and line.startswith("["):
            stamp = datetime.strptime(line[1:24], "%Y-%m-%d %H:%M:%S,%f").timestamp()  # noqa: DTZ007 - local
            return stamp - after if stamp >= after - 1.0 else None
    return None


def one_run(
    page: Any, url: str, log: Path, watch: StateWatch, index: int, users: int, seconds: float, early: bool
) -> dict[str, Any]:
    """Start, wait, Stop, (with ``early``, press Start again at once), wait for the verdict; the figures."""
    from playwright.sync_api import expect

    if index > 1:
        page.get_by_role("button", name="New").click()
    page.get_by_label("Number of users (peak concurrency)").fill(str(users))
    page.get_by_label("Ramp up (users started/second)").fill(str(users))
    page.get_by_role("button", name="Start").click()
    wait_for(lambda: get_json(f"{url}/stats/requests")["state"] == "running", 120, "the run did not start")
    time.sleep(seconds)
    rps = float(get_json(f"{url}/stats/requests")["total_rps"])
    watch.reset()
    t0, pressed = time.monotonic(), time.time()
    page.get_by_role("button", name="Stop").click()
    expect(page.get_by_role("button", name="New")).to_be_visible(timeout=600_000)
    ui_stopped = time.monotonic() - t0
    wait_for(lambda: watch.first("stopped") is not None, 60, "the runner's stopped state was not polled")
    logged = stop_logged(log, pressed)
    row: dict[str, Any] = {
        "run": index,
        "users": users,
        "rps_before_stop": round(rps, 1),
        "stopped_s": round(watch.first("stopped") or -1.0, 2),
        "stop_logged_s": round(logged, 3) if logged is not None else None,
        "ui_stopped_s": round(ui_stopped, 2),
        "states": {k: round(v, 2) for k, v in watch.seen.items()},
    }
    if early:
        page.get_by_role("button", name="New").click()
        page.get_by_role("button", name="Start").click()
        refused = page.get_by_text("is still being verified after its stop")
        try:
            expect(refused).to_be_visible(timeout=10_000)
            row["early_start"] = "refused: " + refused.inner_text()
        except AssertionError:
            row["early_start"] = "not refused"
        page.keyboard.press("Escape")
    steps: list[str] = []

    def verdict() -> dict[str, Any] | None:
        run = get_json(f"{url}/sotw/state")["run"] or {}
        step = str((run.get("verification") or {}).get("step") or run.get("phase"))
        if not steps or steps[-1] != step:
            steps.append(step)
        return run if run.get("index") == index and (run.get("verdict") or {}).get("verdict") else None

    run = wait_for(verdict, 900, f"run {index} had no verdict")
    return {
        **row,
        "verdict_s": round(time.monotonic() - t0, 1),
        "steps_after_stop": steps,
        "verdict": run["verdict"]["verdict"],
        "reasons": run["verdict"].get("reasons") or [],
    }


def measure(
    runs: int,
    users: int,
    seconds: float,
    profile: str,
    extra: list[str],
    early_start: bool = False,
    workers: int = 0,
) -> dict[str, Any]:
    """A ``sotw locust`` session (a master with ``workers`` workers if any) with ``runs`` runs from the UI."""
    from playwright.sync_api import sync_playwright

    work = Path(tempfile.mkdtemp(prefix="sotw-bench-locust-stop-"))
    port, master_port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "sotw", "locust", "--profile", profile, "--web-host", "127.0.0.1"]
    command += ["--web-port", str(port), "--run-dir", str(work / "session"), *extra]
    if workers:
        command += ["--master", "--master-bind-host=127.0.0.1", f"--master-bind-port={master_port}"]
    env = {k: v for k, v in os.environ.items() if k != "LOCUST_SKIP_MONKEY_PATCH"}
    procs: list[subprocess.Popen[bytes]] = []
    with (work / "locust.log").open("wb") as log:
        procs.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env))  # noqa: S603
    out: list[dict[str, Any]] = []
    try:
        wait_for(
            lambda: any("ready:" in line for line in get_json(f"{url}/sotw/state")["log"]),
            300,
            f"the harness was not ready (see {work / 'locust.log'})",
        )
        for k in range(workers):
            worker = [sys.executable, "-m", "sotw", "locust", "--worker", "--master-host=127.0.0.1"]
            with (work / f"worker-{k}.log").open("wb") as log:
                procs.append(
                    subprocess.Popen(  # noqa: S603
                        [*worker, f"--master-port={master_port}"],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
        if workers:
            wait_for(
                lambda: get_json(f"{url}/stats/requests").get("worker_count") == workers,
                120,
                "the workers did not connect",
            )
        watch = StateWatch(url)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            try:
                for index in range(1, runs + 1):
                    row = one_run(page, url, work / "locust.log", watch, index, users, seconds, early_start)
                    print(json.dumps(row), flush=True)
                    out.append(row)
            finally:
                page.screenshot(path=str(work / "last.png"))
            browser.close()
        watch.close()
    finally:
        for proc in procs:  # the master first: its quit reaches the workers
            proc.terminate()
            try:
                proc.wait(300)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
    return {
        "profile": profile,
        "users": users,
        "workers": workers,
        "seconds": seconds,
        "runs": out,
        "work_dir": str(work),
    }


def main() -> int:
    """Run and print the figures (and write them as JSON with ``--json``)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--profile", default="baseline")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=0, help="run a master with this many workers")
    parser.add_argument(
        "--early-start",
        action="store_true",
        help="press New and Start again as soon as a run is STOPPED, before its verdict (it is refused)",
    )
    parser.add_argument("extra", nargs="*", help="more `sotw locust` arguments (after --)")
    args = parser.parse_args()
    result = measure(
        args.runs, args.users, args.seconds, args.profile, args.extra, args.early_start, args.workers
    )
    stopped = [r["stopped_s"] for r in result["runs"]]
    print(
        f"{args.profile}, {args.users} users, Stop after {args.seconds:g} s, {len(stopped)} runs: "
        f"Stop -> STOPPED {min(stopped):.2f} to {max(stopped):.2f} s; "
        f"UI {', '.join(str(r['ui_stopped_s']) for r in result['runs'])} s; "
        f"verdicts {', '.join(r.get('verdict', '-') for r in result['runs'])}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
