"""The HTML report and Markdown summary: written, charts embedded, key numbers present."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from loadtest.reports.charts import charts
from loadtest.reports.report import write_report
from tests.loadtest.sample_results import sample_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def embedded_images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)]


def test_one_run_report_has_charts_verdict_and_key_numbers(tmp_path: Path) -> None:
    paths = write_report([sample_results(1.0)], tmp_path)
    html = paths.html.read_text()
    images = embedded_images(html)
    assert len(images) == 6  # throughput, lag, latency, percentiles, resources, capacity
    assert html.count("<figcaption>") == 6
    assert all(img.startswith(PNG_MAGIC) and len(img) > 5000 for img in images)
    assert "src='http" not in html and "<script" not in html  # self-contained
    for text in (
        "PASS",
        "Throughput over time",
        "Latency percentiles",
        "Damage window",
        "Capacity",
        "sess-0003-1",
        "2,000 msg/s",
        "410 ms",
        "101 of 101 required",
        "<figcaption>Top: age of the oldest message",
    ):
        assert text in html, text
    md = paths.markdown.read_text()
    for text in (
        "**1x: PASS**",
        "| end-to-end latency p99 | steady | 410 ms |",
        "| drain time | drain | 9.5 s |",
        "| 1x | end_to_end | steady | 84,000 | 180 ms | 240 ms | 410 ms | 650 ms | 1,200 ms |",
        "max sustained load factor | 6 x",
        str(paths.html),
    ):
        assert text in md, text


def key_number_rows(md: str) -> list[list[str]]:
    """The body rows of the Markdown summary's key-numbers table, as cells."""
    section = md.split("## Key numbers", 1)[1].split("##", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def test_the_key_numbers_state_each_figure_once_with_the_phase_it_covers(tmp_path: Path) -> None:
    # The lag series over the whole run peak at 4 s (the drain's backlog); the steady phase's max is 0.4 s.
    paths = write_report([sample_results(1.0), sample_results(10.0, seed=2)], tmp_path)
    rows = key_number_rows(paths.markdown.read_text())
    names = [row[0] for row in rows]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    assert all(row[1] in ("steady", "drain", "whole run") for row in rows), rows
    lag_rows = [row for row in rows if "oldest unprocessed" in row[0]]
    assert lag_rows == [
        ["lag: age of the oldest unprocessed message, p95", "steady", "0.3 s", "0.3 s"],
        ["lag: age of the oldest unprocessed message, max", "steady", "0.4 s", "0.4 s"],
    ]


def test_failed_run_shows_reasons_and_triage_with_the_layer(tmp_path: Path) -> None:
    paths = write_report([sample_results(1.0, passed=False)], tmp_path)
    html, md = paths.html.read_text(), paths.markdown.read_text()
    assert "class='FAIL'" in html and "correctness: 1 lost row" in html
    assert "in Kafka at sotw-sensor-0007[0]@812" in html
    assert "| lost_row | sess-0007-3 | 41 | pipeline |" in md


def test_two_runs_are_reported_side_by_side(tmp_path: Path) -> None:
    paths = write_report([sample_results(1.0), sample_results(10.0, seed=2)], tmp_path, name="bench")
    md = paths.markdown.read_text()
    assert paths.html.name == "bench.html"
    assert "| figure | phase | 1x | 10x |" in md
    assert "| produced | steady | 2,000 msg/s | 20,000 msg/s |" in md
    assert len(embedded_images(paths.html.read_text())) == 7  # one capacity chart per run


def test_charts_are_skipped_when_a_run_has_no_samples(tmp_path: Path) -> None:
    bare = sample_results(1.0)
    from dataclasses import replace

    bare = replace(bare, throughput=[], lag=[], latency_series=[], resource_series=[], capacity=None)
    titles = [title for title, _, _ in charts([bare])]
    assert titles == ["Latency percentiles"]
    write_report([bare], tmp_path)
