"""One tab = one conversation: history view, system prompt, composer, and the reply in flight.

The conversation file is written before a request is sent (the user's words are never lost),
every couple of seconds while a reply streams (marked interrupted until it finishes, so a crash
keeps what arrived), when the reply ends, and when the tab closes or the app quits. Writes while
replies stream go through the Saver's thread, so an fsync never stalls the window.

Editing a user message keeps the old turn, on screen (faded) and on disk, until the edited one
is sent; Esc or Cancel gives the composer its draft back and changes nothing. Once sent, the old
message and what followed stay in the conversation's tree, as does a regenerated reply; ‹ › on
a message switches between them (app/branches.py).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import secrets
import time

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QHBoxLayout, QPlainTextEdit, QToolButton, QVBoxLayout, QWidget

from engine import EngineInfo, Finished, LanechatError, SamplingParams

from . import branches, search, theme
from .chat_view import ChatView, centered
from .composer import Composer
from .context_meter import ContextMeter
from .conversation import Conversation, Message, title_from
from .engine_bridge import EngineBridge, Ticket
from .engine_picker import EnginePicker
from .engines import EngineChoices, TabEngine
from .message_view import MessageWidget
from .saver import Saver
from .store import ConversationStore
from .thinking_view import ThinkingToggle
from .wrap_guard import WrapGuard

STREAM_SAVE_PERIOD_S = 2.0

# Tab states, shown as the tab's icon.
IDLE, WAITING, GENERATING, ERROR = "idle", "waiting", "generating", "error"


def reply_sampling(defaults: SamplingParams) -> SamplingParams:
    """Seed 0 means a fresh seed for every reply, so Regenerate gives another answer; any other
    seed is kept, and the engine then repeats a reply exactly."""
    if defaults.seed:
        return defaults
    return dataclasses.replace(defaults, seed=secrets.randbits(31) or 1)


class Reply:
    """The RequestSink of one assistant reply: events for an older reply can never touch a newer."""

    def __init__(self, tab: "ChatTab", message: Message, widget: MessageWidget) -> None:
        self.tab, self.message, self.widget = tab, message, widget
        self.ticket: Ticket | None = None
        self._t0: float | None = None
        self._sent = time.monotonic()
        self._saved_at = time.monotonic()
        self.live_tps = 0.0  # decode rate so far, for the total across tabs

    def on_queued(self, ahead: int, reason: str) -> None:
        reason = reason[:1].upper() + reason[1:]
        self.widget.set_status(f"{reason} ({ahead} ahead)…" if ahead else f"{reason}…")
        self.tab.set_state(WAITING)

    def on_started(self, prompt_tokens: int, reused: int = 0) -> None:
        info = self.tab.bridge.info
        if info is not None:
            self.tab.conversation.model = info.model_name
        self._t0 = time.monotonic()
        self.message.prompt_tokens = prompt_tokens or None
        # A remote engine says how long the prompt was only at the end.
        if reused:
            self.widget.set_status(f"Resumed from snapshot ({reused} tokens); reading "
                                   f"{prompt_tokens - reused} new…")
        elif prompt_tokens:
            self.widget.set_status(f"Reading the conversation (recomputing {prompt_tokens} tokens)…")
        else:
            self.widget.set_status("Reading the conversation…")
        self.tab.set_state(GENERATING)

    def on_reasoning(self, text: str, tokens: int) -> None:
        self._first_output()
        self.message.reasoning += text
        self.message.reasoning_tokens = tokens
        self.widget.append_reasoning(text, tokens)
        self._progress(max(tokens, self.message.tokens or 0))

    def on_text(self, text: str, tokens: int) -> None:
        self._first_output()
        self.message.text += text
        self.message.tokens = tokens
        self.widget.append(text)
        self._progress(tokens)

    def _first_output(self) -> None:
        if not self.message.text and not self.message.reasoning:
            self.widget.set_status("")
            self._t0 = time.monotonic()  # tok/s counts decoding, not reading the prompt
            self.message.ttft = round(self._t0 - self._sent, 3)

    def _progress(self, tokens: int) -> None:
        elapsed = time.monotonic() - (self._t0 or time.monotonic())
        self.live_tps = tokens / elapsed if elapsed > 0.2 else 0.0
        self.widget.update_meta(live_tps=self.live_tps)
        if time.monotonic() - self._saved_at > STREAM_SAVE_PERIOD_S:
            self._saved_at = time.monotonic()
            self.tab.save(background=True)

    def on_finished(self, event: Finished) -> None:
        m = self.message
        m.text, m.tokens = event.text, event.tokens  # the engine's whole reply: what streamed, joined
        m.reasoning, m.reasoning_tokens = event.reasoning, event.reasoning_tokens
        m.tok_s = round(event.decode_tps, 2) if event.decode_tps else m.tok_s
        m.accepted = round(event.accepted_length, 2) if event.accepted_length else None
        m.prompt_tokens = event.prompt_tokens or m.prompt_tokens
        m.interrupted = event.reason in ("cancelled", "shutdown")
        self.tab.end_reply(self, length_limit=event.reason == "length")

    def on_failed(self, message: str, too_long: bool = False) -> None:
        if too_long:
            message = self.tab.fit_context(self, message)
            if message is None:
                return
        self.message.interrupted = True
        self.message.error = message
        self.tab.end_reply(self)


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

        self.system_toggle = QToolButton(checkable=True, objectName="messageAction",
                                         toolTip="How the assistant should behave in this conversation")
        self.system_edit = QPlainTextEdit(
            placeholderText="System prompt for this conversation, e.g. “Answer briefly, in English.”")
        WrapGuard(self.system_edit)
        self.system_edit.setPlainText(conversation.system_prompt)
        self.system_edit.setTabChangesFocus(True)
        self.system_edit.setFixedHeight(self.system_edit.fontMetrics().lineSpacing() * 3 + 16)
        self.system_edit.setVisible(bool(conversation.system_prompt))
        self.system_toggle.setChecked(bool(conversation.system_prompt))
        self.system_toggle.toggled.connect(self._toggle_system)
        self.system_edit.textChanged.connect(self._system_changed)
        inner = QWidget()
        bl = QVBoxLayout(inner)
        bl.setContentsMargins(0, 4, 0, 6)
        row = QHBoxLayout()
        row.addWidget(self.system_toggle)
        self.meter = ContextMeter()
        self.meter.at_limit_changed.connect(self._at_limit_chosen)
        row.addWidget(self.meter)
        self.thinking_toggle = ThinkingToggle()
        self.thinking_toggle.changed.connect(self._thinking_chosen)
        row.addWidget(self.thinking_toggle)
        row.addStretch()
        self.engine_picker: EnginePicker | None = None
        if engines is not None:
            self.engine_picker = EnginePicker(engines, engines.id_of(self.bridge))
            self.engine_picker.picked.connect(self.set_engine)
            self.engine_picker.add_requested.connect(self.add_remote_requested)
            row.addWidget(self.engine_picker)
        bl.addLayout(row)
        bl.addWidget(self.system_edit)
        bar = centered(inner, "systemPromptBar")

        self.view = ChatView()
        self.view.decorate = self._decorate
        self.view.edit_requested.connect(self.edit)
        self.view.regenerate_requested.connect(self.regenerate)
        self.view.branch_requested.connect(self.switch_branch)
        self.view.fork_requested.connect(self.fork)
        self.composer = Composer()
        self.composer.set_text(conversation.draft)
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
        self._update_system_toggle()
        self.view.set_messages(conversation.messages)
        self._update_actions()
        (engines.local if engines is not None else bridge).state_changed.connect(self.update_meter)
        self.update_meter()
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
        if self.generating or not text.strip():
            return
        conv = self.conversation
        if self._editing is not None:
            self._replace_edited(text)
        else:
            had_title = bool(conv.title)
            conv.add(Message("user", text))
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
            self._stashed_draft = self.composer.text()
        self._editing = idx
        for i in range(idx, len(msgs)):
            widget = self.view.widget_for(i)
            if widget is not None:
                widget.set_dimmed(True)
        self.composer.start_edit(msgs[idx].text)
        self.composer.edit.setFocus()
        self._update_actions()

    def cancel_edit(self) -> None:
        if self._editing is None:
            return
        self._undim()
        self._editing = None
        self.composer.end_edit(self._stashed_draft)
        self._stashed_draft = ""
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
        self.update_thinking_toggle()
        if self.engine_picker is not None:
            self.engine_picker.show_engine(self.conversation.engine)
        self.save()
        self.engine_changed.emit()

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
        widget = self.view.reveal(hit.index) if hit is not None and hit.index is not None else None
        if widget is None:
            return 0
        return search.highlight(widget.text_views(), query, theme.find_color(self.palette()))

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

    def _replace_edited(self, text: str) -> None:
        """The edited message replaces the old one and what followed it; a title made from the old
        words follows the new ones (a title the user gave stays)."""
        conv, idx = self.conversation, self._editing
        assert idx is not None
        old = conv.messages[idx]
        first_user = next(i for i, m in enumerate(conv.messages) if m.role == "user")
        self._undim()
        self._editing = None
        self._stashed_draft, draft = "", self._stashed_draft
        branches.set_aside(conv, idx)
        self.view.remove_from(idx)
        conv.add(Message("user", text))
        self.composer.end_edit(draft)
        if idx == first_user and conv.title == title_from(old.text) and title_from(text) != conv.title:
            conv.title = title_from(text)
            self.title_changed.emit(self.title)

    def _generate(self) -> None:
        conv = self.conversation
        history = conv.engine_messages()
        if self.bridge.settings is not None:
            conv.settings = self.bridge.settings.to_dict()
        message = conv.add(Message("assistant", "", interrupted=True))
        conv.touch()
        self.save()  # before generation: the user's message is on disk whatever happens next
        widget = self.view.add(message)
        widget.show_streaming()
        self.view.scroll_to_end()
        self.reply = reply = Reply(self, message, widget)
        self.composer.set_generating(True)
        self._update_actions()
        self._submit(reply, history)

    def _submit(self, reply: Reply, history: list[dict[str, str]]) -> None:
        sampling = reply_sampling(self.bridge.settings.sampling) if self.bridge.settings is not None else None
        try:
            reply.ticket = self.bridge.submit(history, sampling, reply, thinking=self.conversation.thinking,
                                              snapshot=self.store.snapshot_base(self.conversation.id))
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
        conv, m = self.conversation, reply.message
        path = conv.messages[:-1]  # the history before this reply
        last_user = max((i for i, x in enumerate(path) if x.role == "user"), default=0)
        start = next((i for i in range(m.left_out + 1, last_user + 1) if path[i].role == "user"), None)
        if conv.at_limit != "drop" or start is None or reply is not self.reply:
            hint = ("even the last message alone is too long; shorten it or raise the context in Settings"
                    if conv.at_limit == "drop" else "choose “When full: drop oldest turns” above to continue")
            return f"{refusal[:1].upper()}{refusal[1:]} ({hint})."
        m.left_out = start
        self._submit(reply, conv.engine_messages(start))
        return None

    def end_reply(self, reply: Reply, length_limit: bool = False) -> None:
        if reply is not self.reply:
            return
        self.reply = None
        reply.widget.show_final()
        if length_limit:
            reply.widget.set_status("Stopped at the reply length limit (max tokens in Settings).")
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
        if conv.messages or conv.draft.strip() or conv.system_prompt.strip() or self.store.exists(conv.id):
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
                           fork=idle and bool(m.text))
        options = branches.siblings(self.conversation, idx)
        widget.branch.show_place(options.index(m) + 1, len(options), enabled=idle)

    def _undim(self) -> None:
        for widget in self.view.widgets:
            widget.set_dimmed(False)

    def update_meter(self) -> None:
        info = self.bridge.info
        # A remote engine does not say its context: the meter counts for this computer's only.
        self.meter.show_for(self.conversation, info.context if isinstance(info, EngineInfo) else None)

    def _at_limit_chosen(self, choice: str) -> None:
        self.conversation.at_limit = choice
        self.save()

    def update_thinking_toggle(self) -> None:
        """Show the thinking switch when the tab's model has one (its default until this conversation picks)."""
        self.thinking_toggle.show_for(getattr(self.bridge.info, "thinking", None), self.conversation.thinking)

    def _thinking_chosen(self, on: bool) -> None:
        self.conversation.thinking = on
        self.save()

    def _toggle_system(self, on: bool) -> None:
        self.system_edit.setVisible(on)
        self._update_system_toggle()
        if on:
            self.system_edit.setFocus()

    def _system_changed(self) -> None:
        self.conversation.system_prompt = self.system_edit.toPlainText()
        self._update_system_toggle()

    def _update_system_toggle(self) -> None:
        state = "set" if self.conversation.system_prompt.strip() else "none"
        self.system_toggle.setText(f"System prompt: {state}  {'▴' if self.system_toggle.isChecked() else '▾'}")
