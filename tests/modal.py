"""Answering a modal dialog from a test: its exec() blocks the test until someone closes it."""
from typing import Callable

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QDialog, QFileDialog, QLineEdit


def when_modal(kind: type, act: Callable[[QDialog], None]) -> None:
    """Once a modal dialog of `kind` is up, run act(dialog) on it."""
    def look() -> None:
        dialog = QApplication.activeModalWidget()
        if isinstance(dialog, kind):
            act(dialog)
        else:
            QTimer.singleShot(50, look)
    QTimer.singleShot(50, look)


def answer_file_dialog(path: str, seen: list | None = None) -> None:
    """Type `path` into the next file dialog's name box and accept it, as a user would; `seen`
    gets the (folder, name) the dialog offered first."""
    def answer(dialog: QFileDialog) -> None:
        name = dialog.findChild(QLineEdit, "fileNameEdit")
        if seen is not None:
            seen.append((dialog.directory().absolutePath(), name.text()))
        name.setText(path)
        dialog.accept()
    when_modal(QFileDialog, answer)
