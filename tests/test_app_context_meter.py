"""The context meter, what happens at the context's limit (refuse, or drop the oldest turns and
say so), time to first token per reply, and the total rate while several tabs stream."""
import time

import pytest
from fake_engine import FAKE_INFO, _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here
from tab_actions import shown
from test_app_window import click, conv_file, launch, send, settings_for  # noqa: F401 - the window fixture

from app.chat_tab import ChatTab
from app.context_meter import ContextMeter, used_tokens
from app.conversation import Conversation, Message
from app.reply import METER_PERIOD_S
from app.store import ConversationStore
from engine import EngineSettings

LONG = "many words to fill the context " * 25


def test_the_meter_counts_the_last_reply_and_warns_before_the_limit(qtbot):
    c = Conversation()
    c.add(Message("user", "q"))
    c.add(Message("assistant", "a", tokens=40, prompt_tokens=300))
    meter = ContextMeter()
    qtbot.addWidget(meter)
    assert used_tokens(c) == 340
    meter.show_for(c, 1000)
    assert meter.label.text() == "Context 340 / 1,000 tokens" and meter.label.objectName() == "meta"
    meter.show_for(c, 400)
    assert meter.label.text().endswith("nearly full") and meter.label.objectName() == "error"
    meter.show_for(c, 300)
    assert meter.label.text().endswith("· full")
    meter.show_for(c, None)
    assert meter.label.text() == ""
    assert used_tokens(Conversation()) is None


@pytest.mark.parametrize("think", [0, 10**6], ids=["text", "thinking"])
def test_the_meter_counts_a_reply_while_it_streams_a_few_times_a_second(qtbot, tmp_path, run_async, think):
    bridge, _ = bridge_with(n=10**6, gap=0.0005, think=think, info=FAKE_INFO)  # until stopped: prompt 5, context 512
    run_async(bridge.start(EngineSettings()))
    tab = shown(qtbot, ChatTab(Conversation(), ConversationStore(tmp_path), bridge))
    shows, show_for = [], tab.meter.show_for
    tab.meter.show_for = lambda *a, **kw: (shows.append(time.monotonic()), show_for(*a, **kw))

    def used() -> int:
        return int(tab.meter.label.text().split()[1].replace(",", ""))

    tab.composer.set_text("Hi")
    click(qtbot, tab.composer.send_button)
    sent = time.monotonic()
    qtbot.waitUntil(lambda: used() > 5, timeout=10000)  # the prompt, and tokens of the reply so far
    first = used()
    qtbot.waitUntil(lambda: used() > first, timeout=10000)  # ... and it moves on as more arrive
    reply = tab.conversation.messages[-1]
    assert tab.generating and used() <= 5 + reply.tokens and "with the reply so far" in tab.meter.label.toolTip()
    progress, update_meta = [], tab.view.widgets[-1].update_meta  # once per batch of tokens delivered
    tab.view.widgets[-1].update_meta = lambda *a, **kw: (progress.append(1), update_meta(*a, **kw))
    qtbot.wait(1500)
    streamed = time.monotonic() - sent
    click(qtbot, tab.composer.stop_button)
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    assert bool(reply.reasoning) == bool(think) and reply.tokens > 50
    assert len(shows) <= streamed / METER_PERIOD_S + 4 < len(progress)  # not per token, nor per batch
    assert used() == 5 + reply.tokens and "after the last reply" in tab.meter.label.toolTip()


def fill(tab, turns):
    for i in range(turns):
        tab.conversation.add(Message("user", f"{i}: {LONG}"))
        tab.conversation.add(Message("assistant", f"answer {i}"))
    tab.view.set_messages(tab.conversation.messages)


