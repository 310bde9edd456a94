"""A thinking model's side of a reply: the collapsed "Thinking" section above the answer, and the
per-conversation toggle that turns thinking on or off (the chat template's enable_thinking).

The section is closed unless opened; open, it streams the thinking as it arrives (only the new
characters are inserted). Its header counts the thinking tokens. The toggle shows the model's own
default until the conversation picks one, and hides for a model without the switch.
"""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QFrame, QToolButton, QVBoxLayout, QWidget

from .text_view import TextView


class ThinkingSection(QFrame):
    toggled = Signal(bool)  # opened or closed by the user

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="thinking")
        self.text = ""
        self.tokens = 0
        self.live = False
        self.header = QToolButton(objectName="thinkingHeader", checkable=True,
                                  toolTip="Show or hide what the model thought before it answered")
        self.header.setCursor(Qt.CursorShape.PointingHandCursor)
        self.header.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        self.header.toggled.connect(self._toggled)
        self.view = TextView()
        self.view.setViewportMargins(10, 2, 4, 4)
        self.view.hide()
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.header, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.view)
        self._update_header()

    @property
    def is_open(self) -> bool:
        return self.header.isChecked()

    def set_open(self, open_: bool) -> None:
        self.header.setChecked(open_)

    def append(self, text: str, tokens: int) -> None:
        """More thinking of a reply being written; an open section shows it at once."""
        self.text += text
        self.tokens = tokens
        if self.is_open:
            self.view.sync_tail(self.text)
        self._update_header()

    def set_live(self, live: bool) -> None:
        """Thinking still arrives (the header says so, the open view shows the live glyph)."""
        self.live = live
        self.view.set_live(live and self.is_open)
        self._update_header()

    def set_final(self, text: str, tokens: int | None) -> None:
        self.text, self.tokens, self.live = text, tokens or 0, False
        self.view.set_live(False)
        self.view.set_plain(text)
        self._update_header()

    def _toggled(self, open_: bool) -> None:
        if open_:
            self.view.set_plain(self.text)
            self.view.set_live(self.live)
        self.view.setVisible(open_)
        self._update_header()
        self.toggled.emit(open_)

    def _update_header(self) -> None:
        arrow = "▾" if self.is_open else "▸"
        what = "Thinking…" if self.live else "Thinking"
        count = f"  ·  {self.tokens} token{'s' if self.tokens != 1 else ''}" if self.tokens else ""
        self.header.setText(f"{arrow} {what}{count}")


class ThinkingToggle(QToolButton):
    """On/off for this conversation's thinking; `changed(value)` with the conversation's new choice."""
    changed = Signal(bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="messageAction", checkable=True)
        self.setCursor(Qt.CursorShape.PointingHandCursor)
        self._default: bool | None = None
        self.clicked.connect(lambda on: self.changed.emit(on))
        self.toggled.connect(lambda _on: self._label())
        self.hide()

    def show_for(self, model_default: bool | None, chosen: bool | None) -> None:
        """The model's default (None: it has no switch, and the toggle hides) and this conversation's
        choice (None: it follows the model)."""
        self._default = model_default
        self.setVisible(model_default is not None)
        self.blockSignals(True)
        self.setChecked(bool(model_default if chosen is None else chosen))
        self.blockSignals(False)
        self._label()

    def _label(self) -> None:
        on = self.isChecked()
        self.setText(f"Thinking: {'on' if on else 'off'}")
        default = "on" if self._default else "off"
        self.setToolTip(f"Let the model think before it answers in this conversation (the model's default: {default})")
