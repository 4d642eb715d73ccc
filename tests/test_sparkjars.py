"""Spark's jars as make setup installs them: checked against the installed PySpark, named with their fix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pipeline.spark import SparkConfig, jars_setting
from sotw.errors import SetupError
from sotw.jars import DEFINITIONS, bundle_dir, classpath
from sotw.sparkjars import BUNDLES, MARKER, install, pyspark_version, spark_jars


def fake_bundle(prefix: Path, bundle: str, jar: str) -> None:
    """A bundle as ``sotw.jars.fetch`` leaves it, holding one jar of the given name."""
    folder = bundle_dir(bundle, prefix)
    folder.mkdir(parents=True)
    (folder / jar).write_bytes(b"jar")
    pom = hashlib.sha256((DEFINITIONS / bundle / "pom.xml").read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps({"bundle": bundle, "pom_sha256": pom, "jars": {jar: 3}}))


def test_the_installed_bundles_are_built_for_the_installed_pyspark() -> None:
    jars = spark_jars()
    names = {p.name for p in jars}
    version = pyspark_version()
    assert f"spark-sql-kafka-0-10_2.13-{version}.jar" in names
    assert f"spark-token-provider-kafka-0-10_2.13-{version}.jar" in names
    assert any(n.startswith("kafka-clients-") for n in names) and any(
        n.startswith("commons-pool2-") for n in names
    )
    minor = ".".join(version.split(".")[:2])
    assert any(n.startswith(f"delta-spark_{minor}_2.13-") for n in names)
    # What PySpark ships is not given twice (Scala, Hadoop, Jackson core, log4j are Spark's own).
    assert not any(
        n.startswith(("scala-library", "hadoop-client", "jackson-databind", "log4j")) for n in names
    )


def test_a_missing_bundle_names_make_setup(tmp_path: Path) -> None:
    with pytest.raises(SetupError, match=r"spark-kafka jars are not installed in .*: run `make setup`"):
        spark_jars(("spark-kafka",), prefix=tmp_path)


def test_a_connector_built_for_another_spark_is_refused_naming_both_versions_and_the_fix(
    tmp_path: Path,
) -> None:
    fake_bundle(tmp_path, "spark-kafka", "spark-sql-kafka-0-10_2.13-4.1.0.jar")
    with pytest.raises(SetupError) as refused:
        spark_jars(("spark-kafka",), prefix=tmp_path)
    message = str(refused.value)
    assert f"built for Spark 4.1.0, but PySpark {pyspark_version()} is installed" in message
    assert "make setup" in message and "jars/spark-kafka/pom.xml" in message


def test_delta_built_for_the_same_spark_minor_version_is_accepted_and_another_refused(tmp_path: Path) -> None:
    minor = ".".join(pyspark_version().split(".")[:2])
    fake_bundle(tmp_path / "same", "delta", f"delta-spark_{minor}_2.13-9.9.9.jar")
    assert [p.name for p in spark_jars(("delta",), prefix=tmp_path / "same")] == [
        f"delta-spark_{minor}_2.13-9.9.9.jar"
    ]
    fake_bundle(tmp_path / "other", "delta", "delta-spark_3.9_2.13-9.9.9.jar")
    with pytest.raises(SetupError, match=r"Delta Lake's Spark jars .* built for Spark 3\.9, but PySpark"):
        spark_jars(("delta",), prefix=tmp_path / "other")


def test_spark_jars_keeps_the_user_s_own_jars_first() -> None:
    setting = jars_setting(SparkConfig(extra={"spark.jars": "/opt/team/udfs.jar"})).split(",")
    assert setting[0] == "/opt/team/udfs.jar"
    assert setting[1:] == [str(p) for p in spark_jars(BUNDLES)]
    assert jars_setting(SparkConfig(jar_bundles=())) == ""


def test_install_writes_spark_defaults_once_and_leaves_someone_else_s_file_alone(tmp_path: Path) -> None:
    target = tmp_path / "conf" / "spark-defaults.conf"
    install(target)
    install(target)  # make setup again: its own file is rewritten
    text = target.read_text()
    assert text.startswith(MARKER)
    [line] = [line for line in text.splitlines() if line.startswith("spark.jars ")]
    assert line.split(None, 1)[1].split(",") == [str(p) for p in spark_jars()]

    theirs = tmp_path / "theirs.conf"
    theirs.write_text("spark.executor.memory 4g\n")
    with pytest.raises(SetupError, match="was not written by sotw: add `spark.jars "):
        install(theirs)
    assert theirs.read_text() == "spark.executor.memory 4g\n"
    assert classpath("spark-kafka")  # untouched by any of it
