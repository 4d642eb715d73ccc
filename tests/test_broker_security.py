"""A secured local broker against its real JVMs: SCRAM logins over TLS, the admin's settings file, secrets kept off
command lines and logs, bad credentials and certificates refused fast, users holding only a run's ACLs, and
the nodes talking to each other over TLS."""

from __future__ import annotations

import socket
import ssl
import stat
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from sotw import broker_cli
from sotw.broker import KafkaBroker
from sotw.broker.config import KafkaBrokerConfig, NodePorts, argfile_text, node_properties
from sotw.broker.security import ADMIN, BrokerSecrets, security_mode
from sotw.broker.users import RUN_TOPIC_OPERATIONS, run_acls
from sotw.errors import BrokerError
from sotw.kafka import KafkaConfig, ensure_topics, read_settings
from tests.conftest import SecuredKafka


def client(settings: Mapping[str, str], bootstrap: str, **extra: object) -> dict[str, object]:
    return {"bootstrap.servers": bootstrap, **settings, **extra}


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def round_trip(
    bootstrap: str, settings: Mapping[str, str], topic: str, group: str, count: int = 20
) -> list[bytes]:
    """Produce ``count`` records to ``topic`` and read them back in group ``group``; return the values read."""
    producer = Producer(client(settings, bootstrap, acks="all"))
    errors: list[KafkaError] = []
    for i in range(count):
        producer.produce(topic, b"%d" % i, on_delivery=lambda err, _msg: err and errors.append(err))
    assert producer.flush(15) == 0 and errors == []
    consumer = Consumer(client(settings, bootstrap, **{"group.id": group, "auto.offset.reset": "earliest"}))
    consumer.subscribe([topic])
    values: list[bytes] = []
    deadline = time.monotonic() + 20
    try:
        while len(values) < count and time.monotonic() < deadline:
            for msg in consumer.consume(100, 0.5):
                assert msg.error() is None, msg.error()
                values.append(msg.value())
    finally:
        consumer.close()
    return values


def first_error(
    settings: Mapping[str, str], bootstrap: str, timeout: float = 15.0
) -> tuple[KafkaError, float]:
    """The first error a client with ``settings`` reports when it connects, and the seconds until it did."""
    errors: list[KafkaError] = []
    admin = AdminClient(client(settings, bootstrap, error_cb=errors.append, log_level=0))
    started = time.monotonic()
    while not errors and time.monotonic() - started < timeout:
        try:
            admin.list_topics(timeout=0.5)
        except KafkaException:
            pass
        admin.poll(0.1)
    assert errors, f"no error within {timeout:g} s"
    return errors[0], time.monotonic() - started


# ---- settings, without a broker ----------------------------------------------------------------------------


def ports() -> dict[int, NodePorts]:
    return {1: NodePorts(9092, 9092, 9093, 9094)}


def test_plaintext_nodes_keep_plaintext_listeners_and_no_security_settings(tmp_path: Path) -> None:
    props = node_properties(KafkaBrokerConfig(), 1, ports(), tmp_path)
    assert (
        props["listener.security.protocol.map"] == "CLIENT:PLAINTEXT,INTERNAL:PLAINTEXT,CONTROLLER:PLAINTEXT"
    )
    assert not [k for k in props if k.startswith(("ssl.", "sasl.", "authorizer", "super.users"))]


@pytest.mark.parametrize(
    ("mode", "listeners"),
    [
        ("ssl", "CLIENT:SSL,INTERNAL:SSL,CONTROLLER:SSL"),
        ("sasl_plaintext", "CLIENT:SASL_PLAINTEXT,INTERNAL:SASL_SSL,CONTROLLER:SSL"),
        ("sasl_ssl", "CLIENT:SASL_SSL,INTERNAL:SASL_SSL,CONTROLLER:SSL"),
    ],
)
def test_secured_nodes_talk_to_each_other_over_tls_whatever_the_clients_speak(
    mode: str, listeners: str
) -> None:
    assert security_mode(mode).listener_map == listeners


def test_an_unknown_mode_is_refused_naming_the_modes() -> None:
    with pytest.raises(BrokerError, match="plaintext, ssl, sasl_plaintext, sasl_ssl"):
        KafkaBrokerConfig(security="tls")


def test_a_secured_broker_refuses_overrides_of_its_tls_and_logins() -> None:
    KafkaBrokerConfig(overrides={"super.users": "User:x"})  # plaintext: nothing of sotw's to break
    with pytest.raises(BrokerError, match="super.users"):
        KafkaBrokerConfig(security="sasl_ssl", overrides={"super.users": "User:x"})


