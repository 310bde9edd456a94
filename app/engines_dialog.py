"""Engines and server: remote OpenAI-compatible engines the tabs may pick (base URL, API key,
model listed from /v1/models), and "Serve on localhost" for this computer's engine (port; other
computers only with an API key, generated here and shown once)."""
from __future__ import annotations

import asyncio
import copy

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine import LanechatError

from . import theme
from .connections import Connections, RemoteConfig, new_api_key
from .remote_engine import list_models


class EnginesDialog(QDialog):
    def __init__(self, connections: Connections, parent: QWidget | None = None) -> None:
        super().__init__(parent, windowTitle="Engines and server")
        self.setMinimumWidth(640)
        self.remotes = copy.deepcopy(connections.remotes)
        self.server = copy.deepcopy(connections.server)
        self._listing: asyncio.Future | None = None
        self._loading = False  # True while the form is filled from a remote (not an edit)
        self._key_fresh = False  # a key made in this dialog, shown until it closes

        # Remote engines
        self.list = QListWidget()
        self.list.setMaximumHeight(110)
        add, self.remove = QPushButton("Add"), QPushButton("Remove")
        add.clicked.connect(self.add_remote)
        self.remove.clicked.connect(self._remove)
        side = QVBoxLayout()
        side.addWidget(add)
        side.addWidget(self.remove)
        side.addStretch()
        top = QHBoxLayout()
        top.addWidget(self.list, 1)
        top.addLayout(side)
        self.name = QLineEdit(placeholderText="e.g. GPU server")
        self.url = QLineEdit(placeholderText="http://gpu-box:8000/v1  (vLLM, SGLang, llama-server, Lanechat)")
        self.key = QLineEdit(placeholderText="none", echoMode=QLineEdit.EchoMode.Password)
        self.model = QComboBox(editable=True)
        self.model.lineEdit().setPlaceholderText("List the server's models, or type one")
        self.list_button = QPushButton("List models")
        self.list_button.clicked.connect(self._list_clicked)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model, 1)
        model_row.addWidget(self.list_button)
        self.remote_note = QLabel(objectName="meta", wordWrap=True)
        self.remote_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.form = QWidget()
        form = QFormLayout(self.form)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Name", self.name)
        form.addRow("Base URL", self.url)
        form.addRow("API key", self.key)
        form.addRow("Model", model_row)
        remote_box = QGroupBox("Remote engines (OpenAI-compatible), for models beyond this computer")
        rl = QVBoxLayout(remote_box)
        rl.addLayout(top)
        rl.addWidget(self.form)
        rl.addWidget(self.remote_note)

        # This computer's engine for other programs
        self.serve = QCheckBox("Serve on localhost", checked=self.server.enabled)
        self.port = QSpinBox(minimum=1, maximum=65535, value=self.server.port, prefix="port ")
        self.lan = QCheckBox("Let other computers connect (they must send the API key)", checked=self.server.lan)
        self.key_shown = QLineEdit(readOnly=True, visible=False)
        self.new_key = QPushButton("New key")
        self.new_key.clicked.connect(self._make_key)
        key_row = QHBoxLayout()
        key_row.addWidget(self.key_shown, 1)
        key_row.addWidget(self.new_key)
        self.server_note = QLabel(objectName="meta", wordWrap=True)
        serve_row = QHBoxLayout()
        serve_row.addWidget(self.serve)
        serve_row.addWidget(self.port)
        serve_row.addStretch()
        server_box = QGroupBox("This computer's engine for other programs (OpenAI API)")
        sl = QVBoxLayout(server_box)
        sl.addLayout(serve_row)
        sl.addWidget(self.lan)
        sl.addLayout(key_row)
        sl.addWidget(self.server_note)

        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        self.save_button = buttons.button(QDialogButtonBox.StandardButton.Save)
        buttons.accepted.connect(self._save)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(remote_box)
        layout.addWidget(server_box)
        layout.addWidget(buttons)

        for remote in self.remotes:
            self.list.addItem(remote.label)
        self.list.currentRowChanged.connect(self._show_remote)
        for w in (self.name, self.url, self.key):
            w.textEdited.connect(self._edited)
        self.model.currentTextChanged.connect(self._edited)
        for w in (self.serve, self.lan):
            w.toggled.connect(self._server_changed)
        self.port.valueChanged.connect(self._server_changed)
        self.list.setCurrentRow(0 if self.remotes else -1)
        self._show_remote(self.list.currentRow())
        self._server_changed()

    # --- remotes --------------------------------------------------------------------------

    @property
    def selected(self) -> RemoteConfig | None:
        row = self.list.currentRow()
        return self.remotes[row] if 0 <= row < len(self.remotes) else None

    def add_remote(self) -> None:
        self.remotes.append(RemoteConfig(name=f"Remote engine {len(self.remotes) + 1}"))
        self.list.addItem(self.remotes[-1].label)
        self.list.setCurrentRow(len(self.remotes) - 1)
        self.url.setFocus()

    def _remove(self) -> None:
        row = self.list.currentRow()
        if 0 <= row < len(self.remotes):
            del self.remotes[row]
            self.list.takeItem(row)
            self._show_remote(self.list.currentRow())

    def _show_remote(self, row: int) -> None:
        remote = self.selected
        self.form.setEnabled(remote is not None)
        self.remove.setEnabled(remote is not None)
        self._loading = True
        self.name.setText(remote.name if remote else "")
        self.url.setText(remote.base_url if remote else "")
        self.key.setText(remote.api_key if remote else "")
        self.model.clear()
        self.model.setEditText(remote.model if remote else "")
        self._loading = False
        self._note("" if remote else "Add a remote engine to run big models on another machine.")

    def _edited(self) -> None:
        remote = self.selected
        if remote is None or self._loading:
            return
        remote.name, remote.base_url, remote.api_key = self.name.text(), self.url.text().strip(), self.key.text()
        remote.model = self.model.currentText().strip()
        self.list.item(self.list.currentRow()).setText(remote.label)

    def _list_clicked(self) -> None:
        self._listing = asyncio.ensure_future(self.refresh_models())

    async def refresh_models(self) -> None:
        """Fill the model list from the selected remote's /v1/models; the note says what happened."""
        remote = self.selected
        if remote is None or not remote.base_url:
            self._note("Enter the server's base URL first.", error=True)
            return
        self.list_button.setEnabled(False)
        self._note(f"Asking {remote.api_base}/models…")
        try:
            ids = await list_models(remote.base_url, remote.api_key)
        except LanechatError as e:
            self._note(str(e), error=True)
            return
        finally:
            self.list_button.setEnabled(True)
        if remote is not self.selected:
            return
        chosen = remote.model
        self._loading = True
        self.model.clear()
        self.model.addItems(ids)
        self._loading = False
        self.model.setEditText(chosen if chosen or not ids else ids[0])
        self._edited()
        self._note(f"{len(ids)} model{'s' if len(ids) != 1 else ''} on {remote.api_base}" if ids
                   else f"{remote.api_base} lists no models", error=not ids)

    def _note(self, text: str, error: bool = False) -> None:
        self.remote_note.setText(text)
        theme.restyle(self.remote_note, "error" if error else "meta")

    # --- the local server -----------------------------------------------------------------

    def _make_key(self) -> None:
        self.server.api_key = new_api_key()
        self.key_shown.setText(self.server.api_key)
        self.key_shown.selectAll()
        self._key_fresh = True
        self._server_changed()

    def _server_changed(self) -> None:
        s = self.server
        s.enabled, s.port, s.lan = self.serve.isChecked(), self.port.value(), self.lan.isChecked()
        if s.lan and not s.api_key:
            self._make_key()
            return
        self.port.setEnabled(s.enabled)
        self.lan.setEnabled(s.enabled)
        self.new_key.setVisible(s.enabled and s.lan)
        self.key_shown.setVisible(self._key_fresh and s.enabled and s.lan)
        if not s.enabled:
            text = "Off. When on, editors, agents and scripts use the model loaded here, as more streams."
        else:
            text = f"Other programs on this computer reach it at http://127.0.0.1:{s.port}/v1"
            if s.lan:
                text += f"; other computers at http://<this computer>:{s.port}/v1 with the API key"
                if self._key_fresh:
                    text += " above — copy it now: it is shown only this once"
        self.server_note.setText(text + ".")

    def _save(self) -> None:
        missing = [r.label for r in self.remotes if not r.base_url]
        if missing:
            self._note(f"{missing[0]} needs a base URL (or remove it).", error=True)
            return
        self.accept()

    def connections(self) -> Connections:
        return Connections(copy.deepcopy(self.remotes), copy.deepcopy(self.server))
