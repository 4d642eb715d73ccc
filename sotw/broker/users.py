"""Users of a secured broker that hold only what a run needs: a SCRAM login (or a certificate) and its ACLs.

``run_acls`` is the set of ACLs a run needs, for sotw's own broker and for any cluster an admin grants them on;
``grant_run_acls`` grants them with confluent-kafka's Admin API. ``add_run_user`` makes a user of sotw's own
secured broker (``KafkaBroker.add_user`` and ``sotw broker add-user``), grants it a run's ACLs and writes its
client settings file (mode 0600). docs/broker.md lists the ACLs and why each is needed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sotw.broker.security import MECHANISM, SCRAM_ITERATIONS, BrokerSecrets, check_user_name
from sotw.errors import BrokerError
from sotw.kafka import KafkaConfig
from sotw.tls import new_secret

#: What a run does with its own topics: make them, write, read, look at their settings, and delete them.
RUN_TOPIC_OPERATIONS = ("CREATE", "DESCRIBE", "READ", "WRITE", "DESCRIBE_CONFIGS", "DELETE")
#: What a run's consumer groups (the pipeline's, the lag probe's) need: join and commit, be looked at, go.
RUN_GROUP_OPERATIONS = ("READ", "DESCRIBE", "DELETE")
#: On the cluster: list the brokers, and produce idempotently (the simulator's producer).
RUN_CLUSTER_OPERATIONS = ("DESCRIBE", "IDEMPOTENT_WRITE")


@dataclass(frozen=True)
class RunUser:
    """A user made for runs: its name, principal, the prefix its ACLs cover and its client settings file.

    Attributes
    ----------
    name
        The SCRAM user name (or the CN of its certificate, ``ssl``).
    principal
        Kafka's principal for it (``User:<name>``, or ``User:CN=<name>`` by certificate).
    topic_prefix
        Topics (and groups) it may use start with this.
    settings_path
        Its librdkafka settings file (``--kafka-config``, mode 0600): the password is in it, and only there.
    """

    name: str
    principal: str
    topic_prefix: str
    settings_path: Path


def run_acls(principal: str, topic_prefix: str, group_prefix: str | None = None) -> list[Any]:
    """The ACL bindings a run needs (confluent-kafka ``AclBinding``s), all ALLOW from any host.

    Topics and groups are PREFIXED patterns: every topic whose name starts with ``topic_prefix`` (and every
    group starting with ``group_prefix``, the same prefix by default) and nothing else.

    Raises
    ------
    BrokerError
        If a prefix is empty (it would grant every topic or group).
    """
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    groups = topic_prefix if group_prefix is None else group_prefix
    if not topic_prefix or not groups:
        raise BrokerError("a run's ACLs need a topic and group prefix: an empty one would grant everything")

    def allow(kind: Any, name: str, pattern: Any, operation: str) -> Any:
        return AclBinding(
            kind, name, pattern, principal, "*", AclOperation[operation], AclPermissionType.ALLOW
        )

    prefixed, literal = ResourcePatternType.PREFIXED, ResourcePatternType.LITERAL
    return [
        *(allow(ResourceType.TOPIC, topic_prefix, prefixed, op) for op in RUN_TOPIC_OPERATIONS),
        *(allow(ResourceType.GROUP, groups, prefixed, op) for op in RUN_GROUP_OPERATIONS),
        *(allow(ResourceType.BROKER, "kafka-cluster", literal, op) for op in RUN_CLUSTER_OPERATIONS),
    ]


def _error_text(exc: Exception) -> str:
    arg = exc.args[0] if exc.args else exc
    return str(arg.str()) if hasattr(arg, "str") else str(arg)


def grant_run_acls(
    kafka: KafkaConfig,
    principal: str,
    topic_prefix: str,
    group_prefix: str | None = None,
    timeout: float = 15.0,
) -> list[Any]:
    """Grant ``principal`` the ACLs a run needs (``run_acls``) on the cluster ``kafka`` names.

    ``kafka`` must carry a super user's (or an ACL admin's) settings. Returns once every broker bootstrapped
    on enforces them, so the caller can use them at once.

    Raises
    ------
    BrokerError
        If the cluster refuses (not authorized, no authorizer) or does not answer within ``timeout``.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    bindings = run_acls(principal, topic_prefix, group_prefix)
    admin = AdminClient(kafka.client())
    try:
        for future in admin.create_acls(bindings, request_timeout=timeout).values():
            future.result(timeout)
    except KafkaException as exc:
        raise BrokerError(f"could not grant {principal} a run's ACLs: {_error_text(exc)}") from None
    # Each broker's authorizer learns of new ACLs from the metadata log a moment after they are committed:
    # ask every broker until it lists them all.
    wanted = {(b.restype, b.name, b.operation) for b in bindings}
    match = AclBindingFilter(
        ResourceType.ANY,
        None,
        ResourcePatternType.ANY,
        principal,
        None,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )
    deadline = time.monotonic() + timeout
    for address in kafka.bootstrap.split(","):
        node = AdminClient(KafkaConfig(address, kafka.settings).client())
        while True:
            try:
                found = node.describe_acls(match, request_timeout=timeout).result(timeout)
                if wanted <= {(b.restype, b.name, b.operation) for b in found}:
                    break
            except KafkaException:
                pass  # a node still starting: ask again within the timeout
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"the ACLs granted to {principal} did not reach {address} within {timeout:g} s"
                )
            time.sleep(0.1)
    return bindings


