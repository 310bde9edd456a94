"""Conversation files: atomic writes, listing, bad files set aside, deletion with the sidecar."""
import fcntl
import json
import os
import signal
import time

import pytest

from app.atomic import json_bytes, leftovers, write_atomic
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


def test_delete_moves_the_conversation_and_its_snapshots_to_the_trash_and_undelete_returns_them(store):
    c, other = _conv("x", "2025-01-01T00:00:00+00:00"), _conv("y", "2025-01-01T00:00:00+00:00")
    store.save(c)
    store.snapshot_dir.mkdir(parents=True)
    for name in (f"{c.id}.aaaa.kv", f"{c.id}.bbbb.kv", f"{other.id}.aaaa.kv"):
        (store.snapshot_dir / name).write_bytes(name.encode())
    assert [p.name for p in store.snapshot_files(c.id)] == [f"{c.id}.aaaa.kv", f"{c.id}.bbbb.kv"]
    entry = store.delete(c.id)
    assert list(store.root.iterdir()) == [] and not store.exists(c.id) and store.taken(c.id)
    assert [p.name for p in store.snapshot_dir.iterdir()] == [f"{other.id}.aaaa.kv"]
    assert sorted(p.name for p in entry.iterdir()) == [f"{c.id}.aaaa.kv", f"{c.id}.bbbb.kv", f"{c.id}.json"]
    assert store.undelete(entry) == c and not entry.exists() and not store.taken(other.id)
    assert (store.snapshot_dir / f"{c.id}.bbbb.kv").read_bytes() == f"{c.id}.bbbb.kv".encode()
    assert store.clear_snapshots() == 3 and not list(store.snapshot_dir.iterdir())


def test_undelete_never_overwrites_and_keeps_the_entry(store):
    c = _conv("x", "2025-01-01T00:00:00+00:00")
    store.save(c)
    entry = store.delete(c.id)
    store.save(Conversation(id=c.id, title="new"))  # an import took the id meanwhile
    with pytest.raises(FormatError, match="exists again"):
        store.undelete(entry)
    assert store.load(c.id).title == "new" and (entry / f"{c.id}.json").is_file()
    store.path(c.id).unlink()
    store.trash.empty(keep_days=-1)  # emptied by another start meanwhile
    with pytest.raises(FormatError, match="could not be restored"):
        store.undelete(entry)


def test_missing_conversation_is_reported_not_set_aside(store):
    with pytest.raises(FormatError, match="no longer exists"):
        store.load("gone")
    assert not store.aside.exists()


# --- bad files, lone surrogates, leftovers of killed writes -------------------------------------

@pytest.mark.parametrize("content", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000])
def test_deep_json_is_set_aside_not_a_recursion_error(store, content):
    (store.root / "deep.json").write_text(content)
    convs, notices = store.load_all()
    assert convs == [] and "deep.json" in notices[0] and "nested more than" in notices[0]
    assert (store.aside / "deep.json").exists()


def test_lone_surrogates_are_saved_escaped_and_read_back(store):
    c = _conv("x", "2025-01-01T00:00:00+00:00")
    c.add(Message("assistant", "half \ud800 of a pair, \udcff from a file name"))
    c.system_prompt = "\udfff"
    store.save(c)
    raw = store.path(c.id).read_bytes()
    assert b"\\ud800" in raw and b"\\udcff" in raw and "é".encode() not in raw
    assert store.load(c.id) == c
    c.messages[0].text = "café"  # other text stays readable UTF-8
    store.save(c)
    assert "café".encode() in store.path(c.id).read_bytes()
    assert json.loads(json_bytes({"t": "\ud83d\ude00"})) == {"t": "😀"}  # a pair's halves join


def _temp(store, cid: str, conv: Conversation | bytes, n: int = 0):
    path = store.root / f".{cid}.json.t{n}q.tmp"
    path.write_bytes(conv if isinstance(conv, bytes) else json_bytes(conv.to_dict()))
    return path


def test_a_temp_file_that_extends_the_saved_file_replaces_it(store):
    c = _conv("first", "2025-01-01T00:00:00+00:00")
    store.save(c)
    newer = Conversation.from_dict(c.to_dict())
    newer.add(Message("assistant", "the reply"))
    newer.add(Message("user", "the newest question, written just before the kill"))
    _temp(store, c.id, newer)
    assert store.recover(min_age_s=0) == []
    assert [m.text for m in store.load(c.id).messages] == ["first", "the reply", "the newest question, written just "
                                                                                "before the kill"]
    assert list(store.root.glob(".*.tmp")) == []


def test_a_growing_reply_counts_as_an_extension(store):
    c = _conv("q", "2025-01-01T00:00:00+00:00")
    c.add(Message("assistant", "partial", interrupted=True))
    store.save(c)
    grown = Conversation.from_dict(c.to_dict())
    grown.messages[-1].text = "partial and more"
    _temp(store, c.id, grown)
    store.recover(min_age_s=0)
    assert store.load(c.id).messages[-1].text == "partial and more"


def test_every_other_temp_file_is_removed(store):
    c = _conv("one", "2025-01-01T00:00:00+00:00")
    c.add(Message("assistant", "two"))
    store.save(c)
    older = Conversation.from_dict(c.to_dict())
    del older.messages[-1]
    other = _conv("something else", "2025-01-01T00:00:00+00:00")
    same = Conversation.from_dict(c.to_dict())
    for n, t in enumerate([older.to_dict(), other.to_dict(), same.to_dict()]):
        _temp(store, c.id, Conversation.from_dict(t), n)
    _temp(store, c.id, b"{half a wri", 7)
    (store.root / ".settings.json.abc.tmp").write_bytes(b"x")
    store.recover(min_age_s=0)
    assert list(store.root.glob(".*.tmp")) == [] and store.load(c.id) == c


def test_a_temp_file_without_a_saved_file_becomes_it(store):
    c = _conv("a first message, killed before its first save", "2025-01-01T00:00:00+00:00")
    _temp(store, c.id, c)
    store.recover(min_age_s=0)
    assert store.load(c.id).messages == c.messages


def test_a_live_writers_temp_file_is_left_alone(tmp_path):
    tmp = tmp_path / ".c.json.abc.tmp"
    tmp.write_bytes(b"{}")
    old = time.time() - 60
    os.utime(tmp, (old, old))
    with open(tmp, "rb") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        assert leftovers(tmp_path, min_age_s=0) == []
    assert leftovers(tmp_path, min_age_s=0) == [tmp]
    tmp.touch()
    assert leftovers(tmp_path, min_age_s=10) == []  # just created: its writer may not hold the lock yet


def test_a_killed_writer_leaves_a_temp_file_that_recover_settles(store):
    """A real kill -9 between the temp write and the rename: the child writes, stops, is killed."""
    c = _conv("saved", "2025-01-01T00:00:00+00:00")
    store.save(c)
    c.add(Message("user", "only in the temp file"))
    pid = os.fork()
    if pid == 0:
        real = os.replace
        os.replace = lambda *a: (os.kill(os.getpid(), signal.SIGSTOP), real(*a))
        store.save(c)
        os._exit(0)
    while not list(store.root.glob(".*.tmp")) or os.waitpid(pid, os.WUNTRACED | os.WNOHANG) == (0, 0):
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert [m.text for m in store.load(c.id).messages] == ["saved"]
    store.recover(min_age_s=0)
    assert [m.text for m in store.load(c.id).messages] == ["saved", "only in the temp file"]
