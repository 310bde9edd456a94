"""Settings (Ctrl+,): model, engine and sampling defaults, with the memory plan recomputed as
values change. A plan that cannot fit, or a model the loader refuses, cannot be applied.

Sampling values the user has not set follow the model's recommendation (and change with the
model); one the user sets stays theirs until "Use the model's values".
"""
from __future__ import annotations

import copy
from typing import Callable

from PySide6.QtCore import QSignalBlocker, Qt, QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from engine import EngineSettings, LanechatError, default_model_path, describe_model, model_sampling_defaults, plan

from . import idle_unload, theme
from .app_settings import MODEL_SAMPLING, recommended_sampling
from .model_download import DownloadButton
from .plan_words import plan_sentence

_BACKENDS = [("auto", "Automatic (GPU when there is one)"), ("cupy", "GPU (CuPy)"), ("numpy", "CPU (NumPy)")]
_KV = [("bf16", "bf16"), ("fp8", "fp8 (half the memory)")]
_PREFILL = [("fp16", "Fast (fp16 tensor cores)"), ("exact", "Exact (as decoding; slower on the GPU)")]
_PAGING = [("off", "Off: every stream has its own window"),
           ("pages", "Other streams on pages"),
           ("all", "All streams on pages")]
_PAGE_SIZES = [16, 32, 64, 128, 256, 512, 1024]
_DRAFTERS = [("none", "None"), ("ngram", "N-gram (prompt lookup; any model)"),
             ("mtp", "MTP (the model's own head; Qwen3.5 / 3.6)"),
             ("dflash2", "DFlash2 (a drafter checkpoint made for the model)")]
_DEBOUNCE_MS = 120  # recompute the plan once typing pauses, not on every keystroke


def _combo(items: list[tuple[object, str]], value: object) -> QComboBox:
    box = QComboBox()
    for data, label in items:
        box.addItem(label, data)
    box.setCurrentIndex(max(0, box.findData(value)))
    return box


def _spin(lo: int, hi: int, value: int, step: int = 1, special: str = "") -> QSpinBox:
    box = QSpinBox(minimum=lo, maximum=hi, value=value, singleStep=step)
    box.setSpecialValueText(special)
    return box


def _dspin(lo: float, hi: float, value: float, step: float, decimals: int = 2, special: str = "") -> QDoubleSpinBox:
    box = QDoubleSpinBox(minimum=lo, maximum=hi, value=value, singleStep=step, decimals=decimals)
    box.setSpecialValueText(special)
    return box