def upsert_scram_user(kafka: KafkaConfig, name: str, password: str, timeout: float = 15.0) -> None:
    """Create user ``name`` (or set its password) with a SCRAM-SHA-512 credential, through the Admin API.

    Raises
    ------
    BrokerError
        If the cluster refuses (``kafka`` is not a super user's) or does not answer within ``timeout``.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    info = ScramCredentialInfo(ScramMechanism[MECHANISM.replace("-", "_")], SCRAM_ITERATIONS)
    upsert = UserScramCredentialUpsertion(name, info, password.encode())
    admin = AdminClient(kafka.client())
    try:
        for future in admin.alter_user_scram_credentials([upsert], request_timeout=timeout).values():
            future.result(timeout)
    except KafkaException as exc:
        raise BrokerError(f"could not create user {name}: {_error_text(exc)}") from None


def wait_logged_in(kafka: KafkaConfig, timeout: float = 15.0) -> None:
    """Block until ``kafka``'s settings log in on every node it bootstraps on (a new SCRAM credential).

    A credential reaches each node's metadata a moment after it is committed; until then its logins fail.

    Raises
    ------
    BrokerError
        If a node still refuses after ``timeout`` seconds.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    for address in kafka.bootstrap.split(","):
        while True:
            node = AdminClient(KafkaConfig(address, kafka.settings).client(log_level=0))
            try:
                node.list_topics(timeout=max(0.5, min(5.0, deadline - time.monotonic())))
                break
            except KafkaException as exc:
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"the new user's login is still refused by {address} after {timeout:g} s: "
                        f"{_error_text(exc)}"
                    ) from None
            time.sleep(0.2)


def add_run_user(
    kafka: KafkaConfig,
    secrets: BrokerSecrets,
    name: str,
    topic_prefix: str,
    group_prefix: str | None = None,
    timeout: float = 15.0,
) -> RunUser:
    """Make user ``name`` of sotw's secured broker, holding only a run's ACLs on ``topic_prefix``.

    In SASL modes the user gets a new SCRAM-SHA-512 password; in ``ssl`` a certificate signed by the broker's
    CA. Either is written only to the user's settings file (``users/<name>.properties``, mode 0600), never
    printed. Returns once the user can log in and its ACLs are enforced.

    Parameters
    ----------
    kafka
        The broker's address with the admin's settings.
    secrets
        The broker's TLS material and modes (``KafkaBroker.secrets``).
    name
        The user name (``check_user_name``).
    topic_prefix, group_prefix
        What its ACLs cover (``run_acls``).
    timeout
        Seconds for each step (create, grant, first login).

    Raises
    ------
    BrokerError
        For a bad name or prefix, or a cluster that refuses or does not answer.
    """
    check_user_name(name)
    run_acls("User:check", topic_prefix, group_prefix)  # refuse an empty prefix before creating anything
    password = None
    if secrets.mode.sasl:
        password = new_secret()
        upsert_scram_user(kafka, name, password, timeout)
    settings = secrets.user_settings(name, password)
    path = secrets.write_user(name, settings)
    principal = secrets.mode.principal(name)
    grant_run_acls(kafka, principal, topic_prefix, group_prefix, timeout)
    wait_logged_in(KafkaConfig(kafka.bootstrap, settings), timeout)
    return RunUser(name, principal, topic_prefix, path)
