"""One tab = one conversation: history view, system prompt (and its presets), the conversation's
own sampling, composer (and the files attached to the message), and the reply in flight.

The conversation file is written before a request is sent (the user's words are never lost),
every couple of seconds while a reply streams (marked interrupted until it finishes, so a crash
keeps what arrived), when the reply ends, and when the tab closes or the app quits. Writes while
replies stream go through the Saver's thread, so an fsync never stalls the window.

Editing a user message keeps the old turn, on screen (faded) and on disk, until the edited one
is sent; Esc or Cancel gives the composer its draft back and changes nothing. Once sent, the old
message and what followed stay in the conversation's tree, as does a regenerated reply; ‹ › on
a message switches between them (app/branches.py). A reply cut short (stopped, or at its max
tokens) has Continue: the same message goes on (app/reply.py).
"""
from __future__ import annotations

import copy
import functools
from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QHBoxLayout, QVBoxLayout, QWidget

from engine import EngineInfo, EngineSettings, LanechatError, SamplingParams

from . import attachments, branches, context_meter, search, theme
from .attachments import Attachment
from .chat_view import ChatView, centered
from .composer import Composer, dropped_files
from .context_meter import ContextMeter
from .conversation import Conversation, Message, title_from
from .conversation_settings import SamplingPanel
from .engine_bridge import EngineBridge
from .engine_picker import EnginePicker
from .engines import EngineChoices, TabEngine
from .flow_layout import FlowLayout
from .message_view import MessageWidget
from .prompt_presets import Preset
from .reply import ERROR, IDLE, WAITING, Reply, can_continue, reply_sampling
from .saver import Saver
from .store import ConversationStore
from .system_prompt import SystemPrompt
from .thinking_view import ThinkingToggle


