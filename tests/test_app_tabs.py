"""The tab strip: rename in place (Enter keeps, Esc cancels), state dots, new tab on empty strip."""
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QTabBar, QToolButton

from app.chat_tab import ChatTab
from app.conversation import Conversation
from app.engine_bridge import EngineBridge
from app.reply import GENERATING
from app.store import ConversationStore
from app.tabs import ConversationTabs


def make(qtbot, tmp_path, titles=("one", "two")):
    tabs = ConversationTabs()
    qtbot.addWidget(tabs)
    store, bridge = ConversationStore(tmp_path / "c"), EngineBridge()
    for title in titles:
        tabs.add(ChatTab(Conversation(title=title), store, bridge))
    tabs.show()
    return tabs


def test_rename_enter_keeps_escape_cancels(qtbot, tmp_path):
    tabs = make(qtbot, tmp_path)
    tabs.start_rename(0)
    tabs._editor.setText("first")
    qtbot.keyClick(tabs._editor, Qt.Key.Key_Return)
    assert tabs.tabText(0) == "first" and tabs.widget(0).conversation.title == "first"
    tabs.start_rename(1)
    tabs._editor.setText("nope")
    qtbot.keyClick(tabs._editor, Qt.Key.Key_Escape)
    assert tabs.tabText(1) == "two" and tabs._editor is None


def test_double_click_on_the_empty_strip_asks_for_a_new_tab(qtbot, tmp_path):
    tabs = make(qtbot, tmp_path)
    with qtbot.waitSignal(tabs.new_tab_requested):
        tabs.tabBarDoubleClicked.emit(-1)


def test_state_shows_as_an_icon_and_long_titles_stay_narrow(qtbot, tmp_path):
    tabs = make(qtbot, tmp_path)
    assert tabs.tabIcon(0).pixmap(12).toImage().pixelColor(6, 6).alpha() == 0
    tabs.widget(0).set_state(GENERATING)
    assert tabs.tabIcon(0).pixmap(12).toImage().pixelColor(6, 6).alpha() == 255
    tabs.widget(1).rename("a very long title " * 10)
    assert tabs.tabBar().tabSizeHint(1).width() <= 240


def test_many_tabs_scroll_instead_of_shrinking(qtbot, tmp_path):
    tabs = make(qtbot, tmp_path, [f"Name of chat {i}" for i in range(9)])
    tabs.resize(800, 400)
    qtbot.waitUntil(lambda: tabs.tabBar().width() > 0)
    bar = tabs.tabBar()
    widths = [bar.tabRect(i).width() for i in range(bar.count())]
    assert widths == [bar.tabSizeHint(i).width() for i in range(bar.count())]  # full labels, not "Nam…"
    assert sum(widths) > bar.width()
    arrows = [b for b in bar.findChildren(QToolButton) if b.isVisible()]
    assert len(arrows) == 2  # the strip scrolls
    tabs.setCurrentIndex(8)
    qtbot.waitUntil(lambda: bar.rect().contains(bar.tabRect(8).center()))  # the current tab is in view
    before = bar.tabRect(8).x()
    qtbot.mouseClick(arrows[0], Qt.MouseButton.LeftButton)  # a click on the left arrow scrolls back
    assert bar.tabRect(8).x() > before


def test_a_tabs_close_button_asks_to_close_it(qtbot, tmp_path):
    tabs = make(qtbot, tmp_path)
    close = tabs.tabBar().tabButton(1, QTabBar.ButtonPosition.RightSide)
    with qtbot.waitSignal(tabs.tabCloseRequested) as asked:
        qtbot.mouseClick(close, Qt.MouseButton.LeftButton)
    assert asked.args == [1]
