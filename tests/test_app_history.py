"""The conversation list: order, open marks, selection, relative dates."""
from datetime import datetime, timedelta, timezone

from app.conversation import Conversation
from app.history import HistoryPanel, when


def test_newest_first_and_upsert_moves_to_top(qtbot):
    panel = HistoryPanel()
    qtbot.addWidget(panel)
    a, b = Conversation(title="a"), Conversation(title="b")
    panel.set_conversations([b, a], open_ids={a.id})
    assert panel.ids() == [b.id, a.id]
    with qtbot.waitSignal(panel.open_requested) as opened:
        panel.list.itemClicked.emit(panel.list.item(1))
    assert opened.args == [a.id]
    panel.set_active(a.id)
    panel.upsert(a, True)
    assert panel.ids() == [a.id, b.id] and panel.list.currentItem().text() == "a"
    panel.remove(b.id)
    assert panel.ids() == [a.id]


def test_delete_key_asks_to_delete_the_current_item(qtbot):
    from PySide6.QtCore import Qt
    panel = HistoryPanel()
    qtbot.addWidget(panel)
    c = Conversation(title="x")
    panel.set_conversations([c], set())
    panel.set_active(c.id)
    with qtbot.waitSignal(panel.delete_requested) as asked:
        qtbot.keyClick(panel.list, Qt.Key.Key_Delete)
    assert asked.args == [c.id]


def test_relative_dates():
    now = datetime.now(timezone.utc)
    assert when(now.isoformat()) == f"{now.astimezone():%H:%M}"
    assert when((now - timedelta(days=1)).isoformat()) == "Yesterday"
    old = now - timedelta(days=400)
    assert when(old.isoformat()).endswith(str(old.astimezone().year))
    assert when("garbage") == ""


def test_new_chat_button_asks_for_a_tab(qtbot):
    from PySide6.QtCore import Qt
    panel = HistoryPanel()
    qtbot.addWidget(panel)
    panel.show()
    with qtbot.waitSignal(panel.new_requested, timeout=1000):
        qtbot.mouseClick(panel.new_button, Qt.MouseButton.LeftButton)


def test_the_active_conversation_stays_highlighted_while_others_move(qtbot):
    panel = HistoryPanel()
    qtbot.addWidget(panel)
    a, b, c = Conversation(title="a"), Conversation(title="b"), Conversation(title="c")
    panel.set_conversations([c, b, a], open_ids={a.id, b.id})
    panel.set_active(a.id)
    panel.upsert(b, True)  # another tab's conversation was saved: it moves to the top
    panel.upsert(c, False)
    assert panel.ids()[:2] == [c.id, b.id] and panel.highlighted() == a.id
    panel.remove(b.id)
    assert panel.highlighted() == a.id
    panel.set_active(None)
    assert panel.highlighted() is None
    panel.set_conversations([a, b], open_ids=set())
    panel.set_active(b.id)
    assert panel.highlighted() == b.id


def test_a_conversation_back_from_the_trash_goes_to_its_place_by_date(qtbot):
    panel = HistoryPanel()
    qtbot.addWidget(panel)
    pin = Conversation(title="pinned", pinned=True, updated="2025-01-01T00:00:00+00:00")
    new, old = (Conversation(title=t, updated=f"2025-0{m}-01T00:00:00+00:00") for t, m in (("new", 5), ("old", 1)))
    panel.set_conversations([pin, new, old], set())
    middle = Conversation(title="middle", updated="2025-03-01T00:00:00+00:00")
    panel.upsert(middle, False, on_top=False)
    assert panel.ids() == [pin.id, new.id, middle.id, old.id]
    panel.upsert(middle, False)  # used just now: on top of the unpinned
    assert panel.ids() == [pin.id, middle.id, new.id, old.id]