def test_at_the_limit_refuses_clearly_or_drops_the_oldest_turns_and_says_so(qtbot, launch, app_home):  # noqa: F811
    window = launch(max_tokens=4)
    tab = window.current_tab()
    assert tab.meter.label.text().startswith("Context 0 / 512")
    fill(tab, 6)
    send(qtbot, tab, "And now?")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    reply = tab.conversation.messages[-1]
    assert reply.error and "does not fit the context" in reply.error and "drop oldest turns" in reply.error
    assert not reply.left_out
    # The user picks dropping in the meter's box; Retry now fits by leaving turns out, and says so.
    tab.meter.choice.setCurrentIndex(tab.meter.choice.findData("drop"))
    tab.meter.choice.activated.emit(tab.meter.choice.currentIndex())
    assert tab.conversation.at_limit == "drop"
    tab.regenerate()
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    reply = tab.conversation.messages[-1]
    assert not reply.error and reply.text and reply.left_out >= 2 and reply.left_out % 2 == 0
    assert f"{reply.left_out} earlier messages left out to fit" in tab.view.widgets[-1]._meta.text()
    assert reply.prompt_tokens < 512 and tab.meter.label.text().startswith(f"Context {reply.prompt_tokens + 4}")
    saved = conv_file(app_home, tab)
    assert saved["at_limit"] == "drop" and saved["messages"][-1]["left_out"] == reply.left_out


def test_a_last_message_too_long_alone_is_refused_even_when_dropping(qtbot, launch):  # noqa: F811
    window = launch(max_tokens=4)
    tab = window.current_tab()
    tab.conversation.at_limit = "drop"
    fill(tab, 1)
    send(qtbot, tab, LONG * 3)
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    assert "even the last message alone is too long" in tab.conversation.messages[-1].error


def test_each_reply_shows_its_first_token_time_and_tabs_together_their_total_rate(qtbot, launch, tmp_path):  # noqa: F811
    # Replies that run until stopped: at 512 positions a fast machine finished both between two refreshes.
    from ckpt import tiny_llama_config, write_hf
    cfg = tiny_llama_config()
    cfg["max_position_embeddings"] = 32768
    write_hf(tmp_path, cfg, seed=0)
    window = launch(model=str(tmp_path), max_tokens=100000, parallel=2, context=16384)
    first = window.current_tab()
    second = window.new_tab()  # both tabs first: the two sends go back to back, so the replies overlap
    send(qtbot, first, "Hello")
    send(qtbot, second, "Hi")
    qtbot.waitUntil(lambda: window.throughput.isVisible(), timeout=30000)
    qtbot.waitUntil(lambda: "tok/s in all" in window.throughput.text() and float(
        window.throughput.text().split("· ")[1].split()[0]) > 0, timeout=30000)
    assert window.throughput.text().startswith("2 replies")
    for tab in (first, second):  # each tab's own Stop button, on the tab the user has in front
        window.tabs.setCurrentWidget(tab)
        click(qtbot, tab.composer.stop_button)
        qtbot.waitUntil(lambda tab=tab: not tab.generating, timeout=30000)
        m = tab.conversation.messages[-1]
        assert m.ttft is not None and m.ttft > 0 and f"first token {m.ttft:.2f} s" in tab.view.widgets[-1]._meta.text()
    qtbot.waitUntil(lambda: not window.throughput.isVisible(), timeout=3000)


def test_the_meters_words_are_never_cut_at_the_default_window_width(qtbot, launch):  # noqa: F811
    window = launch()
    window.resize(1200, 800)
    tab = window.current_tab()
    tab.conversation.sampling = {"temperature": 0.2, "top_p": 0.5, "top_k": 7, "seed": 3, "max_tokens": 9}
    tab.conversation.add(Message("user", "q"))
    tab.conversation.add(Message("assistant", "a", tokens=40, prompt_tokens=420))
    tab.update_meter()
    tab._update_sampling()
    tab.system_toggle.setText("System prompt: set (a long one) ▴")
    label = tab.meter.label
    assert label.text() == "Context 460 / 512 tokens · nearly full"
    qtbot.waitUntil(lambda: label.width() >= label.sizeHint().width())
    right = label.mapTo(tab, label.rect().topRight()).x()
    assert right < tab.width() and tab.engine_picker.geometry().right() < tab.width()
