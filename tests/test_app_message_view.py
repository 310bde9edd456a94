"""One message on screen: streaming text, Markdown with code blocks and copy, meta, errors, and
every button by a real mouse click."""
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QToolButton

from app.conversation import Message
from app.message_view import CodeBlock, MessageWidget
from app.text_view import LIVE_GLYPH, TextView

REPLY = "Try this:\n\n```sh\nls -la\n```\n\nThen **check** the output."
POEM = "Roses are red\nViolets are blue\nSugar is sweet"


def click(qtbot, button):
    assert button.isVisible(), button.text()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def shown(qtbot, message: Message) -> MessageWidget:
    w = MessageWidget(message)
    qtbot.addWidget(w)
    w.resize(600, 400)
    w.show()
    qtbot.waitExposed(w)
    return w


def stream(qtbot, w: MessageWidget, text: str, step: int = 7) -> None:
    w.show_streaming()
    for i in range(0, len(text), step):
        w.message.text += text[i:i + step]
        w.append(text[i:i + step])
    w.message.interrupted = False
    w.show_final()


def test_final_reply_renders_code_blocks_with_copy(qtbot, qapp):
    w = shown(qtbot, Message("assistant", REPLY, tokens=12, tok_s=30.0))
    blocks = w.findChildren(CodeBlock)
    assert len(blocks) == 1 and blocks[0].code == "ls -la"
    copy = [b for b in blocks[0].findChildren(QToolButton) if b.text() == "Copy"][0]
    click(qtbot, copy)
    assert QGuiApplication.clipboard().text() == "ls -la" and copy.text() == "Copied"
    assert "12 tokens" in w._meta.text() and "30.0 tok/s" in w._meta.text()


def test_copy_message_button_copies_the_whole_text(qtbot):
    w = shown(qtbot, Message("assistant", REPLY))
    click(qtbot, w._copy)
    assert QGuiApplication.clipboard().text() == REPLY


def test_edit_and_regenerate_buttons_ask_when_clicked(qtbot):
    user, reply = shown(qtbot, Message("user", "hi")), shown(qtbot, Message("assistant", "hello"))
    user.set_actions(edit=True)
    reply.set_actions(regenerate=True)
    with qtbot.waitSignal(user.edit_requested, timeout=1000):
        click(qtbot, user._edit)
    with qtbot.waitSignal(reply.regenerate_requested, timeout=1000):
        click(qtbot, reply._regenerate)


def test_in_a_narrow_column_the_meta_line_gives_way_to_the_buttons(qtbot):
    w = shown(qtbot, Message("assistant", "hello", tokens=12345, tok_s=123.4, interrupted=True))
    w.set_actions(regenerate=True)
    assert w.minimumSizeHint().width() < 300  # the meta line alone is wider
    w.resize(300, 200)
    qtbot.waitUntil(lambda: w.width() == 300)
    for button in (w._regenerate, w._copy):
        assert button.isVisible() and button.geometry().right() < w.width()


def test_streaming_shows_plain_text_with_a_cursor_then_markdown(qtbot):
    m = Message("assistant", "")
    w = shown(qtbot, m)
    w.show_streaming()
    m.text = "**partial"
    w.append(m.text)
    assert w.body_text() == "**partial" + LIVE_GLYPH  # the paragraph being written is plain
    m.text += " bold**\n\nnext"
    w.append(" bold**\n\nnext")
    assert w.body_text() == "partial bold\nnext" + LIVE_GLYPH  # a closed paragraph is Markdown
    w.show_final()
    assert w.body_text() == "partial bold\nnext"


def test_streamed_and_reopened_replies_look_the_same(qtbot):
    text = "Intro\n\n```python\ndef f():\n    return 1\n```\n\n1. one\n2. **two**\n\n" + "Long. " * 400
    streamed = shown(qtbot, Message("assistant", ""))
    stream(qtbot, streamed, text)
    reopened = shown(qtbot, Message("assistant", text))
    kinds = [type(v).__name__ for v in streamed._views]
    assert kinds == [type(v).__name__ for v in reopened._views] and kinds[:3] == ["TextView", "CodeBlock", "TextView"]
    assert streamed.body_text() == reopened.body_text()
    assert LIVE_GLYPH not in streamed.body_text()


def test_a_finished_poem_keeps_its_line_breaks(qtbot):
    w = shown(qtbot, Message("assistant", ""))
    stream(qtbot, w, POEM)
    view = w._views[0]
    line = view.fontMetrics().lineSpacing()
    qtbot.waitUntil(lambda: view.height() >= 3 * line, timeout=2000)  # three lines, not one paragraph
    assert w.body_text().splitlines() == POEM.splitlines()


def test_user_text_is_shown_as_typed(qtbot):
    w = shown(qtbot, Message("user", "2 * 3 * 4 <b>"))
    assert w.body_text() == "2 * 3 * 4 <b>"


def test_failed_reply_shows_the_error_and_offers_retry(qtbot):
    w = shown(qtbot, Message("assistant", "", interrupted=True, error="engine error: boom"))
    w.set_actions(regenerate=True)
    assert w._status.text() == "engine error: boom" and w._status.objectName() == "error"
    assert w._regenerate.text() == "Retry" and "interrupted" not in w._meta.text()
    assert w._copy.isHidden()
    with qtbot.waitSignal(w.regenerate_requested, timeout=1000):
        click(qtbot, w._regenerate)


def test_interrupted_reply_says_so_but_not_while_it_is_still_coming(qtbot):
    w = shown(qtbot, Message("assistant", "half", tokens=2, interrupted=True))
    assert w._meta.text().endswith("interrupted")
    waiting = shown(qtbot, Message("assistant", "", interrupted=True))  # saved as interrupted until done
    waiting.show_streaming()
    waiting.set_status("Waiting for a free stream…")
    assert "interrupted" not in waiting._meta.text()
    waiting.update_meta(live_tps=None)
    assert "interrupted" not in waiting._meta.text()
    waiting.show_final()  # the reply ended without finishing (stopped): now it says so
    assert waiting._meta.text().endswith("interrupted")


def test_an_update_inserts_only_the_new_characters(qtbot):
    w = shown(qtbot, Message("assistant", ""))
    w.show_streaming()
    w.append("word " * 2000)
    view = w._views[0]
    assert isinstance(view, TextView)
    changes = []
    view.document().contentsChange.connect(lambda pos, removed, added: changes.append((removed, added)))
    w.append("more")
    assert changes == [(0, 4)]


def test_a_drafted_reply_shows_its_mean_accepted_length_beside_tok_s(qtbot):
    w = MessageWidget(Message("assistant", "ok", tokens=40, tok_s=55.0, accepted=2.5))
    qtbot.addWidget(w)
    assert "55.0 tok/s  ·  2.50 accepted per draft window" in w._meta.text()
    plain = MessageWidget(Message("assistant", "ok", tokens=40, tok_s=55.0))
    qtbot.addWidget(plain)
    assert "accepted" not in plain._meta.text()
