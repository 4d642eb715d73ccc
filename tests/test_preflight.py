"""The pre-flight check and the topics a run owns, against the session's secured (``sasl_ssl``) broker."""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path

import psutil
import pytest

from loadtest.errors import HarnessError
from loadtest.gameday.drills import drill_from_mapping
from loadtest.run.profile import load_profile
from loadtest.run.runner import RunRequest, execute
from loadtest.run.topicargs import security_from_args
from sotw.cli import main as sotw_main
from sotw.errors import BrokerError
from sotw.kafka import KafkaConfig, ensure_topics, read_settings
from sotw.preflight import PreflightError, preflight
from sotw.tls import CertificateAuthority
from sotw.topics import TopicSettings, check_replication, delete_topics, list_topics, run_prefix
from tests.conftest import SecuredKafka

#: The issue's bound for a failing pre-flight check.
FAST_S = 15.0


def _fails(kafka: KafkaConfig, prefix: str) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(PreflightError) as caught:
        preflight(kafka, prefix)
    return str(caught.value), time.monotonic() - started


def test_the_admin_passes_the_check_and_the_cluster_has_one_broker(
    secured_kafka: SecuredKafka, unique_prefix
):
    report = preflight(secured_kafka.kafka, unique_prefix())
    assert report.brokers == 1
    assert report.seconds < FAST_S


def test_a_wrong_password_fails_fast_naming_the_user_and_the_password_setting(
    secured_kafka: SecuredKafka, unique_prefix
):
    settings = {**secured_kafka.kafka.settings, "sasl.password": "not-the-password"}
    message, seconds = _fails(KafkaConfig(secured_kafka.bootstrap, settings), unique_prefix())
    assert seconds < FAST_S
    assert "authentication failed" in message and "sasl.username=admin" in message
    assert "sasl.password" in message and "not-the-password" not in message


def test_a_ca_the_client_does_not_trust_fails_fast_naming_ssl_ca_location(
    secured_kafka: SecuredKafka, unique_prefix, tmp_path: Path
):
    other = tmp_path / "other-ca.pem"
    other.write_bytes(CertificateAuthority.create("not the broker's CA").pem)
    settings = {**secured_kafka.kafka.settings, "ssl.ca.location": str(other)}
    message, seconds = _fails(KafkaConfig(secured_kafka.bootstrap, settings), unique_prefix())
    assert seconds < FAST_S
    assert f"ssl.ca.location={other}" in message and "certificate verify failed" in message


def test_a_user_whose_acls_cover_another_prefix_is_refused_the_run_prefix(
    secured_kafka: SecuredKafka, unique_prefix
):
    user = secured_kafka.user(unique_prefix())
    kafka = KafkaConfig(secured_kafka.bootstrap, _read(user.settings_path))
    preflight(kafka, run_prefix(user.topic_prefix))  # its own prefix, extended as a run extends it
    message, seconds = _fails(kafka, unique_prefix())
    assert seconds < FAST_S
    assert f"not authorized: {user.name} may not create topics" in message
    assert "TOPIC_AUTHORIZATION_FAILED" in message and "docs/own-cluster.md" in message


def test_a_user_without_its_groups_is_refused_naming_the_groups(secured_kafka: SecuredKafka, unique_prefix):
    prefix = unique_prefix()
    user = secured_kafka.broker.add_user(f"g{uuid.uuid4().hex[:8]}", prefix, group_prefix="elsewhere-")
    message, seconds = _fails(KafkaConfig(secured_kafka.bootstrap, _read(user.settings_path)), prefix)
    assert seconds < FAST_S
    assert "consumer groups" in message and "GROUP_AUTHORIZATION_FAILED" in message


def test_a_job_group_the_user_may_not_describe_is_refused_by_name(secured_kafka: SecuredKafka, unique_prefix):
    prefix = unique_prefix()
    kafka = KafkaConfig(secured_kafka.bootstrap, _read(secured_kafka.user(prefix).settings_path))
    preflight(kafka, run_prefix(prefix), groups=[f"{prefix}job"])
    with pytest.raises(PreflightError, match="may not describe the consumer group 'team-job'"):
        preflight(kafka, run_prefix(prefix), groups=["team-job"])


