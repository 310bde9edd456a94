"""A conversation's system prompt: the toggle that says whether one is set and opens the editor,
the editor, and the presets saved prompts (and sampling) come from (app/prompt_presets.py)."""
from __future__ import annotations

from PySide6.QtWidgets import QPlainTextEdit, QToolButton, QWidget

from .conversation import Conversation
from .prompt_presets import Preset, PresetButton
from .wrap_guard import WrapGuard


class SystemPrompt:
    """The widgets; the text goes into `conversation.system_prompt` as it is typed."""

    def __init__(self, conversation: Conversation, parent: QWidget | None = None) -> None:
        self.conversation = conversation
        self.toggle = QToolButton(parent, checkable=True, objectName="messageAction",
                                  toolTip="How the assistant should behave in this conversation")
        self.edit = QPlainTextEdit(
            parent, placeholderText="System prompt for this conversation, e.g. “Answer briefly, in English.”")
        WrapGuard(self.edit)
        self.edit.setPlainText(conversation.system_prompt)
        self.edit.setTabChangesFocus(True)
        self.edit.setFixedHeight(self.edit.fontMetrics().lineSpacing() * 3 + 16)
        shown = bool(conversation.system_prompt)
        self.edit.setVisible(shown)
        self.toggle.setChecked(shown)
        self.presets = PresetButton(lambda: (self.conversation.system_prompt, self.conversation.sampling), parent)
        self.presets.picked.connect(self._picked)
        self.presets.setVisible(shown)
        self.toggle.toggled.connect(self._toggled)
        self.edit.textChanged.connect(self._changed)
        self._label()

    def _toggled(self, on: bool) -> None:
        self.edit.setVisible(on)
        self.presets.setVisible(on)
        self._label()
        if on:
            self.edit.setFocus()

    def _picked(self, preset: Preset) -> None:
        """A preset's prompt replaces this one (a preset of sampling alone leaves it; the tab
        takes its sampling)."""
        if preset.text:
            self.edit.setPlainText(preset.text)

    def _changed(self) -> None:
        self.conversation.system_prompt = self.edit.toPlainText()
        self._label()

    def _label(self) -> None:
        state = "set" if self.conversation.system_prompt.strip() else "none"
        self.toggle.setText(f"System prompt: {state}  {'▴' if self.toggle.isChecked() else '▾'}")
