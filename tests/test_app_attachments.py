"""Files as context: what is taken (UTF-8 text that fits what the context has left) and what is
refused, saying why; in a tab, attach (the button and its dialog, a drop, a paste), remove before
sending, sent as part of the user message and shown on it as chips, kept in the file."""
import json
from pathlib import Path

import pytest
from fake_engine import _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here
from modal import answer_file_dialog
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDropEvent
from tab_actions import shown

from app.attachments import MAX_BYTES, Attachment, AttachmentError, read, with_files
from app.chat_tab import ChatTab
from app.context_meter import room_for_files
from app.conversation import Conversation, Message
from app.store import ConversationStore
from engine import EngineSettings, SamplingParams


def words(text: str) -> int:
    return len(text.split())


def test_a_utf8_file_is_taken_whole_and_counted(tmp_path):
    path = tmp_path / "main.py"
    path.write_bytes("\ufeffdef f():\n    return 'é'\n".encode())
    a = read(path, room=100, count=words)
    assert a == Attachment("main.py", "def f():\n    return 'é'\n", 4)
    assert a.size == "2 lines · 4 tokens"


@pytest.mark.parametrize("content, room, why", [
    (b"\x7fELF\x00\x01", 100, "not a text file (it holds binary data)"),
    ("caf\u00e9".encode("latin-1"), 100, "not UTF-8 text (byte 3 is not UTF-8)"),
    (b"one two three four five", 3, "is 5 tokens, too long for this conversation: it has room for 3 more"),
    (b"x", 0, "its context is full"),
    (b"y " * 200, 4, "too long for this conversation"),  # longer than the room could hold: not counted
])
def test_refused_files_say_why(tmp_path, content, room, why):
    path = tmp_path / "f.txt"
    path.write_bytes(content)
    with pytest.raises(AttachmentError, match=why.replace("(", r"\(").replace(")", r"\)")):
        read(path, room, words)


def test_a_folder_and_a_file_past_any_context_are_refused_unread(tmp_path):
    with pytest.raises(AttachmentError, match="is not a file"):
        read(tmp_path, None, words)
    big = tmp_path / "big.log"
    with big.open("wb") as f:
        f.truncate(MAX_BYTES + 1)  # sparse: nothing is written, nothing is read
    with pytest.raises(AttachmentError, match="more than any context takes"):
        read(big, None, words)


