"""Attached files as chips: name and size, the first lines in the tooltip; in the composer each
has a × that takes it off the message before it is sent."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QToolButton, QWidget

from .attachments import Attachment

PREVIEW_LINES = 12
NAME_CHARS = 40  # a longer name is cut on its chip (the tooltip has it whole)


class Chip(QFrame):
    def __init__(self, attachment: Attachment, removable: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="chip")
        lines = attachment.text.splitlines()
        preview = "\n".join(lines[:PREVIEW_LINES]) + ("\n…" if len(lines) > PREVIEW_LINES else "")
        self.setToolTip(f"{attachment.name}\n\n{preview}")
        row = QHBoxLayout(self)
        row.setContentsMargins(8, 2, 2 if removable else 8, 2)
        row.setSpacing(6)
        name = attachment.name if len(attachment.name) <= NAME_CHARS else attachment.name[:NAME_CHARS - 1] + "…"
        self.name = QLabel(name)
        row.addWidget(self.name)
        row.addWidget(QLabel(attachment.size, objectName="meta"))
        self.remove: QToolButton | None = None
        if removable:
            self.remove = QToolButton(text="×", objectName="messageAction",
                                      toolTip=f"Take {attachment.name} off this message")
            self.remove.setCursor(Qt.CursorShape.PointingHandCursor)
            row.addWidget(self.remove)


class ChipRow(QWidget):
    removed = Signal(int)  # the index of the chip whose × was clicked

    def __init__(self, removable: bool, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._removable = removable
        self.chips: list[Chip] = []
        self._row = QHBoxLayout(self)
        self._row.setContentsMargins(0, 0, 0, 0)
        self._row.setSpacing(6)
        self._row.addStretch(1)
        self.hide()

    def set_attachments(self, files: list[Attachment]) -> None:
        for chip in self.chips:
            self._row.removeWidget(chip)
            chip.deleteLater()
        self.chips = [Chip(a, self._removable) for a in files]
        for i, chip in enumerate(self.chips):
            self._row.insertWidget(i, chip)
            if chip.remove is not None:
                chip.remove.clicked.connect(lambda _=False, i=i: self.removed.emit(i))
        self.setVisible(bool(files))
