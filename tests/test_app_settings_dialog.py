"""The settings dialog: values in and out, the live plan in words (the exact line as tooltip),
refusing plans and models that fail, sampling that follows the model, and every button clicked."""
import json
import shutil

import pytest
from modal import answer_file_dialog
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.plan_words import plan_sentence
from app.settings_dialog import SettingsDialog
from engine import EngineSettings, SamplingParams, plan


@pytest.fixture
def dialog(qtbot, app_home, app_model):
    s = EngineSettings(model=app_model, backend="numpy", parallel=2, context=512, memory_gib=1.0,
                       sampling=SamplingParams(temperature=0.3, top_k=20, max_tokens=99, seed=5))
    d = SettingsDialog(s, busy=2)
    qtbot.addWidget(d)
    d.show()
    qtbot.waitExposed(d)
    return d


@pytest.fixture
def model_with_generation_config(tmp_path, app_model):
    folder = tmp_path / "model"
    shutil.copytree(app_model, folder)
    (folder / "generation_config.json").write_text(json.dumps({"do_sample": True, "temperature": 0.25,
                                                               "top_p": 0.8, "top_k": 7}))
    return str(folder)


def refreshed(qtbot, d):
    qtbot.waitUntil(lambda: not d._timer.isActive(), timeout=2000)
    return d


def click(qtbot, button):
    assert button.isVisible() and button.isEnabled(), button.text()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def test_round_trips_settings_and_shows_the_plan(dialog, app_model):
    assert dialog.settings() == EngineSettings(model=app_model, backend="numpy", parallel=2, context=512,
                                               memory_gib=1.0, sampling=SamplingParams(
                                                   temperature=0.3, top_k=20, max_tokens=99, seed=5))
    p = plan(dialog.settings())
    assert dialog.plan_label.text() == plan_sentence(p) and dialog.plan_label.toolTip() == p.line
    assert dialog.apply_button.isEnabled()
    assert "2 replies in progress will stop" in dialog.busy_note.text()
    assert "llama" in dialog.model_info.text()


def test_the_plan_reads_as_a_sentence(dialog):
    text = dialog.plan_label.text()
    assert text.startswith("Up to 2 chats can be answered at once, each up to 512 tokens long")
    assert "Memory for them:" in text and "engine's own" not in text
    assert dialog.plan_line.startswith("plan: the engine's own window")


def test_plan_updates_live_as_values_change(qtbot, dialog):
    before = dialog.plan_label.text()
    dialog.kv_dtype.setCurrentIndex(dialog.kv_dtype.findData("fp8"))
    dialog.paging.setCurrentIndex(dialog.paging.findData("all"))
    dialog.parallel.setValue(5)
    assert not dialog.apply_button.isEnabled()  # until the plan for the new values is known
    refreshed(qtbot, dialog)
    s = dialog.settings()
    assert (s.kv_dtype, s.paging, s.parallel) == ("fp8", "all", 5)
    assert dialog.plan_label.toolTip() == plan(s).line and dialog.plan_label.text() != before
    assert "the engine's own and 4 more" in dialog.plan_label.toolTip()
    assert dialog.plan_label.text().startswith("Up to 5 chats")
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
    click(qtbot, dialog.memory_auto)
    refreshed(qtbot, dialog)
    assert dialog.settings().memory_gib is None and not dialog.memory.isEnabled()


def test_a_tiny_memory_budget_is_refused_not_made_automatic(qtbot, dialog, default_model):
    dialog.model.setText(default_model)  # 0.001 GiB holds a few thousand tokens of the tiny model
    dialog.memory.lineEdit().selectAll()
    qtbot.keyClicks(dialog.memory.lineEdit(), "0.001")
    refreshed(qtbot, dialog)
    assert dialog.settings().memory_gib == 0.001 and not dialog.memory_auto.isChecked()
    assert dialog.plan_label.text().startswith("Does not fit") and "0.001 GiB" in dialog.plan_label.text()
    assert not dialog.apply_button.isEnabled()


