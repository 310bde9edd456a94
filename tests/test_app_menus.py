"""The menu bar: its menus, shortcuts that never clash, the theme's exclusive choice."""
from collections import Counter

from fake_engine import _stop_fake_engines, fake_window  # noqa: F401 - the fixture applies here
from PySide6.QtGui import QAction

from app.help_dialogs import plain


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
