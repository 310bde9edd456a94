"""How full a conversation's context is (tokens of the last reply's prompt and answer, of the
context the engine runs), a warning before it is full, and what happens when it is: refuse with
a clear message, or leave the oldest turns out of the prompt (and say so on the reply)."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QWidget

from . import theme
from .conversation import Conversation

WARN_AT = 0.8  # of the context: the meter warns from here
AT_LIMIT = {"refuse": "Refuse", "drop": "Drop oldest turns"}


def used_tokens(conv: Conversation) -> int | None:
    """Tokens the conversation took at its last reply (prompt and answer); None before any."""
    last = next((m for m in reversed(conv.messages) if m.role == "assistant" and m.prompt_tokens), None)
    return last.prompt_tokens + (last.tokens or 0) if last is not None else None


class ContextMeter(QWidget):
    at_limit_changed = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel(objectName="meta")
        self.choice = QComboBox(toolTip="What happens when the conversation no longer fits the context")
        for key, text in AT_LIMIT.items():
            self.choice.addItem(f"When full: {text.lower()}", key)
        self.choice.activated.connect(lambda i: self.at_limit_changed.emit(self.choice.itemData(i)))
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label)
        layout.addWidget(self.choice)

    def show_for(self, conv: Conversation, context: int | None) -> None:
        self.choice.setCurrentIndex(max(self.choice.findData(conv.at_limit), 0))
        used = used_tokens(conv)
        if not context:
            self.label.setText("")
            return
        share = (used or 0) / context
        text = f"Context {used or 0:,} / {context:,} tokens"
        if share >= 1:
            text += " · full"
        elif share >= WARN_AT:
            text += " · nearly full"
        self.label.setText(text)
        self.label.setToolTip(f"{share:.0%} of the context this engine runs, after the last reply")
        theme.restyle(self.label, "error" if share >= WARN_AT else "meta")
