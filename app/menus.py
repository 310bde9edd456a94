"""The window's menu bar: File, Conversation, View (with the theme) and Help. Every command of the
window is an action here, with its shortcuts; Help → Keyboard shortcuts lists them from these
actions, so the list cannot go stale."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QApplication, QMenu

from . import theme
from .chat_tab import ChatTab
from .help_dialogs import AboutDialog, ShortcutsDialog
from .model_menu import RecentModelsMenu

if TYPE_CHECKING:
    from .window import MainWindow

THEME_NAMES = {theme.SYSTEM: "&System", theme.LIGHT: "&Light", theme.DARK: "&Dark"}


def add_action(menu: QMenu, text: str, slot: Callable[[], object],
               *shortcuts: QKeySequence.StandardKey | str) -> QAction:
    action = menu.addAction(text)
    action.triggered.connect(lambda _checked=False: slot())
    keys: list[QKeySequence] = []
    for key in shortcuts:
        # A standard key has several bindings (Close: Ctrl+W and Ctrl+F4); keep them all.
        keys += QKeySequence.keyBindings(key) if isinstance(key, QKeySequence.StandardKey) else [QKeySequence(key)]
    action.setShortcuts(keys)
    return action


class Menus:
    """The menu bar of `window`; `sidebar` and `themes` are the actions that show a state."""

    def __init__(self, window: MainWindow) -> None:
        self.window = w = window
        bar = w.menuBar()
        m = bar.addMenu("&File")
        add_action(m, "&New tab", w.new_tab, QKeySequence.StandardKey.AddTab)
        add_action(m, "&Close tab", lambda: w.close_tab(w.current_tab()), QKeySequence.StandardKey.Close)
        m.addSeparator()
        add_action(m, "&Export conversation…",
                   lambda: w.on_tab(lambda tab: w.transfers.export_one(tab.conversation.id)), "Ctrl+Shift+E")
        add_action(m, "Export &all conversations…", w.transfers.export_all)
        add_action(m, "&Import conversations…", w.transfers.import_files, "Ctrl+O")
        m.addSeparator()
        add_action(m, "&Settings…", w.open_settings, "Ctrl+,")
        add_action(m, "&Models…", w.open_models, "Ctrl+Shift+M")
        m.addMenu(RecentModelsMenu(w.open_model, w))
        add_action(m, "E&ngines and server…", w.open_engines, "Ctrl+Shift+,")
        m.addSeparator()
        add_action(m, "&Quit", w.close, "Ctrl+Q")

        m = bar.addMenu("&Conversation")
        add_action(m, "&Stop reply or cancel edit", lambda: w.on_tab(ChatTab.escape), "Esc")
        add_action(m, "&Regenerate last reply", lambda: w.on_tab(ChatTab.regenerate), "Ctrl+R")
        add_action(m, "&Edit last message", lambda: w.on_tab(ChatTab.edit_last), "Ctrl+E")
        add_action(m, "Con&tinue last reply", lambda: w.on_tab(ChatTab.continue_reply), "Ctrl+Shift+Return")
        add_action(m, "Copy last &reply", w.copy_last_reply, "Ctrl+Shift+C")
        add_action(m, "&Attach files…", lambda: w.on_tab(lambda tab: tab.composer.pick_files()), "Ctrl+U")
        m.addSeparator()
        add_action(m, "System &prompt", lambda: w.on_tab(lambda tab: tab.system_toggle.toggle()), "Ctrl+Shift+P")
        add_action(m, "This conversation's own sa&mpling",
                   lambda: w.on_tab(lambda tab: tab.sampling_panel.toggle.toggle()), "Ctrl+Shift+S")
        add_action(m, "Re&name tab", lambda: w.tabs.start_rename(w.tabs.currentIndex()), "F2")
        add_action(m, "&Focus message box", lambda: w.on_tab(lambda tab: tab.composer.edit.setFocus()), "Ctrl+L")

        m = bar.addMenu("&View")
        self.sidebar = add_action(m, "&Conversation list", w.toggle_sidebar, "Ctrl+B")
        self.sidebar.setCheckable(True)
        self.sidebar.setChecked(True)
        add_action(m, "&Search conversations", w.search, "Ctrl+K", "Ctrl+F")
        add_action(m, "&Next tab", lambda: w.cycle(1), "Ctrl+Tab", "Ctrl+PgDown")
        # Qt matches Ctrl+Shift+Tab presses (which arrive as Backtab) to this, and shows it readably.
        add_action(m, "&Previous tab", lambda: w.cycle(-1), "Ctrl+Shift+Tab", "Ctrl+PgUp")
        m.addSeparator()
        self.theme_menu = m.addMenu("&Theme")
        group = QActionGroup(self.theme_menu, exclusive=True)
        chosen = theme.load_choice()
        self.themes: dict[str, QAction] = {}
        for choice, name in THEME_NAMES.items():
            action = add_action(self.theme_menu, name, lambda choice=choice: self.choose_theme(choice))
            action.setCheckable(True)
            action.setChecked(choice == chosen)
            group.addAction(action)
            self.themes[choice] = action

        m = bar.addMenu("&Help")
        add_action(m, "&Keyboard shortcuts", self.show_shortcuts, "Ctrl+/")
        add_action(m, "&About Lanechat", self.show_about)

    def choose_theme(self, choice: str) -> None:
        """The user's pick in View → Theme: applied at once and kept for the next start."""
        theme.choose(QApplication.instance(), choice)
        self.themes[choice].setChecked(True)

    def show_shortcuts(self) -> ShortcutsDialog:
        dialog = ShortcutsDialog(self.window)
        dialog.show()
        return dialog

    def show_about(self) -> AboutDialog:
        w = self.window
        dialog = AboutDialog(w.bridge, w.settings, w.store.root.parent, w)
        dialog.show()
        return dialog
