"""The window end to end on the numpy backend: parallel tabs, stop, settings, quit and relaunch,
bad files, load failures, per-tab errors, history. Qt offscreen; the real engine."""
import json
import time

import pytest
from PySide6.QtCore import Qt

from app.app_settings import load_settings, save_settings
from app.chat_tab import WAITING
from app.main import create_window
from engine import EngineSettings, SamplingParams


def settings_for(model: str, **kw) -> EngineSettings:
    sampling = SamplingParams(temperature=0, max_tokens=kw.pop("max_tokens", 48), ignore_eos=True)
    return EngineSettings(model=model, backend="numpy", parallel=kw.pop("parallel", 2), context=512,
                          sampling=sampling, **kw)


@pytest.fixture
def launch(qtbot, run_async, app_home, app_model):
    """launch(**settings) -> a shown window of the saved session with its engine started."""
    windows = []

    def start(start_engine=True, **kw):
        if kw or not windows:
            save_settings(settings_for(kw.pop("model", app_model), **kw))
        window = create_window()
        qtbot.addWidget(window)
        window.show()
        qtbot.waitExposed(window)
        window.activateWindow()
        windows.append(window)
        if start_engine:
            assert run_async(window.start_engine(), timeout=120)
        return window
    yield start
    for w in windows:
        w.close()


def send(qtbot, tab, text):
    tab.composer.set_text(text)
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)


def conv_file(app_home, tab) -> dict:
    return json.loads((app_home / "data" / "conversations" / f"{tab.conversation.id}.json").read_text())


def test_two_tabs_stream_at_the_same_time(qtbot, launch):
    window = launch(max_tokens=300)
    a = window.current_tab()
    b = window.new_tab()
    assert window.tabs.count() == 2
    send(qtbot, a, "First question")
    send(qtbot, b, "Second question")
    seen = {a: [], b: []}  # (time, characters so far, still generating)

    def sample():
        for tab in (a, b):
            reply = tab.conversation.messages[-1]
            seen[tab].append((time.monotonic(), len(reply.text), tab.generating))
        return not a.generating and not b.generating
    qtbot.waitUntil(sample, timeout=60000)
    both_typing = [i for i, (sa, sb) in enumerate(zip(seen[a], seen[b]))
                   if sa[1] and sa[2] and sb[1] and sb[2]]
    assert both_typing, "the two replies never streamed at the same time"
    for tab in (a, b):
        reply = tab.conversation.messages[-1]
        assert reply.role == "assistant" and reply.tokens == 300 and not reply.interrupted and reply.tok_s
    assert a.title == "First question" and window.tabs.tabText(1) == "Second question"


def test_stop_keeps_the_text_so_far_as_interrupted(qtbot, launch, app_home):
    window = launch(max_tokens=100000)
    tab = window.current_tab()
    send(qtbot, tab, "Tell me everything")
    assert tab.composer.stop_button.isVisibleTo(tab) and not tab.composer.send_button.isVisibleTo(tab)
    qtbot.waitUntil(lambda: bool(tab.conversation.messages[-1].text), timeout=30000)
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    reply = tab.conversation.messages[-1]
    assert reply.interrupted and reply.text and reply.tokens
    assert conv_file(app_home, tab)["messages"][-1]["interrupted"] is True
    assert tab.composer.send_button.isVisibleTo(tab)
    send(qtbot, tab, "And now?")  # the tab is usable again: stop by the button this time
    qtbot.waitUntil(lambda: len(tab.conversation.messages) == 4 and bool(tab.conversation.messages[-1].text),
                    timeout=30000)
    qtbot.mouseClick(tab.composer.stop_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)


