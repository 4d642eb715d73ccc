"""Brokers sotw starts on this machine: Apache Kafka (one node or a cluster), and the embedded Tansu broker.

Tests (one broker per test session), the demo and the load-test harness start a broker through
``local_broker`` (``sotw.broker.local``), Apache Kafka unless asked for Tansu; ``sotw broker`` runs one in the
foreground. Either way it is for rehearsals on one machine: pass ``--bootstrap`` to any command to use a real
cluster. docs/broker.md says what each incident does to clients.
"""

from sotw.broker.config import KafkaBrokerConfig
from sotw.broker.kafka import KafkaBroker
from sotw.broker.local import BROKERS, LocalBroker, local_broker
from sotw.broker.net import free_port, port_in_use, wait_for_kafka
from sotw.broker.tansu import TansuBroker
from sotw.outage import Outage

__all__ = [
    "BROKERS",
    "KafkaBroker",
    "KafkaBrokerConfig",
    "LocalBroker",
    "Outage",
    "TansuBroker",
    "free_port",
    "local_broker",
    "port_in_use",
    "wait_for_kafka",
]
