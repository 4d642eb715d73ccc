r"""The snapshot/update job as a quixstreams team writes it: each session's rows in a table topic, exactly once.

It is the job ``examples/kafka-streams/`` does in Kafka Streams, written with quixstreams 3.28: an
``Application`` with ``processing_guarantee="exactly-once"``, one ``StreamingDataFrame`` per sensor topic and
a stateful ``apply`` whose state is keyed by the message key, the session (docs/wire-format.md). Faults
reorder and repeat messages, so for each row the state holds the seq of the message that last set it and
whether that message deleted it; a message changes a row only when its seq is higher, so a delayed update or
a copy sent again never puts an old value back, and an old upsert never revives a deleted row. The row's
values go from the message straight to the output, so the state holds two small numbers per row, not the
session's table.

Output (sotw's tables contract as a topic, docs/own-pipeline.md): key ``SESSION/ROW_ID``, value the row as
JSON with ``session``, ``sensor``, ``row_id``, ``seq`` and ``committed_ms`` beside the row's columns, and a
Kafka tombstone (null value) for a deleted row. The record keeps its input's timestamp (the send time), so
``committed_ms`` says when the row was processed.

Exactly-once: each checkpoint (every ``--commit-interval-ms``) commits the output records, the state's
changelog records and the input offsets in one Kafka transaction, so a job killed mid-checkpoint and started
again neither loses nor repeats a change, and a ``read_committed`` reader never sees the aborted attempt. The
state lives in RocksDB under ``--state-dir`` and in changelog topics ``changelog__GROUP--TOPIC--default``,
one per sensor topic, which quixstreams creates. With ``--instance-id`` the consumer is a static member of
its group and the producer's ``transactional.id`` is stable, so a job started again after ``kill -9`` takes
its partitions back at once and fences its old transaction instead of leaving it open (and the topic's
``read_committed`` readers waiting) until it times out.

quixstreams subscribes to a list of topics, not to a regex. So the job lists the topics matching
``--input-pattern`` with the admin client when it starts, waiting until some exist and their list has not
changed for two seconds (sotw's simulator creates a run's sensor topics just after it starts the job), and
consumes those. A thread keeps looking: when a new matching topic appears (a sensor joined the run), it stops
the ``Application``, which commits its checkpoint, and the job starts one again on the longer list.

quixstreams 3.28 pins confluent-kafka below 2.13 and sotw uses 2.16, so the job runs in a virtualenv of its
own (``make quixstreams-venv`` makes ``build/quixstreams-venv``); sotw's ``{python}`` is not its interpreter.
It imports nothing from sotw. Run it under the harness::

    make quixstreams-venv
    sotw run --profile smoke --contract tables --format topic --lag-from group:team-quix --cleanup \
      --pipeline-cmd 'build/quixstreams-venv/bin/python examples/quixstreams_pipeline.py --bootstrap {bootstrap}
        --kafka-config {kafka_config} --input-pattern {pattern} --output-topic {output_topic}
        --consumer-group team-quix --state-dir {checkpoint} --commit-interval-ms {trigger_ms} --instance-id 1'

``--cleanup`` deletes the output topic and the changelog topics of the job's group (``--lag-from group:``) with
the run's topics.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any, NamedTuple

from confluent_kafka.admin import AdminClient
from quixstreams import Application, State
from quixstreams.kafka import ConnectionConfig
from quixstreams.models import SerializationContext, Serializer

log = logging.getLogger("quixstreams_pipeline")

#: How long the list of matching topics must stay the same before the job starts on it, and how often it is read.
SETTLE_S = 2.0
LOOK_EVERY_S = 2.0


def parse_args() -> argparse.Namespace:
    """The job's flags (the harness fills them in from its --pipeline-cmd template)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap address, HOST:PORT")
    p.add_argument("--input-pattern", required=True, help="regex of the sensor topics (anchored with ^)")
    p.add_argument("--output-topic", required=True, help="the topic the table is written to")
    p.add_argument("--consumer-group", required=True, help="consumer group (where sotw reads the lag)")
    p.add_argument("--state-dir", type=Path, required=True, help="directory of the RocksDB state")
    p.add_argument("--commit-interval-ms", type=int, default=1000, help="checkpoint interval in ms (1000)")
    p.add_argument("--instance-id", default=None, help="static group member id and stable transactional.id")
    p.add_argument(
        "--kafka-config", type=Path, default=None, help="librdkafka settings file (key=value lines)"
    )
    return p.parse_args()


