"""The HTML report and Markdown summary: written, charts embedded, key numbers present."""

from __future__ import annotations

import base64
import re
from pathlib import Path

from loadtest.report import charts, write_report
from tests.loadtest.sample_results import sample_results

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def embedded_images(html: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)]


def test_one_run_report_has_charts_verdict_and_key_numbers(tmp_path: Path) -> None:
    paths = write_report([sample_results(1.0)], tmp_path)
    html = paths.html.read_text()
    images = embedded_images(html)
    assert len(images) == 6  # throughput, lag, latency, percentiles, resources, capacity
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
    ):
        assert text in html, text
    md = paths.markdown.read_text()
    for text in (
        "**1x: PASS**",
        "| end-to-end p50 / p99 / p99.9 / max | 180 / 410 / 650 / 1,200 ms |",
        "max sustained load factor | 6 x",
        str(paths.html),
    ):
        assert text in md, text


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
    assert "|  | 1x | 10x |" in md
    assert "| produced (steady mean) | 2,000 msg/s | 20,000 msg/s |" in md
    assert len(embedded_images(paths.html.read_text())) == 7  # one capacity chart per run


def test_charts_are_skipped_when_a_run_has_no_samples(tmp_path: Path) -> None:
    bare = sample_results(1.0)
    from dataclasses import replace

    bare = replace(bare, throughput=[], lag=[], latency_series=[], resource_series=[], capacity=None)
    titles = [title for title, _ in charts([bare])]
    assert titles == ["Latency percentiles"]
    write_report([bare], tmp_path)
