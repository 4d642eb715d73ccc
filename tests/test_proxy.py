"""The TCP proxy's network incidents, with every client of a real broker going through it."""

import threading
import time
from collections.abc import Iterator

import pytest

from sotw.broker import KafkaBroker, port_in_use
from tests.deliveries import filled, read_all

pytestmark = pytest.mark.system  # a broker of its own behind the proxy


@pytest.fixture(scope="module")
def proxied() -> Iterator[KafkaBroker]:
    with KafkaBroker(proxied=True) as broker:
        yield broker


def test_a_cut_in_the_middle_of_a_produce_loses_and_repeats_nothing(proxied, unique_prefix):
    topic = unique_prefix() + "cut"
    sender = filled(proxied.bootstrap, topic, 10_000)
    assert proxied.proxy is not None
    refused: list[bool] = []

    def probe() -> None:
        time.sleep(0.5)
        refused.append(not port_in_use(proxied.host, proxied.port))

    prober = threading.Thread(target=probe)
    prober.start()
    outage = proxied.proxy.cut(1.5)
    prober.join()
    sender.send(topic, range(10_000, 20_000))
    assert sender.flush() == 0 and sender.errors == []
    assert refused == [True]  # new connections refused during the cut
    assert sorted(read_all(proxied.bootstrap, topic, 20_000)) == list(range(20_000))
    assert outage.kind == "cut" and outage.kept_data and outage.duration_s >= 1.5
    assert proxied.proxy.outages[-1] == outage
    proxied.check_alive()  # the broker itself never stopped


def test_a_frozen_proxy_holds_deliveries_until_thawed(proxied, unique_prefix):
    topic = unique_prefix() + "freeze"
    sender = filled(proxied.bootstrap, topic, 500)
    assert proxied.proxy is not None
    proxied.proxy.freeze()
    proxied.proxy.freeze()  # idempotent
    sender.send(topic, range(500, 1000))
    assert sender.flush(1.5) > 0
    assert len(sender.acked) == 500
    outage = proxied.proxy.thaw()
    assert proxied.proxy.thaw() is None
    assert sender.flush() == 0 and sender.errors == []
    assert sorted(read_all(proxied.bootstrap, topic, 1000)) == list(range(1000))
    assert outage is not None and outage.kind == "freeze" and outage.duration_s >= 1.5


@pytest.mark.slow  # over 20 s on CI: the nightly job runs it (make test-slow)
def test_a_restart_behind_the_proxy_keeps_the_clients_address(unique_prefix):
    with KafkaBroker(proxied=True) as broker:
        topic = unique_prefix() + "behind"
        sender = filled(broker.bootstrap, topic, 1000)
        broker.restart(kill=True)
        sender.send(topic, range(1000, 2000))
        assert sender.flush() == 0 and sender.errors == []
        assert sorted(read_all(broker.bootstrap, topic, 2000)) == list(range(2000))
