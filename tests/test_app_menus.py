"""The menu bar: its menus, shortcuts that never clash, the theme's exclusive choice, the
conversation's commands (Continue, Attach, its own sampling) from the menu."""
from collections import Counter

from fake_engine import _stop_fake_engines, fake_window  # noqa: F401 - the fixture applies here
from modal import answer_file_dialog
from PySide6.QtGui import QAction
from tab_actions import ask

from app.help_dialogs import plain
from engine import EngineSettings, SamplingParams


def menu_action(window, menu: str, text: str) -> QAction:
    """The item `text` of the menu bar's `menu`, found as a user reads them."""
    for top in window.menuBar().actions():
        if plain(top.text()) == menu:
            return next(a for a in top.menu().actions() if plain(a.text()) == text)
    raise LookupError(menu)


def test_menus_and_shortcuts_that_never_clash(qtbot, app_home):
    window = fake_window(qtbot)
    assert [plain(a.text()) for a in window.menuBar().actions()] == ["File", "Conversation", "View", "Help"]
    keys = Counter(k.toString() for a in window.findChildren(QAction) for k in a.shortcuts())
    assert keys and [k for k, n in keys.items() if n > 1] == []
    assert menu_action(window, "File", "Import conversations").shortcut().toString() == "Ctrl+O"


def test_the_theme_is_one_choice_of_three(qtbot, app_home):
    window = fake_window(qtbot)
    themes = menu_action(window, "View", "Theme").menu().actions()
    assert [plain(a.text()) for a in themes] == ["System", "Light", "Dark"]
    assert [a.isChecked() for a in themes] == [True, False, False]
    assert all(a.actionGroup() is themes[0].actionGroup() and a.actionGroup().isExclusive() for a in themes)


def test_continue_attach_and_the_conversations_sampling_from_the_menu(qtbot, app_home, run_async, tmp_path):
    window = fake_window(qtbot, n=3)
    run_async(window.bridge.start(EngineSettings(sampling=SamplingParams(max_tokens=3))))
    tab = window.current_tab()
    ask(qtbot, tab, "Go on")
    reply = tab.conversation.messages[-1]
    assert reply.finish_reason == "length" and reply.text == "xxx"
    go_on = menu_action(window, "Conversation", "Continue last reply")
    assert go_on.shortcut().toString() == "Ctrl+Shift+Return"
    go_on.trigger()
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    assert tab.conversation.messages[-1] is reply and reply.text == "xxxxxx" and reply.tokens == 6

    sampling = menu_action(window, "Conversation", "This conversation's own sampling")
    sampling.trigger()
    assert tab.sampling_panel.isVisible()
    sampling.trigger()
    assert not tab.sampling_panel.isVisible()

    (tmp_path / "notes.txt").write_text("read me\n")
    answer_file_dialog(str(tmp_path / "notes.txt"))
    menu_action(window, "Conversation", "Attach files").trigger()
    assert [a.name for a in tab.composer.attachments] == ["notes.txt"]
