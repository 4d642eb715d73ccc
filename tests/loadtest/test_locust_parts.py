"""The Locust side's small parts: shapes, users to load, aggregated request events, the UI's login guard."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from locust import events
from locust.env import Environment

from loadtest.conductor import Conductor, LocustSettings
from loadtest.driver import ACK_NAME, REQUEST_TYPE, count_aggregated, fire_acks
from loadtest.errors import HarnessError
from loadtest.fleetplan import LiveConfig, part_config, process_factor, users_for
from loadtest.locustfile import SensorLoad
from loadtest.profile import load_profile
from loadtest.shapes import make_shape
from loadtest.webui import install


def test_step_climbs_from_1x_to_10x_in_equal_stages_then_ends() -> None:
    shape = make_shape("step", steady_s=100.0)
    assert [level.load for level in shape.levels] == [float(k) for k in range(1, 11)]
    assert shape.load_at(0) == 1.0 and shape.load_at(95) == 10.0 and shape.load_at(100) is None


def test_spike_goes_to_its_peak_and_back_and_soak_holds_an_hour() -> None:
    spike = make_shape("spike", steady_s=30.0, load=5.0)
    assert [spike.load_at(t) for t in (0, 15, 25)] == [1.0, 5.0, 1.0]
    assert make_shape("soak", steady_s=30.0).seconds == 3600.0


def test_an_unknown_shape_is_refused_naming_the_choices() -> None:
    with pytest.raises(HarnessError, match="steady, step, spike, soak"):
        make_shape("ramp", steady_s=10.0)


def test_ten_users_make_1x_and_a_process_without_users_keeps_a_trickle() -> None:
    assert users_for(10.0, 10.0) == 100 and users_for(0.01, 10.0) == 1
    assert process_factor(25, 10.0, rate=300.0) == 2.5
    assert 0 < process_factor(0, 10.0, rate=300.0) < 0.1


def test_workers_get_disjoint_sensor_ids_that_cover_the_fleet() -> None:
    profile = load_profile("smoke")
    parts = [part_config(profile, "p-", i, 3, 1.0) for i in range(3)]
    assert sum(p.sensors for p in parts) == profile.simulator.sensors
    ids = [set(range(p.first_sensor, p.first_sensor + p.sensors)) for p in parts]
    assert not (ids[0] & ids[1] or ids[1] & ids[2] or ids[0] & ids[2])


def test_one_aggregated_event_counts_every_message_it_stands_for() -> None:
    env = Environment(user_classes=[SensorLoad], events=events)
    env.create_local_runner()
    listener = count_aggregated(env)
    env.events.request.add_listener(listener)
    try:
        fired = fire_acks(env, acks=[[120, 500], [124, 250], [400, 250]], failures=[["timed out", 7]])
        entry = env.stats.get(ACK_NAME, REQUEST_TYPE)
        assert fired == 3, "120 and 124 ms share a bucket of Locust's; one event per error"
        assert entry.num_requests == 1007 and entry.num_failures == 7
        assert entry.get_response_time_percentile(0.5) == 120
    finally:
        env.events.request.remove_listener(listener)
        env.runner.quit()


def test_sotw_routes_ask_for_a_login_when_locust_runs_with_web_login(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["locust"])  # Locust's UI reads its extra options from the command line
    env = Environment(user_classes=[SensorLoad], events=events)
    env.create_local_runner()
    web_ui = env.create_web_ui("127.0.0.1", 0, web_login=True)
    web_ui.app.config["SECRET_KEY"] = "test"  # what an auth plugin sets, with its user loader
    web_ui.login_manager.user_loader(lambda user_id: None)  # nobody is logged in
    install(web_ui, Conductor(env, LocustSettings(LiveConfig(str(tmp_path), "smoke")), None, None))
    client = web_ui.app.test_client()
    try:
        for path in ("/sotw/", "/sotw/state", "/sotw/history.csv"):
            response = client.get(path)
            assert response.status_code == 302 and "login" in response.headers["Location"], path
        assert client.post("/sotw/faults", json={"gap": 0.5}).status_code == 302
    finally:
        env.runner.quit()  # the UI's server never served: the test client calls the app directly
