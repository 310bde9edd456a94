"""Persisted settings and session: the config and state dirs under LANECHAT_HOME, tolerant reads."""
from app.app_settings import (
    Session,
    load_session,
    load_settings,
    save_session,
    save_settings,
    session_path,
    settings_path,
)
from engine import EngineSettings, SamplingParams


def test_settings_round_trip_under_lanechat_home(app_home):
    s = EngineSettings(model="/m", backend="numpy", parallel=3, kv_dtype="fp8", paging="all",
                       memory_gib=2.5, sampling=SamplingParams(temperature=0.2, seed=7))
    save_settings(s)
    assert settings_path().is_relative_to(app_home / "config")
    assert load_settings() == (s, None)


def test_no_file_gives_defaults_without_notice(app_home):
    assert load_settings() == (EngineSettings(), None)


def test_broken_or_invalid_settings_fall_back_with_a_notice(app_home):
    settings_path().write_text("{oops")
    s, notice = load_settings()
    assert s == EngineSettings() and "using the defaults" in notice
    settings_path().write_text('{"format_version": 1, "engine": {"parallel": 0}}')
    s, notice = load_settings()
    assert s == EngineSettings() and "parallel" in notice


def test_session_round_trip_and_damage(app_home):
    assert load_session() == Session()
    session = Session(open_tabs=["a", "b"], active=1, geometry="AAA", splitter="BBB", sidebar=False)
    save_session(session)
    assert session_path().is_relative_to(app_home / "state")
    assert load_session() == session
    session_path().write_text('{"open_tabs": [1, 2]}')
    assert load_session() == Session()
    session_path().write_text("[]")
    assert load_session() == Session()


def test_sampling_the_user_chose_is_remembered(app_home):
    from app.app_settings import load_sampling_chosen
    assert load_sampling_chosen() == set()  # no file: everything follows the model
    save_settings(EngineSettings(), {"temperature"})
    assert load_sampling_chosen() == {"temperature"}
    save_settings(EngineSettings())  # without a set: the values are the user's own
    assert load_sampling_chosen() == {"temperature", "top_p", "top_k"}
    # A file from before the choice was recorded: what differs from the defaults was set by the user.
    settings_path().write_text('{"format_version": 1, "engine": {"sampling": {"temperature": 0.7, "top_p": 0.5}}}')
    assert load_sampling_chosen() == {"top_p"}


def test_replies_use_the_models_sampling_unless_the_user_chose(app_home, default_model):
    from app.app_settings import with_model_sampling
    s = EngineSettings(model=default_model, sampling=SamplingParams(temperature=0.7, top_p=0.95, top_k=40,
                                                                    max_tokens=99))
    first = with_model_sampling(s, set()).sampling
    assert (first.temperature, first.top_p, first.top_k, first.max_tokens) == (0.2, 0.9, 40, 99)
    mine = with_model_sampling(s, {"temperature"}).sampling
    assert (mine.temperature, mine.top_p) == (0.7, 0.9)
    assert s.sampling.temperature == 0.7  # the settings themselves are untouched


def test_prompt_precision_round_trips_and_an_unknown_one_falls_back(app_home):
    s = EngineSettings(prefill_precision="exact")
    save_settings(s)
    assert load_settings() == (s, None)
    settings_path().write_text('{"format_version": 1, "engine": {"prefill_precision": "fp8"}}')
    s, notice = load_settings()
    assert s == EngineSettings() and s.prefill_precision == "fp16"
    assert "prefill precision must be fp16 or exact, got 'fp8'" in notice and "using the defaults" in notice


def test_the_app_leaves_the_prompt_chunk_to_the_backend(app_home):
    """Files from before the backend chose it hold the old default, 128, which nobody chose."""
    settings_path().write_text('{"format_version": 1, "engine": {"prefill_chunk": 128, "parallel": 3}}')
    s, notice = load_settings()
    assert notice is None and s.prefill_chunk == 0 and s.parallel == 3