def test_without_a_tokenizer_the_count_is_an_estimate_on_the_safe_side(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("abcdefghij" * 3)
    assert read(path, None, lambda text: None).tokens is None
    with pytest.raises(AttachmentError, match="is about 10 tokens"):
        read(path, 9, lambda text: None)


def test_the_message_reads_each_file_in_a_fence_longer_than_any_inside():
    files = [Attachment("README.md", "Use ```code```\n"), Attachment("Makefile", "all:")]
    assert with_files("Explain.", files) == ("File: README.md\n````md\nUse ```code```\n````\n\n"
                                             "File: Makefile\n```\nall:\n```\n\nExplain.")


def test_room_leaves_the_reply_its_share_and_counts_what_is_attached():
    c = Conversation()
    c.add(Message("user", "q"))
    c.add(Message("assistant", "a", tokens=100, prompt_tokens=400))
    assert room_for_files(c, 4096, 256, []) == 4096 - 500 - 256
    assert room_for_files(c, 4096, 4096, [Attachment("a", "t", 96)]) == 4096 - 500 - 96 - 1024
    assert room_for_files(c, None, 256, []) is None


# --- in a tab -------------------------------------------------------------------------------------

@pytest.fixture
def tab(qtbot, tmp_path, run_async):
    bridge, engines = bridge_with(n=3)
    run_async(bridge.start(EngineSettings(context=64, sampling=SamplingParams(max_tokens=8))))
    return shown(qtbot, ChatTab(Conversation(), ConversationStore(tmp_path / "conversations"), bridge)), engines


def file(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def names(chips) -> list[str]:
    return [c.name.text() for c in chips.chips]


def test_attach_remove_and_send_a_file_with_the_message(qtbot, tmp_path, tab):
    tab, engines = tab
    composer = tab.composer
    assert composer.attach_files([file(tmp_path, "a.py", "print(1)\n"), file(tmp_path, "b.txt", "bee\n")]) == []
    assert names(composer.chips) == ["a.py", "b.txt"] and composer.chips.isVisible()
    qtbot.mouseClick(composer.chips.chips[1].remove, Qt.MouseButton.LeftButton)
    assert [a.name for a in composer.attachments] == ["a.py"]
    composer.set_text("What does it print?")
    qtbot.keyClick(composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    sent = engines[0].requests[1]["messages"][-1]
    assert sent == {"role": "user", "content": "File: a.py\n```py\nprint(1)\n```\n\nWhat does it print?"}
    assert not composer.attachments and not composer.chips.isVisible()
    user = tab.view.widgets[0]
    assert names(user.chips) == ["a.py"] and user.chips.chips[0].remove is None
    assert user.body_text() == "What does it print?"
    tab.saver.flush()
    saved = json.loads(tab.store.path(tab.conversation.id).read_text())
    assert saved["messages"][0]["attachments"] == [{"name": "a.py", "text": "print(1)\n", "tokens": 1}]


def test_a_file_too_long_for_the_context_left_is_refused_above_the_box(qtbot, tmp_path, tab):
    tab, _ = tab
    # context 64, the reply's room 8: a file of 60 words does not fit, one of 50 does
    problems = tab.composer.attach_files([file(tmp_path, "long.txt", "w " * 60), file(tmp_path, "ok.txt", "w " * 50)])
    assert problems == ["Not attached: long.txt is 60 tokens, too long for this conversation: it has room for 56 "
                        "more tokens, leaving space for the reply (raise the context in Settings)."]
    assert tab.composer.problem.isVisible() and tab.composer.problem.text() == problems[0]
    assert [a.name for a in tab.composer.attachments] == ["ok.txt"]
    assert tab.composer.attach_files([file(tmp_path, "more.txt", "w " * 10)])[0].startswith(
        "Not attached: more.txt is 10 tokens, too long for this conversation: it has room for 6 more")


def test_the_attach_button_opens_a_file_dialog(qtbot, tmp_path, tab):
    tab, _ = tab
    path = file(tmp_path, "notes.md", "# Notes\n")
    answer_file_dialog(str(path))  # types the path into the dialog's file name box and opens it
    qtbot.mouseClick(tab.composer.attach_button, Qt.MouseButton.LeftButton)
    assert [a.name for a in tab.composer.attachments] == ["notes.md"]


def drop(widget, paths: list[Path]) -> bool:
    """Drop local files on the widget; whether it took them."""
    mime = QMimeData()  # alive until the event is handled: the event does not own it
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    event = QDropEvent(QPointF(widget.width() / 2, widget.height() / 2), Qt.DropAction.CopyAction, mime,
                       Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier)
    event.ignore()
    widget.dropEvent(event)
    return event.isAccepted()


def test_a_file_dropped_on_the_conversation_or_pasted_in_the_box_is_attached(qtbot, tmp_path, tab):
    tab, _ = tab
    assert drop(tab, [file(tmp_path, "dropped.rs", "fn main() {}\n")])
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(file(tmp_path, "pasted.c", "int x;\n")))])
    assert tab.composer.edit.canInsertFromMimeData(mime)
    tab.composer.edit.insertFromMimeData(mime)  # what a paste or a drop into the box does
    assert [a.name for a in tab.composer.attachments] == ["dropped.rs", "pasted.c"]
    assert tab.composer.text() == ""  # the box got the file, not its path
    assert not drop(tab, [file(tmp_path, "model.gguf", "GGUF")])  # a model is the window's to open
    assert len(tab.composer.attachments) == 2


def test_the_draft_keeps_its_files_and_an_edit_brings_the_messages_back(qtbot, tmp_path, tab):
    tab, _ = tab
    tab.composer.attach_files([file(tmp_path, "draft.txt", "later\n")])
    tab.save()
    again = ChatTab(tab.store.load(tab.conversation.id), tab.store, tab.bridge)
    qtbot.addWidget(again)
    assert [a.name for a in again.composer.attachments] == ["draft.txt"]
    again.composer.set_attachments([])
    again.composer.attach_files([file(tmp_path, "sent.txt", "now\n")])
    again.send("With a file")
    qtbot.waitUntil(lambda: not again.generating, timeout=10000)
    again.composer.attach_files([file(tmp_path, "next.txt", "next\n")])
    again.edit_last()
    assert [a.name for a in again.composer.attachments] == ["sent.txt"]
    again.cancel_edit()
    assert [a.name for a in again.composer.attachments] == ["next.txt"]
    again.edit_last()
    again.composer.set_attachments([])
    again.send("Without it")
    qtbot.waitUntil(lambda: not again.generating, timeout=10000)
    assert again.conversation.messages[0].attachments == [] and again.conversation.branches[0].attachments
    assert [a.name for a in again.composer.attachments] == ["next.txt"]