def test_a_secured_node_settings_hold_the_authorizer_and_node_super_users(tmp_path: Path) -> None:
    secrets = BrokerSecrets(security_mode("sasl_ssl"), tmp_path, "127.0.0.1")
    secrets.prepare()
    (tmp_path / "node-1").mkdir()
    props = secrets.node_properties(1, tmp_path / "node-1", [1, 2, 3])
    assert props["authorizer.class.name"].endswith("StandardAuthorizer")
    assert props["super.users"].split(";") == [
        "User:admin",
        "User:CN=sotw-node-1",
        "User:CN=sotw-node-2",
        "User:CN=sotw-node-3",
    ]
    assert props["listener.name.controller.ssl.client.auth"] == "required"
    assert mode_of(tmp_path / "node-1" / "keystore.p12") == 0o600
    assert mode_of(secrets.admin_config_path) == 0o600
    settings = read_settings(secrets.admin_config_path)
    assert settings["security.protocol"] == "SASL_SSL" and settings["sasl.username"] == ADMIN
    assert settings["ssl.ca.location"] == str(secrets.ca_path)


def test_a_run_user_gets_prefixed_topics_and_groups_and_no_empty_prefix() -> None:
    acls = run_acls("User:bob", "run-7-")
    topics = [a for a in acls if a.restype.name == "TOPIC"]
    assert {a.operation.name for a in topics} == set(RUN_TOPIC_OPERATIONS)
    assert {(a.name, a.resource_pattern_type.name) for a in topics} == {("run-7-", "PREFIXED")}
    with pytest.raises(BrokerError, match="empty one would grant everything"):
        run_acls("User:bob", "")


def test_java_argument_files_quote_what_they_hold() -> None:
    assert argfile_text(["a b", 'c"d', "e\\f"]) == '"a b"\n"c\\"d"\n"e\\\\f"\n'


# ---- the session's sasl_ssl broker -------------------------------------------------------------------------


def admin_password(kafka: SecuredKafka) -> str:
    return read_settings(kafka.admin_config)["sasl.password"]


def test_the_admin_produces_and_consumes_over_sasl_ssl(secured_kafka: SecuredKafka) -> None:
    topic = f"sec-{uuid.uuid4().hex[:8]}"
    ensure_topics(secured_kafka.kafka, {topic: 2})
    values = round_trip(secured_kafka.bootstrap, secured_kafka.kafka.settings, topic, f"g-{topic}")
    assert sorted(values, key=int) == [b"%d" % i for i in range(20)]


def test_the_admin_settings_file_is_private_and_its_password_is_nowhere_else(
    secured_kafka: SecuredKafka,
) -> None:
    password = admin_password(secured_kafka)
    assert len(password) >= 24
    assert mode_of(secured_kafka.admin_config) == 0o600
    assert mode_of(secured_kafka.data_dir / "node-1" / "server.properties") == 0o600
    assert not (secured_kafka.data_dir / "node-1" / "format.args").exists()
    seen = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if password in " ".join(proc.info["cmdline"] or []):
            seen.append(proc.info["pid"])
    assert seen == []
    java = psutil.Process(secured_kafka.broker.pids["kafka"]).cmdline()
    assert "kafka.Kafka" in java and not any("password" in arg.lower() for arg in java)
    assert password not in secured_kafka.broker.log_path(1).read_text()


def test_a_wrong_password_fails_fast_with_an_authentication_error(secured_kafka: SecuredKafka) -> None:
    settings = {**secured_kafka.kafka.settings, "sasl.password": "not-the-password"}
    error, seconds = first_error(settings, secured_kafka.bootstrap)
    assert error.code() == KafkaError._AUTHENTICATION, error
    assert "invalid credentials" in error.str().lower() or "authentication failed" in error.str().lower()
    assert seconds < 15


def test_a_client_that_does_not_trust_the_ca_fails_with_an_ssl_error(secured_kafka: SecuredKafka) -> None:
    secrets = secured_kafka.broker.secrets
    assert secrets is not None
    foreign = secrets.issue("stranger", foreign=True)
    settings = {**secured_kafka.kafka.settings, "ssl.ca.location": str(foreign.ca)}
    error, seconds = first_error(settings, secured_kafka.bootstrap)
    assert error.code() == KafkaError._SSL, error
    assert "certificate verify failed" in error.str()
    assert seconds < 15


