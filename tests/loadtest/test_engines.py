"""``sotw compare-engines`` as a team choosing an engine runs it: the engines file, the checks before any run, and a comparison where one engine's job has a bug the verdict must name."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from loadtest.engines.catalog import Engine, check_args, load_engines
from loadtest.engines.compare import write_pages
from loadtest.engines.steps import Comparison, Outcome, Plan, steps
from loadtest.engines.table import engine_rows, headline
from loadtest.reports.results import DrillCheck, DrillScore, Figure, IncidentResult, ResourceUsage, Results
from sotw.cli import main as sotw_main
from tests.loadtest.sample_results import sample_results
from tests.loadtest.test_own_pipeline import SCENARIO

ROOT = Path(__file__).resolve().parents[2]


def test_the_shipped_engines_are_the_spark_pipeline_with_each_source_kafka_streams_and_quixstreams() -> None:
    engines = load_engines()

    assert [e.name for e in engines] == ["spark-kafka", "spark-sotw-kafka", "kafka-streams", "quixstreams"]
    for engine in engines:  # each engine's options are options of every command it is given to
        check_args(engine, ("run", "drill", "capacity"))
    streams = engines[2]
    assert streams.prepare == ("make", "kafka-streams-job")
    assert "group:engines-streams" in streams.args and "--application-id engines-streams" in " ".join(
        streams.args
    )


def _engines_file(tmp_path: Path, args: str) -> Path:
    path = tmp_path / "engines.toml"
    path.write_text(f'[engines.mine]\ndescription = "a team job"\nargs = {args}\n')
    return path


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (
            '["--sorce", "spark-kafka"]',
            "engine mine: its args are not options of sotw run: unrecognized arguments: --sorce",
        ),
        ('["--source", "flink"]', "argument --source: invalid choice: 'flink'"),
        ('["--load", "10x"]', "engine mine: --load is set by sotw compare-engines for every run"),
        ('"--source spark-kafka"', "engine mine: args must be a list of strings"),
        (
            '["--run", "/tmp/x"]',
            "engine mine: --run-dir is set by sotw compare-engines",
        ),  # argparse's abbreviation
        (
            '["--pipeline-cmd", "job --out {output} --ckpt {ckpt}"]',
            "engine mine: --pipeline-cmd uses an unknown placeholder {ckpt}",
        ),
    ],
)
def test_an_engine_whose_options_are_wrong_is_refused_before_any_run_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: str, named: str
) -> None:
    engines = _engines_file(tmp_path, args)

    code = sotw_main(["compare-engines", "--engines", str(engines), "--run-dir", str(tmp_path / "out")])

    assert code == 1
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing ran


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (
            ["--engine", "flink"],
            "no engine 'flink' in the engines file (it has spark-kafka, spark-sotw-kafka,",
        ),
        (["--drill", "pipeline-kil-1x"], "no shipped drill 'pipeline-kil-1x'"),
        (["--profile", "nightly"], "nightly"),
        (["--load", "ten"], "ten"),
        (["--load", "1x", "--load", "1x"], "--load: 1x is given twice"),
    ],
)
def test_a_wrong_engine_drill_profile_or_load_is_named_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], named: str
) -> None:
    code = sotw_main(["compare-engines", *flags, "--run-dir", str(tmp_path / "out")])

    assert code == 1
    assert named in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_run_directory_already_used_is_refused_so_no_old_results_are_read_as_new(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "spark-kafka" / "run-1x").mkdir(parents=True)
    (tmp_path / "spark-kafka" / "run-1x" / "results.json").write_text("{}")

    assert sotw_main(["compare-engines", "--run-dir", str(tmp_path)]) == 1
    assert "is not empty (an earlier comparison's?): give a new --run-dir" in capsys.readouterr().err


# The naive job keeps the last message it saw per row: a delayed message or a copy sent again puts an old value back.
ENGINES = """
[engines.naive]
description = "examples/naive_pipeline.py: last write wins"
args = ["--contract", "tables", "--pipeline-cmd", "{{python}} {naive} --bootstrap {{bootstrap}} --topics {{pattern}} --out {{output}} --checkpoint {{checkpoint}} --trigger-ms {{trigger_ms}}"]

