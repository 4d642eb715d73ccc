"""A run on a network of hosts (``--netns``): each broker node and the pipeline in a namespace of its own.

The harness stays in the root namespace (the network's ``GATEWAY``), and the simulator with it: the simulator
is a thread sharing the ledger, the live controls and the counters with the harness, which a process of its
own would have to send over a wire, where a partition could cut them too. So "the simulator" of a network
incident is the root namespace: cutting it from the brokers also cuts the lag sampler and the verifier's
look-ups, whose samples during the cut are missing (the charts show a gap), not wrong. The pipeline (driver
and executors: a local Spark, or a team's command) is started inside host ``pipeline``'s namespace; it
reaches the brokers over the bridge and writes its output to files as anywhere else.
"""

from __future__ import annotations

import signal
import threading

from sotw.broker.placement import host_name
from sotw.network import GATEWAY, Network

#: The host the pipeline runs in.
PIPELINE = "pipeline"

#: What network incidents call the root namespace, where the simulator (a thread of the harness) runs.
SIMULATOR = GATEWAY


def run_network(nodes: int) -> Network:
    """A started network with hosts ``n1``...``nN`` for the broker's nodes and ``PIPELINE``.

    ``Network`` closes itself on SIGTERM; the harness's own handler (a graceful stop with a partial report,
    which still needs the broker) is put back, and the run closes the network when it ends.

    Raises
    ------
    NetworkError
        Naming what this machine lacks (root, ``ip``, ``tc``, ``nft``) and how to get it.
    """
    main = threading.current_thread() is threading.main_thread()
    handler = signal.getsignal(signal.SIGTERM) if main else None
    network = Network(hosts=(*(host_name(n) for n in range(1, nodes + 1)), PIPELINE)).start()
    if main and callable(handler):  # the default (die) is Network's own fallback: keep its clean-up then
        signal.signal(signal.SIGTERM, handler)
    return network


def pipeline_command(network: Network) -> tuple[str, ...]:
    """The prefix that starts a command in the pipeline's host, Spark's driver bound to the host's address."""
    address = network.address(PIPELINE)
    return tuple(
        network.command(PIPELINE, ["env", f"SPARK_LOCAL_IP={address}", f"SPARK_LOCAL_HOSTNAME={address}"])
    )
