"""Presets: saved in the config dir, picked into any conversation's system prompt (and its own
sampling), replaced by name, deleted; an unreadable file is moved aside, never overwritten, and an
entry that cannot be used says why and stays in the file."""
import json

import pytest
from fake_engine import _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QInputDialog

from app.chat_tab import ChatTab
from app.conversation import Conversation, FormatError
from app.prompt_presets import Preset, load_presets, presets_path, save_presets, saved_as
from app.store import ConversationStore
from engine import EngineSettings


@pytest.fixture
def tab(qtbot, tmp_path, app_home, run_async):
    bridge, _ = bridge_with(n=2)
    run_async(bridge.start(EngineSettings()))
    t = ChatTab(Conversation(), ConversationStore(tmp_path / "c"), bridge)
    qtbot.addWidget(t)
    t.show()
    qtbot.waitExposed(t)
    return t


def actions(menu) -> list[str]:
    return [a.text() for a in menu.actions() if a.text()]


def test_saved_as_adds_in_order_and_replaces_by_name():
    presets = saved_as([], "Terse", "Answer briefly.")
    presets = saved_as(presets, "French", "Réponds en français.")
    assert saved_as(presets, " Terse ", "One line.") == [Preset("Terse", "One line."),
                                                         Preset("French", "Réponds en français.")]
    with pytest.raises(ValueError):
        saved_as(presets, "  ", "x")
    assert saved_as([], "Cold", "", {"temperature": 0, "max_tokens": 256}) == [
        Preset("Cold", "", {"temperature": 0, "max_tokens": 256})]
    for sampling, why in [({"temperature": 3.5}, "temperature must be a number from 0.0 to 2.0, got 3.5"),
                          ({"max_tokens": 0}, "max_tokens must be a whole number from 1 to 1,048,576, got 0"),
                          ({"top_k": 2.5}, "top_k must be a whole number from 0 to 1,000, got 2.5"),
                          ({"stop": ["x"]}, "'stop' is no sampling value a conversation sets")]:
        with pytest.raises(FormatError, match=why.replace("(", r"\(").replace(")", r"\)")):
            saved_as(presets, "Bad", "x", sampling)


def test_save_pick_and_delete_from_the_presets_menu(qtbot, tab):
    click = tab.system_toggle
    qtbot.mouseClick(click, Qt.MouseButton.LeftButton)
    button = tab.system.presets
    assert button.isVisible()
    tab.system_edit.setPlainText("Answer in one sentence.")
    button.save_as("One sentence", tab.conversation.system_prompt)
    button.save_as("Pirate", "Talk like a pirate.")
    assert json.loads(presets_path().read_text())["presets"][0] == {"name": "One sentence",
                                                                    "text": "Answer in one sentence."}
    button.rebuild()
    assert actions(button.menu())[:2] == ["One sentence", "Pirate"]
    next(a for a in button.menu().actions() if a.text() == "Pirate").trigger()
    assert tab.conversation.system_prompt == "Talk like a pirate." and tab.system_toggle.text().startswith(
        "System prompt: set")
    delete = next(a for a in button.menu().actions() if a.text() == "Delete a preset").menu()
    next(a for a in delete.actions() if a.text() == "One sentence").trigger()
    assert [p.name for p in load_presets()] == ["Pirate"]


def test_the_save_action_asks_for_a_name(qtbot, tab):
    tab.system_edit.setPlainText("Cite your sources.\nAlways.")
    button = tab.system.presets
    button.rebuild()
    save = next(a for a in button.menu().actions() if a.text().startswith("Save this prompt"))
    assert save.isEnabled()

    def answer():
        dialog = next(w for w in QApplication.topLevelWidgets() if isinstance(w, QInputDialog) and w.isVisible())
        assert dialog.textValue() == "Cite your sources."  # the prompt's first line, to start from
        dialog.setTextValue("Sources")
        dialog.accept()
    QTimer.singleShot(200, answer)
    save.trigger()
    assert load_presets() == [Preset("Sources", "Cite your sources.\nAlways.")]


def test_an_unreadable_presets_file_is_moved_aside(app_home):
    save_presets([Preset("a", "b")])
    presets_path().write_text("{not json")
    assert load_presets() == []
    assert (presets_path().parent / "presets.unreadable.json").read_text() == "{not json"
    presets_path().write_text("[]")
    assert load_presets() == [] and (presets_path().parent / "presets.unreadable.1.json").read_text() == "[]"