def read_settings(path: Path) -> dict[str, str]:
    """``key=value`` lines of a settings file; blank lines and ``#`` comments skipped."""
    settings = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            settings[key.strip()] = value.strip()
    return settings


class Change(NamedTuple):
    """One row changed by a message: its output key and its new value (None: the row was deleted)."""

    key: str
    row: dict[str, Any] | None


class ChangeSerializer(Serializer):
    """A change as the output record's value: the row as JSON, or no value at all (a tombstone) for a delete.

    quixstreams passes the value serializer's result to the producer as it is, so None is a Kafka tombstone
    (its JSON serializer would write the text ``null`` instead).
    """

    def __call__(self, value: Change, ctx: SerializationContext) -> bytes | None:  # type: ignore[override]
        """The record's value bytes, or None for a tombstone."""
        return None if value.row is None else json.dumps(value.row, separators=(",", ":")).encode()


def decode(value: bytes | None) -> dict[str, Any] | None:
    """A message of the wire format, or None for anything else (a malformed copy: skipped)."""
    try:
        msg = json.loads(value or b"")
    except ValueError:
        return None
    if not isinstance(msg, dict):
        return None
    seq = msg.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool):
        return None
    if not all(isinstance(msg.get(name), str) for name in ("session", "sensor", "kind")):
        return None
    return msg


def apply_message(value: bytes | None, state: State[int, list[Any]]) -> list[Change]:
    """Apply one message to its session's rows in ``state``; the rows it changes, in the message's order.

    ``state`` is the session's (quixstreams keys it by the message key): per row id, ``[seq, deleted]`` of
    the message that last set the row. A delete stays in it as a tombstone with its seq, so an older upsert
    read later cannot bring the row back.
    """
    msg = decode(value)
    if msg is None:
        return []
    if msg["kind"] == "snapshot":
        rows = msg.get("rows")
    elif msg["kind"] == "update":
        rows = [msg.get("row")]
    else:
        return []  # "end" changes no row
    if not isinstance(rows, list):
        return []
    session, sensor, seq = msg["session"], msg["sensor"], msg["seq"]
    deleted = msg.get("op") == "delete"
    changes = []
    for row in rows:
        row_id = row.get("id") if isinstance(row, dict) else None
        if not isinstance(row_id, int) or isinstance(row_id, bool):
            continue
        held = state.get(row_id)
        if held is not None and held[0] >= seq:
            continue  # an older or repeated message: the row already holds a later one
        state.set(row_id, [seq, deleted])
        out = None if deleted else output(session, sensor, row_id, seq, row)
        changes.append(Change(f"{session}/{row_id}", out))
    return changes


def output(session: str, sensor: str, row_id: int, seq: int, row: dict[str, Any]) -> dict[str, Any]:
    """The output row: the row's columns, then the table's own columns (``id`` stays, as in the message)."""
    committed_ms = int(time.time() * 1000)
    return {
        **row,
        "session": session,
        "sensor": sensor,
        "row_id": row_id,
        "seq": seq,
        "committed_ms": committed_ms,
    }


class TopicLister:
    """The topics matching the input pattern, read with the admin client (quixstreams takes no regex)."""

    def __init__(self, settings: dict[str, str], pattern: str) -> None:
        self.admin = AdminClient(dict(settings))
        self.pattern = re.compile(pattern)

    def topics(self) -> set[str]:
        """The matching topics the cluster has now."""
        names = self.admin.list_topics(timeout=10).topics
        return {name for name in names if self.pattern.match(name)}

    def settled(self, stop: threading.Event) -> set[str]:
        """Wait for matching topics and for their list to stay the same for ``SETTLE_S``; empty if stopped."""
        seen: set[str] = set()
        since = time.monotonic()
        while not stop.is_set():
            now = self.topics()
            if now != seen:
                seen, since = now, time.monotonic()
            elif seen and time.monotonic() - since >= SETTLE_S:
                return seen
            stop.wait(0.5)
        return set()


