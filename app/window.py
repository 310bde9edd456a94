"""The main window: conversation list | tabs, menus and shortcuts, status bar, notices; it owns
the session (open tabs, geometry) and turns Settings into an engine restart."""
from __future__ import annotations

import asyncio
import copy
import re
from pathlib import Path
from typing import Callable

import platformdirs
from PySide6.QtCore import QByteArray, Qt, QTimer
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
from .app_settings import MODEL_SAMPLING, Session, load_session, save_session, save_settings, with_model_sampling
from .chat_tab import ChatTab
from .connections import Connections, load_connections, save_connections
from .conversation import Conversation, FormatError
from .engine_bridge import EngineBridge, in_thread
from .engines import EngineChoices
from .engines_dialog import EnginesDialog
from .history import HistoryPanel
from .idle_unload import IdleUnloader
from .local_server import LocalServer
from .model_download import DownloadButton
from .model_menu import RecentModelsMenu, dropped_model
from .models_page import ModelsPage
from .notice_bar import NoticeBar
from .remote_engine import RemoteEngine
from .saver import Saver
from .settings_dialog import SettingsDialog
from .status_bar import StatusBar
from .store import ConversationStore
from .tabs import ConversationTabs
from .throughput import Throughput

_LOAD_FAILED = "The model could not be loaded"
_NO_MODEL = "Lanechat needs a model to chat with"
_SAVE_FAILED = "Could not save"
_UNSAFE_IN_NAMES = re.compile(r'[\x00-\x1f<>:"/\\|?*]+')


def export_path(conv: Conversation, folder: Path | None = None) -> Path:
    """Where an export goes unless the user picks another place: the documents folder, named
    after the conversation's title as written (without what file names cannot hold)."""
    if folder is None:
        documents = Path(platformdirs.user_documents_dir())
        folder = documents if documents.is_dir() else Path.home()
    name = " ".join(_UNSAFE_IN_NAMES.sub(" ", conv.title).split())[:80].strip(" .") or "Conversation"
    return folder / f"{name}.md"


