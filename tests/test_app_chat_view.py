"""The message list: a long conversation opens with widgets for its last messages only, older
ones appear while scrolling up (what the reader looks at stays put), buttons reach the tab."""
from PySide6.QtCore import Qt

from app.chat_view import FIRST_BATCH, ChatView
from app.conversation import Message

CODE_REPLY = "Here:\n\n```python\nprint('hi')\n```\n\nDone, " + "and more words " * 30


def conversation(n: int) -> list[Message]:
    return [Message("user", f"Question {i}") if i % 2 == 0 else Message("assistant", CODE_REPLY) for i in range(n)]


def shown(qtbot, messages) -> ChatView:
    view = ChatView()
    qtbot.addWidget(view)
    view.resize(800, 600)
    view.set_messages(messages)
    view.show()
    qtbot.waitExposed(view)
    return view


def test_a_long_conversation_opens_with_its_last_messages(qtbot):
    messages = conversation(100)
    view = shown(qtbot, messages)
    qtbot.wait(100)  # let it fill the screen
    assert FIRST_BATCH <= len(view.widgets) < 40
    assert [w.message for w in view.widgets] == messages[view.first:]
    bar = view.verticalScrollBar()
    assert bar.value() == bar.maximum()  # at the end, where the conversation continues


def test_scrolling_up_brings_older_messages_and_keeps_the_place(qtbot):
    messages = conversation(100)
    view = shown(qtbot, messages)
    qtbot.wait(100)
    bar = view.verticalScrollBar()
    def on_screen(widget):
        return widget.mapTo(view.widget(), widget.rect().topLeft()).y() - bar.value()
    while view.first > 0:
        first, oldest = view.first, view.widgets[0]
        bar.setValue(0)  # the reader reaches the top of what is there
        before = on_screen(oldest)
        qtbot.waitUntil(lambda: view.first < first, timeout=3000)
        qtbot.wait(30)
        assert abs(on_screen(oldest) - before) < 3, "the message the reader was at moved away"
    assert [w.message for w in view.widgets] == messages


def test_a_hidden_view_builds_no_more_than_its_first_batch(qtbot):
    view = ChatView()
    qtbot.addWidget(view)
    view.set_messages(conversation(100))
    qtbot.wait(100)
    assert len(view.widgets) == FIRST_BATCH


def test_message_buttons_reach_the_view(qtbot):
    messages = conversation(2)
    view = shown(qtbot, messages)
    view.widgets[0].set_actions(edit=True)
    view.widgets[1].set_actions(regenerate=True)
    with qtbot.waitSignal(view.edit_requested, timeout=1000):
        qtbot.mouseClick(view.widgets[0]._edit, Qt.MouseButton.LeftButton)
    with qtbot.waitSignal(view.regenerate_requested, timeout=1000):
        qtbot.mouseClick(view.widgets[1]._regenerate, Qt.MouseButton.LeftButton)


def test_remove_from_and_add(qtbot):
    messages = conversation(4)
    view = shown(qtbot, messages)
    del messages[2:]
    view.remove_from(2)
    assert len(view.widgets) == 2 and view.widget_for(1).message is messages[1] and view.widget_for(2) is None
    messages.append(Message("user", "again"))
    assert view.add(messages[-1]).message.text == "again" and view.widget_for(2) is view.widgets[-1]