def build_app(args: argparse.Namespace, settings: dict[str, str], inputs: set[str]) -> Application:
    """The application: one dataframe per sensor topic, each with its session state, into the table topic.

    ``settings`` are the cluster's librdkafka settings (``--kafka-config``): the connection's go to
    quixstreams' ``ConnectionConfig``, which its admin client uses too, and all of them to its consumer and
    producer, so a setting ``ConnectionConfig`` does not know still reaches the clients.
    """
    client = {**settings, "bootstrap.servers": args.bootstrap}
    connection = ConnectionConfig.from_librdkafka_dict(client, ignore_extras=True)
    consumer_extra: dict[str, Any] = dict(settings)
    producer_extra: dict[str, Any] = dict(settings)
    if args.instance_id is not None:
        # Static membership: an instance killed and started again takes its partitions back at once; a stable
        # transactional.id fences the old instance's open transaction when the new one starts.
        consumer_extra["group.instance.id"] = f"{args.consumer_group}-{args.instance_id}"
        producer_extra["transactional.id"] = f"{args.consumer_group}-{args.instance_id}"
    app = Application(
        broker_address=connection,
        consumer_group=args.consumer_group,
        auto_offset_reset="earliest",  # the job starts before the sensors send: read a topic from its start
        processing_guarantee="exactly-once",
        commit_interval=args.commit_interval_ms / 1000,
        state_dir=args.state_dir,
        consumer_extra_config=consumer_extra,
        producer_extra_config=producer_extra,
    )
    table = app.topic(args.output_topic, key_serializer="str", value_serializer=ChangeSerializer())
    for name in sorted(inputs):
        topic = app.topic(name, key_deserializer="bytes", value_deserializer="bytes")
        # Sessions live in one partition of one sensor topic, so each topic's state is all its sessions need.
        rows = app.dataframe(topic).apply(apply_message, stateful=True, expand=True)
        rows.to_topic(table, key=lambda change: change.key)
    return app


class NewTopics(threading.Thread):
    """Stops ``app`` when a topic matching the pattern appears that it does not consume (a sensor joined)."""

    def __init__(self, lister: TopicLister, known: set[str], app: Application) -> None:
        super().__init__(name="new-topics", daemon=True)
        self.lister = lister
        self.known = known
        self.app = app
        self.done = threading.Event()
        self.found = threading.Event()

    def run(self) -> None:
        """Look every ``LOOK_EVERY_S`` until ``done``; on a new topic, set ``found`` and stop the application."""
        while not self.done.wait(LOOK_EVERY_S):
            try:
                new = self.lister.topics() - self.known
            except Exception as exc:  # a slow metadata answer: look again next time
                log.warning("cannot list the topics: %s", exc)
                continue
            if new:
                log.info("new input topics %s: starting again on them", ", ".join(sorted(new)))
                self.found.set()
                self.app.stop()  # the application commits its checkpoint and returns from run()
                return


def main() -> None:
    """Run the job until SIGTERM, starting it again on the longer list whenever a sensor topic appears."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args()
    settings = read_settings(args.kafka_config) if args.kafka_config else {}
    lister = TopicLister({**settings, "bootstrap.servers": args.bootstrap}, args.input_pattern)
    stopping = threading.Event()
    while not stopping.is_set():
        # quixstreams installs its own SIGTERM handler while it runs; ours covers the waits between runs.
        signal.signal(signal.SIGTERM, lambda *_: stopping.set())
        inputs = lister.settled(stopping)
        if not inputs:
            break
        log.info("consuming %d topics: %s -> %s", len(inputs), ", ".join(sorted(inputs)), args.output_topic)
        app = build_app(args, settings, inputs)
        watch = NewTopics(lister, inputs, app)
        watch.start()
        try:
            if not stopping.is_set():  # a SIGTERM while the application was being built
                app.run()
        finally:
            watch.done.set()
            watch.join()
        if not watch.found.is_set():
            break  # stopped by SIGTERM (quixstreams' handler committed the checkpoint)


if __name__ == "__main__":
    main()
