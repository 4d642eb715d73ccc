"""Locust's web UI with sotw's tabs and panel, driven in a real browser (Debian's Chromium via Playwright).

``make setup`` installs Chromium when it is missing (``scripts/check-chromium.sh``); Playwright's own
browser download is not used. Not marked slow (about a minute and a half): ``make test`` runs it.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

from sotw.kafka import KafkaConfig
from tests.loadtest.locust_process import free_port, get_json, start, stop, wait_for

CHROMIUM = Path("/usr/bin/chromium")
#: The longest Stop may take to bring Locust's runner to STOPPED, as the UI shows it (issue 27).
STOP_LIMIT_S = 5.0


def wait_ready(url: str, log: Path, timeout_s: float) -> None:
    """Wait until the session's pipeline is ready (the panel's log says so)."""
    wait_for(
        lambda: any("ready:" in line for line in get_json(f"{url}/sotw/state")["log"]),
        timeout_s,
        "the pipeline was not ready",
        log,
    )


def started_in_the_ui(playwright: Playwright, url: str) -> tuple[Browser, Page]:
    """Chromium on Locust's UI at ``url``, a run started with 10 users, its lag tab showing the run's topics."""
    browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(url)
    page.get_by_label("Number of users (peak concurrency)").fill("10")
    page.get_by_label("Ramp up (users started/second)").fill("10")
    page.get_by_role("button", name="Start").click()
    page.get_by_role("tab", name="Kafka lag").click()
    expect(page.locator("table").first).to_contain_text("-run-1-0000", timeout=120_000)
    return browser, page


def test_a_run_started_in_the_ui_shows_live_lag_and_latency_its_controls_reach_the_simulator_and_stop_stops(
    kafka: KafkaConfig, tmp_path: Path, artifact_dir: Path
) -> None:
    assert CHROMIUM.exists(), f"{CHROMIUM} is missing: `make setup` installs it (scripts/check-chromium.sh)"
    port, log = free_port(), tmp_path / "locust.log"
    url = f"http://127.0.0.1:{port}"
    args = ["--bootstrap", kafka.bootstrap, "--profile", "smoke", "--warmup", "2"]
    args += ["--web-host", "127.0.0.1", "--web-port", str(port), "--run-dir", str(tmp_path / "session")]
    proc = start(args, log, sotw=True)
    try:
        wait_ready(url, log, 240)
        with sync_playwright() as playwright:
            browser, page = started_in_the_ui(playwright, url)
            page.get_by_role("tab", name="End-to-end latency").click()
            # A row per 5 s window of commit time: the pipeline has committed rows the verifier dated.
            expect(page.locator("table").first).to_contain_text(
                re.compile(r"\d\d:\d\d:\d\d"), timeout=120_000
            )

            page.locator("#sotw-button").click()
            panel = page.frame_locator("#sotw-frame")
            panel.locator("#fault-gap").fill("0.05")
            panel.locator("#apply-faults").click()
            # "simulator runs at" is what the simulator process reports back once it applied the rates.
            expect(panel.locator("#now-gap")).to_have_text("0.05", timeout=30_000)
            expect(panel.locator("#chart-lag-age path")).to_have_count(1)
            panel.locator("#incident-burst").click()  # a drill's incident: 3x for 20 s
            expect(panel.locator("#incident-message")).to_have_text("sent", timeout=10_000)
            # The harness carries it out and says so ("incident load: ..."), beside the UI's "fired" line.
            expect(panel.locator("#sotw-log")).to_contain_text("incident load: ", timeout=30_000)
            page.get_by_role("tab", name="Kafka lag").click()
            panel.locator("h1").scroll_into_view_if_needed()
            page.screenshot(path=str(artifact_dir / "locust-ui.png"))
            page.locator("#sotw-button").click()  # closes the panel, which covers the header's right side

            # Stop: Locust's runner is STOPPED at once (the UI's New button shows only then), while the run
            # is still being verified; the Correctness tab follows the verification to its verdict.
            pressed = time.monotonic()
            page.get_by_role("button", name="Stop").click()
            expect(page.get_by_role("button", name="New")).to_be_visible(timeout=STOP_LIMIT_S * 1000)
            took = time.monotonic() - pressed
            assert took <= STOP_LIMIT_S, f"Stop took {took:.1f} s to reach STOPPED"
            assert get_json(f"{url}/stats/requests")["state"] == "stopped"
            # A new Start before the verdict (the smoke profile's settle alone takes 11 s) is refused, saying
            # why, and starts nothing.
            page.get_by_role("button", name="New").click()
            page.get_by_role("button", name="Start").click()
            expect(page.get_by_text("is still being verified after its stop")).to_be_visible(timeout=10_000)
            assert get_json(f"{url}/stats/requests")["state"] == "stopped"
            page.keyboard.press("Escape")
            page.get_by_role("tab", name="Correctness").click()
            # Locust's UI polls its tabs only while a run goes on: sotw's script shows the rows as they are.
            correctness = page.locator("#sotw-correctness-live")
            expect(correctness).to_contain_text("verification after Stop", timeout=30_000)
            expect(correctness).to_contain_text("being verified")
            expect(correctness).to_contain_text(
                re.compile(r"verdict \(final\)\s*(PASS|FAIL|INCONCLUSIVE)"), timeout=300_000
            )
            shown = re.search(r"verdict \(final\)\s*(PASS|FAIL|INCONCLUSIVE)", correctness.inner_text())
            page.screenshot(path=str(artifact_dir / "locust-verdict.png"))
            browser.close()
        assert get_json(f"{url}/sotw/state")["faults_now"]["gap"] == 0.05
        results = json.loads((tmp_path / "session" / "run-1" / "results.json").read_text())
        assert shown is not None and shown.group(1) == results["verdict"]["verdict"]
    finally:
        code = stop(proc)
    assert code == 0, log.read_text()[-3000:]
    assert not (tmp_path / "session" / "run-2").exists(), "the refused Start started no run"
