"""The SparkSession sotw builds: its JVM settings reach the JVM, a user's own options add to them, and its
Python workers start from sotw's daemon with pyspark imported from the installed package."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyspark

import sotw
from pipeline.spark import SparkConfig, driver_java_options
from sotw.pysparkpath import install, installed_beside


def test_the_spark_jvm_runs_with_the_driver_java_options(spark: Any) -> None:
    runtime = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
    arguments = list(runtime.getInputArguments())
    assert SparkConfig().driver_java_options == "-XX:TieredStopAtLevel=1"
    assert "-XX:TieredStopAtLevel=1" in arguments


def test_a_users_extra_java_options_come_after_the_default_so_they_win() -> None:
    user = SparkConfig(extra={"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4 -Dsite=lab"})
    assert driver_java_options(user) == "-XX:TieredStopAtLevel=1 -XX:TieredStopAtLevel=4 -Dsite=lab"
    assert driver_java_options(SparkConfig(driver_java_options="")) == ""
    assert driver_java_options(SparkConfig(driver_java_options="", extra=user.extra)) == (
        "-XX:TieredStopAtLevel=4 -Dsite=lab"
    )


def test_python_workers_import_the_installed_pyspark_not_its_zip(spark: Any) -> None:
    def worker_facts(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        import sys

        import pyspark

        for _ in batches:
            yield pd.DataFrame({"pyspark": [pyspark.__file__], "daemon": [" ".join(sys.argv)]})

    rows = spark.range(2, numPartitions=2).mapInPandas(worker_facts, "pyspark string, daemon string")
    facts = rows.collect()
    assert facts
    for row in facts:
        # Forked from sotw's daemon, which put the installed package (with its compiled bytecode) first.
        assert "pipeline.pydaemon" in row.daemon or "pipeline/pydaemon.py" in row.daemon
        assert row.pyspark == pyspark.__file__
        assert ".zip" not in row.pyspark


def test_only_zips_shipped_inside_the_pyspark_this_python_imports_are_dropped(tmp_path: Path) -> None:
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    zips = sorted(str(p) for p in lib.glob("*.zip"))
    assert any(z.endswith("pyspark.zip") for z in zips) and any("py4j-" in z for z in zips)
    assert all(installed_beside(z) for z in zips)
    # The same installation, but not on this interpreter's path (a PYSPARK_PYTHON of another environment).
    elsewhere = [p for p in sys.path if Path(p).resolve() != Path(pyspark.__file__).parent.parent.resolve()]
    assert not any(installed_beside(z, elsewhere) for z in zips)
    # A Spark distribution's SPARK_HOME/python/lib, with no package beside it, keeps its zips.
    home = tmp_path / "spark-4.0.0-bin" / "python" / "lib"
    home.mkdir(parents=True)
    for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        (home / name).write_bytes(b"")
        assert not installed_beside(str(home / name), [*sys.path, str(tmp_path)])
    assert not installed_beside(str(Path(pyspark.__file__).parent))  # not a zip


def test_a_python_started_the_way_spark_starts_one_imports_the_installed_pyspark(tmp_path: Path) -> None:
    """Spark puts its zips first on ``PYTHONPATH``; with sotw's ``.pth`` the installed package wins."""
    lib = Path(pyspark.__file__).parent / "python" / "lib"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in sorted(lib.glob("*.zip")))}
    # The installed packages (and sotw) on the path as a site directory puts them there, without running the
    # environment's own .pth files; then the site directory under test, if any.
    paths = [str(Path(pyspark.__file__).parent.parent), str(Path(sotw.__file__).parent.parent)]
    probe = "import pyspark, py4j; print(pyspark.__file__, py4j.__file__, 'sotw' in sys.modules)"

    def imported(site: Path | None) -> list[str]:
        add = "" if site is None else f"import site; site.addsitedir({str(site)!r}); "
        code = f"import sys; sys.path.extend({paths!r}); {add}{probe}"
        run = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return run.stdout.split()

    assert all(".zip" in f for f in imported(None)[:2])  # Python alone takes the zips, as Spark asks
    install(tmp_path)
    # The installed packages instead; and the .pth did not import sotw (which would pin its version).
    assert imported(tmp_path) == [pyspark.__file__, sys.modules["py4j"].__file__, "False"]
