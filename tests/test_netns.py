"""A network of namespaces: hosts talk over it, faults cut, drop and slow it, and nothing of it is left behind.

Every test but the first needs root, ``ip`` and ``nft`` and skips saying which is missing (CI runners without
root). Programs inside the namespaces are small Python scripts run with ``Network.popen``/``Network.run``: a
server (TCP lines answered with their length, UDP datagrams printed) and one-shot clients; the last test puts a
real Kafka node on a host (a ``KafkaBroker`` given the network) and a real producer on another.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sotw.network import GATEWAY, Names, Network, NetworkError, missing

MISSING = missing()
needs_network = pytest.mark.skipif(
    bool(MISSING), reason="a network of namespaces needs " + "; ".join(MISSING)
)

PORT = 7000

#: In a host: answer each TCP line with its length in bytes (one connection may send many lines); print each
#: UDP datagram received on the same port. Prints "ready" once both are bound.
SERVER = textwrap.dedent(
    """
    import socket, sys, threading
    port = int(sys.argv[1])
    def serve(conn):
        with conn:
            n = 0
            while data := conn.recv(1 << 16):
                parts = data.split(b"\\n")
                for part in parts[:-1]:
                    conn.sendall(f"{n + len(part)}\\n".encode())
                    n = 0
                n += len(parts[-1])
    def tcp(srv):
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=serve, args=(conn,), daemon=True).start()
    srv = socket.create_server(("0.0.0.0", port))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("0.0.0.0", port))
    threading.Thread(target=tcp, args=(srv,), daemon=True).start()
    print("ready", flush=True)
    while True:
        print(udp.recv(1024).decode(), flush=True)
    """
)

#: In a host, once per line of standard input (a byte count): send that many bytes and a newline on one kept
#: connection, wait for the answer, print {"ok", "error", "seconds"}. The connection is opened on the first line.
CLIENT = textwrap.dedent(
    """
    import json, socket, sys, time
    host, port, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    conn, pending = None, b""
    for line in sys.stdin:
        size, started, error = int(line), time.monotonic(), None
        try:
            if conn is None:
                conn = socket.create_connection((host, port), timeout=timeout)
            conn.sendall(b"x" * size + b"\\n")
            conn.settimeout(timeout)
            while True:  # answers to requests that timed out arrive late: skip them
                while b"\\n" not in pending:
                    chunk = conn.recv(1024)
                    if not chunk:
                        raise ConnectionError("closed")
                    pending += chunk
                answer, pending = pending.split(b"\\n", 1)
                if int(answer) == size:
                    break
        except (OSError, ConnectionError) as exc:
            error = type(exc).__name__
        print(json.dumps({"ok": error is None, "error": error, "seconds": time.monotonic() - started}), flush=True)
    """
)

UDP_SEND = (
    "import socket, sys; socket.socket(2, 2).sendto(sys.argv[3].encode(), (sys.argv[1], int(sys.argv[2])))"
)


class Lines:
    """The lines a process prints, read by a thread so a test can wait for one with a timeout."""

    def __init__(self, proc: subprocess.Popen[Any]) -> None:
        self.proc = proc
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line.strip())

    def next(self, timeout: float = 10.0) -> str | None:
        """The next line, or None if none came within ``timeout`` seconds."""
        try:
            return self._lines.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self) -> list[str]:
        """Every line printed so far and not yet read."""
        lines = []
        while not self._lines.empty():
            lines.append(self._lines.get())
        return lines


def start_server(net: Network, host: str) -> Lines:
    proc = net.popen(host, [sys.executable, "-c", SERVER, str(PORT)], stdout=subprocess.PIPE, text=True)
    lines = Lines(proc)
    assert lines.next() == "ready", f"the server in {host} did not start"
    return lines


class Client:
    """A ``CLIENT`` kept running in a host, asked to send ``size`` bytes and wait for their answer."""

    def __init__(self, net: Network, host: str, server: str, timeout: float = 1.0) -> None:
        argv = [sys.executable, "-c", CLIENT, net.address(server), str(PORT), str(timeout)]
        self.proc = net.popen(host, argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lines = Lines(self.proc)

    def send(self, size: int = 5) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"{size}\n")
        self.proc.stdin.flush()
        line = self.lines.next(timeout=30.0)
        assert line is not None, "the client did not answer"
        result: dict[str, Any] = json.loads(line)
        return result


def connect_once(net: Network, host: str, server: str, size: int = 5, timeout: float = 1.0) -> dict[str, Any]:
    """A fresh connection from ``host`` to ``server``: send ``size`` bytes, wait for the answer."""
    client = Client(net, host, server, timeout)
    try:
        return client.send(size)
    finally:
        client.proc.kill()
        client.proc.wait()


def udp_send(net: Network, host: str, to: str, text: str) -> None:
    done = net.run(host, [sys.executable, "-c", UDP_SEND, net.address(to), str(PORT), text])
    assert done.returncode == 0, done.stderr


@pytest.fixture
def net() -> Iterator[Network]:
    with Network(hosts=("a", "b")) as network:
        yield network


def test_without_root_or_nft_the_network_refuses_naming_what_is_missing_and_make_setup(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(shutil, "which", lambda name, path=None: None)
    with pytest.raises(NetworkError) as caught:
        Network()
    message = str(caught.value)
    assert "root" in message
    assert "`ip`" in message and "`nft`" in message
    assert "make setup" in message and "apt-get install nftables" in message


@needs_network
def test_hosts_talk_a_partition_times_out_silently_and_heal_restores_it(net: Network) -> None:
    start_server(net, "b")
    kept = Client(net, "a", "b")
    assert kept.send()["ok"]
    assert connect_once(net, "a", "b")["ok"]

    fault = net.partition(["a"], ["b"])
    # Silent: the kept connection's read and a new connect time out, rather than being refused or unreachable.
    cut = kept.send()
    assert cut["error"] == "TimeoutError", cut
    fresh = connect_once(net, "a", "b")
    assert fresh["error"] == "TimeoutError", fresh
    # Only a and b are cut: the root namespace still reaches b.
    with socket.create_connection((net.address("b"), PORT), timeout=1.0) as s:
        s.sendall(b"abc\n")
        assert s.recv(16) == b"3\n"
    outage = fault.heal()

    assert outage.kind == "partition" and outage.up_ms >= outage.down_ms
    assert connect_once(net, "a", "b")["ok"]
    # The kept connection comes back once TCP retransmits: within a few seconds of the heal.
    healed_at = time.monotonic()
    while not (answer := kept.send())["ok"]:
        assert time.monotonic() - healed_at < 15, answer
    assert net.faults == []


@needs_network
def test_a_partition_can_cut_the_gateway_from_a_host(net: Network) -> None:
    start_server(net, "b")
    with net.partition([GATEWAY], ["b"]), pytest.raises(TimeoutError):
        socket.create_connection((net.address("b"), PORT), timeout=0.5)
    assert connect_once(net, "a", "b")["ok"]
    with socket.create_connection((net.address("b"), PORT), timeout=1.0):
        pass


@needs_network
def test_a_one_way_cut_drops_what_a_sends_to_b_and_lets_b_reach_a(net: Network) -> None:
    to_a, to_b = start_server(net, "a"), start_server(net, "b")
    udp_send(net, "a", "b", "before")
    assert to_b.next(2.0) == "before"

    with net.partition(["a"], ["b"], one_way=True):
        for n in range(3):
            udp_send(net, "a", "b", f"a-to-b-{n}")
            udp_send(net, "b", "a", f"b-to-a-{n}")
        assert [to_a.next(2.0) for _ in range(3)] == [f"b-to-a-{n}" for n in range(3)]
        assert to_b.next(0.5) is None
        # TCP needs both ways: a connection from either side fails, the one from b by its answers' loss.
        assert connect_once(net, "b", "a", timeout=0.5)["error"] == "TimeoutError"

    udp_send(net, "a", "b", "after")
    assert to_b.next(2.0) == "after"


@needs_network
def test_flaky_at_100_percent_drops_everything_and_at_0_nothing(net: Network) -> None:
    start_server(net, "b")
    with net.flaky(None, 100):
        assert connect_once(net, "a", "b", timeout=0.5)["error"] == "TimeoutError"
    with net.flaky("b", 0):
        assert connect_once(net, "a", "b", size=256 * 1024)["ok"]
    with net.flaky(["a", "b"], 100):
        assert connect_once(net, "a", "b", timeout=0.5)["error"] == "TimeoutError"
    assert connect_once(net, "a", "b")["ok"]


@needs_network
def test_a_cap_slows_a_transfer_to_its_rate_and_its_heal_frees_it(net: Network) -> None:
    start_server(net, "b")
    size = 512 * 1024  # 4 Mbit: a second at 4mbit
    free = connect_once(net, "a", "b", size=size, timeout=10.0)
    with net.cap("b", "4mbit"):
        capped = connect_once(net, "a", "b", size=size, timeout=10.0)
    after = connect_once(net, "a", "b", size=size, timeout=10.0)

    assert free["ok"] and capped["ok"] and after["ok"]
    assert capped["seconds"] > 0.7, capped
    assert capped["seconds"] > 5 * free["seconds"], (free, capped)
    assert after["seconds"] < capped["seconds"] / 3, (capped, after)


@needs_network
def test_two_networks_at_once_get_their_own_names_subnets_and_faults() -> None:
    with Network(hosts=("a", "b")) as one, Network(hosts=("a", "b")) as two:
        assert one.tag != two.tag
        assert one.address("a").rsplit(".", 1)[0] != two.address("a").rsplit(".", 1)[0]
        start_server(one, "b")
        start_server(two, "b")
        with one.partition(["a"], ["b"]):
            assert connect_once(one, "a", "b", timeout=0.5)["error"] == "TimeoutError"
            assert connect_once(two, "a", "b")["ok"]
        with pytest.raises(NetworkError, match="the network's hosts are"):
            one.partition(["a"], ["nobody"])


def _ours(pid: int) -> Names:
    found = Names.found()
    return Names(
        *(
            tuple(n for n in names if n.startswith(f"sotw{pid}"))
            for names in (found.namespaces, found.links, found.tables)
        )
    )


OWNER = textwrap.dedent(
    """
    import sys, time
    from sotw.network import Network
    net = Network(hosts=("x", "y")).start()
    net.partition(["x"], ["y"])
    sleeper = net.popen("x", ["sleep", "300"])
    print(sleeper.pid, flush=True)
    time.sleep(300)
    """
)


def start_owner() -> tuple[subprocess.Popen[str], int]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    sleeper = int(owner.stdout.readline())
    return owner, sleeper


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@needs_network
def test_nothing_is_left_after_the_network_closes_even_on_ctrl_c() -> None:
    network = Network(hosts=("a", "b"))
    with pytest.raises(KeyboardInterrupt), network:
        network.partition(["a"], ["b"])
        network.cap("a", "1mbit")
        assert _ours(os.getpid())
        raise KeyboardInterrupt
    assert not _ours(os.getpid())
    network.close()  # again: nothing to do


@needs_network
def test_sigterm_removes_the_owners_network_and_stops_its_processes() -> None:
    owner, sleeper = start_owner()
    assert _ours(owner.pid).namespaces
    owner.send_signal(signal.SIGTERM)
    assert owner.wait(10) == -signal.SIGTERM
    assert not _ours(owner.pid)
    assert gone(sleeper)


@needs_network
def test_the_next_start_removes_what_an_owner_killed_with_sigkill_left() -> None:
    owner, sleeper = start_owner()
    owner.kill()
    owner.wait()
    left = _ours(owner.pid)
    assert len(left.namespaces) == 2 and len(left.links) == 3 and len(left.tables) == 1, left
    with Network(hosts=("a",)):
        assert not _ours(owner.pid)
        assert gone(sleeper)


#: In a host: one producer kept for the whole test; each line of standard input is a value to produce and
#: flush, printed back as {"value", "result" ("ok" or librdkafka's error), "seconds"}.
PRODUCER = textwrap.dedent(
    """
    import json, sys, time
    from confluent_kafka import Producer
    producer = Producer({"bootstrap.servers": sys.argv[1], "message.timeout.ms": 3000, "log_level": 0})
    for line in sys.stdin:
        value, results, started = line.strip(), [], time.monotonic()
        producer.produce(sys.argv[2], value.encode(), on_delivery=lambda err, msg: results.append(err))
        producer.flush(10)
        error = results[0] if results else "no delivery report"
        result = "ok" if error is None else str(error)
        print(json.dumps({"value": value, "result": result, "seconds": time.monotonic() - started}), flush=True)
    """
)


@pytest.mark.system
@needs_network
def test_a_real_producer_cut_from_a_real_broker_fails_its_sends_and_recovers_after_the_heal(
    tmp_path: Path,
) -> None:
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient, NewTopic

    from sotw.broker import KafkaBroker

    # A broker given a network puts node 1 on its host n1 (listening on n1's address, started inside n1's
    # namespace) and leaves the network to its owner when it stops.
    with Network(hosts=("n1", "client")) as net, KafkaBroker(nodes=1, heap_mb=256, network=net) as broker:
        bootstrap = broker.bootstrap  # reached from the root namespace, through the gateway
        assert bootstrap == f"{net.address('n1')}:9092"
        topic, admin = "netns-cut", AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
        argv = [sys.executable, "-c", PRODUCER, bootstrap, topic]
        producer = net.popen("client", argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        replies = Lines(producer)

        def produce(value: str) -> dict[str, Any]:
            assert producer.stdin is not None
            producer.stdin.write(value + "\n")
            producer.stdin.flush()
            line = replies.next(30.0)
            assert line is not None, "the producer did not answer"
            reply: dict[str, Any] = json.loads(line)
            return reply

        assert produce("before")["result"] == "ok"
        with net.partition(["client"], ["n1"]):
            cut = produce("during")
            broker.check_alive()
        assert "timed out" in cut["result"].lower(), cut
        healed_at, tries = time.monotonic(), 0
        while (after := produce(f"after-{tries}"))["result"] != "ok":
            tries += 1
            assert time.monotonic() - healed_at < 30, after
        producer.stdin.close()  # type: ignore[union-attr]
        producer.wait(10)

        consumer = Consumer(
            {"bootstrap.servers": bootstrap, "group.id": "netns", "auto.offset.reset": "earliest"}
        )
        consumer.subscribe([topic])
        values: list[str] = []
        deadline = time.monotonic() + 20
        while after["value"] not in values and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                values.append(msg.value().decode())
        consumer.close()
        assert values[0] == "before" and values[-1] == after["value"], values
        broker.stop()
        assert net.address("n1") and net.tag is not None  # the network stays with its owner
