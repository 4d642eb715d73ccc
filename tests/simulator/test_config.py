import pytest

from simulator import FaultConfig, SimulatorConfig, SimulatorError, load_scenario
from sotw.errors import SotwError


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"sensors": 0}, "sensors"),
        ({"rate": -1.0}, "rate"),
        ({"load_factor": 0}, "load_factor"),
        ({"partitions": 1.5}, "partitions"),
        ({"topic_prefix": "bad prefix/"}, "topic_prefix"),
        ({"rate": 0, "duration_s": None}, "unthrottled"),
    ],
)
def test_bad_config_raises_a_simulator_error_naming_the_field(changes, field):
    with pytest.raises(SimulatorError, match=field):
        SimulatorConfig(**changes)


def test_fault_rates_must_be_fractions_that_fit_together():
    with pytest.raises(SimulatorError, match=r"faults\.gap must be a number between 0 and 1, got 1\.5"):
        FaultConfig(gap=1.5)
    with pytest.raises(SimulatorError, match="at most 1"):
        FaultConfig(gap=0.6, malformed=0.6)
    assert issubclass(SimulatorError, SotwError)


def test_scenario_profiles_override_the_base_settings(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(
        """
sensors = 10
rate = 500
[faults]
gap = 0.01
[sensor_faults."0003"]
malformed = 0.2
[producer]
"linger.ms" = 5
[profiles.10x.simulator]
load_factor = 10
[profiles.10x.simulator.faults]
duplicate = 0.02
"""
    )
    base = load_scenario(path)
    assert (base.sensors, base.rate, base.load_factor, base.faults.gap) == (10, 500, 1.0, 0.01)
    assert base.sensor_faults["0003"].malformed == 0.2 and base.producer == {"linger.ms": "5"}
    ten = load_scenario(path, "10x")
    assert ten.load_factor == 10 and ten.faults == FaultConfig(gap=0.01, duplicate=0.02)
    with pytest.raises(SimulatorError, match="no profile 'nope'.*10x"):
        load_scenario(path, "nope")


def test_the_shipped_load_test_scenarios_are_simulator_scenarios_too():
    """One format for every command: ``sotw simulate --scenario loadtest/scenarios.toml --profile baseline``."""
    from loadtest.run.profile import default_scenario, load_profile

    fleet = load_scenario(default_scenario(), "baseline")
    assert fleet == load_profile("baseline").simulator


def test_a_singular_profile_table_is_refused_naming_the_format(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("sensors = 3\n[profile.short]\nduration_s = 1\n")
    with pytest.raises(SimulatorError, match=r"\[profiles.NAME.simulator\]"):
        load_scenario(path, "short")


def test_scenario_with_an_unknown_key_names_it(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("sensor = 3\n")
    with pytest.raises(SimulatorError, match="unknown setting s.toml.sensor"):
        load_scenario(path)
