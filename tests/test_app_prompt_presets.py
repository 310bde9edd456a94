"""System-prompt presets: saved in the config dir, picked into any conversation's system prompt,
replaced by name, deleted; an unreadable file is moved aside, never overwritten."""
import json

import pytest
from fake_engine import _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication, QInputDialog

from app.chat_tab import ChatTab
from app.conversation import Conversation
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
    presets_path().write_text(json.dumps({"presets": [{"name": "ok", "text": "t"}, {"name": 3}, {"text": "x"},
                                                      {"name": " ", "text": "blank name"}]}))
    assert load_presets() == [Preset("ok", "t")]
