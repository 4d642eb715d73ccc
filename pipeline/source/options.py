"""The ``sotw-kafka`` source's options: Spark's Kafka source options, parsed and checked once at ``load()``.

``SourceOptions.from_options`` turns the strings given to ``spark.readStream.format("sotw-kafka")`` into one
frozen value, naming the option and the bad value when one is wrong, so a typo fails before the query starts.
The table of options is in ``docs/pipeline.md`` ("Kafka source").
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline.errors import ConfigError
from pipeline.source.offsets import TP, parse_offset_spec
from sotw.kafka import KafkaConfig

FORMAT = "sotw-kafka"
DEFAULT_TASKS = 2
"""Tasks per micro-batch when ``minPartitions`` is not given: Spark's default parallelism on local[2]."""


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    raw = options.get(name.lower())
    if raw is None:
        return default
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {name} must be true or false, got {raw!r}")
    return value == "true"


def _int_option(options: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ConfigError(f"option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"option {name} must be at least {minimum}, got {value}")
    return value


@dataclass(frozen=True)
class SourceOptions:
    """The source's options, parsed and checked once where ``load()`` is called.

    Parameters
    ----------
    kafka
        Bootstrap address and librdkafka settings (every ``kafka.*`` option with the prefix removed).
    subscribe
        Topics named by ``subscribe`` (empty when ``subscribePattern`` is used).
    pattern
        ``subscribePattern``: a Python regular expression that must match the whole topic name.
    starting
        ``startingOffsets``: ``earliest``, ``latest`` or ``{(topic, partition): offset}``; ``None`` for the
        default (``latest`` for streams, ``earliest`` for batch reads, as in Spark).
    ending
        ``endingOffsets`` (batch reads only): ``latest`` or ``{(topic, partition): offset}``.
    fail_on_data_loss
        Stop the query when offsets it still needs are gone (``failOnDataLoss``).
    max_offsets_per_trigger
        Upper bound of offsets per micro-batch, shared among partitions by backlog.
    min_partitions
        Spark tasks per micro-batch; ``None`` means ``DEFAULT_TASKS``.
    discovery_interval_ms
        How often the topic list is refreshed to find new (and notice deleted) topics.
    pack
        ``packRecords``: emit ``PACKED_SCHEMA`` rows (one per key and partition per batch) instead of one row
        per message.
    poll_timeout_ms
        How long a reader waits for records the broker says exist before it gives up.
    """

    kafka: KafkaConfig
    subscribe: tuple[str, ...] = ()
    pattern: str | None = None
    starting: str | dict[TP, int] | None = None
    ending: str | dict[TP, int] = "latest"
    fail_on_data_loss: bool = True
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    discovery_interval_ms: int = 5000
    poll_timeout_ms: int = 120_000
    pack: bool = False
    _regex: re.Pattern[str] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if bool(self.subscribe) == (self.pattern is not None):
            raise ConfigError("give exactly one of the options subscribe and subscribePattern")
        if self.pattern is not None:
            try:
                object.__setattr__(self, "_regex", re.compile(self.pattern))
            except re.error as exc:
                raise ConfigError(
                    f"option subscribePattern {self.pattern!r} is not a valid regex: {exc}"
                ) from None
        if self.discovery_interval_ms < 0:
            raise ConfigError(
                f"option topicDiscoveryIntervalMs must be >= 0, got {self.discovery_interval_ms}"
            )
        if self.poll_timeout_ms < 1:
            raise ConfigError(f"option kafkaConsumer.pollTimeoutMs must be >= 1, got {self.poll_timeout_ms}")

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> SourceOptions:
        """Build from the options given to ``spark.readStream.format("sotw-kafka")``, named as Spark names them.

        Raises
        ------
        ConfigError
            Naming the option and its bad value.
        """
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        bootstrap = opts.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise ConfigError("option kafka.bootstrap.servers is required (HOST:PORT[,HOST:PORT...])")
        settings = {
            k[len("kafka.") :]: v
            for k, v in opts.items()
            if k.startswith("kafka.") and k != "kafka.bootstrap.servers"
        }
        for unsupported in ("assign", "startingtimestamp", "startingoffsetsbytimestamp", "includeheaders"):
            if unsupported in opts:
                raise ConfigError(
                    f"option {unsupported} of Spark's Kafka source is not supported by {FORMAT}"
                )
        try:
            kafka = KafkaConfig(bootstrap, settings)
        except ValueError as exc:
            raise ConfigError(f"option kafka.bootstrap.servers: {exc}") from None
        subscribe = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        try:
            starting = (
                parse_offset_spec("startingOffsets", opts["startingoffsets"], ("earliest", "latest"))
                if "startingoffsets" in opts
                else None
            )
            ending = parse_offset_spec("endingOffsets", opts.get("endingoffsets", "latest"), ("latest",))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        interval = _int_option(opts, "topicDiscoveryIntervalMs", 0)
        poll = _int_option(opts, "kafkaConsumer.pollTimeoutMs", 1)
        return cls(
            kafka=kafka,
            subscribe=subscribe,
            pattern=opts.get("subscribepattern"),
            starting=starting,
            ending=ending,
            fail_on_data_loss=_bool_option(opts, "failOnDataLoss", True),
            max_offsets_per_trigger=_int_option(opts, "maxOffsetsPerTrigger", 1),
            min_partitions=_int_option(opts, "minPartitions", 1),
            discovery_interval_ms=5000 if interval is None else interval,
            poll_timeout_ms=120_000 if poll is None else poll,
            pack=_bool_option(opts, "packRecords", False),
        )

    def matches(self, topic: str) -> bool:
        """Whether the query reads ``topic``: named by ``subscribe`` or fully matched by the pattern.

        Internal topics (``__consumer_offsets`` and the like) never match a pattern, as with Kafka's own
        pattern subscription.
        """
        if self._regex is None:
            return topic in self.subscribe
        return not topic.startswith("__") and self._regex.fullmatch(topic) is not None

    @property
    def tasks(self) -> int:
        """Spark tasks per micro-batch (``minPartitions``, else ``DEFAULT_TASKS``)."""
        return self.min_partitions or DEFAULT_TASKS
