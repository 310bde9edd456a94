"""Syntax colours in code blocks: Pygments' tokens land on the right characters (also after
characters outside the BMP), unknown languages stay plain, and a block is coloured once it closes."""
from PySide6.QtGui import QTextCursor, QTextDocument, QTextFormat

from app.code_highlight import highlight
from app.conversation import Message
from app.message_view import CodeBlock, MessageWidget


def colour_at(doc: QTextDocument, position: int) -> str:
    cursor = QTextCursor(doc)
    cursor.setPosition(position + 1)  # the format of the character before the cursor
    fmt = cursor.charFormat()
    return fmt.foreground().color().name() if fmt.hasProperty(QTextFormat.Property.ForegroundBrush) else ""


def test_keywords_strings_and_names_get_their_own_colours_after_an_emoji():
    code = 's = "😀"\ndef f():\n    return 1\n'
    doc = QTextDocument()
    doc.setPlainText(code)
    assert highlight(doc, code, "python", dark=False)
    utf16 = code.encode("utf-16-le")
    pos = len(code[:code.index("def")].encode("utf-16-le")) // 2
    assert len(utf16) // 2 == doc.characterCount() - 1
    keyword, string, name = colour_at(doc, pos), colour_at(doc, code.index('"')), colour_at(doc, 0)
    assert keyword and string and keyword != string and name != keyword
    dark = QTextDocument()
    dark.setPlainText(code)
    highlight(dark, code, "Python", dark=True)
    assert colour_at(dark, pos) not in ("", keyword)


def test_an_unknown_or_missing_language_stays_plain():
    for lang in ("", "no-such-language"):
        doc = QTextDocument()
        doc.setPlainText("x = 1")
        assert not highlight(doc, "x = 1", lang, dark=False)
        assert colour_at(doc, 0) == ""


def test_a_streaming_block_is_plain_until_it_closes(qtbot):
    m = Message("assistant", "")
    w = MessageWidget(m)
    qtbot.addWidget(w)
    w.show_streaming()
    m.text = "Code:\n\n```python\ndef f():\n    pass\n"
    w.append(m.text)
    block = next(v for v in w._views if isinstance(v, CodeBlock))
    assert colour_at(block.view.document(), 0) == ""
    m.text += "```\n\nAfter."
    w.append("```\n\nAfter.")
    assert colour_at(block.view.document(), 0) != ""
    w.show_final()
    assert colour_at(block.view.document(), 0) != ""
