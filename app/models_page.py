"""The Models window: download a model from the Hugging Face Hub, and manage the installed ones.

Download: type a repo id (or pick a suggestion), look it up, see its files and sizes, the format
and the memory plan for the current settings, then download with progress, pause/resume and
cancel (engine.hub: verified, and moved into the models folder only when whole). Installed: every
model in the models folder, then those used recently from elsewhere, with its format, size on
disk, maximum context and when it was last used; the selected one's memory plan with the current
settings, before it is loaded; use it, open its folder, delete it (after asking; models folder
only). The current model's plan and how long it took to get ready show at the bottom. Network and
disk work runs on plain threads (in_thread).
"""
from __future__ import annotations

import asyncio
import copy
import shutil
from datetime import datetime
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QMessageBox,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine import EngineSettings, LanechatError, ModelError, Plan, hub, installed, paths, plan

from .engine_bridge import EngineBridge, in_thread, newest_only
from .plan_words import plan_sentence, size


class Lookup:
    """What the Hub says about one repo, for the page: its files, the chosen ones, format, plan."""

    def __init__(self, listing: hub.Listing, files: list[hub.RemoteFile], label: str, plan_text: str,
                 plan_line: str, config) -> None:
        self.listing, self.files, self.label = listing, files, label
        self.plan_text, self.plan_line, self.config = plan_text, plan_line, config


def look_up(repo: str, token: str | None, settings: EngineSettings, gguf: str | None = None,
            known: hub.Listing | None = None, config=None) -> Lookup:
    """Blocking: the repo's listing, its config.json and the plan (a worker thread's job)."""
    lst = known or hub.listing(repo, token=token)
    files = hub.wanted(lst, gguf)
    why = ""
    if known is None:
        try:
            config = hub.remote_config(lst, token, files)
        except ModelError as e:  # a model this engine cannot run: its files still show, and why
            config, why = None, str(e)
    plan = Plan(line=f"plan: cannot be made: {why}", fits=False, error=why) if why else \
        hub.plan_before_download(lst, files, settings, config)
    return Lookup(lst, files, hub.format_label(lst, files, config[0] if config else None),
                  plan_sentence(plan) if plan.fits else plan.line.removeprefix("plan: "), plan.line, config)


def _item(text: str, align_right: bool = False) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(item.flags() & ~Qt.ItemFlag.ItemIsEditable)
    if align_right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _table(headers: list[str]) -> QTableWidget:
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.verticalHeader().hide()
    t.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    t.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    t.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
    return t


def when(ts: float | None) -> str:
    if ts is None:
        return "never"
    t = datetime.fromtimestamp(ts)
    return f"{t:%H:%M}" if t.date() == datetime.now().date() else f"{t.day} {t:%b %Y}"


