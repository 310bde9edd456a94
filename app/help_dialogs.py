"""Help → Keyboard shortcuts (read from the window's actions, so it lists exactly what the keys do)
and Help → About (version, engine backend, GPU, model, and the data folder with Open)."""
from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import Qt, QUrl, qVersion
from PySide6.QtGui import QAction, QDesktopServices, QFont, QKeySequence
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMenu,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from engine import EngineSettings, default_model_path

from . import APP_NAME
from .engine_bridge import EngineBridge

OTHER = "Other"  # actions with shortcuts outside the menu bar


def plain(text: str) -> str:
    """A menu text as read: without its mnemonic '&' (a doubled one is a real '&') and ellipsis."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").rstrip("…").strip()


def key_name(key: QKeySequence) -> str:
    """One binding as the user presses it. A keyboard's own key for a command (Close, Back: Qt's
    keys from Key_Back on) is named a key, or it would read as the command."""
    text = key.toString(QKeySequence.SequenceFormat.NativeText)
    combo = key[0] if key.count() == 1 else None
    own = (combo is not None and combo.keyboardModifiers() == Qt.KeyboardModifier.NoModifier
           and combo.key().value >= Qt.Key.Key_Back.value)
    return f"{text} key" if own else text


def keys_text(action: QAction) -> str:
    """The action's bindings as alternatives ("Ctrl+W or Ctrl+F4"): Qt writes a sequence of keys
    pressed in turn with commas, so a comma between alternatives would read as one."""
    return " or ".join(key_name(k) for k in action.shortcuts())


def shortcut_rows(window: QMainWindow) -> list[tuple[str, str, str]]:
    """(menu, command, keys) for every action of the window that has a shortcut: those of the
    menu bar in menu order (a submenu's as 'Menu › Submenu'), then any other as OTHER."""
    rows: list[tuple[str, str, str]] = []
    seen: set[QAction] = set()

    def walk(menu: QMenu, group: str) -> None:
        for action in menu.actions():
            seen.add(action)
            if action.menu() is not None:
                walk(action.menu(), f"{group} › {plain(action.text())}")
            elif action.shortcuts() and action.text():
                rows.append((group, plain(action.text()), keys_text(action)))

    for top in window.menuBar().actions():
        if top.menu() is not None:
            walk(top.menu(), plain(top.text()))
    rows += sorted((OTHER, plain(a.text()), keys_text(a)) for a in window.findChildren(QAction)
                   if a not in seen and a.shortcuts() and a.text())
    return rows


class ShortcutsDialog(QDialog):
    def __init__(self, window: QMainWindow) -> None:
        super().__init__(window, windowTitle="Keyboard shortcuts")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.filter = QLineEdit(placeholderText="Type to filter", clearButtonEnabled=True)
        self.filter.textChanged.connect(self._filter)
        self.tree = QTreeWidget(columnCount=2, rootIsDecorated=False, uniformRowHeights=True)
        self.tree.setHeaderLabels(["Command", "Keys"])
        self.tree.header().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.tree.header().setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        self.tree.header().setStretchLastSection(False)
        groups: dict[str, QTreeWidgetItem] = {}
        for group, command, keys in shortcut_rows(window):
            if group not in groups:
                groups[group] = head = QTreeWidgetItem(self.tree, [group])
                head.setFirstColumnSpanned(True)
                font = QFont(head.font(0))
                font.setWeight(QFont.Weight.DemiBold)
                head.setFont(0, font)
                head.setFlags(Qt.ItemFlag.ItemIsEnabled)
            QTreeWidgetItem(groups[group], [command, keys])
        self.tree.expandAll()
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, rejected=self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.filter)
        layout.addWidget(self.tree, 1)
        layout.addWidget(buttons)
        self.resize(520, 600)

    def rows(self) -> list[tuple[str, str, str]]:
        """What the list shows now: (menu, command, keys) of the rows not filtered out."""
        out = []
        for i in range(self.tree.topLevelItemCount()):
            head = self.tree.topLevelItem(i)
            out += [(head.text(0), head.child(j).text(0), head.child(j).text(1))
                    for j in range(head.childCount()) if not head.child(j).isHidden()]
        return out

    def _filter(self, text: str) -> None:
        words = text.lower().split()
        for i in range(self.tree.topLevelItemCount()):
            head = self.tree.topLevelItem(i)
            for j in range(head.childCount()):
                row = head.child(j)
                hay = f"{head.text(0)} {row.text(0)} {row.text(1)}".lower()
                row.setHidden(not all(w in hay for w in words))
            head.setHidden(all(head.child(j).isHidden() for j in range(head.childCount())))


def version() -> str:
    try:
        return metadata.version("lanechat")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


class AboutDialog(QDialog):
    """What runs here. Follows the engine: a model that finishes loading while it is open shows."""

    def __init__(self, bridge: EngineBridge, settings: EngineSettings, data_dir: Path,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent, windowTitle=f"About {APP_NAME}")
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.bridge, self.settings, self.data_dir = bridge, settings, data_dir
        title = QLabel(APP_NAME, objectName="title")
        blurb = QLabel("A desktop chat with its own local LLM engine.", objectName="hint")
        self.backend, self.gpu, self.model = (QLabel(wordWrap=True) for _ in range(3))
        for label in (self.backend, self.gpu, self.model):
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        folder = QLabel(str(data_dir), wordWrap=True)
        folder.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.open_button = QPushButton("Open", toolTip="Show the data folder in the file manager")
        self.open_button.clicked.connect(self.open_data_dir)
        self.open_note = QLabel("No file manager could be started here: the path can be selected and copied.",
                                objectName="hint", wordWrap=True, visible=False)
        folder_row = QHBoxLayout()
        folder_row.addWidget(folder, 1)
        folder_row.addWidget(self.open_button, 0, Qt.AlignmentFlag.AlignTop)
        form = QFormLayout()
        form.addRow("Version:", QLabel(version()))
        form.addRow("Engine backend:", self.backend)
        form.addRow("GPU:", self.gpu)
        form.addRow("Model:", self.model)
        form.addRow("Data folder:", folder_row)
        form.addRow("", self.open_note)
        runtime = QLabel(f"Qt {qVersion()} · PySide6 {pyside_version} · Python {platform.python_version()}",
                         objectName="meta")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close, rejected=self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addWidget(blurb)
        layout.addSpacing(8)
        layout.addLayout(form)
        layout.addWidget(runtime)
        layout.addWidget(buttons)
        self.setMinimumWidth(520)
        bridge.state_changed.connect(self.refresh)
        self.refresh()

    def refresh(self) -> None:
        info, b = self.bridge.info, self.bridge
        path = self.settings.model or f"{default_model_path()} (the default model)"
        if info is None:
            state = {"starting": "loading the model…", "failed": "no model loaded",
                     "unloaded": "unloaded while idle"}.get(b.state, "not running")
            self.backend.setText(f"{self.settings.backend} ({state})")
            self.gpu.setText("not known until a model is loaded")
            self.model.setText(path)
        else:
            self.backend.setText(info.backend)
            self.gpu.setText(info.device if info.backend == "cupy" else f"none: {info.backend} runs on the "
                             f"{info.device}")
            self.model.setText(f"{info.model_name}\n{path}")

    def open_data_dir(self) -> bool:
        """Show the folder in the desktop's file manager; says so where none starts."""
        opened = QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.data_dir)))
        self.open_note.setVisible(not opened)
        return opened

