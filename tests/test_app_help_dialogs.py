"""Help → Keyboard shortcuts lists every action's keys, read from the actions themselves; Help →
About says what runs here and opens the data folder."""
from importlib import metadata

from fake_engine import _stop_fake_engines, fake_window  # noqa: F401 - the fixture applies here
from PySide6.QtCore import QObject, Qt, QUrl, Slot
from PySide6.QtGui import QAction, QDesktopServices, QKeySequence
from test_app_menus import menu_action

from app.help_dialogs import OTHER, AboutDialog, ShortcutsDialog, key_name, keys_text, plain


def test_the_shortcuts_dialog_lists_every_action_that_has_keys(qtbot, app_home):
    window = fake_window(qtbot)
    extra = QAction("Jump somewhere", window, shortcut="Ctrl+Alt+J")  # an action outside the menus
    window.addAction(extra)
    menu_action(window, "Help", "Keyboard shortcuts").trigger()
    [dialog] = window.findChildren(ShortcutsDialog)
    rows = dialog.rows()
    listed = {(command, keys) for _menu, command, keys in rows}
    with_keys = [a for a in window.findChildren(QAction) if a.shortcuts() and a.text()]
    assert len(with_keys) >= 20
    for action in with_keys:
        assert (plain(action.text()), keys_text(action)) in listed, action.text()
    assert len(rows) == len(with_keys)  # and nothing else
    assert ("Conversation", "Regenerate last reply", "Ctrl+R") in rows
    close = next(keys for menu, command, keys in rows if (menu, command) == ("File", "Close tab"))
    bindings = QKeySequence.keyBindings(QKeySequence.StandardKey.Close)  # the platform's, all of them
    assert close.split(" or ") == [key_name(k) for k in bindings] and "Ctrl+W" in close.split(" or ")
    assert ("File", "Export conversation", "Ctrl+Shift+E") in rows
    assert ("Help", "Keyboard shortcuts", "Ctrl+/") in rows
    assert (OTHER, "Jump somewhere", "Ctrl+Alt+J") == rows[-1]
    dialog.filter.setText("next TAB")
    assert dialog.rows() == [("View", "Next tab", "Ctrl+Tab or Ctrl+PgDown")]
    dialog.close()


def test_each_shortcut_reads_as_keys_to_press_and_alternatives_as_such(qtbot, app_home):
    # A comma is how Qt writes keys pressed in turn, and a keyboard's own Close key read as the
    # command itself ("Ctrl+W, Close"): alternatives are joined by "or", such a key is named one.
    window = fake_window(qtbot)
    menu_action(window, "Help", "Keyboard shortcuts").trigger()
    [dialog] = window.findChildren(ShortcutsDialog)
    keys = {command: keys for _menu, command, keys in dialog.rows()}
    assert "Ctrl+W" in keys["Close tab"].split(" or ") and "Ctrl+F4" in keys["Close tab"].split(" or ")
    assert not any("," in k.replace("+,", "+") for k in keys.values()), keys
    assert keys["Next tab"] == "Ctrl+Tab or Ctrl+PgDown" and keys["Settings"] == "Ctrl+,"
    assert key_name(QKeySequence(Qt.Key.Key_Close)) == "Close key" and key_name(QKeySequence("Esc")) == "Esc"
    assert key_name(QKeySequence("Ctrl+Shift+M")) == "Ctrl+Shift+M" and key_name(QKeySequence("F1")) == "F1"
    dialog.close()


class _Opened(QObject):
    def __init__(self):
        super().__init__()
        self.urls = []

    @Slot(QUrl)
    def open(self, url):
        self.urls.append(url)


def test_about_says_what_runs_and_opens_the_data_folder(qtbot, app_home, run_async):
    window = fake_window(qtbot)
    menu_action(window, "Help", "About Lanechat").trigger()
    [dialog] = window.findChildren(AboutDialog)
    assert dialog.backend.text() == f"{window.settings.backend} (not running)"
    assert run_async(window.start_engine(), timeout=60)
    # It follows the engine: the model loaded while it was open shows.
    assert dialog.backend.text() == "numpy" and dialog.gpu.text() == "none: numpy runs on the CPU"
    assert dialog.model.text().startswith("fake-model\n")
    labels = {lbl.text() for lbl in dialog.findChildren(type(dialog.backend))}
    assert metadata.version("lanechat") in labels and str(app_home / "data") in labels
    qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)  # offscreen: no file manager to start
    assert dialog.open_note.isVisible()
    opened = _Opened()
    QDesktopServices.setUrlHandler("file", opened, "open")
    try:
        qtbot.mouseClick(dialog.open_button, Qt.MouseButton.LeftButton)
    finally:
        QDesktopServices.unsetUrlHandler("file")
    assert opened.urls == [QUrl.fromLocalFile(str(app_home / "data"))] and not dialog.open_note.isVisible()
    dialog.close()
