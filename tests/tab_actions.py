"""What a person does to a chat tab in the tab tests: show it, click a button, send a message and
wait for the reply."""
from PySide6.QtCore import Qt


def shown(qtbot, tab, width: int = 900, height: int = 700):
    qtbot.addWidget(tab)
    tab.resize(width, height)
    tab.show()
    qtbot.waitExposed(tab)
    return tab


def click(qtbot, button) -> None:
    assert button.isVisible() and button.isEnabled()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def ask(qtbot, tab, text: str, timeout_ms: int = 20000) -> None:
    tab.composer.set_text(text)
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not tab.generating, timeout=timeout_ms)
