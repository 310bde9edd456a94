"""Very long words: every wrapping text widget of a tab wraps anywhere before Qt lays such a word
out (word-boundary wrapping costs the square of a word's length: seconds for 256 KB), and wraps at
word boundaries again once the word is gone. The mode Qt lays out with is recorded, not timed."""
from pathlib import Path

import pytest
from PySide6.QtWidgets import QPlainTextEdit, QTextEdit

from app.chat_tab import ChatTab
from app.conversation import Conversation, Message
from app.engine_bridge import EngineBridge
from app.store import ConversationStore
from app.text_view import TextView
from app.wrap_guard import ANYWHERE, LONG_RUN, WORDS, WrapGuard, has_long_run

PROSE = "Short words, as people write them. " * 200


def guarded(qtbot, kind=QPlainTextEdit):
    w = kind()
    qtbot.addWidget(w)
    WrapGuard(w)
    w.resize(400, 200)
    w.show()
    qtbot.waitExposed(w)
    return w


def modes_laid_out(w) -> list:
    """The wrap mode at each moment Qt's layout of `w` reports a new size (after laying out)."""
    seen = []
    w.document().documentLayout().documentSizeChanged.connect(lambda *_: seen.append(w.wordWrapMode()))
    return seen


def test_a_run_is_long_from_long_run_characters_without_whitespace():
    assert has_long_run("a" * LONG_RUN)
    assert not has_long_run("a" * (LONG_RUN - 1))
    assert not has_long_run(("a" * (LONG_RUN // 2) + "\u2029") * 4)  # a paragraph break ends a run
    assert not has_long_run(PROSE * 10)


@pytest.mark.parametrize("kind", [QPlainTextEdit, QTextEdit, TextView])
def test_a_long_word_is_laid_out_wrapping_anywhere(qtbot, kind):
    w = guarded(qtbot, kind)
    seen = modes_laid_out(w)
    w.setPlainText("a" * (256 << 10))
    qtbot.waitUntil(lambda: bool(seen))
    assert set(seen) == {ANYWHERE}  # never laid out at word boundaries, the slow way


def test_prose_wraps_at_word_boundaries(qtbot):
    w = guarded(qtbot)
    w.setPlainText(PROSE)
    assert w.wordWrapMode() == WORDS


def test_a_run_streamed_in_small_pieces_is_found(qtbot):
    w = guarded(qtbot, TextView)
    text = "Here it comes: "
    w.set_plain(text)
    for _ in range(2 * LONG_RUN // 7):
        text += "abcdefg"
        w.sync_tail(text)
        if w.wordWrapMode() == ANYWHERE:
            break
    assert w.wordWrapMode() == ANYWHERE
    assert len(w.text()) < 15 + LONG_RUN + 7  # found as soon as the run was long


def test_taking_a_space_out_between_two_words_can_make_a_long_run(qtbot):
    w = guarded(qtbot)
    half = "b" * (LONG_RUN // 2 + 1)
    w.setPlainText(PROSE + half + " " + half + PROSE)
    assert w.wordWrapMode() == WORDS
    cursor = w.textCursor()
    cursor.setPosition(len(PROSE) + len(half))
    cursor.deleteChar()
    assert w.wordWrapMode() == ANYWHERE


def test_without_the_long_word_it_wraps_at_words_again(qtbot):
    w = guarded(qtbot)
    w.setPlainText(PROSE + "a" * (4 * LONG_RUN))
    assert w.wordWrapMode() == ANYWHERE
    cursor = w.textCursor()
    cursor.setPosition(len(PROSE))
    cursor.movePosition(cursor.MoveOperation.End, cursor.MoveMode.KeepAnchor)
    cursor.removeSelectedText()
    assert w.wordWrapMode() == WORDS


def test_every_text_of_a_tab_with_a_256_kb_word_wraps_anywhere(qtbot, tmp_path: Path):
    word = "a" * (256 << 10)
    conv = Conversation(title="long", system_prompt=word, draft=word)
    conv.messages += [Message("user", word), Message("assistant", word, tokens=9)]
    tab = ChatTab(conv, ConversationStore(tmp_path), EngineBridge())
    qtbot.addWidget(tab)
    tab.resize(900, 700)
    tab.show()
    qtbot.waitExposed(tab)
    views = tab.findChildren(TextView)
    assert len(views) == 2  # the user's message and the reply
    wrapping = [tab.system_edit, tab.composer.edit, *views]
    assert [w.wordWrapMode() for w in wrapping] == [ANYWHERE] * 4
    tab.system_edit.setPlainText("Be brief.")
    assert tab.system_edit.wordWrapMode() == WORDS
