"""The thinking section of a reply and the per-conversation toggle (app.thinking_view), alone and in
a message widget."""
from app.conversation import Message
from app.message_view import MessageWidget
from app.thinking_view import ThinkingSection, ThinkingToggle


def test_closed_until_opened_then_streams_into_its_view(qtbot):
    s = ThinkingSection()
    qtbot.addWidget(s)
    s.show()
    s.set_live(True)
    s.append("First, ", 2)
    assert not s.is_open and not s.view.isVisible() and s.header.text() == "▸ Thinking…  ·  2 tokens"
    s.set_open(True)
    assert s.view.isVisible() and s.view.text().startswith("First, ")
    s.append("then.", 3)
    assert s.view.text().startswith("First, then.") and s.header.text() == "▾ Thinking…  ·  3 tokens"
    s.set_final("First, then.", 3)
    assert s.view.text() == "First, then." and s.header.text() == "▾ Thinking  ·  3 tokens"
    s.header.click()
    assert not s.view.isVisible() and s.header.text().startswith("▸ Thinking")


def test_a_reply_shows_its_thinking_above_the_answer(qtbot):
    m = Message("assistant", "")
    w = MessageWidget(m)
    qtbot.addWidget(w)
    w.show()
    w.show_streaming()
    assert w.thinking is None
    m.reasoning = "Hmm."
    w.append_reasoning("Hmm.", 2)
    assert w.thinking is not None and w.thinking.live and not w.thinking.is_open
    m.text = "Yes."
    w.append("Yes.")
    assert not w.thinking.live  # the answer has begun
    m.reasoning_tokens = 2
    w.show_final()
    assert w.thinking.text == "Hmm." and w.thinking.tokens == 2 and "Yes." in w.body_text()
    assert "Hmm." not in w.body_text()
    plain = MessageWidget(Message("assistant", "No thinking here."))
    qtbot.addWidget(plain)
    assert plain.thinking is None


def test_a_saved_reply_opens_with_its_thinking_closed(qtbot):
    w = MessageWidget(Message("assistant", "Answer.", reasoning="Because.", reasoning_tokens=5))
    qtbot.addWidget(w)
    w.show()
    assert w.thinking is not None and not w.thinking.is_open and w.thinking.header.text() == "▸ Thinking  ·  5 tokens"


def test_toggle_follows_the_model_until_the_conversation_chooses(qtbot):
    t = ThinkingToggle()
    qtbot.addWidget(t)
    chosen = []
    t.changed.connect(chosen.append)
    t.show_for(None, None)
    assert t.isHidden()  # a model without the switch
    t.show_for(True, None)
    assert not t.isHidden() and t.isChecked() and t.text() == "Thinking: on" and "default: on" in t.toolTip()
    t.click()
    assert chosen == [False] and t.text() == "Thinking: off"
    t.show_for(True, False)
    assert not t.isChecked() and chosen == [False]  # showing a choice is not making one
