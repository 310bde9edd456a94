"""System-prompt presets: named prompts the user saves, picks for any conversation and deletes.

They live in `presets.json` in the config dir, beside settings.json: {"format_version": 1,
"presets": [{"name", "text"}]}, written atomically. A file that cannot be read is moved to
`presets.unreadable.json` (nothing is lost) and the list starts empty.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QInputDialog, QMenu, QToolButton, QWidget

from engine import jsonfile, paths

from .atomic import write_json_atomic

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
MAX_BYTES, MAX_DEPTH = 4 << 20, 4
MAX_NAME = 80


@dataclass
class Preset:
    name: str
    text: str


def presets_path() -> Path:
    return paths.config_dir() / "presets.json"


def load_presets() -> list[Preset]:
    """The saved presets, in the order they were saved."""
    path = presets_path()
    if not path.exists():
        return []
    try:
        raw = jsonfile.read(path, MAX_DEPTH, MAX_BYTES)
        if not isinstance(raw, dict) or not isinstance(raw.get("presets"), list):
            raise ValueError("no list of presets")
    except (OSError, ValueError) as e:
        aside = path.with_name("presets.unreadable.json")
        log.warning("presets in %s could not be read (%s); moved to %s", path, e, aside.name)
        path.replace(aside)
        return []
    return [Preset(p["name"][:MAX_NAME], p["text"]) for p in raw["presets"]
            if isinstance(p, dict) and isinstance(p.get("name"), str) and p["name"].strip()
            and isinstance(p.get("text"), str)]


def save_presets(presets: list[Preset]) -> None:
    write_json_atomic(presets_path(), {"format_version": FORMAT_VERSION, "presets": [asdict(p) for p in presets]})


def saved_as(presets: list[Preset], name: str, text: str) -> list[Preset]:
    """The list with `text` saved under `name`: a preset of that name is replaced in its place."""
    name = name.strip()[:MAX_NAME]
    if not name:
        raise ValueError("a preset needs a name")
    if any(p.name == name for p in presets):
        return [Preset(name, text) if p.name == name else p for p in presets]
    return presets + [Preset(name, text)]


class PresetButton(QToolButton):
    """"Presets": pick a saved system prompt, save the one written here, or delete one."""
    picked = Signal(str)  # the text of the preset picked

    def __init__(self, current: Callable[[], str], parent: QWidget | None = None) -> None:
        super().__init__(parent, text="Presets", objectName="messageAction",
                         toolTip="Saved system prompts: pick one, or save this one for other conversations")
        self._current = current
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.setMenu(QMenu(self))
        self.menu().aboutToShow.connect(self.rebuild)

    def rebuild(self) -> None:
        menu = self.menu()
        menu.clear()
        presets = load_presets()
        for p in presets:
            action = menu.addAction(p.name)
            action.setToolTip(p.text[:300])
            action.triggered.connect(lambda _=False, text=p.text: self.picked.emit(text))
        if not presets:
            menu.addAction("No presets yet").setEnabled(False)
        menu.addSeparator()
        save = menu.addAction("Save this prompt as a preset…")
        save.setEnabled(bool(self._current().strip()))
        save.triggered.connect(self._ask_name)
        delete = menu.addMenu("Delete a preset")
        delete.setEnabled(bool(presets))
        for p in presets:
            delete.addAction(p.name).triggered.connect(lambda _=False, name=p.name: self.delete(name))
        menu.setToolTipsVisible(True)

    def _ask_name(self) -> None:
        text = self._current()
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:40]
        name, ok = QInputDialog.getText(self, "Save the system prompt",
                                        "Name of the preset (one of the same name is replaced):", text=first)
        if ok and name.strip():
            self.save_as(name, text)

    def save_as(self, name: str, text: str) -> None:
        save_presets(saved_as(load_presets(), name, text))

    def delete(self, name: str) -> None:
        save_presets([p for p in load_presets() if p.name != name])