def test_an_invalid_model_is_refused_with_the_loaders_message(qtbot, dialog, tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a gguf at all")
    dialog.model.setText(str(bad))
    refreshed(qtbot, dialog)
    assert dialog.model_info.objectName() == "error" and "model.gguf" in dialog.model_info.text()
    assert not dialog.apply_button.isEnabled()
    dialog.apply_button.click()
    assert dialog.result() == 0


def test_file_folder_and_default_buttons(qtbot, dialog, app_model, default_model):
    answer_file_dialog(default_model)
    click(qtbot, dialog.findChild(type(dialog.apply_button), "browseFile"))
    assert dialog.model.text() == default_model
    answer_file_dialog(app_model)
    click(qtbot, dialog.findChild(type(dialog.apply_button), "browseFolder"))
    assert dialog.model.text().rstrip("/") == app_model.rstrip("/")
    click(qtbot, dialog.findChild(type(dialog.apply_button), "useDefault"))
    refreshed(qtbot, dialog)
    assert dialog.settings().model is None


def test_apply_accepts_a_good_plan_and_cancel_rejects(qtbot, dialog, app_home, app_model):
    click(qtbot, dialog.apply_button)
    assert dialog.result() == 1
    other = SettingsDialog(EngineSettings(model=app_model, backend="numpy", context=512))
    qtbot.addWidget(other)
    other.show()
    click(qtbot, other.buttons.button(other.buttons.StandardButton.Cancel))
    assert other.result() == 0


def test_sampling_follows_the_model_until_the_user_sets_it(qtbot, app_home, model_with_generation_config):
    s = EngineSettings(model=model_with_generation_config, backend="numpy", context=512)
    d = SettingsDialog(s, chosen=set())
    qtbot.addWidget(d)
    d.show()
    sp = d.settings().sampling
    assert (sp.temperature, sp.top_p, sp.top_k) == (0.25, 0.8, 7)
    assert "From the model: temperature 0.25, top-p 0.8, top-k 7" in d.sampling_note.text()
    assert not d.use_model_sampling.isEnabled()
    d.temperature.lineEdit().selectAll()
    qtbot.keyClicks(d.temperature.lineEdit(), "0.6")
    assert d.chosen_sampling() == {"temperature"} and d.settings().sampling.temperature == 0.6
    assert "Yours: temperature" in d.sampling_note.text()
    click(qtbot, d.use_model_sampling)
    assert d.chosen_sampling() == set() and d.settings().sampling.temperature == 0.25


def test_a_model_without_recommendations_gets_lanechats_defaults(qtbot, app_home, app_model):
    d = SettingsDialog(EngineSettings(model=app_model, backend="numpy", context=512), chosen=set())
    qtbot.addWidget(d)
    sp, default = d.settings().sampling, SamplingParams()
    assert (sp.temperature, sp.top_p, sp.top_k) == (default.temperature, default.top_p, default.top_k)
    assert "recommends no sampling values" in d.sampling_note.text()


def test_the_drafter_and_its_drafts_reach_the_settings_and_the_plan(qtbot, dialog):
    assert dialog.settings().drafter == "none" and not dialog.draft_tokens.isEnabled()
    dialog.drafter.setCurrentIndex(dialog.drafter.findData("ngram"))
    dialog.draft_tokens.setValue(6)
    refreshed(qtbot, dialog)
    s = dialog.settings()
    assert (s.drafter, s.draft_tokens) == ("ngram", 6) and dialog.draft_tokens.isEnabled()
    assert "drafter ngram (6 drafts per window)" in dialog.plan_line
    assert "Speculative decoding: ngram, 6 drafts per step." in dialog.plan_label.text()
    dialog.drafter.setCurrentIndex(dialog.drafter.findData("mtp"))  # the default model has no MTP head
    refreshed(qtbot, dialog)
    assert "drafter mtp refused" in dialog.plan_line and dialog.apply_button.isEnabled()
    assert "Drafter mtp refused: the checkpoint ships no MTP head" in dialog.plan_label.text()


def test_a_dflash2_drafter_is_chosen_with_its_folder(qtbot, dialog, app_model, tmp_path):
    from engine.config import ModelConfig

    from ckpt import write_dflash2
    write_dflash2(tmp_path / "drafter", ModelConfig.from_file(f"{app_model}/config.json"))
    browse = dialog.findChild(type(dialog.apply_button), "browseDrafter")
    assert not browse.isEnabled() and not dialog.drafter_model.isEnabled()
    dialog.drafter.setCurrentIndex(dialog.drafter.findData("dflash2"))
    refreshed(qtbot, dialog)
    assert "drafter dflash2 refused: no drafter checkpoint chosen" in dialog.plan_line
    answer_file_dialog(str(tmp_path / "drafter"))
    click(qtbot, browse)
    refreshed(qtbot, dialog)
    s = dialog.settings()
    assert (s.drafter, s.drafter_model) == ("dflash2", str(tmp_path / "drafter"))
    assert "drafter dflash2 (4 drafts per window, context ring" in dialog.plan_line and dialog.apply_button.isEnabled()
    dialog.drafter_model.setText(str(tmp_path))  # not a checkpoint: the plan says so, the engine would run plain
    refreshed(qtbot, dialog)
    assert f"drafter dflash2 refused: {tmp_path}/config.json: no such file" in dialog.plan_line


def test_cache_and_snapshot_budgets_and_the_clear_action(qtbot, app_home, app_model):
    cleared = []
    s = EngineSettings(model=app_model, backend="numpy", parallel=2, context=512, memory_gib=1.0, paging="all",
                       page_tokens=16)
    d = SettingsDialog(s, clear_snapshots=lambda: cleared.append(1) or 3)
    qtbot.addWidget(d)
    assert d.prompt_cache.value() == 0 and d.snapshot_disk.value() == s.snapshot_disk_gib
    d.prompt_cache.setValue(0.25)
    d.snapshot_disk.setValue(0)
    refreshed(qtbot, d)
    out = d.settings()
    assert (out.prompt_cache_gib, out.snapshot_disk_gib) == (0.25, 0)
    assert "prompt cache up to" in d.plan_line  # the plan says what the cache may take
    d.clear_button.click()
    assert cleared == [1] and d.clear_button.text() == "Cleared (3)" and not d.clear_button.isEnabled()


def choose(qtbot, combo, data):
    """Pick `data` as a user does: click the combo open, then click the item in its popup."""
    click(qtbot, combo)
    view = combo.view()
    qtbot.waitUntil(view.isVisible, timeout=2000)
    index = view.model().index(combo.findData(data), 0)
    assert index.isValid(), data
    qtbot.wait(QApplication.doubleClickInterval() + 50)  # Qt ignores a release this soon after the popup opened
    at = view.visualRect(index).center()
    qtbot.mouseMove(view.viewport(), at)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=at)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=2000)
    assert combo.currentData() == data


