"""The trash: deleting moves a conversation and its KV snapshots aside, Undo in the notice puts
both back (and the tab), and the rule at start empties what is old."""
from datetime import datetime, timedelta, timezone

from fake_engine import _stop_fake_engines, fake_window  # noqa: F401 - the fixture applies here
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from app.atomic import json_bytes
from app.conversation import Conversation, Message
from app.trash import KEEP_DAYS, Trash, conversation_id

NOW = datetime(2025, 6, 10, 12, 0, tzinfo=timezone.utc)


def test_put_take_and_names(tmp_path):
    trash = Trash(tmp_path / "trash")
    (tmp_path / "a.json").write_text("{}")
    (tmp_path / "a.fp.kv").write_bytes(b"kv")
    first = trash.put("a", [tmp_path / "a.json", tmp_path / "a.fp.kv", tmp_path / "absent.kv"], NOW)
    assert first.name == "20250610T120000Z-a" and conversation_id(first) == "a"
    assert sorted(p.name for p in first.iterdir()) == ["a.fp.kv", "a.json"]
    second = trash.put("a", [], NOW)  # the same second: a name of its own
    assert second.name == "20250610T120000Z-a~1" and conversation_id(second) == "a"
    convs, snaps = tmp_path / "convs", tmp_path / "snaps"
    convs.mkdir()
    assert trash.take(first, convs, snaps) == "a" and not first.exists()
    assert (convs / "a.json").read_text() == "{}" and (snaps / "a.fp.kv").read_bytes() == b"kv"
    assert trash.entries() == [second]


def test_at_start_old_entries_go_and_so_do_the_snapshots_of_the_others(tmp_path):
    trash = Trash(tmp_path / "trash")
    for cid, age in (("old", KEEP_DAYS + 1), ("recent", KEEP_DAYS - 1)):
        (tmp_path / f"{cid}.json").write_text(cid)
        (tmp_path / f"{cid}.fp.kv").write_bytes(b"kv")
        trash.put(cid, [tmp_path / f"{cid}.json", tmp_path / f"{cid}.fp.kv"], NOW - timedelta(days=age))
    (trash.root / "not-ours").mkdir()
    assert trash.empty(NOW) == 1
    [recent] = trash.entries()
    assert conversation_id(recent) == "recent" and [p.name for p in recent.iterdir()] == ["recent.json"]
    assert (trash.root / "not-ours").is_dir()
    assert Trash(tmp_path / "none").empty(NOW) == 0


def _seed(home, cid, title, updated="2025-05-01T10:00:00+00:00"):
    folder = home / "data" / "conversations"
    folder.mkdir(parents=True, exist_ok=True)
    conv = Conversation(id=cid, title=title, updated=updated)
    conv.add(Message("user", f"About {title}"))
    conv.add(Message("assistant", "Sure."))
    (folder / f"{cid}.json").write_bytes(json_bytes(conv.to_dict()))  # as the store writes it
    snaps = home / "data" / "snapshots"
    snaps.mkdir(parents=True, exist_ok=True)
    for fp in ("aaaa", "bbbb"):
        (snaps / f"{cid}.{fp}.kv").write_bytes(f"{cid} {fp} state".encode())


def test_delete_from_the_list_and_undo_restores_the_file_the_snapshots_and_the_tab(qtbot, app_home):
    _seed(app_home, "newer", "Newer", "2025-05-03T10:00:00+00:00")
    _seed(app_home, "gone", "Delete me", "2025-05-02T10:00:00+00:00")
    _seed(app_home, "keep", "Keep me")
    data = app_home / "data"
    before = {p.relative_to(data): p.read_bytes() for p in data.rglob("*") if p.is_file()}
    window = fake_window(qtbot)
    order = window.history.ids()
    assert order == ["newer", "gone", "keep"]
    window.open_conversation("gone")
    assert window.current_tab().conversation.id == "gone"
    menu = window.history.context_menu(window.history.item("gone"))
    next(a for a in menu.actions() if a.text() == "Delete").trigger()
    assert "gone" not in window.history.ids() and all(t.conversation.id != "gone" for t in window.tabs.tabs())
    assert sorted(p.name for p in (data / "conversations").iterdir()) == ["keep.json", "newer.json"]
    assert sorted(p.name for p in (data / "snapshots").iterdir()) == ["keep.aaaa.kv", "keep.bbbb.kv",
                                                                       "newer.aaaa.kv", "newer.bbbb.kv"]
    [entry] = (data / "trash").iterdir()
    assert sorted(p.name for p in entry.iterdir()) == ["gone.aaaa.kv", "gone.bbbb.kv", "gone.json"]
    [notice] = [n for n in window.notices.notices() if n.text == "Deleted “Delete me”."]
    undo = next(b for b in notice.findChildren(QPushButton) if b.text() == "Undo")
    qtbot.mouseClick(undo, Qt.MouseButton.LeftButton)
    after = {p.relative_to(data): p.read_bytes() for p in data.rglob("*") if p.is_file()}
    assert after == before and not any((data / "trash").iterdir())
    assert window.history.ids() == order and window.current_tab().conversation.id == "gone"  # in its place
    assert notice not in window.notices.notices()


def test_the_delete_key_then_a_restart_empties_the_trash_by_the_rule(qtbot, app_home):
    _seed(app_home, "gone", "Delete me")
    window = fake_window(qtbot)
    window.history.set_active("gone")
    qtbot.keyClick(window.history.list, Qt.Key.Key_Delete)
    trash = app_home / "data" / "trash"
    [entry] = trash.iterdir()
    old = trash / "20000101T000000Z-ancient"
    old.mkdir()
    (old / "ancient.json").write_text("{}")
    window.close()
    fake_window(qtbot)  # the next start
    assert [p.name for p in trash.iterdir()] == [entry.name]  # the old one went
    assert [p.name for p in entry.iterdir()] == ["gone.json"]  # snapshots only live for the session's Undo


def test_a_tab_deleted_mid_reply_comes_back_as_it_was_shown(qtbot, app_home, run_async):
    window = fake_window(qtbot, n=100000, gap=0.001)
    assert run_async(window.start_engine(), timeout=60)
    tab = window.current_tab()
    tab.composer.set_text("A long answer, please")
    tab.composer.send_button.click()
    qtbot.waitUntil(lambda: bool(tab.conversation.messages[-1].text), timeout=20000)
    tab.composer.set_text("my unsent draft")
    cid = tab.conversation.id
    window.delete_conversation(cid)
    assert window.bridge.busy == 0 and not window.store.exists(cid)  # the reply stopped
    [notice] = [n for n in window.notices.notices() if n.text.startswith("Deleted")]
    qtbot.mouseClick(next(b for b in notice.findChildren(QPushButton) if b.text() == "Undo"), Qt.MouseButton.LeftButton)
    back = window.current_tab()
    assert back.conversation.id == cid and back.composer.text() == "my unsent draft"
    reply = back.conversation.messages[-1]
    assert reply.role == "assistant" and reply.interrupted and reply.text.startswith("x")
