"""Search: hits in titles and messages, the list filtered as the user types (Ctrl+K), the hit
marked in the conversation it opens, and pins keeping conversations on top."""
import json

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from test_app_window import launch, settings_for  # noqa: F401 - the window fixture

from app.conversation import Conversation, Message
from app.history import HistoryPanel
from app.search import find, highlight, snippet
from app.text_view import TextView


def conv(title, *texts):
    c = Conversation(title=title)
    for i, t in enumerate(texts):
        c.add(Message("user" if i % 2 == 0 else "assistant", t))
    return c


def test_find_takes_the_newest_message_then_the_title_in_any_case():
    c = conv("Kernels", "What is a warp?", "A warp is 32 threads.", "And a WARP scheduler?")
    assert find(c, "warp").index == 2
    assert find(c, "threads").snippet == "A warp is 32 threads."
    long = "x " * 40 + "the\nhit   is here"
    assert snippet(long, long.index("hit")).startswith("…") and snippet(long, long.index("hit")).endswith("hit is here")
    assert find(c, "kernels").index is None and find(c, "nowhere") is None and find(c, "  ") is None
    assert snippet("short", 0) == "short"


def test_find_reaches_the_other_branches_after_the_one_shown():
    from app import branches
    c = conv("Math", "add two numbers", "def add(a, b)", "now multiply", "def mul(a, b)")
    branches.set_aside(c, 0)
    c.add(Message("user", "subtract two numbers"))
    c.add(Message("assistant", "def sub(a, b)"))
    assert find(c, "def").index == 1 and find(c, "def").hidden is None  # the branch shown first
    hit = find(c, "MULTIPLY")
    assert hit.index is None and hit.hidden.text == "now multiply" and hit.snippet == "now multiply"


def test_highlight_marks_every_occurrence_and_clears(qtbot):
    view = TextView()
    qtbot.addWidget(view)
    view.set_plain("one Two two TWO")
    assert highlight([view], "two", QColor("yellow")) == 3
    assert len(view.extraSelections()) == 3
    assert highlight([view], "", QColor("yellow")) == 0 and view.extraSelections() == []


def test_typing_filters_the_list_and_pins_stay_on_top(qtbot):
    panel = HistoryPanel()
    qtbot.addWidget(panel)
    a, b, c = conv("Alpha", "about paging"), conv("Beta", "about fp8"), conv("Gamma", "nothing")
    c.pinned = True
    panel.set_conversations([a, b, c], set())
    assert panel.ids()[0] == c.id  # pinned, though the oldest
    qtbot.keyClicks(panel.search, "ABOUT")
    assert panel.shown_ids() == [a.id, b.id]
    qtbot.keyClicks(panel.search, " fp")
    assert panel.shown_ids() == [b.id]
    with qtbot.waitSignal(panel.search_opened) as opened:
        qtbot.keyClick(panel.search, Qt.Key.Key_Return)
    assert opened.args == [b.id, "ABOUT fp"]
    panel.search.clear()
    assert panel.shown_ids() == panel.ids()
    a.title = "Alpha, newer"
    panel.upsert(a, False)
    assert panel.ids() == [c.id, a.id, b.id]  # a used conversation goes on top of the unpinned


def test_ctrl_k_searches_opens_and_marks_the_hit_in_an_old_message(qtbot, launch, app_home):  # noqa: F811
    window = launch(start_engine=False)
    long = Conversation(title="A long one")
    for i in range(60):
        long.add(Message("user" if i % 2 == 0 else "assistant", "needle here" if i == 3 else f"filler {i}"))
    window.store.save(long)
    window.store.save(conv("Other", "hay"))
    window.history.set_conversations(window.store.load_all()[0], set())
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=2000)
    qtbot.keyClick(window.current_tab().composer.edit, Qt.Key.Key_K, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(window.history.search.hasFocus, timeout=2000)
    qtbot.keyClicks(window.history.search, "Needle")
    assert window.history.shown_ids() == [long.id]
    qtbot.keyClick(window.history.search, Qt.Key.Key_Return)
    tab = window.current_tab()
    assert tab.conversation.id == long.id
    widget = tab.view.widget_for(3)  # built, although far above the last messages
    assert widget is not None and len(widget.text_views()[0].extraSelections()) == 1
    bar = tab.view.verticalScrollBar()
    qtbot.waitUntil(lambda: 0 < bar.maximum() and abs(widget.y() - bar.value() - 24) < 30, timeout=3000)
    window.history.search.selectAll()  # the user empties the search box: the marks go with it
    qtbot.keyClick(window.history.search, Qt.Key.Key_Delete)
    assert window.history.search.text() == "" and widget.text_views()[0].extraSelections() == []


def test_a_hit_in_another_branch_opens_with_that_branch_shown_and_marked(qtbot, launch, app_home):  # noqa: F811
    from app import branches
    window = launch(start_engine=False)
    c = conv("Math", "add two numbers", "def add(a, b)", "now multiply", "def mul(a, b)")
    branches.set_aside(c, 0)  # the first question edited: the multiply turn is on the old branch
    c.add(Message("user", "subtract two numbers"))
    c.add(Message("assistant", "def sub(a, b)"))
    window.store.save(c)
    window.history.set_conversations(window.store.load_all()[0], set())
    qtbot.keyClicks(window.history.search, "multiply")
    assert window.history.shown_ids() == [c.id]
    qtbot.keyClick(window.history.search, Qt.Key.Key_Return)
    tab = window.current_tab()
    assert [m.text for m in tab.conversation.messages] == ["add two numbers", "def add(a, b)", "now multiply",
                                                          "def mul(a, b)"]
    widget = tab.view.widget_for(2)
    assert widget is not None and len(widget.text_views()[0].extraSelections()) == 1
    assert tab.view.widget_for(0).branch.label.text() == "1/2"  # the edited question is still ‹ 2 ›
    tab.saver.flush()
    assert json.loads(window.store.path(c.id).read_text())["messages"][2]["text"] == "now multiply"


def test_pin_from_the_menu_is_saved(qtbot, launch, app_home):  # noqa: F811
    window = launch(start_engine=False)
    old, new = conv("Old", "x"), conv("New", "y")
    for c in (old, new):
        window.store.save(c)
    window.history.set_conversations([new, old], set())
    window.pin_conversation(old.id, True)
    window.saver.flush()
    assert window.history.ids()[0] == old.id
    assert json.loads(window.store.path(old.id).read_text())["pinned"] is True
    window.open_conversation(new.id)
    window.pin_conversation(new.id, True)
    window.saver.flush()
    assert window.store.load(new.id).pinned and window.history.ids()[0] == new.id
