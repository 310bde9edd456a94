"""Presets: named system prompts, with sampling values of their own if the user wants, that the
user saves, picks for any conversation and deletes.

They live in `presets.json` in the config dir, beside settings.json: {"format_version": 1,
"presets": [{"name", "text", "sampling" (optional: any of the conversation's own values)}]},
written atomically. A file that cannot be read is moved aside to `presets.unreadable.json` (nothing
is lost) and the list starts empty. An entry that cannot be used (no name, a text that is not
text, a sampling value out of its range) is listed with the reason, cannot be picked, and is
written back as it was until the user deletes it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QInputDialog, QMenu, QToolButton, QWidget

from engine import jsonfile, paths

from .atomic import write_json_atomic
from .conversation import FormatError, check_sampling
from .conversation_settings import detail

log = logging.getLogger(__name__)
FORMAT_VERSION = 1
MAX_BYTES, MAX_DEPTH = 4 << 20, 4
MAX_NAME = 80
SHOWN_PROBLEM = 70  # characters of the reason an entry cannot be used, in its menu item


@dataclass
class Preset:
    name: str
    text: str  # the system prompt ("": the preset sets sampling alone)
    sampling: dict[str, Any] = field(default_factory=dict)  # own values it gives the conversation
    problem: str | None = None  # why the entry cannot be used
    raw: Any = field(default=None, repr=False, compare=False)  # such an entry as the file holds it

    def to_json(self) -> Any:
        if self.problem is not None:
            return self.raw
        return {"name": self.name, "text": self.text, **({"sampling": self.sampling} if self.sampling else {})}


def preset_from(raw: Any, n: int) -> Preset:
    """The file's `n`th entry (from 1); one that cannot be used keeps its JSON and says why."""
    name = raw.get("name") if isinstance(raw, dict) else None
    shown = name.strip()[:MAX_NAME] if isinstance(name, str) and name.strip() else f"Preset {n}"
    try:
        if not isinstance(raw, dict):
            raise FormatError("it is not an object with a name and a text")
        if not (isinstance(name, str) and name.strip()):
            raise FormatError("it has no name")
        if not isinstance(raw.get("text"), str):
            raise FormatError("its text is not text")
        sampling = check_sampling(raw.get("sampling", {}))
    except FormatError as e:
        return Preset(shown, "", problem=str(e), raw=raw)
    return Preset(shown, raw["text"], sampling)


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
        n = 1
        while aside.exists():
            aside = path.with_name(f"presets.unreadable.{n}.json")
            n += 1
        log.warning("presets in %s could not be read (%s); moved to %s", path, e, aside.name)
        path.replace(aside)
        return []
    presets = [preset_from(p, i) for i, p in enumerate(raw["presets"], 1)]
    for p in presets:
        if p.problem is not None:
            log.warning("preset %r in %s cannot be used: %s", p.name, path, p.problem)
    return presets


def save_presets(presets: list[Preset]) -> None:
    write_json_atomic(presets_path(), {"format_version": FORMAT_VERSION, "presets": [p.to_json() for p in presets]})


def saved_as(presets: list[Preset], name: str, text: str, sampling: dict[str, Any] | None = None) -> list[Preset]:
    """The list with `text` and `sampling` saved under `name`: a preset of that name is replaced
    in its place. ValueError (FormatError) for no name or a sampling value out of its range."""
    name = name.strip()[:MAX_NAME]
    if not name:
        raise ValueError("a preset needs a name")
    new = Preset(name, text, check_sampling(sampling or {}))
    if any(p.name == name for p in presets):
        return [new if p.name == name else p for p in presets]
    return presets + [new]


class PresetButton(QToolButton):
    """"Presets": pick a saved system prompt (and its sampling), save this conversation's, or delete one."""
    picked = Signal(object)  # the Preset picked

    def __init__(self, current: Callable[[], tuple[str, dict[str, Any]]], parent: QWidget | None = None) -> None:
        super().__init__(parent, text="Presets", objectName="messageAction",
                         toolTip="Saved system prompts and sampling: pick one, or save this conversation's "
                                 "for other conversations")
        self._current = current  # the conversation's system prompt and own sampling
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.setMenu(QMenu(self))
        self.menu().aboutToShow.connect(self.rebuild)

    def rebuild(self) -> None:
        menu = self.menu()
        menu.clear()
        presets = load_presets()
        for p in presets:
            if p.problem is not None:
                why = p.problem if len(p.problem) <= SHOWN_PROBLEM else p.problem[:SHOWN_PROBLEM - 1] + "…"
                action = menu.addAction(f"{p.name} (cannot be used: {why})")
                action.setEnabled(False)
                action.setToolTip(f"{p.name} in {presets_path()} cannot be used: {p.problem}")
                continue
            action = menu.addAction(p.name)
            action.setToolTip("\n\n".join(([p.text[:300]] if p.text else []) + ([detail(p.sampling)] if p.sampling
                                                                                   else [])))
            action.triggered.connect(lambda _=False, p=p: self.picked.emit(p))
        if not presets:
            menu.addAction("No presets yet").setEnabled(False)
        menu.addSeparator()
        text, sampling = self._current()
        save = menu.addAction("Save this prompt and sampling as a preset…")
        save.setEnabled(bool(text.strip() or sampling))
        save.triggered.connect(self._ask_name)
        delete = menu.addMenu("Delete a preset")
        delete.setEnabled(bool(presets))
        for i, p in enumerate(presets):
            delete.addAction(p.name).triggered.connect(lambda _=False, i=i: self.delete(i))
        menu.setToolTipsVisible(True)

    def _ask_name(self) -> None:
        text, sampling = self._current()
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")[:40]
        name, ok = QInputDialog.getText(self, "Save as a preset",
                                        "Name of the preset (one of the same name is replaced):", text=first)
        if ok and name.strip():
            self.save_as(name, text, sampling)

    def save_as(self, name: str, text: str, sampling: dict[str, Any] | None = None) -> None:
        save_presets(saved_as(load_presets(), name, text, sampling))

    def delete(self, index: int) -> None:
        """Delete the `index`th preset of the list as the menu showed it."""
        presets = load_presets()
        save_presets(presets[:index] + presets[index + 1:])
