"""Background writes: the newest version of a file always wins, `now` is never overtaken by an
older write, failures are reported, and background writes leave the caller's thread."""
import threading
import time

from app.saver import Saver


def test_later_runs_on_another_thread_and_flush_waits(tmp_path):
    saver, ran = Saver(), []
    saver.later("a", lambda: ran.append(threading.current_thread() is threading.main_thread()))
    saver.flush()
    assert ran == [False]


def test_the_newest_write_of_a_key_wins_and_queued_ones_coalesce(tmp_path):
    saver, written = Saver(), []
    gate = threading.Event()
    saver.later("slow", gate.wait)  # keeps the worker busy while the others queue up
    for i in range(5):
        saver.later("a", lambda i=i: written.append(i))
    gate.set()
    saver.flush()
    assert written == [4]


def test_now_is_never_overtaken_by_an_older_write(tmp_path):
    saver, file = Saver(), []
    started, gate = threading.Event(), threading.Event()

    def old_write():
        started.set()
        gate.wait()
        file.append("old")
    saver.later("b", lambda: (started.set(), gate.wait()))  # worker busy with another key
    started.wait(5)
    saver.later("a", old_write)  # queued behind it
    threading.Timer(0.1, gate.set).start()
    saver.now("a", lambda: file.append("new"))  # the newest, written on this thread
    saver.flush()
    assert file == ["new"]  # the older queued write was dropped, not run after it


def test_an_older_write_the_worker_already_took_never_lands_after_now(tmp_path):
    saver, file = Saver(), []
    in_lock, gate = threading.Event(), threading.Event()
    holder = threading.Thread(target=saver.now, args=("z", lambda: (in_lock.set(), gate.wait())))
    holder.start()  # holds the one write slot
    in_lock.wait(5)
    saver.later("a", lambda: file.append("old"))
    time.sleep(0.2)  # the worker takes it and waits for the slot
    newer = threading.Thread(target=saver.now, args=("a", lambda: file.append("new")))
    newer.start()  # also waits for the slot
    time.sleep(0.1)
    gate.set()
    for t in (holder, newer):
        t.join(5)
    saver.flush()
    assert file[-1] == "new"  # whoever got the slot first, the older content never wins


def test_failures_are_reported_and_the_worker_carries_on(tmp_path):
    saver, ran = Saver(), []

    def boom():
        raise OSError("disk full")
    saver.later("a", boom)
    saver.later("b", lambda: ran.append("b"))
    saver.flush()
    assert ran == ["b"] and saver.errors() == ["a: disk full"] and saver.errors() == []
