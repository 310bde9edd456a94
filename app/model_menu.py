"""Ways to open a model besides Settings: File → Recent models, and a .gguf file or a model folder
dropped onto the window."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from PySide6.QtCore import QMimeData
from PySide6.QtWidgets import QMenu, QWidget

from engine import installed


def dropped_model(mime: QMimeData) -> Path | None:
    """The first dropped local file or folder that could be a model: a .gguf file, a model's
    config.json or .safetensors (its folder), or a folder. The loader says later if it is not one."""
    for url in mime.urls() if mime.hasUrls() else []:
        if not url.isLocalFile():
            continue
        path = Path(url.toLocalFile())
        if path.is_dir() or (path.is_file() and path.suffix == ".gguf"):
            return path
        if path.is_file() and (path.name == "config.json" or path.suffix == ".safetensors"):
            return path.parent
    return None


class RecentModelsMenu(QMenu):
    """The models loaded most recently (newest first), read each time the menu opens."""

    def __init__(self, open_model: Callable[[str], None], parent: QWidget | None = None) -> None:
        super().__init__("Recent &models", parent)
        self._open = open_model
        self.aboutToShow.connect(self.rebuild)
        self.rebuild()

    def rebuild(self) -> None:
        self.clear()
        recent = installed.recent()
        for i, path in enumerate(recent):
            label = path.name if path.suffix != ".gguf" else path.stem
            action = self.addAction(f"&{i + 1}  {label}" if i < 9 else label)
            action.setToolTip(str(path))
            action.triggered.connect(lambda _checked=False, p=str(path): self._open(p))
        if not recent:
            self.addAction("No models used yet").setEnabled(False)