class ChatTab(QWidget):
    title_changed = Signal(str)
    state_changed = Signal(str)
    saved = Signal(object)  # the Conversation, after its write was handed to the saver
    engine_changed = Signal()
    add_remote_requested = Signal()
    fork_requested = Signal(object)  # a new Conversation to open in a tab

    def __init__(self, conversation: Conversation, store: ConversationStore, bridge: EngineBridge,
                 parent: QWidget | None = None, engines: EngineChoices | None = None,
                 saver: Saver | None = None) -> None:
        super().__init__(parent)
        self.conversation = conversation
        self.store = store
        self.engines = engines
        self.bridge: TabEngine = engines.get(conversation.engine) if engines is not None else bridge
        self.saver = saver or Saver()
        self.state = IDLE
        self.reply: Reply | None = None
        self._editing: int | None = None  # index of the user message being edited
        self._stashed_draft = ""  # the composer's draft from before the edit
        self._stashed_files: list[Attachment] = []  # ... and the files attached to it
        self.setAcceptDrops(True)  # a text or code file dropped on the conversation is attached

        self.system = SystemPrompt(conversation, self)
        self.system_toggle, self.system_edit = self.system.toggle, self.system.edit
        self.system.presets.picked.connect(self._preset_picked)
        self.sampling_panel = SamplingPanel()
        self.sampling_panel.changed.connect(self._sampling_chosen)
        inner = QWidget()
        bl = QVBoxLayout(inner)
        bl.setContentsMargins(0, 4, 0, 6)
        row = FlowLayout()  # wraps where the column is narrow: the meter's words are never cut
        row.addWidget(self.system_toggle)
        row.addWidget(self.sampling_panel.toggle)
        self.meter = ContextMeter()
        self.meter.at_limit_changed.connect(self._at_limit_chosen)
        row.addWidget(self.meter)
        self.thinking_toggle = ThinkingToggle()
        self.thinking_toggle.changed.connect(self._thinking_chosen)
        row.addWidget(self.thinking_toggle)
        self.engine_picker: EnginePicker | None = None
        if engines is not None:
            self.engine_picker = EnginePicker(engines, engines.id_of(self.bridge))
            self.engine_picker.picked.connect(self.set_engine)
            self.engine_picker.add_requested.connect(self.add_remote_requested)
            row.add_right(self.engine_picker)
        bl.addLayout(row)
        panels, prompt = QHBoxLayout(), QVBoxLayout()
        prompt.addWidget(self.system_edit)
        prompt.addWidget(self.system.presets, 0, Qt.AlignmentFlag.AlignLeft)
        prompt.addStretch()
        panels.addLayout(prompt, 1)
        panels.addWidget(self.sampling_panel, 0, Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        bl.addLayout(panels)
        bar = centered(inner, "systemPromptBar")

        self.view = ChatView()
        self.view.decorate = self._decorate
        self.view.edit_requested.connect(self.edit)
        self.view.regenerate_requested.connect(self.regenerate)
        self.view.branch_requested.connect(self.switch_branch)
        self.view.fork_requested.connect(self.fork)
        self.view.continue_requested.connect(self.continue_reply)
        self.composer = Composer()
        self.composer.set_text(conversation.draft)
        self.composer.set_attachments(conversation.draft_attachments)
        self.composer.read_file = self._read_file
        self.composer.send_requested.connect(self.send)
        self.composer.stop_requested.connect(self.stop)
        self.composer.edit_cancelled.connect(self.cancel_edit)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addWidget(bar)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.composer)
        self.setFocusProxy(self.composer.edit)
        self.view.set_messages(conversation.messages)
        self._update_actions()
        local = engines.local if engines is not None else bridge
        local.state_changed.connect(self.update_meter)
        local.state_changed.connect(self._update_sampling)
        self.update_meter()
        self._update_sampling()
        if engines is not None:
            engines.local.state_changed.connect(self.update_thinking_toggle)
        self.update_thinking_toggle()

    @property
    def title(self) -> str:
        return self.conversation.title or "New chat"

    @property
    def generating(self) -> bool:
        return self.reply is not None

    @property
    def editing(self) -> bool:
        return self._editing is not None

    # --- conversation actions ------------------------------------------------------------------

    def send(self, text: str) -> None:
        files = self.composer.attachments
        if self.generating or not (text.strip() or files):
            return
        conv = self.conversation
        self.composer.set_attachments([])
        if self._editing is not None:
            self._replace_edited(text, files)
        else:
            had_title = bool(conv.title)
            conv.add(Message("user", text, attachments=files))
            if not had_title:
                self.title_changed.emit(self.title)
        self.view.add(conv.messages[-1])
        self._generate()

    def regenerate(self) -> None:
        """Write the last reply again (or retry after a failure left the user's message last).
        The reply it replaces stays as an alternative; a failed one that wrote nothing goes."""
        msgs = self.conversation.messages
        if self.generating or self.editing or not msgs:
            return
        if msgs[-1].role == "assistant":
            if msgs[-1].text:
                branches.set_aside(self.conversation, len(msgs) - 1)
            else:
                msgs.pop()
            self.view.remove_from(len(msgs))
        if msgs and msgs[-1].role == "user":
            self._generate()

    def edit_last(self) -> None:
        """Edit the last user message."""
        msgs = self.conversation.messages
        last = next((m for m in reversed(msgs) if m.role == "user"), None)
        if last is not None:
            self.edit(last)

    def edit(self, message: Message) -> None:
        """Put a user message in the composer to change and send again. Nothing is removed until it
        is sent: the old turn stays (faded) and on disk; Esc or Cancel leaves it as it was. Sent, it
        starts a branch from there and the old one stays in the tree."""
        msgs = self.conversation.messages
        idx = next((i for i, m in enumerate(msgs) if m is message and m.role == "user"), None)
        if self.generating or idx is None:
            return
        if self._editing is not None:
            self._undim()
        if self._editing is None:
            self._stashed_draft, self._stashed_files = self.composer.text(), self.composer.attachments
        self._editing = idx
        for i in range(idx, len(msgs)):
            widget = self.view.widget_for(i)
            if widget is not None:
                widget.set_dimmed(True)
        self.composer.start_edit(msgs[idx].text)
        self.composer.set_attachments(msgs[idx].attachments)
        self.composer.edit.setFocus()
        self._update_actions()

    def cancel_edit(self) -> None:
        if self._editing is None:
            return
        self._undim()
        self._editing = None
        self.composer.end_edit(self._stashed_draft)
        self.composer.set_attachments(self._stashed_files)
        self._stashed_draft, self._stashed_files = "", []
        self._update_actions()

    def escape(self) -> None:
        """Esc: cancel an edit in progress, else stop the reply."""
        if self.editing:
            self.cancel_edit()
        else:
            self.stop()

    def stop(self) -> None:
        if self.reply is not None and self.reply.ticket is not None:
            self.bridge.cancel(self.reply.ticket)

    def set_engine(self, engine_id: str) -> None:
        """Let this computer or a remote engine write the next replies. The picker is disabled while
        a reply is written; a remote removed meanwhile stops that reply, which keeps its text."""
        if self.engines is None:
            return
        if self.generating:
            self.stop()
        self.bridge = self.engines.get(engine_id)
        self.conversation.engine = self.engines.id_of(self.bridge)
        self.update_meter()
        self._update_sampling()
        self.update_thinking_toggle()
        if self.engine_picker is not None:
            self.engine_picker.show_engine(self.conversation.engine)
        self.save()
        self.engine_changed.emit()

    def continue_reply(self, message: Message | None = None) -> None:
        """Go on writing the last reply (`message`, if given, must be it) where it stopped: at its
        max tokens, or stopped or interrupted; the new text joins the same message."""
        msgs = self.conversation.messages
        m = msgs[-1] if msgs else None
        if (self.generating or self.editing or m is None or (message is not None and message is not m)
                or not can_continue(m)):
            return
        widget = self.view.widget_for(len(msgs) - 1)
        if widget is None:
            return
        m.interrupted, m.error, m.finish_reason = True, None, None  # until it ends, as a new reply is
        self._start(Reply(self, m, widget, continuing=True), self.conversation.engine_messages(m.left_out))

    def switch_branch(self, message: Message, step: int) -> None:
        """Show the previous (-1) or next (+1) alternative of `message` and what follows it."""
        conv = self.conversation
        idx = next((i for i, m in enumerate(conv.messages) if m is message), None)
        if self.generating or self.editing or idx is None:
            return
        options = branches.siblings(conv, idx)
        place = options.index(message) + step
        if not 0 <= place < len(options):
            return
        branches.switch(conv, idx, options[place])
        self.view.remove_from(idx)
        for m in conv.messages[idx:]:
            self.view.add(m)
        self._update_actions()
        self.save()

    def find(self, query: str) -> int:
        """Scroll to the newest message holding `query` and mark it there; how many marks."""
        hit = search.find(self.conversation, query)
        index = hit.index if hit is not None else None
        if hit is not None and hit.hidden is not None and not self.generating:
            index = branches.reveal(self.conversation, hit.hidden)  # the branch that holds it, shown
            self.view.set_messages(self.conversation.messages)
            self._update_actions()
            self.save()
        widget = self.view.reveal(index) if index is not None else None
        if widget is None:
            return 0
        return search.highlight(widget.text_views(), query, theme.find_color(self.palette()))

    def clear_marks(self) -> None:
        """Take the search's marks off every message shown."""
        for widget in self.view.widgets:
            search.highlight(widget.text_views(), "", theme.find_color(self.palette()))

    def fork(self, message: Message) -> None:
        """Open the conversation up to `message` in a new tab, as a conversation of its own."""
        idx = next((i for i, m in enumerate(self.conversation.messages) if m is message), None)
        if idx is not None:
            self.fork_requested.emit(branches.fork(self.conversation, idx))

    def rename(self, title: str) -> None:
        title = title.strip()
        if title and title != self.conversation.title:
            self.conversation.title = title
            self.title_changed.emit(title)
            self.save()

    # --- the reply in flight ------------------------------------------------------------------

    def _replace_edited(self, text: str, files: list[Attachment]) -> None:
        """The edited message replaces the old one and what followed it; a title made from the old
        words follows the new ones (a title the user gave stays)."""
        conv, idx = self.conversation, self._editing
        assert idx is not None
        old = conv.messages[idx]
        first_user = next(i for i, m in enumerate(conv.messages) if m.role == "user")
        self._undim()
        self._editing = None
        self._stashed_draft, draft = "", self._stashed_draft
        self._stashed_files, draft_files = [], self._stashed_files
        branches.set_aside(conv, idx)
        self.view.remove_from(idx)
        conv.add(Message("user", text, attachments=files))
        self.composer.end_edit(draft)
        self.composer.set_attachments(draft_files)
        if idx == first_user and conv.title == title_from(old.text) and title_from(text) != conv.title:
            conv.title = title_from(text)
            self.title_changed.emit(self.title)

    def _generate(self) -> None:
        history = self.conversation.engine_messages()
        message = self.conversation.add(Message("assistant", "", interrupted=True))
        self._start(Reply(self, message, self.view.add(message)), history)

    def _start(self, reply: Reply, history: list[dict[str, str]]) -> None:
        conv = self.conversation
        if self.bridge.settings is not None:
            conv.settings = self.bridge.settings.to_dict()
        conv.touch()
        self.save()  # before generation: the user's message is on disk whatever happens next
        reply.widget.show_streaming()
        self.view.scroll_to_end()
        self.reply = reply
        self.composer.set_generating(True)
        self._update_actions()
        self._submit(reply, history)

    def sampling(self) -> SamplingParams:
        """What the next reply samples with: the engine's defaults, this conversation's own values over them."""
        settings = self.bridge.settings
        return self.conversation.sampling_for(settings.sampling if settings is not None else SamplingParams())

    def _submit(self, reply: Reply, history: list[dict[str, str]]) -> None:
        sampling = reply_sampling(self.sampling()) if self.bridge.settings is not None else None
        try:
            reply.ticket = self.bridge.submit(history, sampling, reply, thinking=self.conversation.thinking,
                                              snapshot=self.store.snapshot_base(self.conversation.id),
                                              continue_final_message=reply.continuing)
        except LanechatError as e:
            reply.on_failed(str(e))
            return
        if self.state == IDLE:
            self.set_state(WAITING)

    def fit_context(self, reply: Reply, refusal: str) -> str | None:
        """The engine refused the prompt as too long for the context. With "drop oldest turns"
        chosen, send it again without the oldest turn left (the reply then says how many messages
        were left out) and return None; else, or with only the last question left, the refusal
        to show, with what the user can do about it."""
        start = context_meter.drop_turn(self.conversation, reply.message.left_out)
        if start is None or reply is not self.reply:
            return context_meter.refused(self.conversation, refusal)
        reply.message.left_out = start
        self._submit(reply, self.conversation.engine_messages(start))
        return None

    def end_reply(self, reply: Reply) -> None:
        if reply is not self.reply:
            return
        self.reply = None
        reply.widget.show_final()
        self.conversation.touch()
        self.save(background=True)
        self.composer.set_generating(False)
        self._update_actions()
        self.update_meter()
        self.set_state(ERROR if reply.message.error else IDLE)

    def set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.state_changed.emit(state)

    # --- files as context ---------------------------------------------------------------------

    def _read_file(self, path: Path) -> Attachment:
        """A file for the message being written, if the conversation's context has room for it."""
        room = context_meter.room_for_files(self.conversation, self._context(), self.sampling().max_tokens,
                                            self.composer.attachments)
        return attachments.read(path, room, self.bridge.count_tokens)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:  # noqa: N802 - Qt override
        if dropped_files(event.mimeData()):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:  # noqa: N802 - Qt override
        files = dropped_files(event.mimeData())
        if files:
            event.acceptProposedAction()
            self.composer.attach_files(files)

    # --- persistence --------------------------------------------------------------------------

    def detach(self) -> None:
        """The tab closes or the app quits: stop the reply (it stays marked interrupted), save."""
        if self.reply is not None:
            if self.reply.ticket is not None:
                self.bridge.abandon(self.reply.ticket)
            self.reply = None
        self.save()

    def save(self, background: bool = False) -> None:
        """Write the conversation unless it is still empty (empty tabs leave no files behind).
        In the background, a copy is written on the saver's thread; else it is written now."""
        conv = self.conversation
        # While an edit is open, the composer holds the message being edited, not a draft.
        conv.draft = self._stashed_draft if self.editing else self.composer.text()
        conv.draft_attachments = list(self._stashed_files if self.editing else self.composer.attachments)
        if (conv.messages or conv.draft.strip() or conv.draft_attachments or conv.system_prompt.strip()
                or conv.sampling or self.store.exists(conv.id)):
            if background:
                self.saver.later(conv.id, functools.partial(self.store.save, copy.deepcopy(conv)))
            else:
                self.saver.now(conv.id, functools.partial(self.store.save, conv))
            self.saved.emit(conv)

    # --- internals ----------------------------------------------------------------------------

    def _update_actions(self) -> None:
        if self.engine_picker is not None:
            self.engine_picker.setEnabled(not self.generating)
        for widget in self.view.widgets:
            self._decorate(widget)

    def _decorate(self, widget: MessageWidget) -> None:
        """A message's buttons and its ‹ n/m ›, for what the tab is doing now."""
        msgs = self.conversation.messages
        m = widget.message
        idx = next((i for i in range(len(msgs) - 1, -1, -1) if msgs[i] is m), None)
        if idx is None:
            return
        idle = not self.generating and not self.editing
        widget.set_actions(edit=idle and m.role == "user",
                           regenerate=idle and idx == len(msgs) - 1 and m.role == "assistant",
                           fork=idle and bool(m.text), go_on=idle and idx == len(msgs) - 1 and can_continue(m))
        options = branches.siblings(self.conversation, idx)
        widget.branch.show_place(options.index(m) + 1, len(options), enabled=idle)

    def _undim(self) -> None:
        for widget in self.view.widgets:
            widget.set_dimmed(False)

    def _context(self) -> int | None:
        """The context of the tab's engine: a remote one does not say, so only this computer's counts."""
        info, settings = self.bridge.info, self.bridge.settings
        if isinstance(info, EngineInfo):
            return info.context
        return settings.context if isinstance(settings, EngineSettings) else None

    def update_meter(self) -> None:
        info = self.bridge.info
        self.meter.show_for(self.conversation, info.context if isinstance(info, EngineInfo) else None,
                            streaming=self.generating)

    def _update_sampling(self) -> None:
        settings = self.bridge.settings
        self.sampling_panel.show_for(self.conversation.sampling, settings.sampling if settings is not None else None)

    def _preset_picked(self, preset: Preset) -> None:
        """A preset with sampling values gives them to this conversation, in place of its own."""
        if preset.sampling:
            self.conversation.sampling = dict(preset.sampling)
            self._update_sampling()
        self.save()

    def _sampling_chosen(self, own: dict) -> None:
        self.conversation.sampling = own
        self.save()

    def _at_limit_chosen(self, choice: str) -> None:
        self.conversation.at_limit = choice
        self.save()

    def update_thinking_toggle(self) -> None:
        """Show the thinking switch when the tab's model has one (its default until this conversation picks)."""
        self.thinking_toggle.show_for(getattr(self.bridge.info, "thinking", None), self.conversation.thinking)

    def _thinking_chosen(self, on: bool) -> None:
        self.conversation.thinking = on
        self.save()
