import pytest

from loadtest.correctness.policies import Policy
from loadtest.errors import HarnessError
from loadtest.run.processes import PipelineProcessConfig
from loadtest.run.profile import load_profile, parse_load, profile_from_mapping


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


def window_profile(tmp_path, pipeline: str):
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'[profiles.w]\ndescription = "x"\n[profiles.w.pipeline]\n{pipeline}\n')
    return load_profile("w", scenario)


def test_a_window_lateness_reaches_both_the_pipeline_command_and_the_verifier(tmp_path):
    profile = window_profile(
        tmp_path, 'policy = "window"\nwindow_messages = 50\nmax_offsets_per_trigger = 5000'
    )
    argv = PipelineProcessConfig("b:9092", tmp_path / "o", tmp_path / "c", settings=profile.pipeline).argv()
    assert argv[argv.index("--window-messages") + 1] == "50"
    assert argv[argv.index("--max-offsets-per-trigger") + 1] == "5000"
    assert argv[argv.index("--policy") + 1] == "window"
    assert profile.pipeline.verifier_policy() == Policy(
        "window",
        window_messages=50,
        session_timeout_ms=profile.pipeline.session_timeout_ms,
        trigger_ms=profile.pipeline.trigger_ms,
    )


def test_the_pipeline_command_line_is_what_sotw_pipeline_parses_back(tmp_path):
    profile = window_profile(tmp_path, 'policy = "window"\nwindow_ms = 2000\nfail_on_data_loss = false')
    from pipeline.cli import build_parser, config_from_args

    config = config_from_args(build_parser().parse_args(["--bootstrap", "b:9092", *profile.pipeline.args()]))
    assert config.policy.policy == "window" and config.policy.window_ms == 2000
    assert config.policy.session_timeout_ms == profile.pipeline.session_timeout_ms
    assert config.fail_on_data_loss is False and config.trigger_ms == 1000


@pytest.mark.parametrize("arg", ["--window-messages=50", "--window-ms", "--no-fail-on-data-loss"])
def test_a_typed_setting_in_extra_args_is_refused_naming_its_field(tmp_path, arg):
    with pytest.raises(
        HarnessError, match=r"pipeline\.(window_messages|window_ms|fail_on_data_loss) instead"
    ):
        window_profile(tmp_path, f'policy = "window"\nwindow_messages = 5\nextra_args = ["{arg}", "7"]')


@pytest.mark.parametrize(
    ("pipeline", "named"),
    [
        ('policy = "ordered"\nwindow_messages = 50', "window_messages only applies to the window policy"),
        ('policy = "window"', "the window policy needs a lateness"),
        ('policy = "sometimes"', "policy must be one of"),
        ('trigger = "soon"', r"pipeline\.trigger must be a duration"),
        ('trigger = "availableNow"', r"pipeline\.trigger must be a duration"),
        ("shuffle_partitions = 0", r"pipeline\.shuffle_partitions must be at least 1"),
        ('window_ms = "2s"', r"pipeline\.window_ms must be a whole number"),
    ],
)
def test_bad_pipeline_settings_are_refused_naming_the_field(tmp_path, pipeline, named):
    with pytest.raises(HarnessError, match=named):
        window_profile(tmp_path, pipeline)


def test_an_end_to_end_bound_is_optional_and_must_be_a_number():
    assert (
        load_profile("smoke").run.max_end_to_end_p99_s is None
        or load_profile("smoke").run.max_end_to_end_p99_s > 0
    )
    with pytest.raises(HarnessError, match=r"run\.max_end_to_end_p99_s must be a number"):
        profile_from_mapping("e", {"run": {"max_end_to_end_p99_s": "fast"}})
