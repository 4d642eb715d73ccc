"""The pre-flight check: whether a run's settings reach the cluster and may use its topics and groups.

A run against a secured cluster that has a wrong password, a CA it does not trust, an expired client
certificate or too few ACLs would otherwise start its simulator and pipeline and then hang in their retries.
``preflight`` asks first, within seconds, and raises a ``PreflightError`` naming the setting to fix.

librdkafka reports an authentication or TLS failure to a client's ``error_cb`` within half a second, while the
call that triggered it (``list_topics``) keeps retrying until its own timeout: so the check waits on the
errors its ``error_cb`` collected, not on the call.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sotw.errors import SotwError
from sotw.kafka import KafkaConfig, transient

log = logging.getLogger(__name__)

#: Seconds the whole check may take before it gives up (the issue's bound is 15 s).
PREFLIGHT_TIMEOUT_S = 10.0
#: Seconds of refused connections, with no answer at all, after which the broker counts as unreachable.
UNREACHABLE_S = 5.0
#: The name a check's probes use under the run's prefix: a topic that is never created, a group never joined.
PROBE_NAME = "preflight"


class PreflightError(SotwError):
    """The run's Kafka settings do not work on the cluster: nothing was started."""


@dataclass(frozen=True)
class PreflightReport:
    """What a passing check found.

    Attributes
    ----------
    brokers
        How many brokers the cluster's metadata lists.
    seconds
        How long the check took.
    """

    brokers: int
    seconds: float