def test_apply_settings_restarts_the_engine_keeps_tabs_and_persists(qtbot, launch, run_async, app_model):
    window = launch()
    tab = window.current_tab()
    send(qtbot, tab, "Before the restart")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    ids = [t.conversation.id for t in window.tabs.tabs()]
    new = settings_for(app_model, parallel=3, kv_dtype="fp8", paging="all", page_tokens=64)
    assert run_async(window.apply_settings(new), timeout=120)
    info = window.bridge.info
    assert info.parallel == 3 and "the engine's own and 2 more" in info.plan_line
    assert window.status.plan.text() == info.plan_line and info.plan_line.startswith("plan:")
    assert [t.conversation.id for t in window.tabs.tabs()] == ids and len(tab.conversation.messages) == 2
    assert load_settings()[0] == new
    send(qtbot, tab, "After the restart")
    qtbot.waitUntil(lambda: not tab.generating and len(tab.conversation.messages) == 4, timeout=30000)
    assert tab.conversation.settings["kv_dtype"] == "fp8"


def test_quit_mid_answer_then_relaunch_restores_and_continues(qtbot, launch, app_home):
    window = launch(max_tokens=100000)
    first = window.current_tab()
    send(qtbot, first, "A question to keep")
    second = window.new_tab()
    second.system_edit.setPlainText("Be brief.")
    send(qtbot, second, "Another one")
    qtbot.waitUntil(lambda: bool(second.conversation.messages[-1].text), timeout=30000)
    second.composer.set_text("an unsent draft")
    window.tabs.setCurrentIndex(0)
    window.close()  # quit with both replies in progress
    saved = conv_file(app_home, second)
    assert saved["messages"][-1]["interrupted"] is True and saved["messages"][-1]["text"]
    assert saved["system_prompt"] == "Be brief." and saved["draft"] == "an unsent draft"
    assert saved["format_version"] == 1 and saved["model"] and saved["settings"]["backend"] == "numpy"

    window = launch(max_tokens=8)
    tabs = window.tabs.tabs()
    assert [t.conversation.id for t in tabs] == [first.conversation.id, second.conversation.id]
    assert window.tabs.currentIndex() == 0
    again = tabs[1]
    assert again.composer.text() == "an unsent draft" and again.system_edit.toPlainText() == "Be brief."
    assert len(again.view.widgets) == 2 and again.conversation.messages[-1].interrupted
    sent = []
    submit = window.bridge.submit
    window.bridge.submit = lambda messages, sampling, sink: (sent.append(messages), submit(messages, sampling, sink))[1]
    send(qtbot, again, "Continue please")
    qtbot.waitUntil(lambda: not again.generating, timeout=30000)
    history = sent[0]
    assert [m["role"] for m in history] == ["system", "user", "assistant", "user"]
    assert history[1]["content"] == "Another one" and history[-1]["content"] == "Continue please"
    assert not again.conversation.messages[-1].interrupted


def test_corrupt_conversation_is_set_aside_with_a_notice(qtbot, launch, app_home):
    folder = app_home / "data" / "conversations"
    folder.mkdir(parents=True)
    (folder / "broken.json").write_text('{"format_version": 1, "messa')
    good = {"format_version": 1, "id": "good", "title": "Still here", "created": "2025-01-01T00:00:00+00:00",
            "updated": "2025-01-01T00:00:00+00:00", "messages": [{"role": "user", "text": "hi"}]}
    (folder / "good.json").write_text(json.dumps(good))
    window = launch(start_engine=False)
    assert any("broken.json" in n.text for n in window.notices.notices())
    assert (folder / "set-aside" / "broken.json").exists()
    assert window.history.ids() == ["good"]
    window.open_conversation("good")
    assert window.current_tab().title == "Still here"
    assert window.tabs.count() == 1  # the blank tab was replaced, not kept beside it