[engines.spark-sotw-kafka]
description = "sotw's pipeline"
args = ["--source", "sotw-kafka"]
"""


@pytest.mark.slow  # two engines, each a run with a broker of its own: about 4 minutes
def test_two_engines_side_by_side_the_one_with_a_bug_fails_with_its_wrong_rows_counted(
    tmp_path: Path,
) -> None:
    (tmp_path / "scenario.toml").write_text(SCENARIO.format(name="reorder", rate=0.05))  # reordering faults
    (tmp_path / "engines.toml").write_text(ENGINES.format(naive=ROOT / "examples" / "naive_pipeline.py"))
    out = tmp_path / "compared"
    argv = [sys.executable, "-m", "sotw", "compare-engines", "--engines", str(tmp_path / "engines.toml")]
    argv += [
        "--scenario",
        str(tmp_path / "scenario.toml"),
        "--profile",
        "reorder",
        "--load",
        "1x",
        "--no-drills",
    ]
    done = subprocess.run(
        [*argv, "--run-dir", str(out)], capture_output=True, text=True, timeout=1200, cwd=tmp_path
    )

    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # not every engine PASSed
    assert "[1/2] naive run 1x: FAIL" in done.stdout and "[2/2] spark-sotw-kafka run 1x: PASS" in done.stdout
    naive = Results.from_json(out / "naive" / "run-1x" / "results.json")
    c = naive.correctness
    assert c is not None and c.rows_wrong > 0
    data = json.loads((out / "engines.json").read_text())
    runs = {e["engine"]: e["runs"][0] for e in data["engines"]}
    assert runs["naive"]["verdict"] == "FAIL" and runs["naive"]["rows_wrong"] >= c.rows_wrong
    assert runs["spark-sotw-kafka"]["verdict"] == "PASS" and runs["spark-sotw-kafka"]["rows_wrong"] == 0
    assert (
        runs["spark-sotw-kafka"]["cpu_us_per_message"] > 0 and runs["spark-sotw-kafka"]["peak_rss_mb"] > 100
    )
    table = (out / "engines.md").read_text()
    assert "| naive | FAIL |" in table and "| spark-sotw-kafka | PASS | 0 |" in table
    assert (out / "engines.png").read_bytes().startswith(b"\x89PNG")
    assert "data:image/png;base64," in (out / "engines.html").read_text()


@pytest.mark.slow  # the baseline profile at 1x (and 10x) and a kill -9 drill: 7 to 20 minutes per engine
@pytest.mark.timeout(3700)  # the comparison's own limit is 3600 s, beyond the suite's 900 s a test
@pytest.mark.parametrize(("engine", "loads"), [("kafka-streams", ["1x", "10x"]), ("quixstreams", ["1x"])])
def test_each_example_job_passes_baseline_and_a_kill_9_of_itself(
    tmp_path: Path, engine: str, loads: list[str]
) -> None:
    # quixstreams, one Python process, reads about 7,000 msg/s here, a third of 10x: docs/engines.md has that
    # run and why.
    out = tmp_path / "compared"
    argv = [sys.executable, "-m", "sotw", "compare-engines", "--engine", engine]
    argv += [word for load in loads for word in ("--load", load)]
    argv += ["--drill", "pipeline-kill-1x", "--run-dir", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=3600, cwd=ROOT)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    runs = json.loads((out / "engines.json").read_text())["engines"][0]["runs"]
    assert [(r["run"], r["verdict"], r["rows_wrong"]) for r in runs] == [
        *((f"run {load}", "PASS", 0) for load in loads),
        ("drill pipeline-kill-1x", "PASS", 0),
    ]
    assert all(s is not None for s in runs[-1]["recover_s"])  # back to normal after the kill


def _results(verdict: str = "PASS", **changes: object) -> Results:
    """A 1x run's results whose job used 150 % of a core to consume 2,000 msg/s, peaking at 900 MB."""
    base = sample_results(1.0, passed=verdict == "PASS")
    summary = [*base.summary, Figure("consumed_rate", "steady", 2000.0, "msg/s")]
    resources = [ResourceUsage("pipeline", 150.0, 190.0, 800.0, 900.0)]
    return dataclasses.replace(base, summary=summary, resources=resources, **changes)  # type: ignore[arg-type]


