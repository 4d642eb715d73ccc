"""A three-node Kafka cluster with each node in a network namespace of its own: clients of the root namespace
reach it through the bridge, a node cut from the other two leaves the ISR and rejoins after the heal, and the
node-level incidents still work.

The cluster tests share one cluster (about 15 s to start) and need root, ``ip`` and ``nft``: without them they
skip with the network's own message. The refusal itself is tested without any of them.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.serialization import pkcs12

from sotw.broker import KafkaBroker, local_broker
from sotw.broker.security import BrokerSecrets, security_mode
from sotw.broker_cli import main as broker_main
from sotw.errors import BrokerError, NetworkError
from sotw.kafka import KafkaConfig, ensure_topics
from sotw.network import missing
from tests.deliveries import Deliveries, filled, read_all

MISSING = missing()
needs_network = pytest.mark.skipif(
    bool(MISSING), reason="a network of namespaces needs " + "; ".join(MISSING)
)


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaBroker]:
    # A start timeout for a machine others load too: the nodes start in about 16 s on a quiet one.
    with KafkaBroker(nodes=3, netns=True, start_timeout=180) as cluster:
        yield cluster


def network_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/net")


def wait_for(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Poll ``check()`` every 0.2 s until it is true; return the seconds it took, or fail naming ``what``."""
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, f"{what}: not within {timeout:g} s"
        time.sleep(0.2)
    return time.monotonic() - started


def test_without_root_or_nft_a_netns_broker_refuses_naming_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    with pytest.raises(NetworkError) as caught:
        local_broker("kafka-3", netns=True).start()
    assert "root" in str(caught.value) and "`nft`" in str(caught.value)
    with pytest.raises(NetworkError, match="root"):
        broker_main(["--nodes", "3", "--netns"])


def test_netns_and_proxied_are_refused_together() -> None:
    with pytest.raises(BrokerError, match="netns and proxied"):
        KafkaBroker(nodes=3, netns=True, proxied=True)


def test_each_nodes_certificate_names_every_nodes_address(tmp_path: Path) -> None:
    hosts = ["10.77.0.2", "10.77.0.3", "10.77.0.4"]
    secrets = BrokerSecrets(security_mode("sasl_ssl"), tmp_path, hosts)
    secrets.prepare()
    props = secrets.node_properties(2, tmp_path, [1, 2, 3])
    keystore = Path(props["ssl.keystore.location"]).read_bytes()
    _, cert, _ = pkcs12.load_key_and_certificates(keystore, props["ssl.keystore.password"].encode())
    assert cert is not None
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} >= {*hosts, "127.0.0.1"}


@pytest.mark.system
@needs_network
def test_three_nodes_in_namespaces_serve_a_root_client_with_acks_all(
    cluster: KafkaBroker, unique_prefix: Callable[[], str]
) -> None:
    network = cluster.network
    assert network is not None
    assert cluster.addresses == {n: network.address(f"n{n}") for n in (1, 2, 3)}
    assert cluster.bootstrap == ",".join(f"{a}:9092" for a in cluster.addresses.values())
    spaces = {network_namespace(pid) for pid in cluster.pids.values()}
    assert len(spaces) == 3 and network_namespace(os.getpid()) not in spaces
    topic = unique_prefix() + "roundtrip"
    sender = filled(cluster.bootstrap, topic, 2000, acks="all")
    assert len(sender.acked) == 2000
    assert sorted(read_all(cluster.bootstrap, topic, 2000)) == list(range(2000))
    assert all(sorted(p.isr) == [1, 2, 3] for p in cluster.partitions([topic]))


@pytest.mark.system
@needs_network
def test_a_node_cut_from_the_other_two_leaves_the_isr_and_rejoins_after_the_heal(
    cluster: KafkaBroker, unique_prefix: Callable[[], str]
) -> None:
    network = cluster.network
    assert network is not None
    topic = unique_prefix() + "split"
    ensure_topics(KafkaConfig(cluster.bootstrap), {topic: 3})
    cut = 3
    others = [cluster.host_name(n) for n in cluster.node_ids if n != cut]

    def out() -> bool:
        states = cluster.partitions([topic])
        return bool(states) and all(cut not in p.isr and p.leader != cut for p in states)

    with network.partition([cluster.host_name(cut)], others) as fault:
        left_s = wait_for(f"node {cut} leaving the ISR", out, 45)
        # The majority still takes acks=all writes (min.insync.replicas=2) from a client that asks it alone for
        # the metadata (the cut-off node still names itself leader of the partitions it led).
        majority = ",".join(f"{cluster.addresses[n]}:9092" for n in cluster.node_ids if n != cut)
        sender = Deliveries(majority, acks="all")
        sender.send(topic, range(300))
        assert sender.flush(60) == 0 and sender.errors == [] and len(sender.acked) == 300
    healed = fault.outage
    assert healed is not None

    def back() -> bool:
        # One metadata answer judged whole: two look-ups may be answered by different nodes, one of them stale.
        states = cluster.partitions([topic])
        return bool(states) and all(sorted(p.isr) == [1, 2, 3] for p in states)

    rejoined_s = wait_for(f"node {cut} back in every ISR", back, 60)
    print(
        f"\nnode {cut} left the ISR {left_s:.1f} s after the cut, rejoined {rejoined_s:.1f} s after the heal"
    )


@pytest.mark.system
@needs_network
def test_a_stopped_node_starts_again_in_its_own_namespace(
    cluster: KafkaBroker, unique_prefix: Callable[[], str]
) -> None:
    network = cluster.network
    assert network is not None
    topic = unique_prefix() + "stop"
    filled(cluster.bootstrap, topic, 300, acks="all")
    space = network_namespace(cluster.pids["kafka-2"])
    cluster.stop_node(2)
    assert cluster.down_nodes == [2]
    cluster.check_alive()
    wait_for("node 2 leaving the ISR", lambda: bool(cluster.under_replicated([topic])), 30)
    cluster.start_node(2)
    assert network_namespace(cluster.pids["kafka-2"]) == space  # a new process in the same namespace
    cluster.wait_replicated(60, [topic])
    cluster.pause(1)
    cluster.resume()
    assert sorted(read_all(cluster.bootstrap, topic, 300)) == list(range(300))


@pytest.mark.system
@needs_network
def test_the_active_controller_cut_off_is_replaced_by_another_node_and_rejoins(cluster: KafkaBroker) -> None:
    network = cluster.network
    assert network is not None
    old = wait_for("a controller quorum leader", lambda: cluster.active_controller() is not None, 30)
    controller = cluster.active_controller()
    assert controller in cluster.node_ids, old
    others = [cluster.host_name(n) for n in cluster.node_ids if n != controller]
    with network.partition([cluster.host_name(controller)], others):
        moved_s = wait_for(
            f"another node than {controller} leading the quorum",
            lambda: cluster.active_controller() not in (None, controller),
            30,
        )
        new = cluster.active_controller()
    # After the heal the quorum has a leader and the cluster serves all three nodes again.
    wait_for("a quorum leader after the heal", lambda: cluster.active_controller() is not None, 30)
    wait_for(
        "the whole cluster registered again",
        lambda: len(cluster.admin().list_topics(timeout=5).brokers) == 3,
        60,
    )
    print(f"\ncontroller {controller} cut off: node {new} took over after {moved_s:.1f} s")