def test_bad_files_in_the_open_tab_session_never_stop_the_start(qtbot, launch, app_home):
    folder = app_home / "data" / "conversations"
    folder.mkdir(parents=True)
    base = {"format_version": 1, "id": "x", "title": "Typed", "created": "2025-01-01T00:00:00+00:00",
            "messages": [{"role": "user", "text": "hi"}]}
    files = {"deep": "[" * 100_000 + "]" * 100_000,
             "types": json.dumps({**base, "created": [1], "updated": "0001-01-01T00:00:00+14:00", "messages": [
                 {"role": "user", "text": "hi", "time": "9999-12-31T23:59:59-14:00"},
                 {"role": "assistant", "text": "a\ud800b", "error": 5, "tok_s": "fast", "tokens": "x"}]}),
             "surrogate": json.dumps({**base, "title": "\udcff"})}
    for name, text in files.items():
        (folder / f"{name}.json").write_text(text, encoding="utf-8", errors="surrogatepass")
    (app_home / "state").mkdir(parents=True)
    (app_home / "state" / "session.json").write_text(json.dumps(
        {"open_tabs": ["deep", "types", "surrogate", 5], "active": "first", "geometry": 7, "sidebar": "yes"}))
    window = launch(start_engine=False)
    assert [t.conversation.id for t in window.tabs.tabs()] == ["types", "surrogate"]
    assert any("deep.json" in n.text and "nested more than" in n.text for n in window.notices.notices())
    typed = window.tabs.tabs()[0].conversation
    assert typed.created == "" and typed.messages[1].error is None and typed.messages[1].tok_s is None
    window.close()
    assert "\\ud800" in (folder / "types.json").read_text()  # saved again on quit, the surrogate escaped


def test_a_model_that_fails_to_load_leaves_the_app_usable(qtbot, launch, run_async, app_home, app_model):
    window = launch(start_engine=False, model=str(app_home / "no-such-model"))
    assert not run_async(window.start_engine(), timeout=60)
    assert window.bridge.state == "failed"
    notice = [n for n in window.notices.notices() if "could not be loaded" in n.text]
    assert notice and "no-such-model" in notice[0].text
    assert window.status.error.isVisibleTo(window) and window.status.fix.isVisibleTo(window)
    tab = window.current_tab()
    send(qtbot, tab, "Anyone there?")
    assert tab.conversation.messages[-1].error.startswith("No model is loaded")
    assert not tab.generating
    assert run_async(window.apply_settings(settings_for(app_model)), timeout=120)
    assert not [n for n in window.notices.notices() if "could not be loaded" in n.text]
    tab.regenerate()  # retry the failed reply
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    assert tab.conversation.messages[-1].text and not tab.conversation.messages[-1].error


def test_an_error_in_one_tab_leaves_the_other_generating(qtbot, launch):
    window = launch(max_tokens=200)
    good, bad = window.current_tab(), window.new_tab()
    send(qtbot, good, "A normal question")
    send(qtbot, bad, "word " * 2000)  # far longer than the 512-token context
    qtbot.waitUntil(lambda: not bad.generating, timeout=30000)  # refused by the engine thread, which tokenizes
    assert "context" in bad.conversation.messages[-1].error
    assert bad.view.widgets[-1]._status.text() == bad.conversation.messages[-1].error
    assert good.generating
    qtbot.waitUntil(lambda: not good.generating, timeout=30000)
    assert good.conversation.messages[-1].tokens == 200


def test_a_tab_beyond_parallel_says_it_waits(qtbot, launch):
    window = launch(parallel=1, max_tokens=100000)
    a, b = window.current_tab(), window.new_tab()
    send(qtbot, a, "One")
    qtbot.waitUntil(lambda: bool(a.conversation.messages[-1].text), timeout=30000)
    send(qtbot, b, "Two")
    qtbot.waitUntil(lambda: b.state == WAITING and "free stream" in b.view.widgets[-1]._status.text(), timeout=10000)
    a.stop()
    qtbot.waitUntil(lambda: bool(b.conversation.messages[-1].text), timeout=30000)
    b.stop()
    qtbot.waitUntil(lambda: not b.generating, timeout=10000)