class SettingsDialog(QDialog):
    def __init__(self, settings: EngineSettings, busy: int = 0, chosen: set[str] | None = None,
                 parent: QWidget | None = None, idle: int | None = None, unified: bool | None = None,
                 clear_snapshots: Callable[[], int] | None = None) -> None:
        """`chosen`: the sampling fields the user set (the rest follow the model); None: all of them.
        `idle`: the unload-when-idle choice (app.idle_unload); `unified`: the running engine's memory kind.
        `clear_snapshots`: removes the saved KV snapshots, returns how many (the "Clear" button)."""
        super().__init__(parent, windowTitle="Settings")
        self._base = settings
        self.chosen = set(MODEL_SAMPLING) if chosen is None else set(chosen)
        self.setMinimumWidth(760)
        s, sp = settings, settings.sampling

        # Model
        self.model = QLineEdit(s.model or "", clearButtonEnabled=True)
        self.model.setPlaceholderText(f"Default: {default_model_path()}")
        browse_file = QPushButton("File…", toolTip="A GGUF file or a safetensors file", objectName="browseFile")
        browse_dir = QPushButton("Folder…", toolTip="A Hugging Face or MLX model folder", objectName="browseFolder")
        use_default = QPushButton("Default", toolTip="The embedded default model", objectName="useDefault")
        browse_file.clicked.connect(self._pick_file)
        browse_dir.clicked.connect(self._pick_folder)
        use_default.clicked.connect(self.model.clear)
        model_row = QHBoxLayout()
        model_row.addWidget(self.model, 1)
        for b in (browse_file, browse_dir, use_default):
            model_row.addWidget(b)
        self.model_info = QLabel(objectName="meta", wordWrap=True)
        self.model_info.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.download = DownloadButton()
        self.download.done.connect(self._downloaded)
        self.download.hide()
        model_box = QGroupBox("Model")
        ml = QVBoxLayout(model_box)
        ml.addLayout(model_row)
        ml.addWidget(self.model_info)
        ml.addWidget(self.download)

        # Engine
        self.backend = _combo(_BACKENDS, s.backend)
        self.parallel = _spin(1, 64, s.parallel)
        self.parallel.setSuffix(" streams")
        self.context = _spin(16, 1 << 20, s.context, step=1024)
        self.context.setSuffix(" tokens")
        self.kv_dtype = _combo(_KV, s.kv_dtype)
        self.prefill_precision = _combo(_PREFILL, s.prefill_precision)
        self.prefill_precision.setToolTip("How the GPU rounds the matrix products of reading a prompt: fp16 tensor "
                                          "cores are about 2.5x faster, at about 0.05% error per element (as other "
                                          "fp16 engines); exact uses decoding's near-fp32 arithmetic. The CPU "
                                          "backend always computes exactly.")
        self.paging = _combo(_PAGING, s.paging)
        self.page_tokens = _combo([(n, f"{n} tokens") for n in _PAGE_SIZES], s.page_tokens)
        # Automatic is a box of its own: a tiny budget typed in is refused by the plan, never
        # rounded to zero and read as "automatic".
        self.memory_auto = QCheckBox("Automatic", checked=s.memory_gib is None,
                                     toolTip="A safe share of the free memory: half of what the weights leave")
        self.memory = _dspin(0.001, 4096, s.memory_gib or 4.0, 0.5, decimals=3)
        self.memory.setSuffix(" GiB")
        self.memory.setEnabled(s.memory_gib is not None)
        self.memory_auto.toggled.connect(lambda auto: self.memory.setEnabled(not auto))
        memory_row = QHBoxLayout()
        memory_row.addWidget(self.memory_auto)
        memory_row.addWidget(self.memory, 1)
        self.drafter = _combo(_DRAFTERS, s.drafter)
        self.drafter_model = QLineEdit(s.drafter_model or "", clearButtonEnabled=True)
        self.drafter_model.setPlaceholderText("The DFlash2 checkpoint folder (config.json and .safetensors)")
        browse_drafter = QPushButton("Folder…", toolTip="The DFlash2 drafter's checkpoint folder",
                                     objectName="browseDrafter")
        browse_drafter.clicked.connect(self._pick_drafter)
        self.drafter_box = QWidget()
        drafter_row = QHBoxLayout(self.drafter_box)
        drafter_row.setContentsMargins(0, 0, 0, 0)
        drafter_row.addWidget(self.drafter_model, 1)
        drafter_row.addWidget(browse_drafter)
        self.draft_tokens = _spin(1, 16, s.draft_tokens)
        self.draft_tokens.setSuffix(" drafts per step")
        self.idle = _combo([(c, idle_unload.describe(c, unified)) for c in idle_unload.CHOICES], idle)
        self.idle.setToolTip("Give the model's memory back when no message came for a while; "
                             "the next message loads it again")
        self.prompt_cache = _dspin(0, 4096, s.prompt_cache_gib, 0.5, special="Off")
        self.prompt_cache.setSuffix(" GiB")
        self.prompt_cache.setToolTip("Pool pages kept so a prompt that repeats a prefix skips it (part of the "
                                     "memory budget; needs paging)")
        self.snapshot_disk = _dspin(0, 1 << 16, s.snapshot_disk_gib, 1, special="Off")
        self.snapshot_disk.setSuffix(" GiB")
        self.snapshot_disk.setToolTip("KV snapshots on disk: a reopened conversation continues without "
                                      "reading its history again (oldest removed first)")
        self.clear_button = QPushButton("Clear", toolTip="Remove every saved KV snapshot")
        self.clear_button.setEnabled(clear_snapshots is not None)
        self._clear_snapshots = clear_snapshots
        self.clear_button.clicked.connect(self._clear)
        snapshot_row = QHBoxLayout()
        snapshot_row.addWidget(self.snapshot_disk, 1)
        snapshot_row.addWidget(self.clear_button)
        engine_box = QGroupBox("Engine")
        ef = QFormLayout(engine_box)
        ef.addRow("Backend", self.backend)
        ef.addRow("Parallel streams", self.parallel)
        ef.addRow("Context", self.context)
        ef.addRow("KV cache dtype", self.kv_dtype)
        ef.addRow("Prompt precision", self.prefill_precision)
        ef.addRow("Paging", self.paging)
        ef.addRow("Page size", self.page_tokens)
        ef.addRow("Memory budget", memory_row)
        ef.addRow("Drafter", self.drafter)
        ef.addRow("Drafter model", self.drafter_box)
        ef.addRow("Drafts", self.draft_tokens)
        ef.addRow("Idle unload", self.idle)
        ef.addRow("Prompt cache", self.prompt_cache)
        ef.addRow("Snapshots on disk", snapshot_row)

        # Sampling
        self.temperature = _dspin(0, 2, sp.temperature, 0.05, special="0 (greedy)")
        self.top_p = _dspin(0.01, 1, sp.top_p, 0.05)
        self.top_k = _spin(0, 1000, sp.top_k, special="Off")
        self.max_tokens = _spin(1, 1 << 20, sp.max_tokens, step=256)
        self.seed = _spin(0, 2**31 - 1, sp.seed, special="Random (a new seed every reply)")
        sampling_box = QGroupBox("Sampling defaults")
        sf = QFormLayout(sampling_box)
        sf.addRow("Temperature", self.temperature)
        sf.addRow("Top-p", self.top_p)
        sf.addRow("Top-k", self.top_k)
        sf.addRow("Max tokens per reply", self.max_tokens)
        sf.addRow("Seed", self.seed)
        self.sampling_note = QLabel(objectName="meta", wordWrap=True)
        self.use_model_sampling = QPushButton("Use the model's values",
                                              toolTip="Temperature, top-p and top-k as the model's makers recommend")
        self.use_model_sampling.clicked.connect(self._use_model_sampling)
        sf.addRow(self.sampling_note)
        sf.addRow(self.use_model_sampling)

        columns = QHBoxLayout()
        columns.addWidget(engine_box, 3)
        columns.addWidget(sampling_box, 2)

        # The plan, live
        self.plan_label = QLabel(wordWrap=True, textFormat=Qt.TextFormat.PlainText)
        self.plan_line = ""  # the engine's exact line, also the label's tooltip
        self.plan_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        plan_box = QFrame(objectName="planBox")
        pl = QVBoxLayout(plan_box)
        pl.addWidget(QLabel("Memory plan", objectName="role"))
        pl.addWidget(self.plan_label)
        self.busy_note = QLabel(objectName="meta", wordWrap=True)
        if busy:
            self.busy_note.setText(f"Applying restarts the engine: {busy} repl{'y' if busy == 1 else 'ies'} "
                                   "in progress will stop, keeping the text so far.")
        self.busy_note.setVisible(bool(busy))

        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Apply | QDialogButtonBox.StandardButton.Cancel)
        self.apply_button = self.buttons.button(QDialogButtonBox.StandardButton.Apply)
        self.apply_button.setText("Apply and restart engine")
        self.apply_button.setDefault(True)
        self.apply_button.clicked.connect(self._apply)
        self.buttons.rejected.connect(self.reject)

        layout = QVBoxLayout(self)
        layout.setSpacing(10)
        layout.addWidget(model_box)
        layout.addLayout(columns)
        layout.addWidget(plan_box)
        layout.addWidget(self.busy_note)
        layout.addWidget(self.buttons)

        self._timer = QTimer(self, singleShot=True, interval=_DEBOUNCE_MS, timeout=self.refresh)
        self._model_checked: str | None = None
        self._model_ok = False
        for w in (self.backend, self.kv_dtype, self.prefill_precision, self.paging, self.page_tokens, self.drafter):
            w.currentIndexChanged.connect(self._changed)
        for w in (self.parallel, self.context, self.memory, self.draft_tokens, self.prompt_cache, self.snapshot_disk,
                  self.temperature, self.top_p, self.top_k, self.max_tokens, self.seed):
            w.valueChanged.connect(self._changed)
        self.memory_auto.toggled.connect(self._changed)
        for name, w in self._sampling_boxes().items():
            w.valueChanged.connect(lambda _v, name=name: self._sampling_set(name))
        self.model.textChanged.connect(self._changed)
        self.drafter_model.textChanged.connect(self._changed)
        self.fits = False
        self._from_model: dict[str, float | int] = {}  # what the model recommends
        self.refresh()

    def settings(self) -> EngineSettings:
        """The settings as the form shows them (not validated)."""
        s = copy.deepcopy(self._base)
        s.model = self.model.text().strip() or None
        s.backend = self.backend.currentData()
        s.parallel = self.parallel.value()
        s.context = self.context.value()
        s.kv_dtype = self.kv_dtype.currentData()
        s.prefill_precision = self.prefill_precision.currentData()
        s.paging = self.paging.currentData()
        s.page_tokens = self.page_tokens.currentData()
        s.memory_gib = None if self.memory_auto.isChecked() else self.memory.value()
        s.drafter = self.drafter.currentData()
        s.drafter_model = self.drafter_model.text().strip() or None
        s.draft_tokens = self.draft_tokens.value()
        s.prompt_cache_gib = round(self.prompt_cache.value(), 2)
        s.snapshot_disk_gib = round(self.snapshot_disk.value(), 2)
        sp = s.sampling
        sp.temperature = round(self.temperature.value(), 4)
        sp.top_p = round(self.top_p.value(), 4)
        sp.top_k = self.top_k.value()
        sp.max_tokens = self.max_tokens.value()
        sp.seed = self.seed.value()
        return s

    def idle_choice(self) -> int | None:
        """Minutes before an idle model is unloaded: None automatic, 0 never."""
        return self.idle.currentData()

    def chosen_sampling(self) -> set[str]:
        """The sampling fields the user set here or before (the others follow the model)."""
        return set(self.chosen)

    def refresh(self) -> None:
        """Describe the model (when it changed) and recompute the plan; enable Apply if it fits."""
        s = self.settings()
        self.page_tokens.setEnabled(s.paging != "off")
        self.prefill_precision.setEnabled(s.backend != "numpy")  # numpy computes exactly either way
        self.draft_tokens.setEnabled(s.drafter != "none")
        self.drafter_box.setEnabled(s.drafter == "dflash2")
        if not self._check_model(s.model):
            fits, text, line = False, "No plan: the model above cannot be read.", ""
        else:
            p = plan(s)  # never raises: a plan that cannot work says why in p.error
            fits, text, line = p.fits, plan_sentence(p), p.line
        self.fits = fits
        self.plan_line = line
        self.plan_label.setText(text)
        self.plan_label.setToolTip(line)
        theme.restyle(self.plan_label, "plan" if fits else "error")
        self.apply_button.setEnabled(self.fits)

    def _check_model(self, model: str | None) -> bool:
        key = model or ""
        if key != self._model_checked:
            self._model_checked = key
            missing = model is None and not default_model_path().is_file()
            self.download.setVisible(missing)
            if missing:
                self.model_info.setText("The default model (SmolLM2-135M-Instruct, a small model that runs on "
                                        "any computer) is not downloaded yet.")
                self._model_ok = False
            else:
                try:
                    self.model_info.setText(describe_model(model))
                    self._model_ok = True
                except LanechatError as e:
                    self.model_info.setText(str(e))
                    self._model_ok = False
            theme.restyle(self.model_info, "meta" if self._model_ok else "error")
            self._from_model = model_sampling_defaults(model) if self._model_ok else {}
            self._show_model_sampling()
        return self._model_ok

    # --- sampling that follows the model -------------------------------------------------------

    def _sampling_boxes(self) -> dict[str, QDoubleSpinBox | QSpinBox]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}

    def _show_model_sampling(self) -> None:
        """The fields the user has not set show the model's values."""
        values = recommended_sampling(self._from_model)
        for name, box in self._sampling_boxes().items():
            if name not in self.chosen:
                with QSignalBlocker(box):  # the model's value, not the user's choice
                    box.setValue(values[name])
        said = {"temperature": "temperature", "top_p": "top-p", "top_k": "top-k"}
        from_model = [f"{said[n]} {values[n]:g}" for n in MODEL_SAMPLING
                      if n not in self.chosen and n in self._from_model]
        yours = [said[n] for n in MODEL_SAMPLING if n in self.chosen]
        parts = []
        if from_model:
            parts.append("From the model: " + ", ".join(from_model) + ".")
        if yours:
            parts.append("Yours: " + ", ".join(yours) + ".")
        self.sampling_note.setText(" ".join(parts) or "The model recommends no sampling values: Lanechat's own apply.")
        self.use_model_sampling.setEnabled(bool(self.chosen))

    def _sampling_set(self, name: str) -> None:
        self.chosen.add(name)
        self._show_model_sampling()

    def _use_model_sampling(self) -> None:
        self.chosen.clear()
        self._show_model_sampling()

    def _downloaded(self) -> None:
        self._model_checked = None  # describe the model that is there now
        self.refresh()

    def _changed(self) -> None:
        self.apply_button.setEnabled(False)  # until the plan for these values is known
        self._timer.start()

    def _apply(self) -> None:
        self._timer.stop()
        self._model_checked = None  # the file may have changed on disk since it was described
        self.refresh()
        if self.fits:
            self.accept()

    def _clear(self) -> None:
        n = self._clear_snapshots()
        self.clear_button.setText(f"Cleared ({n})")
        self.clear_button.setEnabled(False)

    def _pick_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a model file", self.model.text(),
                                              "Models (*.gguf *.safetensors);;All files (*)")
        if path:
            self.model.setText(path)

    def _pick_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a model folder", self.model.text())
        if path:
            self.model.setText(path)

    def _pick_drafter(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Choose a DFlash2 drafter folder", self.drafter_model.text())
        if path:
            self.drafter_model.setText(path)
