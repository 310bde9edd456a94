"""The settings dialog: values in and out, the live plan, refusing plans and models that fail."""
import pytest

from app.settings_dialog import SettingsDialog
from engine import EngineSettings, SamplingParams, plan


@pytest.fixture
def dialog(qtbot, app_home, app_model):
    s = EngineSettings(model=app_model, backend="numpy", parallel=2, context=512, memory_gib=1.0,
                       sampling=SamplingParams(temperature=0.3, top_k=20, max_tokens=99, seed=5))
    d = SettingsDialog(s, busy=2)
    qtbot.addWidget(d)
    return d


def refreshed(qtbot, d):
    qtbot.waitUntil(lambda: not d._timer.isActive(), timeout=2000)
    return d


def test_round_trips_settings_and_shows_the_plan(dialog, app_model):
    assert dialog.settings() == EngineSettings(model=app_model, backend="numpy", parallel=2, context=512,
                                               memory_gib=1.0, sampling=SamplingParams(
                                                   temperature=0.3, top_k=20, max_tokens=99, seed=5))
    assert dialog.plan_label.text() == plan(dialog.settings()).line
    assert dialog.apply_button.isEnabled()
    assert "2 replies in progress will stop" in dialog.busy_note.text()
    assert "llama" in dialog.model_info.text()


def test_plan_updates_live_as_values_change(qtbot, dialog):
    before = dialog.plan_label.text()
    dialog.kv_dtype.setCurrentIndex(dialog.kv_dtype.findData("fp8"))
    dialog.paging.setCurrentIndex(dialog.paging.findData("all"))
    dialog.parallel.setValue(5)
    assert not dialog.apply_button.isEnabled()  # until the plan for the new values is known
    refreshed(qtbot, dialog)
    s = dialog.settings()
    assert (s.kv_dtype, s.paging, s.parallel) == ("fp8", "all", 5)
    assert dialog.plan_label.text() == plan(s).line != before
    assert "the engine's own and 4 more" in dialog.plan_label.text()
    assert dialog.apply_button.isEnabled()
    dialog.paging.setCurrentIndex(dialog.paging.findData("off"))
    refreshed(qtbot, dialog)
    assert not dialog.page_tokens.isEnabled()


def test_a_plan_that_cannot_fit_cannot_be_applied(qtbot, dialog):
    dialog.context.setValue(4096)  # beyond what the tiny model's positions allow
    refreshed(qtbot, dialog)
    assert dialog.plan_label.text().startswith("Does not fit") and dialog.plan_label.objectName() == "error"
    assert "4096" in dialog.plan_label.text()
    assert not dialog.apply_button.isEnabled()
    dialog.memory.setValue(0)  # Automatic
    refreshed(qtbot, dialog)
    assert dialog.settings().memory_gib is None and dialog.memory.text().startswith("Automatic")


def test_an_invalid_model_is_refused_with_the_loaders_message(qtbot, dialog, tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf at all")
    dialog.model.setText(str(bad))
    refreshed(qtbot, dialog)
    assert dialog.model_info.objectName() == "error" and "model.gguf" in dialog.model_info.text()
    assert not dialog.apply_button.isEnabled()
    dialog.apply_button.click()
    assert dialog.result() == 0
    dialog.model.clear()  # back to the default model
    refreshed(qtbot, dialog)
    assert dialog.settings().model is None


def test_apply_accepts_a_good_plan(qtbot, dialog):
    dialog.apply_button.click()
    assert dialog.result() == 1
