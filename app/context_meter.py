"""How full a conversation's context is (tokens of the last reply's prompt and answer, of the
context the engine runs; while a reply streams, its prompt and the tokens so far), a warning
before it is full, and what happens when it is: refuse with a clear message, or leave the oldest
turns out of the prompt (and say so on the reply); and how much a file attached to the next
message may take."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QHBoxLayout, QLabel, QWidget

from . import theme
from .attachments import CHARS_PER_TOKEN, Attachment
from .conversation import Conversation

WARN_AT = 0.8  # of the context: the meter warns from here
REPLY_SHARE = 4  # files leave the reply at least this share (1/4) of the context, or its max tokens
AT_LIMIT = {"refuse": "Refuse", "drop": "Drop oldest turns"}


def used_tokens(conv: Conversation) -> int | None:
    """Tokens the conversation took at its last reply (prompt and answer; so far, for a reply being
    written); None before any."""
    last = next((m for m in reversed(conv.messages) if m.role == "assistant" and m.prompt_tokens), None)
    return last.prompt_tokens + (last.tokens or 0) if last is not None else None


def drop_turn(conv: Conversation, left_out: int) -> int | None:
    """With "drop oldest turns" chosen: where the prompt of the reply being written (the last
    message) starts once one more turn is left out than `left_out`; None when the user chose to
    refuse, or only the last question is left."""
    path = conv.messages[:-1]  # the history before this reply
    last_user = max((i for i, x in enumerate(path) if x.role == "user"), default=0)
    start = next((i for i in range(left_out + 1, last_user + 1) if path[i].role == "user"), None)
    return start if conv.at_limit == "drop" else None


def refused(conv: Conversation, refusal: str) -> str:
    """The engine's refusal of a prompt too long for the context, with what the user can do."""
    hint = ("even the last message alone is too long; shorten it or raise the context in Settings"
            if conv.at_limit == "drop" else "choose “When full: drop oldest turns” above to continue")
    return f"{refusal[:1].upper()}{refusal[1:]} ({hint})."


def room_for_files(conv: Conversation, context: int | None, max_tokens: int, pending: list[Attachment]) -> int | None:
    """Tokens a file attached now may take: the context less what the conversation used at its
    last reply, the files already attached to the draft and room for the reply; None when the
    engine does not say its context (a remote one)."""
    if not context:
        return None
    taken = (used_tokens(conv) or 0) + sum(a.tokens if a.tokens is not None else len(a.text) // CHARS_PER_TOKEN
                                           for a in pending)
    return context - taken - min(max_tokens, context // REPLY_SHARE)


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

    def show_for(self, conv: Conversation, context: int | None, streaming: bool = False) -> None:
        """`streaming`: a reply is being written, and its tokens so far are counted."""
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
        when = "with the reply so far" if streaming else "after the last reply"
        self.label.setToolTip(f"{share:.0%} of the context this engine runs, {when}")
        theme.restyle(self.label, "error" if share >= WARN_AT else "meta")
