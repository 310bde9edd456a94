"""The main window: conversation list | tabs, menus and shortcuts, status bar, notices; it owns
the session (open tabs, geometry) and turns Settings into an engine restart."""
from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Callable

from PySide6.QtCore import QByteArray, Qt, QTimer
from PySide6.QtGui import QCloseEvent, QGuiApplication, QIcon
from PySide6.QtWidgets import QMainWindow, QProgressDialog, QSplitter, QVBoxLayout, QWidget

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
from .menus import Menus
from .model_download import DownloadButton
from .model_menu import dropped_model
from .models_page import ModelsPage
from .notice_bar import Notice, NoticeBar
from .remote_engine import RemoteEngine
from .saver import Saver
from .settings_dialog import SettingsDialog
from .status_bar import StatusBar
from .store import ConversationStore
from .tabs import ConversationTabs
from .throughput import Throughput
from .transfer_actions import Transfers

_LOAD_FAILED = "The model could not be loaded"
_NO_MODEL = "Lanechat needs a model to chat with"
_SAVE_FAILED = "Could not save"


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
        self.transfers = Transfers(self)
        self.history.export_requested.connect(self.transfers.export_one)
        self.history.export_all_requested.connect(self.transfers.export_all)
        self.history.import_requested.connect(self.transfers.import_files)
        self.history.new_requested.connect(self.new_tab)
        self.history.pin_requested.connect(self.pin_conversation)
        self.history.search_opened.connect(lambda _cid, query: self.on_tab(lambda tab: tab.find(query)))
        self.history.search_cleared.connect(lambda: [tab.clear_marks() for tab in self.tabs.tabs()])
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
        self.menus = Menus(self)
        self.sidebar_action = self.menus.sidebar
        self._quitting = False
        self._restoring = False
        self._save_errors = QTimer(self, interval=1000, timeout=self._show_save_errors)
        self._save_errors.start()

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
        """Delete at once: the file and its snapshots go to the trash, its tab closes, and the
        notice's Undo brings both back (and the tab)."""
        conv = self.conversation(cid)
        title = (conv.title if conv is not None else "") or "this conversation"
        tabs = [t for t in self.tabs.tabs() if t.conversation.id == cid]
        for tab in tabs:
            tab.detach()  # its reply stops and the file gets what the tab shows, for Undo to bring back
        entry: list[Path] = []
        try:  # through the saver: a write of this conversation still queued never lands after it
            self.saver.now(cid, lambda: entry.append(self.store.delete(cid)))
        except OSError as e:
            self.notices.add(f"“{title}” could not be deleted: {e.strerror or e}", error=True)
            return
        for tab in tabs:
            self._drop_tab(tab)
        self.history.remove(cid)
        if self.tabs.count() == 0:
            self.new_tab()
        notice = self.notices.add(f"Deleted “{title}”.",
                                  action=("Undo", lambda: self.undo_delete(entry[0], bool(tabs), notice)))

    def undo_delete(self, entry: Path, reopen: bool, notice: Notice | None = None) -> Conversation | None:
        """Bring a deleted conversation back from the trash with its snapshots (and its tab)."""
        try:
            conv = self.store.undelete(entry)
        except FormatError as e:
            self.notices.add(str(e), error=True)
            return None
        if notice is not None:
            notice.dismiss()
        self.history.upsert(conv, False, on_top=False)
        if reopen:
            self.open_conversation(conv.id)
        else:
            self.on_tab(lambda tab: tab.setFocus())  # not whatever followed the notice's button
        return conv

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

    def conversation(self, cid: str) -> Conversation | None:
        """The conversation as the window has it: an open tab's own, else the listed one."""
        tab = next((t for t in self.tabs.tabs() if t.conversation.id == cid), None)
        return tab.conversation if tab is not None else self.history.conversation(cid)

    def conversations(self) -> list[Conversation]:
        """Every saved conversation, in the list's order (an open tab's as it is now)."""
        return [c for c in (self.conversation(cid) for cid in self.history.ids()) if c is not None]

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
                self.on_tab(lambda tab: tab.setFocus())  # not whatever follows the notice's buttons

    def _default_downloaded(self) -> None:
        if self.settings.model is None and self.bridge.state != "starting":
            asyncio.ensure_future(self.start_engine())

    def _show_save_errors(self) -> None:
        for error in self.saver.errors():
            self.notices.add(f"{_SAVE_FAILED} {error}", error=True)

    # --- small actions ----------------------------------------------------------------------------

    def on_tab(self, method: Callable[[ChatTab], object]) -> None:
        tab = self.current_tab()
        if tab is not None:
            method(tab)

    def copy_last_reply(self) -> None:
        tab = self.current_tab()
        replies = [m for m in tab.conversation.messages if m.role == "assistant"] if tab else []
        if replies:
            QGuiApplication.clipboard().setText(replies[-1].text)
            self.statusBar().showMessage("Reply copied", 2000)

    def toggle_sidebar(self) -> None:
        self._set_sidebar(self.sidebar_action.isChecked())
        self.session_changed()

    def search(self) -> None:
        self._set_sidebar(True)
        self.history.start_search()

    def _set_sidebar(self, visible: bool) -> None:
        self.history.setVisible(visible)
        self.sidebar_action.setChecked(visible)

    def cycle(self, step: int) -> None:
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
