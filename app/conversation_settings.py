"""A conversation's own sampling: temperature, top-p, top-k, seed and max tokens that override the
settings' defaults for this conversation only, each behind its own switch, in a small panel
beside the system prompt, opened by its toggle ("Sampling: defaults ▾"). A switch that is off
shows the default the reply will use."""
from __future__ import annotations

from dataclasses import asdict

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QCheckBox,
    QDoubleSpinBox,
    QGridLayout,
    QSizePolicy,
    QSpinBox,
    QToolButton,
    QWidget,
)

from engine import SamplingParams

from .conversation import OWN_RANGES, OWN_SAMPLING

LABELS = {"temperature": "Temperature", "top_p": "Top-p", "top_k": "Top-k", "seed": "Seed",
          "max_tokens": "Max tokens"}
SHORT = {"temperature": "temp", "top_p": "top-p", "top_k": "top-k", "seed": "seed", "max_tokens": "max"}


def _box(name: str) -> QAbstractSpinBox:
    """A box over the range a conversation may set (conversation.OWN_RANGES)."""
    low, high = OWN_RANGES[name]
    if isinstance(low, float):
        box = QDoubleSpinBox(minimum=low, maximum=high, singleStep=0.05, decimals=2)
    else:
        box = QSpinBox(minimum=low, maximum=high, singleStep=256 if name == "max_tokens" else 1)
    special = {"temperature": "0 (greedy)", "top_k": "Off", "seed": "Random"}.get(name)
    if special:
        box.setSpecialValueText(special)
    box.setToolTip(f"{LABELS[name]} for this conversation")
    return box


def summary(own: dict) -> str:
    """The toggle's words: whether this conversation sets values of its own (short: the bar is full)."""
    return f"Sampling: {len(own)} own" if own else "Sampling: defaults"


def detail(own: dict) -> str:
    """The toggle's tooltip: which values this conversation sets."""
    if not own:
        return "Every sampling value as in Settings; click to set this conversation's own"
    return "This conversation's own: " + ", ".join(
        f"{SHORT[n]} {own[n]:g}" if isinstance(own[n], float) else f"{SHORT[n]} {own[n]}"
        for n in OWN_SAMPLING if n in own)


class SamplingPanel(QWidget):
    changed = Signal(dict)  # the conversation's own values, after the user changed one

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent, objectName="samplingPanel")
        self.toggle = QToolButton(checkable=True, objectName="messageAction")
        self.toggle.toggled.connect(self._toggled)
        self.setSizePolicy(QSizePolicy.Policy.Maximum, QSizePolicy.Policy.Maximum)  # beside the prompt, compact
        self.hide()
        self.checks: dict[str, QCheckBox] = {}
        self.boxes: dict[str, QAbstractSpinBox] = {}
        self._defaults = SamplingParams()
        self._showing = False
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.setVerticalSpacing(2)
        for row, name in enumerate(OWN_SAMPLING):
            check = QCheckBox(LABELS[name], toolTip=f"Use this conversation's own {LABELS[name].lower()}, "
                                                    "not the one in Settings")
            box = _box(name)
            check.toggled.connect(lambda on, n=name: self._switched(n, on))
            box.valueChanged.connect(self._edited)
            grid.addWidget(check, row, 0)
            grid.addWidget(box, row, 1)
            self.checks[name], self.boxes[name] = check, box
        self.reset = QToolButton(text="Use the defaults", objectName="messageAction",
                                 toolTip="Every value as in Settings")
        self.reset.clicked.connect(self._reset)
        grid.addWidget(self.reset, len(OWN_SAMPLING), 0, 1, 2)

    def show_for(self, own: dict, defaults: SamplingParams | None) -> None:
        """Show a conversation's own values; the others as the defaults (greyed)."""
        self._showing = True
        self._defaults = defaults or SamplingParams()
        base = asdict(self._defaults)
        for name in OWN_SAMPLING:
            self.checks[name].setChecked(name in own)
            self.boxes[name].setValue(own.get(name, base[name]))
            self.boxes[name].setEnabled(name in own)
        self.reset.setEnabled(bool(own))
        self._showing = False
        self._label(own)

    def _label(self, own: dict) -> None:
        self.toggle.setText(f"{summary(own)}  {'▴' if self.toggle.isChecked() else '▾'}")
        self.toggle.setToolTip(detail(own))

    def _toggled(self, on: bool) -> None:
        self.setVisible(on)
        self._label(self.own())

    def own(self) -> dict:
        """The values switched on, as the conversation file keeps them."""
        out = {}
        for name in OWN_SAMPLING:
            if self.checks[name].isChecked():
                value = self.boxes[name].value()
                out[name] = round(value, 4) if isinstance(value, float) else value
        return out

    def _switched(self, name: str, on: bool) -> None:
        self.boxes[name].setEnabled(on)
        if not on and not self._showing:
            self._showing = True  # the default goes back in without a change of its own
            self.boxes[name].setValue(asdict(self._defaults)[name])
            self._showing = False
        self._edited()

    def _edited(self) -> None:
        if not self._showing:
            own = self.own()
            self.reset.setEnabled(bool(own))
            self._label(own)
            self.changed.emit(own)

    def _reset(self) -> None:
        self.show_for({}, self._defaults)
        self.changed.emit({})
