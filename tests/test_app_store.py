"""Conversation files: atomic writes, listing, bad files set aside, deletion with the sidecar."""
import json
import os

import pytest

from app.atomic import write_atomic
from app.conversation import FORMAT_VERSION, Conversation, FormatError, Message
from app.store import ConversationStore


@pytest.fixture
def store(tmp_path):
    return ConversationStore(tmp_path / "conversations")


def _conv(title: str, updated: str) -> Conversation:
    c = Conversation(title=title, updated=updated)
    c.add(Message("user", title))
    return c


def test_save_load_and_newest_first(store):
    old, new = _conv("old", "2024-01-01T00:00:00+00:00"), _conv("new", "2025-01-01T00:00:00+00:00")
    store.save(old)
    store.save(new)
    convs, notices = store.load_all()
    assert [c.title for c in convs] == ["new", "old"] and notices == []
    assert store.load(old.id) == old


def test_atomic_write_leaves_no_temp_files_and_replaces(tmp_path):
    target = tmp_path / "f.json"
    write_atomic(target, b"one")
    write_atomic(target, b"two")
    assert target.read_bytes() == b"two"
    assert os.listdir(tmp_path) == ["f.json"]


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "f.json"
    write_atomic(target, b"old")

    def boom(fd):
        raise OSError("disk full")
    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        write_atomic(target, b"new")
    assert target.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["f.json"]


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", json.dumps({"format_version": FORMAT_VERSION + 1,
                                                                          "id": "x", "messages": []}).encode()])
def test_bad_file_is_set_aside_and_others_still_load(store, content):
    good = _conv("good", "2025-01-01T00:00:00+00:00")
    store.save(good)
    (store.root / "bad.json").write_bytes(content)
    convs, notices = store.load_all()
    assert [c.id for c in convs] == [good.id]
    assert len(notices) == 1 and "bad.json" in notices[0] and "set-aside" in notices[0]
    assert not (store.root / "bad.json").exists()
    assert (store.aside / "bad.json").read_bytes() == content
    (store.root / "bad.json").write_bytes(content)  # a second bad file of the same name keeps both
    store.load_all()
    assert sorted(p.name for p in store.aside.iterdir()) == ["bad.1.json", "bad.json"]


def test_file_name_is_the_id(store):
    c = _conv("x", "2025-01-01T00:00:00+00:00")
    data = c.to_dict() | {"id": "something-else"}
    (store.root / "real-id.json").write_text(json.dumps(data))
    assert store.load("real-id").id == "real-id"


def test_ids_cannot_escape_the_folder(store):
    for bad in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(FormatError):
            store.path(bad)


def test_delete_removes_the_snapshot_sidecar(store):
    c = _conv("x", "2025-01-01T00:00:00+00:00")
    store.save(c)
    store.snapshot_path(c.id).mkdir()
    (store.snapshot_path(c.id) / "pages.bin").write_bytes(b"kv")
    store.delete(c.id)
    assert list(store.root.iterdir()) == []


def test_missing_conversation_is_reported_not_set_aside(store):
    with pytest.raises(FormatError, match="no longer exists"):
        store.load("gone")
    assert not store.aside.exists()


def test_export_markdown(store, tmp_path):
    c = _conv("Hello", "2025-01-01T00:00:00+00:00")
    store.export_markdown(c, tmp_path / "out.md")
    assert (tmp_path / "out.md").read_text().startswith("# Hello")
