"""The main window: conversation list | tabs, menus and shortcuts, status bar, notices; it owns
the session (open tabs, geometry) and turns Settings into an engine restart."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QByteArray, Qt
from PySide6.QtGui import QAction, QCloseEvent, QGuiApplication, QIcon, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QMainWindow,
    QMenu,
    QMessageBox,
    QProgressDialog,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from engine import EngineSettings, LanechatError

from . import APP_NAME
from .app_settings import Session, load_session, save_session, save_settings
from .chat_tab import ChatTab
from .connections import Connections, load_connections, save_connections
from .conversation import Conversation, FormatError
from .engine_bridge import EngineBridge
from .engines import EngineChoices
from .engines_dialog import EnginesDialog
from .history import HistoryPanel
from .local_server import LocalServer
from .notice_bar import NoticeBar
from .remote_engine import RemoteEngine
from .settings_dialog import SettingsDialog
from .status_bar import StatusBar
from .store import ConversationStore
from .tabs import ConversationTabs

_LOAD_FAILED = "The model could not be loaded"


class MainWindow(QMainWindow):
    def __init__(self, store: ConversationStore, bridge: EngineBridge, settings: EngineSettings,
                 icon: QIcon | None = None) -> None:
        super().__init__()
        self.store, self.bridge, self.settings = store, bridge, settings
        self.setWindowTitle(APP_NAME)
        if icon is not None:
            self.setWindowIcon(icon)
        self.tabs = ConversationTabs()
        self.tabs.tabCloseRequested.connect(lambda i: self.close_tab(self.tabs.widget(i)))
        self.tabs.new_tab_requested.connect(self.new_tab)
        self.tabs.currentChanged.connect(self._current_changed)
        self.history = HistoryPanel()
        self.history.open_requested.connect(self.open_conversation)
        self.history.delete_requested.connect(self.delete_conversation)
        self.history.export_requested.connect(self.export_conversation)
        self.history.new_requested.connect(self.new_tab)
        self.notices = NoticeBar()
        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.setSpacing(0)
        rl.addWidget(self.notices)
        rl.addWidget(self.tabs, 1)
        self.splitter = QSplitter(childrenCollapsible=False)
        self.splitter.addWidget(self.history)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(1, 1)
        self.splitter.setSizes([250, 950])
        self.setCentralWidget(self.splitter)
        self.status = StatusBar(bridge)
        self.status.settings_requested.connect(self.open_settings)
        self.setStatusBar(self.status)
        bridge.state_changed.connect(self._engine_state)
        self.connections, self._connections_notice = load_connections()
        self.engines = EngineChoices(bridge, lambda: self.settings.sampling, self)
        self.engines.set_remotes(self.connections.remotes)
        self.local_server = LocalServer(bridge, self)
        self.local_server.changed.connect(lambda: self.status.set_serving(self.local_server.url))
        self._build_menus()
        self._quitting = False

    # --- menus ------------------------------------------------------------------------------

    def _action(self, menu: QMenu, text: str, slot: Callable[[], object],
                *shortcuts: QKeySequence.StandardKey | str) -> QAction:
        action = menu.addAction(text)
        action.triggered.connect(lambda _checked=False: slot())
        keys: list[QKeySequence] = []
        for key in shortcuts:
            # A standard key has several bindings (Close: Ctrl+W and Ctrl+F4); keep them all.
            keys += QKeySequence.keyBindings(key) if isinstance(key, QKeySequence.StandardKey) else [QKeySequence(key)]
        action.setShortcuts(keys)
        return action

    def _build_menus(self) -> None:
        bar = self.menuBar()
        m = bar.addMenu("&File")
        self._action(m, "&New tab", self.new_tab, QKeySequence.StandardKey.AddTab)
        self._action(m, "&Close tab", lambda: self.close_tab(self.current_tab()), QKeySequence.StandardKey.Close)
        m.addSeparator()
        self._action(m, "&Export conversation to Markdown…",
                     lambda: self._on_tab(lambda tab: self.export_conversation(tab.conversation.id)), "Ctrl+Shift+E")
        m.addSeparator()
        self._action(m, "&Settings…", self.open_settings, "Ctrl+,")
        self._action(m, "E&ngines and server…", self.open_engines, "Ctrl+Shift+,")
        m.addSeparator()
        self._action(m, "&Quit", self.close, "Ctrl+Q")

        m = bar.addMenu("&Conversation")
        self._action(m, "&Stop reply", lambda: self._on_tab(ChatTab.stop), "Esc")
        self._action(m, "&Regenerate last reply", lambda: self._on_tab(ChatTab.regenerate), "Ctrl+R")
        self._action(m, "&Edit last message", lambda: self._on_tab(ChatTab.edit_last), "Ctrl+E")
        self._action(m, "Copy last &reply", self._copy_last_reply, "Ctrl+Shift+C")
        m.addSeparator()
        self._action(m, "System &prompt", lambda: self._on_tab(lambda tab: tab.system_toggle.toggle()), "Ctrl+Shift+P")
        self._action(m, "Re&name tab", lambda: self.tabs.start_rename(self.tabs.currentIndex()), "F2")
        self._action(m, "&Focus message box", lambda: self._on_tab(lambda tab: tab.composer.edit.setFocus()), "Ctrl+L")

        m = bar.addMenu("&View")
        self.sidebar_action = self._action(m, "&Conversation list", self._toggle_sidebar, "Ctrl+B")
        self.sidebar_action.setCheckable(True)
        self.sidebar_action.setChecked(True)
        self._action(m, "&Next tab", lambda: self._cycle(1), "Ctrl+Tab", "Ctrl+PgDown")
        self._action(m, "&Previous tab", lambda: self._cycle(-1), "Ctrl+Shift+Backtab", "Ctrl+PgUp")

    # --- tabs -------------------------------------------------------------------------------

    def current_tab(self) -> ChatTab | None:
        return self.tabs.currentWidget()

    def new_tab(self, conversation: Conversation | None = None) -> ChatTab:
        tab = ChatTab(conversation or Conversation(), self.store, self.bridge, engines=self.engines)
        tab.saved.connect(self._saved)
        tab.engine_changed.connect(self._show_tab_engine)
        tab.add_remote_requested.connect(self.open_engines)
        tab.title_changed.connect(lambda _title: self._current_changed())
        self.tabs.add(tab)
        self.history.set_open(tab.conversation.id, True)
        tab.setFocus()
        return tab

    def close_tab(self, tab: ChatTab | None) -> None:
        if tab is None:
            return
        tab.detach()
        self.history.set_open(tab.conversation.id, False)
        self.tabs.removeTab(self.tabs.indexOf(tab))
        tab.deleteLater()
        if self.tabs.count() == 0 and not self._quitting:
            self.new_tab()  # there is always somewhere to type

    def open_conversation(self, cid: str) -> None:
        """Show its tab if it is open, else load it into a new tab."""
        for tab in self.tabs.tabs():
            if tab.conversation.id == cid:
                self.tabs.setCurrentWidget(tab)
                tab.setFocus()
                return
        try:
            conv = self.store.load(cid)
        except FormatError as e:
            self.history.remove(cid)
            self.notices.add(str(e), error=True)
            return
        current = self.current_tab()
        if current is not None and self._is_blank(current):
            self._drop_tab(current)  # replace an untouched empty tab rather than pile up
        self.new_tab(conv)

    def _drop_tab(self, tab: ChatTab) -> None:
        """Remove a tab without saving: it is blank, or its conversation is being deleted."""
        self.tabs.removeTab(self.tabs.indexOf(tab))
        tab.deleteLater()

    @staticmethod
    def _is_blank(tab: ChatTab) -> bool:
        conv = tab.conversation
        return not (conv.messages or tab.composer.text().strip() or conv.system_prompt.strip()
                    or tab.generating)

    # --- history actions ----------------------------------------------------------------------

    def delete_conversation(self, cid: str) -> None:
        title = next((t.title for t in self.tabs.tabs() if t.conversation.id == cid), None)
        if title is None:
            try:
                title = self.store.load(cid).title or "this conversation"
            except FormatError:
                title = "this conversation"
        if not self.confirm("Delete conversation", f"Delete “{title}”? This cannot be undone."):
            return
        for tab in self.tabs.tabs():
            if tab.conversation.id == cid:
                if tab.reply is not None and tab.reply.ticket is not None:
                    tab.bridge.abandon(tab.reply.ticket)
                self._drop_tab(tab)
        self.store.delete(cid)
        self.history.remove(cid)
        if self.tabs.count() == 0:
            self.new_tab()

    def export_conversation(self, cid: str) -> None:
        tab = next((t for t in self.tabs.tabs() if t.conversation.id == cid), None)
        try:
            conv = tab.conversation if tab is not None else self.store.load(cid)
        except FormatError as e:
            self.notices.add(str(e), error=True)
            return
        name = "".join(c if c.isalnum() or c in " -_" else "_" for c in conv.title or "conversation").strip()
        path, _ = QFileDialog.getSaveFileName(self, "Export to Markdown", str(Path.home() / f"{name}.md"),
                                              "Markdown (*.md)")
        if path:
            self.store.export_markdown(conv, Path(path))
            self.statusBar().showMessage(f"Exported to {path}", 5000)

    def confirm(self, title: str, text: str) -> bool:
        buttons = QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel
        answer = QMessageBox.question(self, title, text, buttons,
                                      QMessageBox.StandardButton.Cancel)
        return answer == QMessageBox.StandardButton.Yes

    # --- session --------------------------------------------------------------------------------

    def restore(self, notices: list[str]) -> None:
        """Reopen the tabs of the last session, its active tab and geometry; list the history."""
        session = load_session()
        convs, bad = self.store.load_all()
        by_id = {c.id: c for c in convs}
        for cid in session.open_tabs:
            if cid in by_id:
                self.new_tab(by_id[cid])
        if self.tabs.count() == 0:
            self.new_tab()
        self.tabs.setCurrentIndex(min(max(session.active, 0), self.tabs.count() - 1))
        self.history.set_conversations(convs, {t.conversation.id for t in self.tabs.tabs()})
        if not (session.geometry and self.restoreGeometry(QByteArray.fromBase64(session.geometry.encode()))):
            self._first_geometry()
        if session.splitter:
            self.splitter.restoreState(QByteArray.fromBase64(session.splitter.encode()))
        self._set_sidebar(session.sidebar)
        for text in notices + bad + ([self._connections_notice] if self._connections_notice else []):
            self.notices.add(text, error=True)
        self._apply_server()

    def _first_geometry(self) -> None:
        """A comfortable size that fits the screen, centred: the first run has no saved geometry."""
        area = self.screen().availableGeometry()
        self.resize(min(1200, int(area.width() * 0.9)), min(800, int(area.height() * 0.85)))
        frame = self.frameGeometry()
        frame.moveCenter(area.center())
        self.move(frame.topLeft())

    def save_session(self) -> None:
        save_session(Session(
            open_tabs=[t.conversation.id for t in self.tabs.tabs()],
            active=self.tabs.currentIndex(),
            geometry=bytes(self.saveGeometry().toBase64()).decode(),
            splitter=bytes(self.splitter.saveState().toBase64()).decode(),
            sidebar=self.sidebar_action.isChecked()))

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt override
        self._quitting = True
        for tab in self.tabs.tabs():
            tab.detach()  # replies in progress are saved as interrupted
        self.save_session()
        self.local_server.stop()
        self.bridge.shutdown_now()
        event.accept()

    # --- engine ---------------------------------------------------------------------------------

    async def start_engine(self) -> bool:
        """Load the model in the settings; a failure is a notice, and the app stays usable."""
        try:
            await self.bridge.start(self.settings)
        except LanechatError:
            return False
        return True

    async def apply_settings(self, settings: EngineSettings) -> bool:
        """Restart the engine with new settings behind a progress dialog; keep them if it loads."""
        dialog = QProgressDialog("Restarting the engine…", "", 0, 100, self, windowTitle="Applying settings")
        dialog.setCancelButton(None)
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.setMinimumDuration(0)
        dialog.setAutoClose(False)
        dialog.setValue(0)
        progress = self.bridge.progress.connect(
            lambda what, f: (dialog.setLabelText(f"Restarting the engine: {what}…"), dialog.setValue(int(f * 100))))
        try:
            self.settings = settings
            ok = await self.start_engine()
        finally:
            self.bridge.progress.disconnect(progress)
            dialog.close()
            dialog.deleteLater()
        if ok:
            save_settings(settings)
        return ok

    def open_settings(self) -> None:
        dialog = SettingsDialog(self.settings, busy=self.bridge.busy, parent=self)
        if dialog.exec():
            asyncio.ensure_future(self.apply_settings(dialog.settings()))

    def open_engines(self) -> None:
        dialog = EnginesDialog(self.connections, parent=self)
        if dialog.exec():
            self.apply_connections(dialog.connections())

    def apply_connections(self, connections: Connections) -> None:
        """Keep the remote engines and server settings, and serve (or stop) as they say."""
        save_connections(connections)
        self.connections = connections
        self.engines.set_remotes(connections.remotes)
        self._apply_server()
        self._show_tab_engine()

    def _apply_server(self) -> None:
        try:
            self.local_server.apply(self.connections.server)
        except LanechatError as e:
            self.notices.add(f"Serving on localhost failed: {e}", error=True,
                             action=("Engines and server…", self.open_engines))

    def _show_tab_engine(self) -> None:
        tab = self.current_tab()
        engine = tab.bridge if tab is not None else None
        self.status.show_engine(engine if isinstance(engine, RemoteEngine) else None)

    def _engine_state(self) -> None:
        if self.bridge.state == "failed":
            self.notices.dismiss(_LOAD_FAILED)
            self.notices.add(f"{_LOAD_FAILED}: {self.bridge.error}", error=True,
                             action=("Open Settings…", self.open_settings))
        elif self.bridge.state in ("starting", "ready"):
            self.notices.dismiss(_LOAD_FAILED)

    # --- small actions ----------------------------------------------------------------------------

    def _on_tab(self, method: Callable[[ChatTab], object]) -> None:
        tab = self.current_tab()
        if tab is not None:
            method(tab)

    def _copy_last_reply(self) -> None:
        tab = self.current_tab()
        replies = [m for m in tab.conversation.messages if m.role == "assistant"] if tab else []
        if replies:
            QGuiApplication.clipboard().setText(replies[-1].text)
            self.statusBar().showMessage("Reply copied", 2000)

    def _toggle_sidebar(self) -> None:
        self._set_sidebar(self.sidebar_action.isChecked())

    def _set_sidebar(self, visible: bool) -> None:
        self.history.setVisible(visible)
        self.sidebar_action.setChecked(visible)

    def _cycle(self, step: int) -> None:
        if self.tabs.count():
            self.tabs.setCurrentIndex((self.tabs.currentIndex() + step) % self.tabs.count())

    def _saved(self, conv: Conversation) -> None:
        self.history.upsert(conv, True)
        current = self.current_tab()
        if current is not None and current.conversation is conv:
            self.history.select(conv.id)

    def _current_changed(self) -> None:
        tab = self.current_tab()
        self.setWindowTitle(f"{tab.title} — {APP_NAME}" if tab is not None else APP_NAME)
        if tab is not None:
            self.history.select(tab.conversation.id)
            tab.setFocus()
        self._show_tab_engine()
