"""A conversation's own sampling, set in the panel beside the system prompt: the values switched on
go into the conversation file and into its replies' requests, the rest follow the settings."""
import json

import pytest
from fake_engine import _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here
from PySide6.QtCore import QPoint, Qt
from tab_actions import ask, click, shown

from app.chat_tab import ChatTab
from app.conversation import Conversation
from app.conversation_settings import detail
from app.store import ConversationStore
from engine import EngineSettings, SamplingParams

DEFAULTS = SamplingParams(temperature=0.7, top_p=0.9, top_k=40, max_tokens=5, seed=0)


@pytest.fixture
def tab(qtbot, tmp_path, run_async):
    bridge, engines = bridge_with(n=3)
    run_async(bridge.start(EngineSettings(sampling=DEFAULTS)))
    return shown(qtbot, ChatTab(Conversation(), ConversationStore(tmp_path), bridge), 1000), engines


def own(qtbot, panel, **values):
    """Switch each value on in the panel and set it, as a person does."""
    if not panel.isVisible():
        click(qtbot, panel.toggle)
    for name, value in values.items():
        tick(qtbot, panel.checks[name])
        panel.boxes[name].setValue(value)


def tick(qtbot, check):
    """A click on the check box's square."""
    assert check.isVisible() and check.isEnabled()
    qtbot.mouseClick(check, Qt.MouseButton.LeftButton, pos=QPoint(7, check.height() // 2))


def test_the_panel_shows_the_defaults_until_a_value_is_switched_on(qtbot, tab):
    tab, _ = tab
    panel = tab.sampling_panel
    assert not panel.isVisible() and panel.toggle.text().startswith("Sampling: defaults")
    click(qtbot, panel.toggle)
    assert panel.isVisible()
    assert [panel.boxes[n].value() for n in ("temperature", "top_p", "top_k", "max_tokens")] == \
        [pytest.approx(0.7), pytest.approx(0.9), 40, 5]
    assert not any(b.isEnabled() for b in panel.boxes.values())
    own(qtbot, panel, temperature=0.2, max_tokens=3)
    assert tab.conversation.sampling == {"temperature": 0.2, "max_tokens": 3}
    assert panel.toggle.text().startswith("Sampling: 2 own")
    assert panel.toggle.toolTip() == "This conversation's own: temp 0.2, max 3"
    saved = json.loads(tab.store.path(tab.conversation.id).read_text())
    assert saved["sampling"] == {"temperature": 0.2, "max_tokens": 3}


def test_a_reply_samples_with_the_conversations_values_over_the_defaults(qtbot, tab):
    tab, engines = tab
    own(qtbot, tab.sampling_panel, temperature=0.0, seed=42, top_k=5)
    ask(qtbot, tab, "Hi")
    sp = engines[0].requests[1]["sampling"]
    assert (sp.temperature, sp.seed, sp.top_k, sp.top_p, sp.max_tokens) == (0.0, 42, 5, 0.9, 5)
    click(qtbot, tab.sampling_panel.reset)
    assert tab.conversation.sampling == {} and not tab.sampling_panel.boxes["seed"].isEnabled()
    ask(qtbot, tab, "Again")
    sp = engines[0].requests[2]["sampling"]
    assert (sp.temperature, sp.top_k) == (0.7, 40) and sp.seed != 0  # seed 0: a fresh one per reply


def test_switching_a_value_off_gives_it_back_to_the_settings(qtbot, tab):
    tab, _ = tab
    panel = tab.sampling_panel
    own(qtbot, panel, top_p=0.5)
    assert tab.conversation.sampling == {"top_p": 0.5}
    tick(qtbot, panel.checks["top_p"])
    assert tab.conversation.sampling == {} and panel.boxes["top_p"].value() == pytest.approx(0.9)


def test_a_reopened_conversation_shows_its_own_values(qtbot, tab):
    tab, _ = tab
    tab.conversation.sampling = {"top_k": 0, "seed": 9}
    tab.save()
    again = ChatTab(tab.store.load(tab.conversation.id), tab.store, tab.bridge)
    qtbot.addWidget(again)
    panel = again.sampling_panel
    assert panel.checks["top_k"].isChecked() and panel.boxes["top_k"].value() == 0
    assert panel.boxes["seed"].value() == 9 and not panel.checks["temperature"].isChecked()
    assert detail(again.conversation.sampling) == "This conversation's own: top-k 0, seed 9"
