"""A reply being written, and Continue on one cut short: the same message goes on (on screen and
in the file), its counts add up; with the real engine and a snapshot, nothing is computed again
and the reply is the one written without the cut."""
import json

import pytest
from fake_engine import _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here
from PySide6.QtCore import Qt
from tab_actions import ask, click, shown

from app.chat_tab import ChatTab
from app.conversation import Conversation, Message
from app.engine_bridge import EngineBridge
from app.reply import can_continue
from app.store import ConversationStore
from engine import Engine, EngineSettings, SamplingParams


@pytest.fixture
def fake(qtbot, tmp_path, run_async):
    bridge, engines = bridge_with(n=5)
    run_async(bridge.start(EngineSettings(sampling=SamplingParams(max_tokens=5))))
    return shown(qtbot, ChatTab(Conversation(), ConversationStore(tmp_path), bridge)), engines


def test_continue_goes_on_with_a_reply_cut_at_its_max_tokens(qtbot, fake):
    tab, engines = fake
    ask(qtbot, tab, "Tell me more")
    reply = tab.conversation.messages[-1]
    widget = tab.view.widgets[-1]
    assert reply.finish_reason == "length" and "reply length limit" in widget._status.text()
    click(qtbot, widget._continue)
    qtbot.waitUntil(lambda: not tab.generating, timeout=20000)
    sent = engines[0].requests[2]
    assert sent["continue_final"] and sent["messages"][-1] == {"role": "assistant", "content": "xxxxx"}
    assert tab.conversation.messages[-1] is reply and len(tab.conversation.messages) == 2
    assert reply.text == "x" * 10 and reply.tokens == 10 and not reply.interrupted
    assert tab.view.widgets[-1] is widget and widget.body_text() == "x" * 10
    tab.saver.flush()
    saved = json.loads(tab.store.path(tab.conversation.id).read_text())
    assert saved["messages"][-1]["text"] == "x" * 10 and saved["messages"][-1]["finish_reason"] == "length"
    assert widget._continue.isVisible()  # cut at the limit again


def test_a_stopped_reply_continues_and_a_finished_one_does_not(qtbot, tmp_path, run_async):
    bridge, engines = bridge_with(n=100000, gap=0.001)
    run_async(bridge.start(EngineSettings()))
    tab = shown(qtbot, ChatTab(Conversation(), ConversationStore(tmp_path), bridge))
    tab.composer.set_text("Go")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: bool(tab.conversation.messages[-1].text), timeout=10000)
    tab.stop()
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    reply = tab.conversation.messages[-1]
    assert reply.interrupted and reply.finish_reason == "cancelled" and can_continue(reply)
    before = reply.text
    engines[0].n = 3
    tab.continue_reply()
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    assert reply.text == before + "xxx" and engines[0].requests[2]["continue_final"]
    for m, ok in [(Message("assistant", "Done.", finish_reason="eos"), False),
                  (Message("assistant", "", interrupted=True, error="boom"), False),
                  (Message("user", "hi", interrupted=True), False),
                  (Message("assistant", "Half", interrupted=True, error="the engine restarted"), True)]:
        assert can_continue(m) is ok


def test_continue_is_only_for_the_last_reply_and_not_while_editing(qtbot, fake):
    tab, engines = fake
    ask(qtbot, tab, "One")
    ask(qtbot, tab, "Two")
    first_reply = tab.view.widgets[1]
    assert not first_reply._continue.isVisible() and tab.view.widgets[3]._continue.isVisible()
    tab.continue_reply(tab.conversation.messages[1])  # not the last: nothing happens
    assert not tab.generating and len(engines[0].requests) == 2
    tab.edit_last()
    assert not tab.view.widgets[3]._continue.isVisible()


# --- the real engine --------------------------------------------------------------------------------

@pytest.fixture
def real(qtbot, tmp_path, run_async, app_model):
    scheds = []

    def factory(settings):
        engine = Engine(settings, log=lambda line: None)
        engine.on_scheduler = scheds.append
        return engine
    bridge = EngineBridge(factory)
    settings = EngineSettings(model=app_model, backend="numpy", parallel=2, context=512, page_tokens=16,
                              sampling=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    run_async(bridge.start(settings))
    yield bridge, scheds, tmp_path
    run_async(bridge.stop())


def test_continuing_from_the_snapshot_computes_one_position_and_gives_the_uncut_reply(qtbot, real):
    bridge, scheds, root = real
    tab = shown(qtbot, ChatTab(Conversation(), ConversationStore(root / "conversations"), bridge))
    ask(qtbot, tab, "What are pages?")
    reply = tab.conversation.messages[-1]
    qtbot.waitUntil(lambda: bool(tab.store.snapshot_files(tab.conversation.id)), timeout=20000)
    before = scheds[0].prompt_positions
    click(qtbot, tab.view.widgets[-1]._continue)
    qtbot.waitUntil(lambda: not tab.generating, timeout=20000)
    assert scheds[0].prompt_positions - before == 1  # the one sampled token never fed; nothing again
    assert reply.tokens == 12 and reply.prompt_tokens is not None
    whole = shown(qtbot, ChatTab(Conversation(), ConversationStore(root / "other"), bridge))
    whole.conversation.sampling = {"max_tokens": 12}
    ask(qtbot, whole, "What are pages?")
    assert whole.conversation.messages[-1].text == reply.text