def test_the_table_reads_each_engines_verdicts_rows_wrong_recovery_p99_cpu_and_memory_from_its_runs(
    tmp_path: Path,
) -> None:
    fast, broken = Engine("fast", "", ()), Engine("broken", "", ())
    plan = Plan(loads=("1x",), drills=("pipeline-kill-1x",), capacity=True)
    kill = IncidentResult("pipeline_kill", "pipeline_kill", 0, 1, recover_s=12.5)
    unmet = DrillScore("pipeline-kill-1x", "", [DrillCheck("recover_s", "<= 10 s", "12.5 s", False)], False)
    fast_steps = steps(fast, plan, tmp_path)
    outcomes = [
        Outcome(fast_steps[0], 0, 100.0, _results(), tmp_path),
        # The run's own verdict is PASS, but the drill's scorecard has an expectation unmet: the drill FAILs.
        Outcome(fast_steps[1], 1, 100.0, _results(incidents=[kill], drill=unmet), tmp_path),
        # A capacity search whose output was wrong found no rate to trust.
        Outcome(fast_steps[2], 1, 100.0, _results("FAIL"), tmp_path),
        Outcome(steps(broken, plan, tmp_path)[0], 124, 1800.0, None, tmp_path, "see run-1x.log"),
    ]
    rows = engine_rows([fast, broken], outcomes, {})

    head, body = headline(rows, ["1x"], ["pipeline-kill-1x"])
    cells = {engine[0]: dict(zip(head, engine, strict=True)) for engine in body}
    assert cells["fast"]["run 1x"] == "PASS" and cells["fast"]["drill pipeline-kill-1x"] == "FAIL"
    assert cells["fast"]["pipeline-kill-1x recovery"] == "12.5 s"
    assert cells["fast"]["rows wrong"] == "1"  # the capacity run's lost row
    assert cells["fast"]["end-to-end p99 1x"] == "0.41 s"
    assert cells["fast"]["CPU per message 1x"] == "750 µs"  # 1.5 cores / 2,000 msg/s
    assert cells["fast"]["peak memory"] == "900 MB"
    assert cells["fast"]["max sustained rate"] == "none (FAIL)"
    assert cells["broken"]["run 1x"] == "no results (exit 124: see run-1x.log)"
    assert cells["broken"]["rows wrong"] == "-"
    assert [o.passed for o in outcomes] == [True, False, False, False]


def test_an_earlier_comparisons_table_is_rebuilt_from_its_directory_running_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = Engine("fast", "", ("--source", "sotw-kafka"))
    plan = Plan(loads=("1x",), drills=("pipeline-kill-1x",))
    kill = IncidentResult("pipeline_kill", "pipeline_kill", 0, 1, recover_s=12.5)
    met = DrillScore("pipeline-kill-1x", "", [DrillCheck("recover_s", "<= 45 s", "12.5 s", True)], True)
    run, drill = steps(engine, plan, tmp_path)
    outcomes = [
        Outcome(run, 0, 100.0, _results(), tmp_path),
        Outcome(drill, 0, 100.0, _results(incidents=[kill], drill=met), tmp_path),
    ]
    for o in outcomes:
        o.step.directory.mkdir(parents=True)
        assert o.results is not None
        o.results.to_json(o.step.directory / "results.json")
    write_pages(tmp_path, "baseline", [engine], Comparison(outcomes), ["1x"], ["pipeline-kill-1x"])
    first = (tmp_path / "engines.md").read_text()
    (tmp_path / "engines.md").unlink()

    assert sotw_main(["compare-engines", "--table-from", str(tmp_path)]) == 0  # every run PASSed

    assert (tmp_path / "engines.md").read_text() == first
    assert "| fast | PASS | PASS | 12.5 s | 0 | 0.41 s | - | 750 µs | 900 MB |" in first
    assert "| fast | PASS | PASS | 12.5 s |" in capsys.readouterr().out
    # A comparison killed before it wrote engines.json: its run directories say what ran.
    (tmp_path / "engines.json").unlink()
    assert sotw_main(["compare-engines", "--table-from", str(tmp_path)]) == 0
    assert (
        "| fast | PASS | PASS | 12.5 s | 0 | 0.41 s | - | 750 µs | 900 MB |"
        in (tmp_path / "engines.md").read_text()
    )
