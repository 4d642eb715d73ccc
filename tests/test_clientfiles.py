"""Secrets stay off command lines and out of what is shown: ``-X`` refuses them, files carry them (0600)."""

from __future__ import annotations

import argparse
import json
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from sotw.cliargs import KafkaArgsError, add_kafka_args, cluster_config, kafka_settings
from sotw.clientfiles import SettingsFiles, hand_over, take_over
from sotw.errors import SotwError
from sotw.kafka import REDACTED, KafkaConfig, read_settings

ROOT = Path(__file__).resolve().parents[1]
SECURED = {
    "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "SCRAM-SHA-512",
    "sasl.username": "team",
    "sasl.password": "s3cret-pw",
    "ssl.ca.location": "/etc/ca.pem",
}


def kafka_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_kafka_args(parser)
    return parser.parse_args(list(argv))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_x_refuses_a_secret_naming_the_settings_file_option_and_takes_the_file(tmp_path: Path) -> None:
    for secret in ("sasl.password=x", "ssl.key.password=x", "sasl.jaas.config=x", "ssl.key.pem=x"):
        with pytest.raises(
            KafkaArgsError, match=r"-X .*never taken on the command line.*--kafka-config FILE"
        ):
            kafka_settings(kafka_args("-X", secret))
    # Refused without --bootstrap too, where a local broker would ignore it.
    with pytest.raises(SotwError, match="sasl.password"):
        cluster_config(kafka_args("-X", "sasl.password=x"))
    settings = tmp_path / "client.properties"
    settings.write_text("# staging\nsasl.username=team\nsasl.password=pw=with=equals\n")
    got = kafka_settings(kafka_args("--kafka-config", str(settings), "-X", "client.id=me"))
    assert got == {"sasl.username": "team", "sasl.password": "pw=with=equals", "client.id": "me"}
    with pytest.raises(KafkaArgsError, match="cannot read --kafka-config"):
        kafka_settings(kafka_args("--kafka-config", str(tmp_path / "missing")))


def test_sotw_run_given_a_password_with_x_exits_non_zero_with_the_way_out() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sotw", "run", "-X", "sasl.password=hunter2", "--bootstrap", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 1
    assert "-X sasl.password" in done.stderr and "--kafka-config FILE" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_config_shows_its_secrets_redacted() -> None:
    kafka = KafkaConfig("h:1", SECURED)
    assert "s3cret-pw" not in repr(kafka) and REDACTED in repr(kafka)
    assert kafka.redacted()["sasl.password"] == REDACTED and kafka.redacted()["sasl.username"] == "team"
    assert kafka.secret_names() == ["sasl.password"]


def test_settings_files_are_private_in_each_dialect_and_removed_together(tmp_path: Path) -> None:
    kafka = KafkaConfig("127.0.0.1:9093", SECURED)
    files = SettingsFiles(tmp_path / "job")
    paths = {kind: files.write(kind, kafka) for kind in ("kafka_config", "java_config", "spark_options")}
    assert all(mode(p) == 0o600 for p in paths.values())
    assert read_settings(paths["kafka_config"]) == SECURED
    java = paths["java_config"].read_text()
    assert "bootstrap.servers=127.0.0.1:9093" in java and 'password="s3cret-pw";' in java
    options = json.loads(paths["spark_options"].read_text())
    assert options["kafka.bootstrap.servers"] == "127.0.0.1:9093"
    assert options["kafka.sasl.mechanism"] == "SCRAM-SHA-512" and "kafka.sasl.jaas.config" in options
    files.remove()
    assert not any(p.exists() for p in paths.values())


def test_secrets_handed_to_another_process_go_in_a_private_file_it_deletes_once_read(tmp_path: Path) -> None:
    public, secrets_file = hand_over(SECURED, tmp_path / "x-secrets.properties")
    assert "sasl.password" not in public and secrets_file is not None
    assert mode(Path(secrets_file)) == 0o600
    assert take_over(public, secrets_file) == SECURED
    assert not Path(secrets_file).exists()
    assert hand_over({"client.id": "me"}, tmp_path / "none") == ({"client.id": "me"}, None)