def test_a_refused_run_starts_nothing_and_writes_nothing(
    secured_kafka: SecuredKafka, unique_prefix, tmp_path: Path
):
    bad = KafkaConfig(secured_kafka.bootstrap, {**secured_kafka.kafka.settings, "sasl.password": "wrong"})
    run_dir = tmp_path / "run"
    children = {p.pid for p in psutil.Process().children(recursive=True)}
    prefix = unique_prefix()
    with pytest.raises(PreflightError, match="authentication failed"):
        execute(RunRequest(load_profile("baseline"), 1.0, run_dir, bad, topic_prefix=prefix))
    assert not run_dir.exists()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= children
    assert list_topics(secured_kafka.kafka, prefix) == []


def test_a_replication_factor_above_the_brokers_is_refused_before_the_run(
    secured_kafka: SecuredKafka, tmp_path: Path
):
    run_dir = tmp_path / "run"
    request = RunRequest(
        load_profile("baseline"),
        1.0,
        run_dir,
        secured_kafka.kafka,
        topics=TopicSettings(replication_factor=3),
    )
    with pytest.raises(
        BrokerError, match=r"--replication-factor 3 needs 3 brokers, but the cluster at .* has 1"
    ):
        execute(request)
    assert not run_dir.exists()


def test_topics_are_created_with_their_settings_listed_and_deleted_by_prefix(
    secured_kafka: SecuredKafka, unique_prefix, capsys: pytest.CaptureFixture[str]
):
    from confluent_kafka.admin import AdminClient, ConfigResource

    prefix = unique_prefix()
    user = secured_kafka.user(prefix)
    kafka = KafkaConfig(secured_kafka.bootstrap, _read(user.settings_path))
    ensure_topics(
        kafka,
        {f"{prefix}a": 2, f"{prefix}b": 1},
        replication_factor=1,
        topic_config={"min.insync.replicas": "1"},
    )
    assert [(t.name, t.partitions, t.replicas) for t in list_topics(kafka, prefix)] == [
        (f"{prefix}a", 2, 1),
        (f"{prefix}b", 1, 1),
    ]
    resource = ConfigResource("topic", f"{prefix}a")
    admin = AdminClient(kafka.client())
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["min.insync.replicas"].value == "1"
    flags = ["--prefix", prefix, "--bootstrap", kafka.bootstrap, "--kafka-config", str(user.settings_path)]
    assert sotw_main(["topics", "list", *flags]) == 0
    assert f"{prefix}a\t2 partitions" in capsys.readouterr().out
    assert sotw_main(["topics", "delete", *flags]) == 0
    assert "2 topics deleted" in capsys.readouterr().out
    assert _gone(kafka, prefix)
    assert delete_topics(kafka, prefix) == []


def _read(path: Path) -> dict[str, str]:
    return read_settings(path)


def _gone(kafka: KafkaConfig, prefix: str) -> bool:
    """Whether the topics under ``prefix`` are gone within 10 s (brokers learn of a deletion a moment later)."""
    deadline = time.monotonic() + 10
    while list_topics(kafka, prefix) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not list_topics(kafka, prefix)


# ----------------------------------------------------------------------------------- without a broker


def test_every_run_prefix_extends_the_profile_prefix_with_its_own_tag():
    first, second = run_prefix("sotw-sensor-"), run_prefix("sotw-sensor-")
    assert first != second
    assert first.startswith("sotw-sensor-") and first.endswith("-") and len(first) == len("sotw-sensor-") + 7


@pytest.mark.parametrize(
    ("rf", "isr", "message"),
    [(0, None, "replication_factor must be 1 or more"), (2, 3, "must not exceed replication_factor")],
)
def test_bad_topic_settings_are_refused_by_name(rf: int, isr: int | None, message: str):
    with pytest.raises(ValueError, match=message):
        TopicSettings(rf, isr)


def test_min_insync_replicas_above_the_brokers_is_refused():
    with pytest.raises(
        BrokerError, match="--min-insync-replicas 2 needs 2 brokers, but the cluster at x has 1"
    ):
        check_replication(TopicSettings(None, 2), 1, "the cluster at x")
    check_replication(TopicSettings(3, 2), 3, "the cluster at x")


def test_a_drill_file_asks_for_a_secured_local_broker():
    drill = drill_from_mapping("d", {"drill": {"profile": "baseline", "security": "sasl_ssl"}})
    assert drill.security == "sasl_ssl"
    assert drill_from_mapping("d", {"drill": {"profile": "baseline"}}).security == "plaintext"
    with pytest.raises(HarnessError, match="security must be one of"):
        drill_from_mapping("d", {"drill": {"profile": "baseline", "security": "tls"}})


