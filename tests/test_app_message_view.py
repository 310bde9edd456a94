"""One message on screen: streaming text, Markdown with code blocks and copy, meta, errors."""
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QLabel

from app.conversation import Message
from app.message_view import CodeBlock, MessageWidget

REPLY = "Try this:\n\n```sh\nls -la\n```\n\nThen **check** the output."


def test_final_reply_renders_code_blocks_with_copy(qtbot, qapp):
    w = MessageWidget(Message("assistant", REPLY, tokens=12, tok_s=30.0))
    qtbot.addWidget(w)
    blocks = w.findChildren(CodeBlock)
    assert len(blocks) == 1 and blocks[0].code == "ls -la"
    copy = [b for b in blocks[0].findChildren(type(w._edit)) if b.text() == "Copy"][0]
    copy.click()
    assert QGuiApplication.clipboard().text() == "ls -la" and copy.text() == "Copied"
    assert "12 tokens" in w._meta.text() and "30.0 tok/s" in w._meta.text()


def test_streaming_shows_plain_text_with_a_cursor_then_markdown(qtbot):
    m = Message("assistant", "")
    w = MessageWidget(m)
    qtbot.addWidget(w)
    w.show_streaming()
    m.text = "**partial"
    w.set_text(m.text)
    labels = [lb for lb in w.findChildren(QLabel) if lb.text().startswith("**partial")]
    assert labels and labels[0].text().endswith("▍")
    m.text = "**done**"
    w.show_final()
    qtbot.waitUntil(lambda: not any(lb.text().startswith("**partial") for lb in w.findChildren(QLabel)))
    assert any('font-weight:700;">done' in lb.text() for lb in w.findChildren(QLabel))


def test_user_text_is_shown_as_typed(qtbot):
    w = MessageWidget(Message("user", "2 * 3 * 4 <b>"))
    qtbot.addWidget(w)
    assert any(lb.text() == "2 * 3 * 4 <b>" for lb in w.findChildren(QLabel))


def test_failed_reply_shows_the_error_and_offers_retry(qtbot):
    w = MessageWidget(Message("assistant", "", interrupted=True, error="engine error: boom"))
    qtbot.addWidget(w)
    w.set_actions(regenerate=True)
    assert w._status.text() == "engine error: boom" and w._status.objectName() == "error"
    assert w._regenerate.text() == "Retry" and "interrupted" not in w._meta.text()
    assert w._copy.isHidden()


def test_interrupted_reply_says_so(qtbot):
    w = MessageWidget(Message("assistant", "half", tokens=2, interrupted=True))
    qtbot.addWidget(w)
    assert w._meta.text().endswith("interrupted")
