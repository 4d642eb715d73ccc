import pytest

from loadtest.errors import HarnessError
from loadtest.profile import load_profile, parse_load, profile_from_mapping


def test_the_shipped_profiles_state_everything_a_run_depends_on():
    baseline = load_profile("baseline")
    assert baseline.simulator.rate > 0 and baseline.pipeline.policy == "ordered"
    stated = baseline.as_dict()
    assert {"simulator", "pipeline", "run", "schedule"} <= set(stated)
    assert stated["simulator"]["faults"]["gap"] == baseline.simulator.faults.gap
    assert load_profile("demo").schedule, "the demo turns faults up mid-run"


@pytest.mark.parametrize(("text", "factor"), [("1x", 1.0), ("10x", 10.0), ("2.5x", 2.5), ("3", 3.0)])
def test_load_factors_are_read_as_users_write_them(text, factor):
    assert parse_load(text) == factor


@pytest.mark.parametrize("text", ["ten", "0x", "-1x", "x"])
def test_a_bad_load_factor_is_named(text):
    with pytest.raises(HarnessError, match="load"):
        parse_load(text)


def test_an_unknown_setting_names_its_place_and_the_known_ones(tmp_path):
    with pytest.raises(HarnessError, match=r"profiles\.mine\.run\.steadyy .*steady_s"):
        profile_from_mapping("mine", {"run": {"steadyy": 30}})
    with pytest.raises(HarnessError, match="rate"):
        profile_from_mapping("mine", {"simulator": {"rate": -5}})
    scenario = tmp_path / "s.toml"
    scenario.write_text('[profiles.a]\ndescription = "x"\n')
    with pytest.raises(HarnessError, match="no profile 'b' .*profiles: a"):
        load_profile("b", scenario)


def test_a_fault_window_must_end_after_it_starts():
    with pytest.raises(HarnessError, match="start_s < end_s"):
        profile_from_mapping("w", {"schedule": [{"start_s": 10, "end_s": 5, "faults": {"gap": 0.1}}]})