def test_regenerate_edit_and_system_prompt(qtbot, launch):
    window = launch(max_tokens=8)
    tab = window.current_tab()
    tab.system_toggle.click()
    assert tab.system_edit.isVisibleTo(tab)
    tab.system_edit.setPlainText("Answer in French.")
    send(qtbot, tab, "Hello")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    first_time = tab.conversation.messages[-1].time
    widgets = tab.view.widgets
    assert widgets[-1]._regenerate.isVisibleTo(tab) and widgets[0]._edit.isVisibleTo(tab)
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_R, Qt.KeyboardModifier.ControlModifier)
    assert tab.generating and len(tab.conversation.messages) == 2
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    assert tab.conversation.messages[-1].time >= first_time
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_E, Qt.KeyboardModifier.ControlModifier)
    assert tab.conversation.messages == [] and tab.composer.text() == "Hello"
    tab.composer.edit.insertPlainText(" again")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    assert [m.text for m in tab.conversation.messages][0] == "Hello again"
    assert tab.conversation.engine_messages()[0] == {"role": "system", "content": "Answer in French."}


def test_shift_enter_is_a_new_line_and_empty_text_is_not_sent(qtbot, launch):
    window = launch(start_engine=False)
    tab = window.current_tab()
    qtbot.keyClicks(tab.composer.edit, "line one")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(tab.composer.edit, "line two")
    assert tab.composer.text() == "line one\nline two" and not tab.conversation.messages
    tab.composer.set_text("   ")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    assert not tab.conversation.messages


def test_tabs_new_close_rename_and_history(qtbot, launch, app_home, monkeypatch):
    window = launch(max_tokens=4)
    qtbot.keyClick(window.current_tab().composer.edit, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.count() == 2
    tab = window.current_tab()
    send(qtbot, tab, "Name me")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    index = window.tabs.indexOf(tab)
    window.tabs.tabBarDoubleClicked.emit(index)
    editor = window.tabs._editor
    editor.setText("Renamed")
    qtbot.keyClick(editor, Qt.Key.Key_Return)
    assert window.tabs.tabText(index) == "Renamed" and conv_file(app_home, tab)["title"] == "Renamed"
    cid = tab.conversation.id
    assert window.history.ids()[0] == cid
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_W, Qt.KeyboardModifier.ControlModifier)
    assert window.tabs.count() == 1 and cid in window.history.ids()
    window.open_conversation(cid)  # from the history list
    assert window.current_tab().conversation.id == cid and window.current_tab().title == "Renamed"
    monkeypatch.setattr(window, "confirm", lambda title, text: False)
    window.delete_conversation(cid)
    assert cid in window.history.ids()
    monkeypatch.setattr(window, "confirm", lambda title, text: "Renamed" in text)
    window.delete_conversation(cid)
    assert cid not in window.history.ids() and window.tabs.count() >= 1
    assert not (app_home / "data" / "conversations" / f"{cid}.json").exists()


def test_empty_tabs_leave_no_files(qtbot, launch, app_home):
    window = launch(start_engine=False)
    window.new_tab()
    window.close()
    folder = app_home / "data" / "conversations"
    assert not list(folder.glob("*.json"))


def test_eight_tabs_stream_together(qtbot, launch):
    window = launch(parallel=8, max_tokens=256)
    tabs = [window.current_tab()] + [window.new_tab() for _ in range(7)]
    for i, tab in enumerate(tabs):
        send(qtbot, tab, f"Question {i}")
    peak = []

    def sample():
        peak.append(sum(1 for t in tabs if t.generating and t.conversation.messages[-1].text))
        return not any(t.generating for t in tabs)
    qtbot.waitUntil(sample, timeout=120000)
    assert max(peak) >= 4  # several tabs were typing at the same moment
    assert all(t.conversation.messages[-1].tokens == 256 for t in tabs)
    qtbot.waitUntil(lambda: window.status.pages.text().endswith("idle"), timeout=3000)  # polled usage