class DownloadPanel(QWidget):
    finished = Signal()  # a model was installed
    use_requested = Signal(str)  # its path, when "Use this model" is clicked

    def __init__(self, settings: Callable[[], EngineSettings], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._settings = settings
        self.lookup: Lookup | None = None
        self.download: hub.Download | None = None
        self.running = False  # a transfer is under way (the window may be closed meanwhile)
        self.repo = QLineEdit(placeholderText="A Hugging Face repo id, e.g. mlx-community/Qwen3.5-27B-4bit",
                              clearButtonEnabled=True)
        self.look_button = QPushButton("Look up", objectName="primary")
        self.repo.returnPressed.connect(self.look_button.click)
        self.look_button.clicked.connect(lambda: asyncio.ensure_future(self.look()))
        self.token = QLineEdit(placeholderText="Access token, for gated or private repos "
                                               "(optional; HF_TOKEN works too)",
                               echoMode=QLineEdit.EchoMode.Password)
        self.suggestions = QListWidget(objectName="suggestions")
        for s in hub.CURATED:
            self.suggestions.addItem(f"{s.repo}    —    {s.note}")
        self.suggestions.setMaximumHeight(self.suggestions.sizeHintForRow(0) * 5 + 8)
        self.suggestions.itemActivated.connect(self._suggested)
        self.suggestions.itemClicked.connect(self._suggested)
        self.summary = QLabel(objectName="role", wordWrap=True)
        self.gguf = QComboBox(toolTip="The quantization to download (one GGUF file)")
        self.gguf.hide()
        self.gguf.activated.connect(lambda _i: asyncio.ensure_future(self.look(self.gguf.currentData())))
        self.files = _table(["File", "Size"])
        self.plan = QLabel(wordWrap=True, textFormat=Qt.TextFormat.PlainText)
        plan_box = QFrame(objectName="planBox")
        QVBoxLayout(plan_box).addWidget(self.plan)
        self.bar = QProgressBar(textVisible=True)
        self.bar.hide()
        self.status = QLabel(objectName="meta", wordWrap=True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.start_button = QPushButton("Download", objectName="primary", enabled=False)
        self.pause_button = QPushButton("Pause")
        self.cancel_button = QPushButton("Cancel")
        self.use_button = QPushButton("Use this model")
        for b in (self.pause_button, self.cancel_button, self.use_button):
            b.hide()
        self.start_button.clicked.connect(lambda: asyncio.ensure_future(self.start()))
        self.pause_button.clicked.connect(self.pause)
        self.cancel_button.clicked.connect(self.cancel)
        self.use_button.clicked.connect(lambda: self.use_requested.emit(self.use_button.property("path")))

        row = QHBoxLayout()
        row.addWidget(self.repo, 1)
        row.addWidget(self.look_button)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status, 1)
        for b in (self.use_button, self.cancel_button, self.pause_button, self.start_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.token)
        layout.addWidget(QLabel("Suggestions", objectName="meta"))
        layout.addWidget(self.suggestions)
        layout.addWidget(self.summary)
        layout.addWidget(self.gguf)
        layout.addWidget(self.files, 1)
        layout.addWidget(plan_box)
        layout.addWidget(self.bar)
        layout.addLayout(buttons)
        self._show_lookup()

    def _suggested(self, item) -> None:
        if not self.running:
            self.repo.setText(item.text().split()[0])
            self.look_button.click()

    async def look(self, gguf: str | None = None) -> None:
        """Ask the Hub about the typed repo (again, for another GGUF file of the same repo)."""
        repo = self.repo.text().strip()
        if not repo or self.running:
            return
        known = self.lookup.listing if gguf and self.lookup and self.lookup.listing.repo == repo else None
        config = self.lookup.config if known else None
        self.status.setText(f"Asking {hub.endpoint()} about {repo}…")
        self.look_button.setEnabled(False)
        try:
            self.lookup = await in_thread(look_up, repo, self.token.text().strip() or None, self._settings(), gguf,
                                          known, config)
            self.status.setText("")
        except LanechatError as e:
            self.lookup = None
            self.status.setText(str(e))
        finally:
            self.look_button.setEnabled(True)
        self.download = None
        self._show_lookup()

    def _show_lookup(self) -> None:
        lk = self.lookup
        self.files.setRowCount(0)
        for w in (self.bar, self.use_button, self.pause_button, self.cancel_button):
            w.hide()  # what the last download showed
        self.start_button.show()
        self.gguf.setVisible(bool(lk and lk.listing.kind == "gguf"))
        if lk is None:
            self.summary.setText("")
            self.plan.setText("Look a model up to see its files, its size and the memory it needs.")
            self.start_button.setEnabled(False)
            return
        total = sum(f.size for f in lk.files)
        self.summary.setText(f"{lk.listing.repo} · {lk.label} · {len(lk.files)} file{'s' if len(lk.files) > 1 else ''}"
                             f" · {size(total)} to download")
        for f in lk.files:
            r = self.files.rowCount()
            self.files.insertRow(r)
            self.files.setItem(r, 0, _item(f.path))
            self.files.setItem(r, 1, _item(size(f.size), align_right=True))
        if lk.listing.kind == "gguf":
            self.gguf.clear()
            for f in lk.listing.ggufs:
                self.gguf.addItem(f"{f.path}  ({size(f.size)})", f.path)
            self.gguf.setCurrentIndex(self.gguf.findData(lk.files[0].path))
        free = shutil.disk_usage(paths.cache_dir()).free
        self.plan.setText(f"Memory plan with your settings: {lk.plan_text}\n"
                          f"Disk: {size(total)} needed, {size(free)} free.")
        self.plan.setToolTip(lk.plan_line)
        self.start_button.setEnabled(True)
        self.start_button.setText("Download")

    async def start(self) -> None:
        lk = self.lookup
        if lk is None or self.running:
            return
        if self.download is None:
            self.download = hub.Download(lk.listing, lk.files, self.token.text().strip() or None)
        d = self.download
        self.start_button.hide()
        self.use_button.hide()
        self.pause_button.setText("Pause")
        self.pause_button.show()
        self.cancel_button.show()
        self.bar.show()
        self.bar.setRange(0, 1000)
        self._progress(hub.Progress("downloading", d.done_bytes(), d.total, "", 0.0))
        report, poll = newest_only(self._progress)
        self.running = True
        try:
            path = await in_thread(d.run, report, poll=poll)
        except hub.DownloadStoppedError as e:
            self._stopped(e.reason)
            return
        except LanechatError as e:
            self._stopped("failed")
            self.status.setText(str(e))
            return
        finally:
            self.running = False
        self.pause_button.hide()
        self.cancel_button.hide()
        self.start_button.hide()
        self.download = None
        self.status.setText(f"Installed in {path}")
        self.use_button.setProperty("path", str(path))
        self.use_button.show()
        self.finished.emit()

    def _progress(self, p: hub.Progress) -> None:
        self.bar.setValue(int(1000 * p.done / p.total) if p.total else 0)
        if p.stage == "downloading":
            rate = f" · {size(int(p.rate))}/s" if p.rate else ""
            self.status.setText(f"Downloading {p.file}: {size(p.done)} of {size(p.total)}{rate}")
        elif p.stage == "verifying":
            self.status.setText(f"Verifying {p.file}…")
        else:
            self.status.setText("Moving it into the models folder…")
        self.bar.setFormat(f"{100 * p.done / p.total:.1f} %" if p.total else "")

    def pause(self) -> None:
        if self.download is None:
            return
        if self.running:
            self.download.pause()
            self.pause_button.setEnabled(False)  # until the transfer has stopped
        else:
            asyncio.ensure_future(self.start())

    def cancel(self) -> None:
        if self.download is not None:
            self.download.cancel()
            if not self.running:  # paused: cancel() removed the files at once
                self._stopped("cancelled")

    def _stopped(self, reason: str) -> None:
        self.running = False
        self.pause_button.setEnabled(True)
        if reason == "paused":
            self.pause_button.setText("Resume")
            done = self.download.done_bytes() if self.download else 0
            total = self.download.total if self.download else 0
            self.status.setText(f"Paused at {size(done)} of {size(total)}; it resumes where it stopped.")
            return
        self.pause_button.hide()
        self.cancel_button.hide()
        self.start_button.show()
        if reason == "cancelled":
            self.download = None
            self.bar.hide()
            self.status.setText("Cancelled; nothing was kept.")
        else:
            self.start_button.setText("Try again")


def where(m: installed.Installed) -> str:
    """The models folder, or the folder it was opened from (the home folder as ~)."""
    if m.in_folder:
        return "models folder"
    parent = m.path.parent
    try:
        return "~/" + str(parent.relative_to(Path.home()))
    except ValueError:
        return str(parent)


def selected_plan(settings: EngineSettings, path: Path) -> str:
    """Blocking: the plan for this model with these settings, in words (reads only its config)."""
    s = copy.deepcopy(settings)
    s.model = str(path)
    return plan_sentence(plan(s))


class InstalledPanel(QWidget):
    use_requested = Signal(str)

    def __init__(self, bridge: EngineBridge, settings: Callable[[], EngineSettings],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.bridge, self._settings = bridge, settings
        self.models: list[installed.Installed] = []
        self.table = _table(["Model", "Format", "Architecture", "Size", "Max context", "Last used", "Where"])
        self.table.itemSelectionChanged.connect(self._selection)
        self.table.itemDoubleClicked.connect(lambda _item: self._use())
        self.note = QLabel(objectName="meta", wordWrap=True)
        self.use_button = QPushButton("Use this model", objectName="primary")
        self.folder_button = QPushButton("Open folder")
        self.delete_button = QPushButton("Delete…")
        self.use_button.clicked.connect(self._use)
        self.folder_button.clicked.connect(self._open_folder)
        self.delete_button.clicked.connect(self._delete)
        self.plan = QLabel(wordWrap=True, textFormat=Qt.TextFormat.PlainText)
        self.current = QLabel(wordWrap=True, textFormat=Qt.TextFormat.PlainText)
        current_box = QFrame(objectName="planBox")
        cl = QVBoxLayout(current_box)
        cl.addWidget(self.plan)
        cl.addWidget(QLabel("Current model", objectName="role"))
        cl.addWidget(self.current)
        buttons = QHBoxLayout()
        buttons.addWidget(self.note, 1)
        for b in (self.folder_button, self.delete_button, self.use_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)
        layout.addWidget(current_box)
        bridge.state_changed.connect(self._state_changed)
        self.refresh()

    def _state_changed(self) -> None:
        if self.bridge.state == "ready" and self.isVisible():
            self.refresh()  # the model just loaded was used now
        else:
            self.show_current()

    def refresh(self) -> None:
        """Read the models folder (and the recent list) again; the selected model stays selected."""
        chosen = self.selected()
        self.models = installed.listing()
        self.table.blockSignals(True)
        self.table.setRowCount(0)
        for m in self.models:
            r = self.table.rowCount()
            self.table.insertRow(r)
            cells = [m.name, m.format or "cannot be loaded", m.arch, size(m.size_bytes),
                     f"{m.max_context:,}" if m.max_context else "", when(m.last_used), where(m)]
            for c, text in enumerate(cells):
                item = _item(text, align_right=c in (3, 4))
                item.setToolTip(m.error or str(m.path))
                self.table.setItem(r, c, item)
            if chosen is not None and m.path == chosen.path:
                self.table.selectRow(r)
        self.table.blockSignals(False)
        n = sum(m.in_folder for m in self.models)
        self.note.setText(f"{n} model{'s' if n != 1 else ''} in {paths.models_dir()}")
        self._selection()
        self.show_current()

    def selected(self) -> installed.Installed | None:
        rows = self.table.selectionModel().selectedRows()
        return self.models[rows[0].row()] if rows else None

    def _selection(self) -> None:
        m = self.selected()
        self.use_button.setEnabled(m is not None and not m.error)
        self.delete_button.setEnabled(m is not None and m.in_folder)
        self.delete_button.setToolTip("" if m is None or m.in_folder else "Only models in the models folder are "
                                      f"deleted here; this one is in {m.path.parent}")
        if m is None:
            self.plan.setText("Select a model to see the memory it needs with your settings.")
        elif m.error:
            self.plan.setText(f"{m.name} cannot be loaded: {m.error}")
        else:
            self.plan.setText(f"Working out the memory {m.name} needs…")
            asyncio.ensure_future(self._show_plan(m))

    async def _show_plan(self, m: installed.Installed) -> None:
        text = await in_thread(selected_plan, self._settings(), m.path)
        if self.selected() is m:  # still the one selected
            self.plan.setText(f"{m.name} with your settings: {text}")

    def _use(self) -> None:
        m = self.selected()
        if m is not None and not m.error:
            self.use_requested.emit(str(m.path))

    def _open_folder(self) -> None:
        m = self.selected()
        target = m.path if m is not None and m.path.is_dir() else paths.models_dir()
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(target)))

    def _delete(self) -> None:
        m = self.selected()
        if m is None:
            return
        in_use = self._in_use(m.path)
        text = (f"Delete {m.name} ({size(m.size_bytes)}) from {m.path.parent}? This cannot be undone."
                + (" It is the model loaded now: the engine stops first." if in_use else ""))
        box = QMessageBox(QMessageBox.Icon.Warning, "Delete model", text, parent=self)
        delete = box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        if box.clickedButton() is not delete:
            return
        asyncio.ensure_future(self._really_delete(m.path, in_use))

    async def _really_delete(self, path: Path, in_use: bool) -> None:
        if in_use:
            await self.bridge.stop()
        try:
            await in_thread(installed.delete, path)
        except (LanechatError, OSError) as e:
            self.note.setText(f"Could not delete {path.name}: {e}")
        self.refresh()

    def _in_use(self, path: Path) -> bool:
        s = self.bridge.settings
        if s is None or self.bridge.state not in ("ready", "starting", "unloaded"):
            return False
        model = Path(s.model).expanduser() if s.model else None
        return model is not None and (model == path or path in model.parents)

    def show_current(self) -> None:
        b, info = self.bridge, self.bridge.info
        if info is None:
            self.current.setText({"starting": "Loading…", "unloaded": "Unloaded while idle; the next message loads "
                                  "it again."}.get(b.state, f"No model is loaded{': ' + b.error if b.error else ''}."))
            return
        lines = [f"{info.model_name} on {info.device}", plan_sentence(info.plan) if info.plan else info.plan_line]
        if b.ready_seconds is not None:
            stages = ", ".join(f"{name} {s:.1f} s" for name, s in info.timings)
            lines.append(f"Ready in {b.ready_seconds:.1f} s" + (f" ({stages})" if stages else ""))
        self.current.setText("\n".join(lines))
        self.current.setToolTip(info.plan_line)


class ModelsPage(QDialog):
    """File → Models…: one window the app keeps, so a download goes on while it is closed."""
    model_chosen = Signal(str)

    def __init__(self, bridge: EngineBridge, settings: Callable[[], EngineSettings],
                 parent: QWidget | None = None) -> None:
        super().__init__(parent, windowTitle="Models")
        self.resize(860, 640)
        self.tabs = QTabWidget()
        self.downloads = DownloadPanel(settings)
        self.installed = InstalledPanel(bridge, settings)
        self.tabs.addTab(self.installed, "Installed")
        self.tabs.addTab(self.downloads, "Download")
        self.downloads.finished.connect(self.installed.refresh)
        self.downloads.use_requested.connect(self.model_chosen)
        self.installed.use_requested.connect(self.model_chosen)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt override
        super().showEvent(event)
        self.installed.refresh()