def test_a_run_user_uses_topics_under_its_prefix_and_is_refused_outside(
    secured_kafka: SecuredKafka,
) -> None:
    prefix = f"run-{uuid.uuid4().hex[:6]}-"
    outside = f"other-{uuid.uuid4().hex[:6]}"
    ensure_topics(secured_kafka.kafka, {outside: 1})
    user = secured_kafka.user(prefix)
    assert user.principal.startswith("User:") and mode_of(user.settings_path) == 0o600
    settings = read_settings(user.settings_path)
    assert settings["sasl.username"] == user.name and settings["sasl.password"]
    mine = f"{prefix}sensor"
    ensure_topics(KafkaConfig(secured_kafka.bootstrap, settings), {mine: 2})  # CREATE under its prefix
    assert len(round_trip(secured_kafka.bootstrap, settings, mine, f"{prefix}group")) == 20
    producer = Producer(client(settings, secured_kafka.bootstrap))
    errors: list[KafkaError] = []
    producer.produce(outside, b"x", on_delivery=lambda err, _msg: errors.append(err))
    producer.flush(15)
    assert [e.code() for e in errors] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    admin = AdminClient(client(settings, secured_kafka.bootstrap))
    created = admin.create_topics([NewTopic(f"x{prefix}", 1)])
    with pytest.raises(KafkaException) as refused:
        created[f"x{prefix}"].result(15)
    assert refused.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_sotw_broker_add_user_writes_a_private_settings_file_and_prints_no_password(
    secured_kafka: SecuredKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"cli{uuid.uuid4().hex[:6]}"
    argv = ["add-user", name, "--topic-prefix", f"{name}-", "--bootstrap", secured_kafka.bootstrap]
    assert broker_cli.main([*argv, "--kafka-config", str(secured_kafka.admin_config)]) == 0
    out = capsys.readouterr().out
    path = secured_kafka.data_dir / "users" / f"{name}.properties"
    assert f"--kafka-config {path}" in out and mode_of(path) == 0o600
    assert read_settings(path)["sasl.password"] not in out


# ---- TLS alone: client certificates (a broker of their own: slow) -----------------------------------------


@pytest.fixture(scope="module")
def ssl_broker() -> Iterator[KafkaBroker]:
    """A one-node ``ssl`` broker of this module's own: client certificates are the identities."""
    with KafkaBroker(security="ssl", start_timeout=120) as broker:
        yield broker


@pytest.mark.slow
def test_ssl_mode_admin_and_run_user_log_in_by_certificate(ssl_broker: KafkaBroker) -> None:
    settings = ssl_broker.client_settings
    assert settings["security.protocol"] == "SSL" and "sasl.password" not in settings
    prefix = f"ssl-{uuid.uuid4().hex[:6]}-"
    user = ssl_broker.add_user(f"u{uuid.uuid4().hex[:6]}", prefix)
    assert user.principal == f"User:CN={user.name}"
    user_settings = read_settings(user.settings_path)
    ensure_topics(KafkaConfig(ssl_broker.bootstrap, user_settings), {f"{prefix}t": 1})
    assert len(round_trip(ssl_broker.bootstrap, user_settings, f"{prefix}t", f"{prefix}g", 5)) == 5


@pytest.mark.slow
def test_ssl_mode_add_user_on_the_command_line_issues_a_certificate_by_the_brokers_ca(
    ssl_broker: KafkaBroker, capsys: pytest.CaptureFixture[str]
) -> None:
    name = f"cli{uuid.uuid4().hex[:6]}"
    argv = ["add-user", name, "--topic-prefix", f"{name}-", "--bootstrap", ssl_broker.bootstrap]
    assert broker_cli.main([*argv, "--kafka-config", str(ssl_broker.admin_config_path)]) == 0
    assert f"User:CN={name}" in capsys.readouterr().out
    assert ssl_broker.data_dir is not None
    settings = read_settings(ssl_broker.data_dir / "users" / f"{name}.properties")
    assert mode_of(Path(settings["ssl.key.location"])) == 0o600
    ensure_topics(KafkaConfig(ssl_broker.bootstrap, settings), {f"{name}-t": 1})


@pytest.mark.slow
def test_ssl_mode_refuses_an_expired_client_certificate(ssl_broker: KafkaBroker) -> None:
    assert ssl_broker.secrets is not None
    expired = ssl_broker.secrets.issue(f"late{uuid.uuid4().hex[:6]}", expired=True)
    settings = {
        **ssl_broker.client_settings,
        "ssl.certificate.location": str(expired.cert),
        "ssl.key.location": str(expired.key),
    }
    error, seconds = first_error(settings, ssl_broker.bootstrap)
    # TLS 1.3: the client's handshake is over before the broker checks its certificate and sends an alert,
    # so librdkafka reports the alert ("certificate unknown") as a transport error.
    assert error.code() in (KafkaError._SSL, KafkaError._TRANSPORT), error
    assert "certificate" in error.str()
    assert seconds < 15


@pytest.mark.slow
def test_sasl_plaintext_logs_clients_in_without_tls_and_users_get_their_acls() -> None:
    with KafkaBroker(security="sasl_plaintext", start_timeout=120) as broker:
        settings = broker.client_settings
        assert settings["security.protocol"] == "SASL_PLAINTEXT" and "ssl.ca.location" not in settings
        prefix = f"sp-{uuid.uuid4().hex[:6]}-"
        user = broker.add_user(f"u{uuid.uuid4().hex[:6]}", prefix)
        user_settings = read_settings(user.settings_path)
        ensure_topics(KafkaConfig(broker.bootstrap, user_settings), {f"{prefix}t": 1})
        assert len(round_trip(broker.bootstrap, user_settings, f"{prefix}t", f"{prefix}g", 5)) == 5
        error, seconds = first_error({**settings, "sasl.password": "wrong"}, broker.bootstrap)
        assert error.code() == KafkaError._AUTHENTICATION and seconds < 15


# ---- the nodes' own traffic: three nodes ------------------------------------------------------------------


def listener_ports(node_dir: Path) -> dict[str, int]:
    props = read_settings(node_dir / "server.properties")
    return {
        name: int(address.rpartition(":")[2])
        for name, _, address in (item.partition("://") for item in props["listeners"].split(","))
    }


def tls_peer(port: int, ca: Path, cert: Path, key: Path) -> str:
    """The CN of the certificate the TLS server on ``port`` shows a client holding ``cert``."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            peer = tls.getpeercert()
    return dict(field[0] for field in peer["subject"])["commonName"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sasl_ssl", "ssl"])
def test_three_secured_nodes_replicate_and_elect_over_tls(mode: str) -> None:
    # Three JVMs making TLS keys on two cores take most of a minute to start: room for a busy machine.
    with KafkaBroker(nodes=3, security=mode, start_timeout=120) as broker:
        secrets = broker.secrets
        assert secrets is not None and broker.data_dir is not None
        topic = f"rf3-{uuid.uuid4().hex[:6]}"
        ensure_topics(broker.kafka_config(), {topic: 3})
        assert len(round_trip(broker.bootstrap, broker.client_settings, topic, f"g{topic}", 30)) == 30
        assert broker.wait_replicated(30, [topic]) < 30
        assert all(len(p.isr) == 3 for p in broker.partitions([topic]))
        probe = secrets.issue("probe")
        for node in broker.node_ids:
            own = listener_ports(broker.data_dir / f"node-{node}")
            for listener in ("INTERNAL", "CONTROLLER"):
                assert tls_peer(own[listener], secrets.ca_path, probe.cert, probe.key) == f"sotw-node-{node}"
        # Every connection between the nodes goes to a TLS listener of another node.
        tls_ports = {
            port
            for node in broker.node_ids
            for name, port in listener_ports(broker.data_dir / f"node-{node}").items()
            if name != "CLIENT"
        }
        client_ports = {int(a.rpartition(":")[2]) for a in broker.bootstrap.split(",")}
        between = [
            c.raddr.port
            for pid in broker.pids.values()
            for c in psutil.Process(pid).net_connections("tcp")
            if c.raddr and c.status == psutil.CONN_ESTABLISHED and c.raddr.port in tls_ports | client_ports
        ]
        assert between and set(between) <= tls_ports


@pytest.mark.slow
def test_sotw_broker_security_prints_a_ready_to_paste_line_and_keeps_the_password_off_argv(
    tmp_path: Path,
) -> None:
    errors = tmp_path / "stderr.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sotw", "broker", "--security", "sasl_ssl"],
        stdout=subprocess.PIPE,
        stderr=errors.open("w"),
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("broker ready: --bootstrap 127.0.0.1:"), line
        config = Path(line.split("--kafka-config ")[1].strip())
        assert mode_of(config) == 0o600
        password = read_settings(config)["sasl.password"]
        bootstrap = line.split()[3]
        AdminClient(client(read_settings(config), bootstrap)).list_topics(timeout=10)
        assert not [
            p for p in psutil.process_iter(["cmdline"]) if password in " ".join(p.info["cmdline"] or [])
        ]
    finally:
        proc.terminate()
        output = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0 and password not in line + output + errors.read_text()