def test_the_prompt_precision_shows_the_saved_value(qtbot, app_home, app_model):
    assert EngineSettings().prefill_precision == "fp16"
    for value, label in (("fp16", "Fast (fp16 tensor cores)"), ("exact", "Exact (as decoding; slower on the GPU)")):
        d = SettingsDialog(EngineSettings(model=app_model, context=512, prefill_precision=value))
        qtbot.addWidget(d)
        assert d.prefill_precision.currentData() == value and d.prefill_precision.currentText() == label
        assert d.settings().prefill_precision == value
        assert d.prefill_precision.isEnabled()  # backend auto: it may run on the GPU
        assert "2.5x faster" in d.prefill_precision.toolTip() and "exactly" in d.prefill_precision.toolTip()


def test_exact_prompt_precision_chosen_applied_and_saved(qtbot, dialog):
    from app.app_settings import load_settings, save_settings
    assert not dialog.prefill_precision.isEnabled()  # numpy computes exactly whatever is chosen
    choose(qtbot, dialog.backend, "auto")
    refreshed(qtbot, dialog)
    assert dialog.prefill_precision.isEnabled() and dialog.prefill_precision.currentData() == "fp16"
    choose(qtbot, dialog.prefill_precision, "exact")
    assert not dialog.apply_button.isEnabled()  # a changed value waits for its plan, as the others do
    refreshed(qtbot, dialog)
    click(qtbot, dialog.apply_button)
    assert dialog.result() == 1
    s = dialog.settings()
    assert (s.prefill_precision, s.backend) == ("exact", "auto")
    save_settings(s)
    assert load_settings() == (s, None) and load_settings()[0].prefill_precision == "exact"