class _Errors:
    """The errors librdkafka reports to a client's ``error_cb``, kept for the check to read."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: list[Any] = []

    def __call__(self, err: Any) -> None:
        with self._lock:
            self._seen.append(err)

    def first_fatal(self) -> Any | None:
        """The first error that will not pass on its own (authentication, TLS, authorization)."""
        with self._lock:
            return next((e for e in self._seen if _fatal(e)), None)

    def last(self) -> Any | None:
        """The latest error of any kind (a refused connection, all brokers down)."""
        with self._lock:
            return self._seen[-1] if self._seen else None


def _name(err: Any) -> str:
    return str(err.name()) if hasattr(err, "name") else type(err).__name__


def _text(err: Any) -> str:
    return str(err.str()) if hasattr(err, "str") else str(err)


def _fatal(err: Any) -> bool:
    from confluent_kafka import KafkaError

    code = err.code() if hasattr(err, "code") else None
    if code in (KafkaError._AUTHENTICATION, KafkaError._SSL):
        return True
    if hasattr(err, "fatal") and err.fatal():
        return True
    # An expired or unknown client certificate: under TLS 1.3 the broker refuses it after the client's
    # handshake is done, so librdkafka sees a transport error carrying the TLS alert.
    return code == KafkaError._TRANSPORT and "alert" in _text(err).lower()


def explain(err: Any, kafka: KafkaConfig) -> str:
    """A message for a client error that names the setting to look at and the way out."""
    from confluent_kafka import KafkaError

    code = err.code() if hasattr(err, "code") else None
    text = _text(err)
    low = text.lower()
    settings = kafka.settings
    if code == KafkaError._AUTHENTICATION:
        user = settings.get("sasl.username", "(not set)")
        return (
            f"authentication failed: the broker refused sasl.username={user} with the sasl.password given "
            f"(sasl.mechanisms={settings.get('sasl.mechanisms', '(default)')}); check both in --kafka-config "
            f"({_name(err)}: {text})"
        )
    if code == KafkaError._SSL or "certificate verify failed" in low:
        ca = settings.get("ssl.ca.location", "(not set: the system's CAs)")
        return (
            f"TLS: the broker's certificate is not trusted by ssl.ca.location={ca}; give the CA that signed "
            f"the cluster's certificates in --kafka-config ({_name(err)}: {text})"
        )
    if "alert" in low and code == KafkaError._TRANSPORT:
        cert = settings.get("ssl.certificate.location", "(not set)")
        return (
            f"TLS: the broker refused the client certificate ssl.certificate.location={cert} (expired, or "
            f"not signed by a CA the broker trusts); renew it ({_name(err)}: {text})"
        )
    return f"{_name(err)}: {text}"


def _authorization(err: Any, what: str, kafka: KafkaConfig) -> str | None:
    """A message for an authorization error of ``what``, or None when ``err`` is not one."""
    from confluent_kafka import KafkaError

    code = err.code() if hasattr(err, "code") else None
    kinds = {
        KafkaError.TOPIC_AUTHORIZATION_FAILED: "topics",
        KafkaError.GROUP_AUTHORIZATION_FAILED: "consumer groups",
        KafkaError.CLUSTER_AUTHORIZATION_FAILED: "the cluster",
    }
    if code not in kinds:
        return None
    who = kafka.settings.get("sasl.username") or kafka.settings.get("ssl.certificate.location", "this client")
    return (
        f"not authorized: {who} may not {what} ({kinds[code]}); the run needs the ACLs in "
        f"docs/own-cluster.md for its prefix ({_name(err)})"
    )


def preflight(
    kafka: KafkaConfig, prefix: str, groups: Sequence[str] = (), timeout: float = PREFLIGHT_TIMEOUT_S
) -> PreflightReport:
    """Check that ``kafka``'s settings log in and may use topics and groups starting with ``prefix``.

    Nothing is created: the topic creation is validated only (``validate_only``), the topic and group looked
    up are never made, and the producer that checks idempotent writes sends nothing.

    Parameters
    ----------
    kafka
        The run's cluster and settings.
    prefix
        The run's topic prefix (its groups start with it too).
    groups
        Other consumer groups the run looks up (a job's, ``--lag-from group:ID``): it must describe them.
    timeout
        Seconds for the whole check.

    Raises
    ------
    PreflightError
        Naming the setting or ACL at fault: bad credentials, an untrusted CA, a refused client certificate, a
        missing ACL, or a broker that does not answer.
    """
    from confluent_kafka import KafkaException, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    started = time.monotonic()
    deadline = started + timeout
    errors = _Errors()
    try:
        admin = AdminClient(kafka.client(error_cb=errors, log_level=0))
    except KafkaException as exc:
        # librdkafka refuses some settings when the client is made (a SASL login without its password).
        raise PreflightError(f"the Kafka settings are refused: {_text(exc.args[0])}") from None
    brokers = _connect(admin, errors, kafka, deadline)
    topic = f"{prefix}{PROBE_NAME}"

    def left() -> float:
        return max(0.5, deadline - time.monotonic())

    def check(what: str, call: Any) -> None:
        while True:
            try:
                call()
                return
            except KafkaException as exc:
                err = exc.args[0]
                message = _authorization(err, what, kafka)
                if message is not None:
                    raise PreflightError(message) from None
                if _allowed(err):
                    return
                # A leader still being chosen: ask again within the time.
                if not transient(err) or time.monotonic() + 0.2 > deadline:
                    raise PreflightError(f"could not {what}: {explain(err, kafka)}") from None
                time.sleep(0.2)

    check(
        f"create topics starting with {prefix!r}",
        lambda: admin.create_topics(
            [NewTopic(topic, num_partitions=1)], validate_only=True, request_timeout=left()
        )[topic].result(left()),
    )
    check(f"describe topics starting with {prefix!r}", lambda: _describe_topic(admin, topic, left()))
    check(
        f"use consumer groups starting with {prefix!r}",
        lambda: _describe_group(admin, f"{prefix}{PROBE_NAME}", left()),
    )
    for group in groups:
        check(f"describe the consumer group {group!r}", lambda g=group: _describe_group(admin, g, left()))
    producer = Producer(kafka.client(error_cb=errors, log_level=0, **{"enable.idempotence": True}))
    _wait_idempotent(producer, errors, kafka, deadline)
    seconds = time.monotonic() - started
    log.info("pre-flight passed in %.1f s: %d broker(s), prefix %s", seconds, brokers, prefix)
    return PreflightReport(brokers, seconds)


def _connect(admin: Any, errors: _Errors, kafka: KafkaConfig, deadline: float) -> int:
    """Fetch the cluster's metadata; fail at the first authentication or TLS error, or at the deadline."""
    from confluent_kafka import KafkaException

    started = time.monotonic()
    while True:
        try:
            metadata = admin.list_topics(timeout=0.5)
            return len(metadata.brokers)
        except KafkaException:
            pass
        admin.poll(0.05)  # serves error_cb
        fatal = errors.first_fatal()
        if fatal is not None:
            raise PreflightError(f"cannot connect to {kafka.bootstrap}: {explain(fatal, kafka)}")
        # A refused connection is retried by librdkafka for ever: after a few seconds of nothing but refusals
        # (a broker restarting answers within them), the address is wrong or the cluster is down.
        down = errors.last() is not None and time.monotonic() > started + UNREACHABLE_S
        if down or time.monotonic() > deadline:
            last = errors.last()
            why = explain(last, kafka) if last is not None else "no answer"
            raise PreflightError(
                f"the broker at {kafka.bootstrap} did not answer: {why}; check --bootstrap and "
                "security.protocol (a TLS listener does not answer PLAINTEXT)"
            )


def _allowed(err: Any) -> bool:
    """Whether an answer means the request was allowed: a topic or group that is not there yet.

    A group's coordinator that is not ready (a new cluster creating ``__consumer_offsets``) counts too: the
    broker answers FindCoordinator only after checking the group's DESCRIBE ACL, so the group is allowed.
    """
    from confluent_kafka import KafkaError

    code = err.code() if hasattr(err, "code") else None
    return code in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError.TOPIC_ALREADY_EXISTS,
        KafkaError.GROUP_ID_NOT_FOUND,
        KafkaError.INVALID_REPLICATION_FACTOR,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    )


def _describe_topic(admin: Any, topic: str, timeout: float) -> None:
    from confluent_kafka import TopicCollection

    for future in admin.describe_topics(TopicCollection([topic]), request_timeout=timeout).values():
        future.result(timeout)


def _describe_group(admin: Any, group: str, timeout: float) -> None:
    for future in admin.describe_consumer_groups([group], request_timeout=timeout).values():
        future.result(timeout)


def _wait_idempotent(producer: Any, errors: _Errors, kafka: KafkaConfig, deadline: float) -> None:
    """An idempotent producer gets a producer id at start; a refusal is a fatal error in ``error_cb``."""
    # The producer id request goes out once the producer has a connection: give it a moment, then a refusal
    # (CLUSTER_AUTHORIZATION_FAILED) has reached error_cb.
    settle = min(deadline, time.monotonic() + 0.5)
    while time.monotonic() < settle:
        producer.poll(0.1)
        fatal = errors.first_fatal()
        if fatal is not None:
            message = _authorization(
                fatal, "write idempotently (IDEMPOTENT_WRITE, or WRITE on a topic)", kafka
            )
            raise PreflightError(message or f"the producer cannot start: {explain(fatal, kafka)}")
    producer.flush(0.1)
