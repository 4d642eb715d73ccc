"""The Java pieces set-up provides: the bundle of Kafka jars Maven copied, checked before a JVM starts, and Java."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from sotw.broker import KafkaBroker
from sotw.errors import BrokerError, SetupError
from sotw.jars import MANIFEST, bundle_dir, classpath, fetch
from sotw.java import java_major


def copy_bundle(prefix: Path) -> Path:
    """This environment's Kafka bundle copied under ``prefix`` (as another environment would hold it)."""
    target = bundle_dir("kafka", prefix)
    shutil.copytree(bundle_dir("kafka"), target)
    return target


def test_make_setup_installed_the_kafka_bundle_with_its_logging_binding():
    names = {p.name for p in classpath("kafka")}
    assert "kafka_2.13-4.4.0.jar" in names
    assert any(n.startswith("log4j-slf4j-impl-") for n in names)
    assert any(n.startswith("log4j-core-") for n in names)


def test_a_bundle_never_fetched_names_make_setup(tmp_path: Path):
    with pytest.raises(
        SetupError, match=r"the kafka jars are not installed in .*: run `make setup` to fetch them"
    ):
        classpath("kafka", tmp_path)


def test_a_truncated_jar_is_named_with_its_size_and_make_setup(tmp_path: Path):
    folder = copy_bundle(tmp_path)
    jar = folder / "kafka_2.13-4.4.0.jar"
    jar.write_bytes(jar.read_bytes()[:1000])
    with pytest.raises(
        SetupError, match=r"damaged \(kafka_2\.13-4\.4\.0\.jar is 1,000 bytes, not [\d,]+\): run `make setup`"
    ):
        classpath("kafka", tmp_path)


def test_a_missing_jar_is_named(tmp_path: Path):
    folder = copy_bundle(tmp_path)
    (folder / "kafka-clients-4.4.0.jar").unlink()
    with pytest.raises(SetupError, match=r"kafka-clients-4\.4\.0\.jar is missing\): run `make setup`"):
        classpath("kafka", tmp_path)


def test_a_bundle_from_an_older_pom_asks_for_make_setup(tmp_path: Path):
    folder = copy_bundle(tmp_path)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["pom_sha256"] = "0" * 64
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(SetupError, match=r"from an older jars/kafka/pom\.xml: run `make setup`"):
        classpath("kafka", tmp_path)


def test_an_unknown_bundle_is_named_with_the_known_ones():
    with pytest.raises(
        SetupError, match=r"no bundle of jars named 'spark' \(known: delta, kafka, spark-kafka\)"
    ):
        classpath("spark")


def test_fetching_without_maven_says_how_to_install_it(tmp_path: Path):
    with pytest.raises(SetupError, match=r"Maven \(no-such-mvn\) is needed .* apt-get install maven"):
        fetch("kafka", tmp_path, mvn="no-such-mvn")
    assert not bundle_dir("kafka", tmp_path).exists()


def test_the_broker_refuses_to_start_without_its_jars_naming_make_setup(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(tmp_path))  # an environment where set-up never ran
    with pytest.raises(BrokerError, match=r"the kafka jars are not installed .*: run `make setup`"):
        KafkaBroker().start()


@pytest.mark.parametrize(
    ("text", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('openjdk version "21" 2023-09-19', 21),
        ('java version "1.8.0_292"', 8),
        ("no version here", None),
    ],
)
def test_the_java_version_is_read_from_java_dash_version(text: str, major: int | None):
    assert java_major(text) == major
