"""Kafka client settings and the one place that reads partitions' offsets.

``KafkaConfig`` carries the bootstrap address and librdkafka settings from the CLI inward; every client in
sotw builds its configuration from it, so SASL, TLS and tuning flags given once reach every producer and
consumer. Some settings are secrets (``is_secret``): ``KafkaConfig.redacted`` is the one form of the settings
that may be shown, logged or written to a report, and ``refuse_secrets`` keeps them off command lines.
``EndOffsets`` reads the watermarks of many partitions in two requests, waiting out the moments when a
partition has no leader.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from sotw.errors import BrokerError

#: What a secret setting's value is shown as.
REDACTED = "[redacted]"
#: Words in a setting's name that make its value a secret: a password, a secret, a key's passphrase, a JAAS
#: login (which holds a password).
_SECRET_WORDS = ("password", "secret", "passphrase", "jaas")
#: Secrets whose names say so less plainly: private keys as strings, and OAUTHBEARER's free-form settings
#: (its unsecured tokens and extensions may carry credentials).
_SECRET_NAMES = frozenset({"ssl_key", "ssl.keystore.key", "sasl.oauthbearer.config"})


def is_secret(name: str) -> bool:
    """Whether a client setting's value is a secret, by its name (librdkafka's or the Java client's).

    Passwords (``sasl.password``, ``ssl.key.password``, ``ssl.keystore.password``), secrets
    (``sasl.oauthbearer.client.secret``), passphrases, private keys as strings (``ssl.key.pem``,
    ``ssl_key.pem``, the Java client's ``ssl.keystore.key``), a JAAS login (``sasl.jaas.config``) and
    ``sasl.oauthbearer.config``. A file's location (``ssl.key.location``) is not a secret; the file is.
    """
    key = name.strip().lower()
    return any(word in key for word in _SECRET_WORDS) or key in _SECRET_NAMES or key.endswith("key.pem")


def redact(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with every secret's value replaced by ``REDACTED``: the form that may be shown or stored."""
    return {k: (REDACTED if is_secret(k) else v) for k, v in settings.items()}


def refuse_secrets(settings: Mapping[str, Any], where: str) -> None:
    """Refuse secret settings given where others can read them (a command line, a scenario's table).

    Raises
    ------
    ValueError
        Naming the first secret setting, where it was given and the way out (``--kafka-config FILE``).
    """
    secret = next((k for k in settings if is_secret(k)), None)
    if secret is not None:
        raise ValueError(
            f"{where} {secret}: a secret is never taken {'there' if ' ' in where else 'on the command line'} "
            "(every process's command line can be read with ps); put it in a settings file given with "
            "--kafka-config FILE, readable only by you (chmod 600)"
        )


@dataclass(frozen=True)
class KafkaConfig:
    """Where the brokers are and how to talk to them.

    Parameters
    ----------
    bootstrap
        ``HOST:PORT[,HOST:PORT...]`` of the Kafka cluster.
    settings
        librdkafka settings passed through unchanged (``security.protocol``, ``sasl.*``, ``ssl.*``, tuning).
    """

    bootstrap: str
    settings: Mapping[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        # A config ends up in tracebacks and log lines: never with its secrets.
        return f"KafkaConfig(bootstrap={self.bootstrap!r}, settings={self.redacted()!r})"

    def __post_init__(self) -> None:
        if not self.bootstrap or any(":" not in hp for hp in self.bootstrap.split(",")):
            raise ValueError(f"bootstrap must be HOST:PORT[,HOST:PORT...], got {self.bootstrap!r}")
        if "bootstrap.servers" in self.settings:
            raise ValueError("give the bootstrap address as bootstrap, not as a 'bootstrap.servers' setting")
        object.__setattr__(self, "settings", dict(self.settings))

    def redacted(self) -> dict[str, str]:
        """The settings as they may be printed, logged or stored: each secret's value is ``REDACTED``."""
        return redact(self.settings)

    def public_settings(self) -> dict[str, str]:
        """The settings that are not secrets (``is_secret``): what may travel in clear to another process."""
        return {k: v for k, v in self.settings.items() if not is_secret(k)}

    def secret_names(self) -> list[str]:
        """The names of the secret settings, sorted (their values stay here)."""
        return sorted(k for k in self.settings if is_secret(k))

    def client(self, **overrides: Any) -> dict[str, Any]:
        """Return a fresh librdkafka configuration dict: our defaults, then ``settings``, then ``overrides``.

        The dict is new on every call because confluent-kafka may pop keys from the dict it is given.
        """
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        conf.update(self.settings)
        conf.update(overrides)
        return conf

    def consumer(self, **overrides: Any) -> Consumer:
        """An assign-only consumer (no group join, no commits): sotw tracks offsets itself."""
        conf = self.client(
            **{
                "group.id": f"sotw-{uuid.uuid4().hex[:12]}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": False,
                **overrides,
            }
        )
        return Consumer(conf)


#: Characters a regular expression gives a meaning outside a character class.
_REGEX_SPECIAL = frozenset(".^$*+?()[]{}|\\")


def topic_pattern(prefix: str) -> str:
    """A regex matching exactly the topics that start with ``prefix``: ``^`` + the prefix + ``.*``.

    Anchored, because librdkafka (and every client built on it) takes a subscription as a regex only when it
    starts with ``^``, and Spark's ``subscribePattern`` and Python's ``re`` read it the same way. Only the
    characters that mean something outside a character class are escaped (``re.escape`` also escapes ``-``,
    which not every regex engine accepts escaped).
    """
    return "^" + "".join("\\" + c if c in _REGEX_SPECIAL else c for c in prefix) + ".*"


def setting_text(value: Any) -> str:
    """A librdkafka setting's value as the text librdkafka takes: ``True`` -> ``true``, 5 -> ``5``."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def parse_settings(pairs: Iterable[str]) -> dict[str, str]:
    """Turn ``key=value`` strings (``-X`` flags or lines of a settings file) into a dict.

    Blank lines and lines starting with ``#`` are skipped. A bad line is named by its number, not its text: a
    settings file's lines may hold secrets.
    """
    out: dict[str, str] = {}
    for number, raw in enumerate(pairs, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise ValueError(
                f"librdkafka setting number {number} is not key=value (its text is not shown: it may be a secret)"
            )
        out[key.strip()] = value.strip()
    return out


def read_settings(path: Path) -> dict[str, str]:
    """The librdkafka settings of a settings file (``--kafka-config``): ``key=value`` lines, ``#`` comments.

    Raises
    ------
    ValueError
        If the file cannot be read, or a line is not ``key=value`` (named by the file).
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"cannot read --kafka-config {path}: {exc.strerror}") from None
    try:
        return parse_settings(text.splitlines())
    except ValueError as exc:
        raise ValueError(f"--kafka-config {path}: {exc}") from None


def settings_text(settings: Mapping[str, Any], heading: str = "") -> str:
    """``settings`` as a settings file's text (``read_settings`` reads it back): one ``key=value`` a line.

    Raises
    ------
    ValueError
        For a value that spans lines (a PEM string): a settings file has one setting a line; give the PEM's
        file instead (``ssl.key.location`` for ``ssl.key.pem``).
    """
    lines = [f"# {heading}"] if heading else []
    for key, value in settings.items():
        text = setting_text(value)
        if "\n" in text or "\r" in text:
            raise ValueError(
                f"setting {key} spans lines, which a settings file cannot hold: give its file instead"
            )
        lines.append(f"{key}={text}")
    return "\n".join(lines) + "\n"


def transient(err: Any) -> bool:
    """Whether a Kafka error passes on its own: retriable, or a partition without a leader for a moment.

    ``ListOffsets`` results do not mark a partition just created, or whose leader is moving, as retriable.
    """
    from confluent_kafka import KafkaError

    if hasattr(err, "retriable") and err.retriable():
        return True
    code = err.code() if hasattr(err, "code") else None
    return code in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE)


