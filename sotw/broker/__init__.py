"""Apache Kafka on this machine: the broker ``sotw broker``, every run, drill and test session start.

``local_broker`` (``sotw.broker.local``) starts one node or a three-node cluster by name; ``KafkaBroker``
(``sotw.broker.kafka``) is the broker itself, with the incidents of game days. It is for rehearsals on one
machine: pass ``--bootstrap`` to any command to use a real cluster. docs/broker.md says what each incident
does to clients.
"""

from sotw.broker.config import KafkaBrokerConfig
from sotw.broker.kafka import KafkaBroker, PartitionState
from sotw.broker.local import BROKERS, LocalBroker, local_broker
from sotw.broker.net import free_port, port_in_use, wait_for_kafka
from sotw.broker.security import SECURITY_MODES, SecurityMode, security_mode
from sotw.broker.users import RunUser, grant_run_acls, run_acls
from sotw.outage import Outage

__all__ = [
    "BROKERS",
    "KafkaBroker",
    "KafkaBrokerConfig",
    "LocalBroker",
    "Outage",
    "PartitionState",
    "RunUser",
    "SECURITY_MODES",
    "SecurityMode",
    "free_port",
    "grant_run_acls",
    "local_broker",
    "port_in_use",
    "run_acls",
    "security_mode",
    "wait_for_kafka",
]
