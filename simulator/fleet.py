"""The fleet: which sensors exist, their capture sessions, churn, and how the rate is shared among them.

Every decision here is taken on the schedule's clock (intended send times) with the run's generator, never
on the wall clock, so a slow broker changes when messages go out but not which messages exist.
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np
from faker import Faker

from simulator import native
from simulator.config import SimulatorConfig
from simulator.ledger import Ledger
from simulator.model import SensorInfo, SensorTable, TableStore, sensor_info, skew_weights
from sotw import wire


class Session:
    """One capture session of one sensor: key, partition, the last planned seq and its message templates."""

    __slots__ = (
        "code",
        "id",
        "key",
        "topic",
        "partition",
        "seq",
        "hi",
        "closed",
        "templates",
        "heads",
        "prefix",
        "started_ms",
    )

    def __init__(
        self,
        code: int,
        sensor: str,
        sid: str,
        topic: str,
        partition: int,
        started_ms: int,
    ) -> None:
        self.code = code
        self.id = sid
        self.key = sid.encode("utf-8")
        self.topic = topic
        self.partition = partition
        self.seq = -1  # last seq planned
        self.hi = -1  # highest seq sent in order (delayed messages wait until a later one went out)
        self.closed = False
        self.templates = wire.update_templates(sensor, sid)
        # The templates up to the row, by op (upsert, delete): the block encoder appends each row's own.
        self.heads = tuple(self.templates[op].removesuffix(b"%b}") for op in wire.OPS)
        self.prefix = wire.update_prefix(sensor, sid)  # for the compiled encoder (``simulator.native``)
        self.started_ms = started_ms


class Sensor:
    """A sensor: its topic, its table and its current session (None between sessions)."""

    __slots__ = (
        "id",
        "topic",
        "table",
        "session",
        "session_end_ms",
        "sessions",
        "info",
        "joined_ms",
    )

    def __init__(self, sid: str, topic: str, table: SensorTable, info: SensorInfo, joined_ms: int) -> None:
        self.id = sid
        self.topic = topic
        self.table = table
        self.session: Session | None = None
        self.session_end_ms = 0.0
        self.sessions = 0
        self.info = info
        self.joined_ms = joined_ms


def partition_for(key: bytes, partitions: int) -> int:
    """The partition of a session: CRC-32 of the key modulo the partition count (librdkafka's 'consistent')."""
    return zlib.crc32(key) % partitions


class Fleet:
    """The sensors of one run, their sessions and their churn.

    Parameters
    ----------
    config
        The run's configuration.
    rng
        The run's generator (shared with the producer loop, so the order of draws is fixed).
    run_id
        Mixed with the seed and the topic prefix into every session id, so ids are unique across runs: two
        runs whose directories share a name (the parts of successive Locust runs, ``parts/local``) write to
        topics of their own, and a pipeline that keys state by session must not take one's sessions for the
        other's.
    ledger
        Registers each new session (its code, FIFO and delivery callback).
    """

    def __init__(
        self, config: SimulatorConfig, rng: np.random.Generator, run_id: str, ledger: Ledger
    ) -> None:
        self.config = config
        self.rng = rng
        self.ledger = ledger
        self.token = hashlib.sha256(f"{config.seed}/{run_id}/{config.topic_prefix}".encode()).hexdigest()[:12]
        self.fake = Faker()
        self.fake.seed_instance(int(rng.integers(2**31)))
        #: Every sensor's table, in one store so that a block of updates is applied to all at once.
        self.tables = TableStore(config.rows, config.columns, config.insert_ratio, config.delete_ratio)
        self.active: list[Sensor] = []
        self.all: list[Sensor] = []
        self.retired_ms: dict[str, int] = {}
        self._next = config.first_sensor
        self._weights: np.ndarray | None = None
        self._cdf = np.ones(1)  # the weights' normalised cumulative sum (``pick``), made with them

    def join(self, now_ms: int) -> Sensor:
        """Add a sensor with the next id; its topic is ``<prefix><id>``."""
        sid = f"{self._next:04d}"
        self._next += 1
        topic = f"{self.config.topic_prefix}{sid}"
        table = SensorTable(
            self.config.rows,
            self.config.columns,
            self.rng,
            self.config.insert_ratio,
            self.config.delete_ratio,
            store=self.tables,
        )
        sensor = Sensor(sid, topic, table, sensor_info(sid, topic, self.fake), now_ms)
        self.active.append(sensor)
        self.all.append(sensor)
        self._weights = None
        return sensor

    def retire(self, sensor: Sensor, now_ms: int) -> None:
        """Take a sensor out of the schedule (its session must be closed first)."""
        self.active.remove(sensor)
        self.retired_ms[sensor.id] = now_ms
        self._weights = None

    def weights(self) -> np.ndarray:
        """Each active sensor's share of the rate (Zipf with ``skew``, in join order)."""
        if self._weights is None or len(self._weights) != len(self.active):
            self._weights = skew_weights(len(self.active), self.config.skew)
            cdf = self._weights.cumsum()
            cdf /= cdf[-1]
            self._cdf = cdf
        return self._weights

    def pick(self, uniforms: np.ndarray) -> np.ndarray:
        """The active sensor (an index into ``active``) each uniform in [0, 1) picks, by ``weights``.

        ``Generator.choice(len(active), size=n, p=weights())`` draws ``Generator.random(n)`` and looks each
        up in the normalised cumulative weights, exactly as this does with the uniforms given: the same picks
        from the same generator state, without its checks of ``p`` and its slow search on every block.
        """
        self.weights()
        picks: np.ndarray = native.search_right(self._cdf, uniforms)
        return picks

    def churn(self, span_s: float) -> tuple[int, list[Sensor]]:
        """Draw how many sensors join and which retire during ``span_s`` seconds of schedule."""
        joins = int(self.rng.poisson(self.config.join_rate * span_s)) if self.config.join_rate else 0
        leaving: list[Sensor] = []
        if self.config.retire_rate:
            n = int(self.rng.poisson(self.config.retire_rate * span_s))
            n = min(n, len(self.active) + joins - 1)
            if n > 0:
                picks = self.rng.choice(len(self.active), size=min(n, len(self.active)), replace=False)
                leaving = [self.active[int(k)] for k in sorted(picks.tolist())]
        return joins, leaving

    def new_session(self, sensor: Sensor, start_ms: int, first: bool) -> Session:
        """Open a session for ``sensor`` starting at ``start_ms`` and decide when it is due to end."""
        sensor.sessions += 1
        sid = f"{sensor.id}-{self.token}-{sensor.sessions:05d}"
        partition = partition_for(sid.encode("utf-8"), self.config.partitions)
        code = self.ledger.add_session(sid, sensor.id, sensor.topic, partition)
        session = Session(code, sensor.id, sid, sensor.topic, partition, start_ms)
        interval = self.config.session_interval_s * 1000.0
        # First sessions get a random phase so the fleet does not restart all at once.
        length = interval * (self.rng.uniform(0.1, 1.0) if first else self.rng.uniform(0.8, 1.2))
        sensor.session = session
        sensor.session_end_ms = start_ms + length
        return session