class EndOffsets:
    """Reads ``(low, end)`` per partition: the earliest offset still kept, and last offset + 1.

    The watermarks of all partitions come from two ``ListOffsets`` requests per broker through an admin
    client (earliest and latest), not two round trips per partition (72 partitions took 62-67 ms one by one
    and 4 ms together). Like a consumer's watermark query, they are read at the ``isolation.level`` of the
    settings, ``read_committed`` unless they say otherwise, so the end of a partition is one a consumer with
    those settings can reach (for the simulator's idempotent, non-transactional records, the high watermark).

    Parameters
    ----------
    kafka
        Where the brokers are.
    timeout
        Seconds to wait for the broker on each call; transient errors (a leader moving) are retried within it.

    Attributes
    ----------
    admin
        The admin client the watermarks are read with. List topics with it too: its metadata cache is what
        ``ListOffsets`` finds partition leaders in, so a listing that finds new partitions also lets their
        offsets be read.
    """

    def __init__(self, kafka: KafkaConfig, timeout: float = 10.0) -> None:
        from confluent_kafka import IsolationLevel
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient(kafka.client())
        self._timeout = timeout
        uncommitted = str(kafka.settings.get("isolation.level", "")).strip() == "read_uncommitted"
        self._isolation = IsolationLevel.READ_UNCOMMITTED if uncommitted else IsolationLevel.READ_COMMITTED

    def __call__(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        """Return ``{(topic, partition): (low, end)}`` for the given partitions.

        Raises
        ------
        BrokerError
            If the broker does not answer for a partition within the timeout, or refuses for good.
        """
        from confluent_kafka.admin import OffsetSpec

        tps = [TopicPartition(t, p) for t, p in partitions]
        if not tps:
            return {}
        deadline = time.monotonic() + self._timeout
        while True:
            left = max(0.1, deadline - time.monotonic())
            try:
                asked = [
                    self.admin.list_offsets(
                        dict.fromkeys(tps, spec), isolation_level=self._isolation, request_timeout=left
                    )
                    for spec in (OffsetSpec.earliest(), OffsetSpec.latest())
                ]
                lows, highs = ({tp: f.result(timeout=left).offset for tp, f in fs.items()} for fs in asked)
                # A request that timed out (a frozen or restarting broker) comes back as offset -1001
                # (OFFSET_INVALID) rather than as an error: never pass it on as a watermark.
                unanswered = [tp for tp in tps if lows[tp] < 0 or highs[tp] < 0]
                if not unanswered:
                    return {(tp.topic, tp.partition): (lows[tp], highs[tp]) for tp in tps}
                if time.monotonic() + 0.2 > deadline:
                    first = unanswered[0]
                    raise BrokerError(
                        f"could not read offsets from the broker: no answer for {len(unanswered)} partitions "
                        f"({first.topic}/{first.partition} first) within {self._timeout:g} s"
                    )
                time.sleep(0.2)
            except KafkaException as exc:
                err = exc.args[0]
                if not transient(err) or time.monotonic() + 0.2 > deadline:
                    raise BrokerError(f"could not read offsets from the broker: {err}") from None
                time.sleep(0.2)  # a leader moving, a broker restarting: ask again within the timeout
            except (RuntimeError, TimeoutError) as exc:
                raise BrokerError(f"could not read offsets from the broker: {exc}") from None

    def first_at(self, partition: tuple[str, int], timestamp_ms: int) -> int:
        """The first offset of ``partition`` whose record's timestamp is at or after ``timestamp_ms``.

        Returns the partition's end when no record is that recent (Kafka answers -1 for that).

        Raises
        ------
        BrokerError
            If the broker does not answer within the timeout.
        """
        from confluent_kafka.admin import OffsetSpec

        tp = TopicPartition(*partition)
        try:
            future = self.admin.list_offsets(
                {tp: OffsetSpec.for_timestamp(int(timestamp_ms))},
                isolation_level=self._isolation,
                request_timeout=self._timeout,
            )[tp]
            offset = future.result(timeout=self._timeout).offset
        except (KafkaException, RuntimeError, TimeoutError) as exc:
            raise BrokerError(f"could not read offsets from the broker: {exc}") from None
        if offset == -1:
            return self([partition])[partition][1]
        if offset < 0:
            raise BrokerError(
                f"could not read offsets from the broker: no answer for {partition[0]}/{partition[1]}"
            )
        return int(offset)


def ensure_topics(
    config: KafkaConfig,
    topics: Mapping[str, int],
    timeout: float = 10.0,
    replication_factor: int | None = None,
    topic_config: Mapping[str, str] | None = None,
) -> None:
    """Create each topic with the given partition count; topics that already exist are left as they are.

    ``replication_factor`` and ``topic_config`` (``min.insync.replicas``, ...) default to the cluster's.
    """
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient, NewTopic

    if not topics:
        return
    admin = AdminClient(config.client())
    futures = admin.create_topics(
        [
            NewTopic(
                name,
                num_partitions=parts,
                replication_factor=replication_factor or -1,
                config=dict(topic_config or {}),
            )
            for name, parts in topics.items()
        ],
        operation_timeout=timeout,
    )
    for name, future in futures.items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise BrokerError(f"could not create topic {name}: {exc.args[0].str()}") from None
