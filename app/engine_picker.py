"""The engine menu at the top of a tab: this computer or one of the remote engines."""
from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QComboBox, QWidget

from .engines import EngineChoices

ADD = "+add"  # the item that opens Engines and server instead of picking one (ids are hex)


class EnginePicker(QComboBox):
    picked = Signal(str)        # an engine id
    add_requested = Signal()    # "Add a remote engine…"

    def __init__(self, engines: EngineChoices, current: str, parent: QWidget | None = None) -> None:
        super().__init__(parent, toolTip="Which engine writes the replies in this tab")
        self.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.engines = engines
        self._current = current
        engines.changed.connect(self._fill)
        self.activated.connect(self._activated)
        self._fill()

    @property
    def current(self) -> str:
        return self._current

    def show_engine(self, engine_id: str) -> None:
        """Show the tab's engine (picked elsewhere) without reporting it as picked."""
        self._current = engine_id
        self.setCurrentIndex(self.findData(engine_id))

    def _fill(self) -> None:
        self.blockSignals(True)
        self.clear()
        for engine_id, label in self.engines.choices():
            self.addItem(label, engine_id)
        self.addItem("Add a remote engine…", ADD)
        gone = self.findData(self._current) < 0  # its remote was removed: back to this computer
        if gone:
            self._current = self.engines.id_of(self.engines.get(self._current))
        self.setCurrentIndex(self.findData(self._current))
        self.blockSignals(False)
        if gone:
            self.picked.emit(self._current)

    def _activated(self, index: int) -> None:
        engine_id = self.itemData(index)
        if engine_id == ADD:
            self.setCurrentIndex(self.findData(self._current))
            self.add_requested.emit()
        elif engine_id != self._current:
            self._current = engine_id
            self.picked.emit(engine_id)
