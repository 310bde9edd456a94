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
    panel.select(a.id)
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
    panel.select(c.id)
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
