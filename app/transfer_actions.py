"""File → Export and Import, and the conversation list's: the file dialogs, the writes, and what
the window says afterwards. An import that fails names the file and why in a notice; nothing of
that file is imported, and no conversation is ever overwritten (an id in use gets a new one)."""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QFileDialog

from .conversation import Conversation, FormatError, new_id
from .transfer import FILTERS, JSON, MARKDOWN, SUFFIXES, documents, export_path, kind_of, read_import, write_export

if TYPE_CHECKING:
    from .window import MainWindow

IMPORT_FILTER = "Conversations (*.json);;All files (*)"


class Transfers:
    def __init__(self, window: MainWindow) -> None:
        self.window = window

    def export_one(self, cid: str) -> Path | None:
        """Export one conversation, as Markdown or JSON (the dialog's choice); where it went."""
        conv = self.window.conversation(cid)
        if conv is None:
            return None
        return self._export([conv], export_path(conv), "Export conversation", several=False)

    def export_all(self) -> Path | None:
        """Every conversation in the list (pinned first, then newest), into one file."""
        convs = self.window.conversations()
        if not convs:
            self.window.statusBar().showMessage("There are no saved conversations to export yet.", 5000)
            return None
        return self._export(convs, export_path(None), f"Export all {len(convs)} conversations", several=True)

    def _export(self, convs: list[Conversation], suggested: Path, title: str, several: bool) -> Path | None:
        dest = self._ask_save(title, suggested)
        if dest is None:
            return None
        try:
            write_export(convs, dest, several)
        except OSError as e:
            self.window.notices.add(f"Could not export to {dest}: {e.strerror or e}", error=True)
            return None
        self.window.statusBar().showMessage(f"Exported to {dest}", 5000)
        return dest

    def _ask_save(self, title: str, suggested: Path) -> Path | None:
        """Where to write, and so in which format: the name's ending if it has one of ours, else
        the filter chosen (the dialog adds its ending before it asks about replacing a file)."""
        dialog = QFileDialog(self.window, title, str(suggested.parent))
        dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dialog.setNameFilters([FILTERS[MARKDOWN], FILTERS[JSON]])
        dialog.setDefaultSuffix(SUFFIXES[MARKDOWN][1:])
        dialog.filterSelected.connect(lambda chosen: dialog.setDefaultSuffix(SUFFIXES[_kind(chosen)][1:]))
        dialog.selectFile(suggested.stem)
        try:
            if not dialog.exec() or not dialog.selectedFiles():
                return None
            dest, chosen = Path(dialog.selectedFiles()[0]), _kind(dialog.selectedNameFilter())
        finally:
            dialog.deleteLater()
        kind = kind_of(dest, chosen)
        return dest if dest.suffix.lower() == SUFFIXES[kind] else dest.with_name(dest.name + SUFFIXES[kind])

    def import_files(self, paths: list[str] | None = None) -> list[Conversation]:
        """Import the files the user picks (or `paths`): each whole or, with a notice, not at all.
        One conversation imported opens in a tab; every one joins the list."""
        if paths is None:
            paths, _ = QFileDialog.getOpenFileNames(self.window, "Import conversations", str(documents()),
                                                    IMPORT_FILTER)
        imported: list[Conversation] = []
        for name in paths:
            try:
                convs = read_import(Path(name))
            except FormatError as e:
                self.window.notices.add(f"Could not import {Path(name).name}: {e}. Nothing was imported from it.",
                                        error=True)
                continue
            imported += [conv for conv in convs if self._add(conv)]
        if len(imported) == 1:
            self.window.open_conversation(imported[0].id)
        if imported:
            self.window.statusBar().showMessage(
                f"Imported {len(imported)} conversation{'s' if len(imported) > 1 else ''}", 5000)
        return imported

    def _add(self, conv: Conversation) -> bool:
        """Save an imported conversation under an id nothing else has; False (with a notice) when
        it cannot be written."""
        w = self.window
        while w.store.taken(conv.id) or w.conversation(conv.id) is not None:
            conv.id = new_id()
        try:
            w.saver.now(conv.id, lambda: w.store.save(conv))
        except OSError as e:
            w.notices.add(f"Could not save the imported “{conv.title}”: {e.strerror or e}", error=True)
            return False
        w.history.upsert(conv, False)
        return True


def _kind(name_filter: str) -> str:
    return JSON if name_filter == FILTERS[JSON] else MARKDOWN