class MainWindow(QMainWindow):
    def __init__(self, store: ConversationStore, bridge: EngineBridge, settings: EngineSettings,
                 icon: QIcon | None = None, chosen: set[str] | None = None, saver: Saver | None = None) -> None:
        """`chosen`: the sampling fields the user set (the rest follow the model); None: all."""
        super().__init__()
        self.store, self.bridge, self.settings = store, bridge, settings
        self.chosen = set(MODEL_SAMPLING) if chosen is None else set(chosen)
        self.saver = saver or Saver()
        self.setWindowTitle(APP_NAME)
        if icon is not None:
            self.setWindowIcon(icon)
        self.tabs = ConversationTabs()
        self.tabs.tabCloseRequested.connect(lambda i: self.close_tab(self.tabs.widget(i)))
        self.tabs.new_tab_requested.connect(self.new_tab)
        self.tabs.currentChanged.connect(self._current_changed)
        self.tabs.tabBar().tabMoved.connect(lambda _a, _b: self.session_changed())
        self.history = HistoryPanel()
        self.history.open_requested.connect(self.open_conversation)
        self.history.delete_requested.connect(self.delete_conversation)
        self.history.export_requested.connect(self.export_conversation)
        self.history.new_requested.connect(self.new_tab)
        self.history.pin_requested.connect(self.pin_conversation)
        self.history.search_opened.connect(lambda _cid, query: self._on_tab(lambda tab: tab.find(query)))
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
        self.throughput = Throughput(self.tabs)
        self.status.addPermanentWidget(self.throughput)
        bridge.state_changed.connect(self._engine_state)
        self.connections, self._connections_notice = load_connections()
        self.engines = EngineChoices(bridge, lambda: self.settings.sampling, self)
        self.engines.set_remotes(self.connections.remotes)
        self.local_server = LocalServer(bridge, self)
        self.local_server.changed.connect(lambda: self.status.set_serving(self.local_server.url))
        self.idle = IdleUnloader(bridge, lambda: self.local_server.url is not None, self)
        self.idle.unloaded.connect(lambda minutes: self.statusBar().showMessage(
            f"The model was unloaded after {minutes} minutes idle; the next message loads it again.", 10000))
        self.models_page: ModelsPage | None = None
        self.setAcceptDrops(True)  # a .gguf file or a model folder dropped here is opened
        self._build_menus()
        self._quitting = False
        self._restoring = False
        self._save_errors = QTimer(self, interval=1000, timeout=self._show_save_errors)
        self._save_errors.start()

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
        self._action(m, "&Models…", self.open_models, "Ctrl+Shift+M")
        m.addMenu(RecentModelsMenu(self.open_model, self))
        self._action(m, "E&ngines and server…", self.open_engines, "Ctrl+Shift+,")
        m.addSeparator()
        self._action(m, "&Quit", self.close, "Ctrl+Q")

        m = bar.addMenu("&Conversation")
        self._action(m, "&Stop reply or cancel edit", lambda: self._on_tab(ChatTab.escape), "Esc")
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
        self._action(m, "&Search conversations", self._search, "Ctrl+K", "Ctrl+F")
        self._action(m, "&Next tab", lambda: self._cycle(1), "Ctrl+Tab", "Ctrl+PgDown")
        # Qt matches Ctrl+Shift+Tab presses (which arrive as Backtab) to this, and shows it readably.
        self._action(m, "&Previous tab", lambda: self._cycle(-1), "Ctrl+Shift+Tab", "Ctrl+PgUp")

    # --- tabs -------------------------------------------------------------------------------

    def current_tab(self) -> ChatTab | None:
        return self.tabs.currentWidget()

    def new_tab(self, conversation: Conversation | None = None) -> ChatTab:
        tab = ChatTab(conversation or Conversation(), self.store, self.bridge, engines=self.engines, saver=self.saver)
        tab.saved.connect(self._saved)
        tab.engine_changed.connect(self._show_tab_engine)
        tab.add_remote_requested.connect(self.open_engines)
        tab.fork_requested.connect(lambda conv: self.new_tab(conv).save())
        tab.title_changed.connect(lambda _title: self._current_changed())
        self.tabs.add(tab)
        self.history.set_open(tab.conversation.id, True)
        tab.setFocus()
        self.session_changed()
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
        self.session_changed()

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
        self.session_changed()

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

    def pin_conversation(self, cid: str, pinned: bool) -> None:
        tab = next((t for t in self.tabs.tabs() if t.conversation.id == cid), None)
        if tab is not None:
            tab.conversation.pinned = pinned
            tab.save()
            return
        try:
            conv = self.store.load(cid)
        except FormatError as e:
            self.notices.add(str(e), error=True)
            return
        conv.pinned = pinned
        self.saver.now(cid, lambda: self.store.save(conv))
        self.history.upsert(conv, False)

    def export_conversation(self, cid: str) -> None:
        tab = next((t for t in self.tabs.tabs() if t.conversation.id == cid), None)
        try:
            conv = tab.conversation if tab is not None else self.store.load(cid)
        except FormatError as e:
            self.notices.add(str(e), error=True)
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export to Markdown", str(export_path(conv)),
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
        # The geometry first: the session written once the tabs are back records this window.
        if not (session.geometry and self.restoreGeometry(QByteArray.fromBase64(session.geometry.encode()))):
            self._first_geometry()
        if session.splitter:
            self.splitter.restoreState(QByteArray.fromBase64(session.splitter.encode()))
        self._set_sidebar(session.sidebar)
        self._restoring = True  # a crash while reopening must not leave half the list on disk
        try:
            for cid in session.open_tabs:
                if cid in by_id:
                    self.new_tab(by_id[cid])
            if self.tabs.count() == 0:
                self.new_tab()
            self.tabs.setCurrentIndex(self._restored_index(session, by_id))
        finally:
            self._restoring = False
        self.history.set_conversations(convs, {t.conversation.id for t in self.tabs.tabs()})
        self._current_changed()
        for text in notices + bad + ([self._connections_notice] if self._connections_notice else []):
            self.notices.add(text, error=True)
        self._apply_server()

    def _restored_index(self, session: Session, by_id: dict[str, Conversation]) -> int:
        """The tab that was active; tabs with no file (blank ones) are not reopened, so count
        the reopened tabs up to it rather than trusting the saved index."""
        active = min(max(session.active, 0), max(len(session.open_tabs) - 1, 0))
        before = sum(1 for cid in session.open_tabs[:active + 1] if cid in by_id)
        return min(max(before - 1, 0), self.tabs.count() - 1)

    def _first_geometry(self) -> None:
        """A comfortable size that fits the screen, centred: the first run has no saved geometry."""
        area = self.screen().availableGeometry()
        self.resize(min(1200, int(area.width() * 0.9)), min(800, int(area.height() * 0.85)))
        frame = self.frameGeometry()
        frame.moveCenter(area.center())
        self.move(frame.topLeft())

    def session(self) -> Session:
        return Session(
            open_tabs=[t.conversation.id for t in self.tabs.tabs()],
            active=self.tabs.currentIndex(),
            geometry=bytes(self.saveGeometry().toBase64()).decode(),
            splitter=bytes(self.splitter.saveState().toBase64()).decode(),
            sidebar=self.sidebar_action.isChecked())

    def session_changed(self) -> None:
        """Tabs opened, closed, moved or switched: write the session now (in the background), so a
        crash reopens what was open, not what was open at the last clean quit."""
        if not (self._restoring or self._quitting):
            session = self.session()
            self.saver.later("session", lambda: save_session(session))

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 - Qt override
        self._quitting = True
        for tab in self.tabs.tabs():
            tab.detach()  # replies in progress are saved as interrupted
        session = self.session()
        self.saver.now("session", lambda: save_session(session))
        self.saver.flush()
        self.local_server.stop()
        self.bridge.shutdown_now()
        event.accept()

    # --- engine ---------------------------------------------------------------------------------

    async def start_engine(self) -> bool:
        """Load the model in the settings; a failure is a notice, and the app stays usable.
        Sampling the user did not choose follows the model's recommendation."""
        try:
            effective = await in_thread(with_model_sampling, self.settings, self.chosen)
            await self.bridge.start(effective)
        except LanechatError:
            return False
        return True

    async def apply_settings(self, settings: EngineSettings, chosen: set[str] | None = None) -> bool:
        """Restart the engine with new settings behind a progress dialog; keep them if it loads.
        `chosen`: the sampling fields the user set (None: as before)."""
        dialog = QProgressDialog("Restarting the engine…", "Cancel", 0, 100, self, windowTitle="Applying settings")
        dialog.canceled.connect(self.bridge.cancel_start)  # stops the load at its next tensor
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.setMinimumDuration(0)
        dialog.setAutoClose(False)
        dialog.setValue(0)
        progress = self.bridge.progress.connect(
            lambda what, f: (dialog.setLabelText(f"Restarting the engine: {what}…"), dialog.setValue(int(f * 100))))
        try:
            self.settings = settings
            if chosen is not None:
                self.chosen = set(chosen)
            ok = await self.start_engine()
        finally:
            self.bridge.progress.disconnect(progress)
            dialog.close()
            dialog.deleteLater()
        if ok:
            save_settings(settings, self.chosen)
        return ok

    def open_models(self) -> None:
        if self.models_page is None:
            self.models_page = ModelsPage(self.bridge, lambda: self.settings, self)
            self.models_page.model_chosen.connect(self.open_model)
        self.models_page.show()
        self.models_page.raise_()

    def open_model(self, path: str) -> None:
        """Load another model with the current settings (from the models page, the recent list, a drop)."""
        settings = copy.deepcopy(self.settings)
        settings.model = path
        asyncio.ensure_future(self.apply_settings(settings))

    def dragEnterEvent(self, event) -> None:  # noqa: N802 - Qt override
        if dropped_model(event.mimeData()) is not None:
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 - Qt override
        path = dropped_model(event.mimeData())
        if path is not None:
            event.acceptProposedAction()
            self.open_model(str(path))

    def open_settings(self) -> None:
        info = self.bridge.info
        dialog = SettingsDialog(self.settings, busy=self.bridge.busy, chosen=self.chosen, parent=self,
                                idle=self.idle.choice, unified=info.unified if info is not None else None,
                                clear_snapshots=self.store.clear_snapshots)
        if dialog.exec():
            self.idle.set_choice(dialog.idle_choice())
            asyncio.ensure_future(self.apply_settings(dialog.settings(), dialog.chosen_sampling()))

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
            self.notices.dismiss(_NO_MODEL)
            if self.bridge.missing_default:
                download = DownloadButton()
                download.done.connect(self._default_downloaded)
                self.notices.add(f"{_NO_MODEL}. The default one is small, runs on any computer, and "
                                 "is downloaded once.", widget=download,
                                 action=("Choose another model…", self.open_settings))
            else:
                self.notices.add(f"{_LOAD_FAILED}: {self.bridge.error}", error=True,
                                 action=("Open Settings…", self.open_settings))
        elif self.bridge.state in ("starting", "ready"):
            if self.notices.dismiss(_LOAD_FAILED) + self.notices.dismiss(_NO_MODEL):
                self._on_tab(lambda tab: tab.setFocus())  # not whatever follows the notice's buttons

    def _default_downloaded(self) -> None:
        if self.settings.model is None and self.bridge.state != "starting":
            asyncio.ensure_future(self.start_engine())

    def _show_save_errors(self) -> None:
        for error in self.saver.errors():
            self.notices.add(f"{_SAVE_FAILED} {error}", error=True)

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
        self.session_changed()

    def _search(self) -> None:
        self._set_sidebar(True)
        self.history.start_search()

    def _set_sidebar(self, visible: bool) -> None:
        self.history.setVisible(visible)
        self.sidebar_action.setChecked(visible)

    def _cycle(self, step: int) -> None:
        if self.tabs.count():
            self.tabs.setCurrentIndex((self.tabs.currentIndex() + step) % self.tabs.count())

    def _saved(self, conv: Conversation) -> None:
        self.history.upsert(conv, True)

    def _current_changed(self) -> None:
        tab = self.current_tab()
        self.setWindowTitle(f"{tab.title} — {APP_NAME}" if tab is not None else APP_NAME)
        self.history.set_active(tab.conversation.id if tab is not None else None)
        if tab is not None:
            tab.setFocus()
        self._show_tab_engine()
        self.session_changed()