BAD_ENTRIES = [{"name": 3}, {"text": "x"}, {"name": " ", "text": "blank name"}, "just a string",
               {"name": "Hot", "text": "t", "sampling": {"temperature": 150}},
               {"name": "Odd", "text": "t", "sampling": {"top_p": "high"}}]


def test_entries_that_cannot_be_used_say_why_and_stay_in_the_file(app_home):
    entries = [{"name": "ok", "text": "t", "sampling": {"seed": 7}}, *BAD_ENTRIES]
    presets_path().write_text(json.dumps({"format_version": 1, "presets": entries}))
    presets = load_presets()
    assert presets[0] == Preset("ok", "t", {"seed": 7})
    assert [(p.name, p.problem) for p in presets[1:]] == [
        ("Preset 2", "it has no name"), ("Preset 3", "it has no name"), ("Preset 4", "it has no name"),
        ("Preset 5", "it is not an object with a name and a text"),
        ("Hot", "temperature must be a number from 0.0 to 2.0, got 150"),
        ("Odd", "top_p must be a number from 0.01 to 1.0, got high")]
    save_presets(saved_as(presets, "new", "n"))  # another preset saved: the others are written as they were
    assert json.loads(presets_path().read_text())["presets"] == entries + [{"name": "new", "text": "n"}]


def test_an_entry_that_cannot_be_used_is_listed_disabled_with_its_reason(qtbot, tab):
    presets_path().parent.mkdir(parents=True, exist_ok=True)
    presets_path().write_text(json.dumps({"presets": [BAD_ENTRIES[4], {"name": "Fine", "text": "f"}]}))
    tab.system_toggle.click()
    button = tab.system.presets
    button.rebuild()
    hot = button.menu().actions()[0]
    assert hot.text() == "Hot (cannot be used: temperature must be a number from 0.0 to 2.0, got 150)"
    assert not hot.isEnabled() and tab.conversation.sampling == {}
    delete = next(a for a in button.menu().actions() if a.text() == "Delete a preset").menu()
    delete.actions()[0].trigger()
    assert load_presets() == [Preset("Fine", "f")]


def test_a_preset_brings_its_sampling_and_the_next_reply_uses_it(qtbot, tab, run_async):
    tab.system_toggle.click()
    tab.system_edit.setPlainText("Be exact.")
    tab.conversation.sampling = {"temperature": 0.0, "top_k": 1}
    button = tab.system.presets
    button.rebuild()
    save = next(a for a in button.menu().actions() if a.text().startswith("Save this prompt"))

    def answer():
        dialog = next(w for w in QApplication.topLevelWidgets() if isinstance(w, QInputDialog) and w.isVisible())
        dialog.setTextValue("Exact")
        dialog.accept()
    QTimer.singleShot(200, answer)
    save.trigger()
    assert load_presets() == [Preset("Exact", "Be exact.", {"temperature": 0.0, "top_k": 1})]
    button.save_as("Cold only", "", {"temperature": 0.1})

    other = ChatTab(Conversation(system_prompt="Mine."), ConversationStore(tab.store.root), tab.bridge)
    qtbot.addWidget(other)
    other.system.presets.rebuild()
    next(a for a in other.system.presets.menu().actions() if a.text() == "Cold only").trigger()
    assert other.conversation.system_prompt == "Mine." and other.conversation.sampling == {"temperature": 0.1}
    next(a for a in other.system.presets.menu().actions() if a.text() == "Exact").trigger()
    assert other.conversation.system_prompt == "Be exact."
    assert other.conversation.sampling == {"temperature": 0.0, "top_k": 1}
    assert other.sampling_panel.toggle.text().startswith("Sampling: 2 own")
    assert other.sampling_panel.checks["top_k"].isChecked() and other.sampling_panel.boxes["top_k"].value() == 1
    saved = json.loads(other.store.path(other.conversation.id).read_text())
    assert saved["sampling"] == {"temperature": 0.0, "top_k": 1} and saved["system_prompt"] == "Be exact."
    other.composer.set_text("Go")
    other.composer.send_requested.emit("Go")
    qtbot.waitUntil(lambda: not other.generating, timeout=10000)
    sp = list(tab.bridge.engine.requests.values())[-1]["sampling"]
    assert (sp.temperature, sp.top_k) == (0.0, 1)