def test_security_is_refused_with_bootstrap():
    args = argparse.Namespace(security="sasl_ssl", bootstrap="127.0.0.1:9092")
    with pytest.raises(HarnessError, match="--security is for the local broker"):
        security_from_args(args)
    assert security_from_args(argparse.Namespace(security=None, bootstrap=None), "ssl") == "ssl"


@pytest.mark.slow
@pytest.mark.system
def test_an_expired_client_certificate_fails_fast_naming_the_certificate(unique_prefix):
    from sotw.broker import KafkaBroker

    with KafkaBroker(security="ssl", start_timeout=120) as broker:
        assert broker.secrets is not None
        expired = broker.secrets.issue("late", expired=True)
        settings = {
            **broker.client_settings,
            "ssl.certificate.location": str(expired.cert),
            "ssl.key.location": str(expired.key),
        }
        message, seconds = _fails(KafkaConfig(broker.bootstrap, settings), unique_prefix())
    assert seconds < FAST_S
    assert f"ssl.certificate.location={expired.cert}" in message and "alert" in message


def test_a_drill_asking_for_a_secured_local_broker_is_refused_on_a_given_cluster(tmp_path: Path):
    from loadtest.cli import run_drill

    drill = drill_from_mapping("d", {"drill": {"profile": "baseline", "security": "sasl_ssl"}})
    with pytest.raises(HarnessError, match="asks for a sasl_ssl local broker: run it without --bootstrap"):
        run_drill(drill, tmp_path / "r", KafkaConfig("127.0.0.1:9"))
    assert not (tmp_path / "r").exists()


def test_run_flags_reach_the_local_broker_and_the_topics(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import loadtest.run.runner as runner
    from loadtest.cli import _parser as harness_parser
    from loadtest.run.topicargs import topics_from_args

    args = harness_parser("run").parse_args(
        ["--security", "sasl_ssl", "--replication-factor", "1", "--min-insync-replicas", "1", "--cleanup"]
    )
    assert topics_from_args(args) == TopicSettings(1, 1) and args.cleanup
    asked: dict[str, object] = {}

    class Started(Exception):
        pass

    def local_broker(name: str, **changes: object) -> None:
        asked.update(changes, name=name)
        raise Started

    monkeypatch.setattr(runner, "local_broker", local_broker)
    with pytest.raises(Started):
        execute(RunRequest(load_profile("baseline"), 1.0, tmp_path / "r", security=security_from_args(args)))
    assert asked["security"] == "sasl_ssl" and asked["name"] == "kafka"


@pytest.mark.slow
def test_a_run_as_a_user_holding_only_the_run_acls_passes_and_cleans_up(
    secured_kafka: SecuredKafka, unique_prefix, tmp_path: Path
):
    import dataclasses

    smoke = load_profile("smoke")
    smoke = dataclasses.replace(
        smoke, run=dataclasses.replace(smoke.run, max_lag_s=600, max_end_to_end_p99_s=None, drain_max_s=300)
    )
    user = secured_kafka.user(unique_prefix())
    kafka = KafkaConfig(secured_kafka.bootstrap, _read(user.settings_path))
    prefix = run_prefix(user.topic_prefix)
    request = RunRequest(
        smoke, 1.0, tmp_path / "run", kafka, topics=TopicSettings(1, 1), cleanup=True, topic_prefix=prefix
    )
    result = execute(request)
    assert result.verdict.verdict == "PASS", result.verdict.reasons
    assert _gone(secured_kafka.kafka, prefix)


def test_a_locust_session_on_a_cluster_runs_the_same_pre_flight_and_starts_nothing(
    secured_kafka: SecuredKafka, tmp_path: Path
):
    import io
    import json

    from loadtest.locust.fleetplan import LiveConfig
    from loadtest.locust.lines import Events
    from loadtest.locust.live import serve

    settings = {**secured_kafka.kafka.settings, "sasl.password": "wrong"}
    config = LiveConfig(
        session_dir=str(tmp_path / "session"), profile="smoke", bootstrap=secured_kafka.bootstrap,
        kafka_settings=settings, pipeline=False, tag="pf",
    )  # fmt: skip
    out = io.StringIO()
    started = time.monotonic()
    code = serve(config, Events(out), io.StringIO(""))
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    assert code == 1 and time.monotonic() - started < FAST_S
    fatal = [e for e in events if e["event"] == "error" and e.get("fatal")]
    assert fatal and "authentication failed" in fatal[0]["message"] and "wrong" not in fatal[0]["message"]
    assert not any(e["event"] == "ready" for e in events)
