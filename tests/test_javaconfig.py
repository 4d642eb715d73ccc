"""librdkafka settings in the Java client's names: each security mode, and what has no Java equivalent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sotw.javaconfig import JavaConfigError, java_settings, options_json, properties_text, spark_options

SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


def test_sasl_ssl_with_scram_becomes_a_jaas_login_and_a_pem_truststore() -> None:
    java = java_settings(
        {
            "security.protocol": "sasl_ssl",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "team",
            "sasl.password": "pa55",
            "ssl.ca.location": "/etc/ca.pem",
        }
    )
    assert java == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.jaas.config": f'{SCRAM} required username="team" password="pa55";',
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": "/etc/ca.pem",
    }


def test_sasl_plain_uses_the_plain_login_module_and_quotes_what_jaas_would_misread() -> None:
    java = java_settings(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "a",
            "sasl.password": 'p"\\q',
        }
    )
    assert java["sasl.jaas.config"] == f'{PLAIN} required username="a" password="p\\"\\\\q";'


def test_a_certificate_and_key_in_two_files_become_a_pem_keystore_of_their_text() -> None:
    files = {
        "/c/cert.pem": "-----BEGIN CERTIFICATE-----\nC\n",
        "/c/key.pem": "-----BEGIN PRIVATE KEY-----\nK\n",
    }
    java = java_settings(
        {
            "security.protocol": "SSL",
            "ssl.ca.location": "/c/ca.pem",
            "ssl.certificate.location": "/c/cert.pem",
            "ssl.key.location": "/c/key.pem",
            "ssl.endpoint.identification.algorithm": "none",
        },
        read=lambda p: files[str(p)],
    )
    assert java["ssl.keystore.type"] == "PEM"
    assert java["ssl.keystore.certificate.chain"] == files["/c/cert.pem"]
    assert java["ssl.keystore.key"] == files["/c/key.pem"]
    assert java["ssl.endpoint.identification.algorithm"] == ""


def test_one_pem_file_with_key_and_chain_is_the_keystore_s_location_and_pkcs12_stays_pkcs12() -> None:
    one = java_settings({"ssl.certificate.location": "/c/both.pem", "ssl.key.location": "/c/both.pem"})
    assert one == {"ssl.keystore.type": "PEM", "ssl.keystore.location": "/c/both.pem"}
    p12 = java_settings({"ssl.keystore.location": "/c/me.p12", "ssl.keystore.password": "x"})
    assert p12 == {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": "/c/me.p12",
        "ssl.keystore.password": "x",
    }


def test_shared_and_producer_only_settings_pass_or_are_left_out() -> None:
    java = java_settings({"client.id": "me", "fetch.wait.max.ms": "50", "linger.ms": "5", "acks": "all"})
    assert java == {"client.id": "me", "fetch.max.wait.ms": "50"}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"socket.keepalive.enable": "true"}, "socket.keepalive.enable"),
        ({"sasl.username": "a"}, "sasl.password"),
        ({"sasl.username": "a", "sasl.password": "b"}, "GSSAPI"),
        ({"sasl.mechanism": "OAUTHBEARER", "sasl.username": "a", "sasl.password": "b"}, "OAUTHBEARER"),
        ({"ssl.certificate.location": "/c.pem"}, "ssl.key.location"),
    ],
)
def test_a_setting_without_a_java_equivalent_is_refused_by_name(settings: dict[str, str], named: str) -> None:
    with pytest.raises(JavaConfigError, match=named):
        java_settings(settings, read=lambda p: "PEM")


def test_a_properties_file_keeps_a_pem_on_one_line_and_spark_options_are_prefixed(tmp_path: Path) -> None:
    text = properties_text({"ssl.keystore.key": "a\nb\\c", "sasl.jaas.config": "x é"})
    assert text.splitlines() == ["ssl.keystore.key=a\\nb\\\\c", "sasl.jaas.config=x \\u00e9"]
    options = spark_options({"security.protocol": "ssl", "ssl.ca.location": "/ca.pem"})
    assert options == {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": "/ca.pem",
    }
    assert json.loads(options_json(options)) == options


def test_spark_s_connector_gets_the_java_names_and_sotw_s_reader_keeps_librdkafka_s(tmp_path: Path) -> None:
    from pipeline.config import PipelineConfig
    from sotw.kafka import KafkaConfig

    kafka = KafkaConfig(
        "h:1",
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "a",
            "sasl.password": "b",
        },
    )
    spark = PipelineConfig(kafka, tmp_path / "o", tmp_path / "c", source="spark-kafka").source_options()
    assert spark["kafka.sasl.jaas.config"].startswith(PLAIN) and "kafka.sasl.password" not in spark
    ours = PipelineConfig(kafka, tmp_path / "o", tmp_path / "c", source="sotw-kafka").source_options()
    assert ours["kafka.sasl.password"] == "b" and "kafka.sasl.jaas.config" not in ours
    with pytest.raises(ValueError, match="spark-kafka: librdkafka setting socket.keepalive.enable"):
        PipelineConfig(
            KafkaConfig("h:1", {"socket.keepalive.enable": "true"}),
            tmp_path / "o",
            tmp_path / "c",
            source="spark-kafka",
        )
