"""What the app remembers between runs: engine settings (config dir) and the session (state dir).

settings.json holds the EngineSettings the user applied and which sampling values they chose
themselves (`sampling_chosen`; the others follow the model's recommendation); session.json the
open tabs, the active tab and the window geometry, written whenever they change. Both honour
LANECHAT_HOME through engine.paths. An unreadable file falls back to defaults with a notice
instead of stopping the app.
"""
from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine import EngineSettings, LanechatError, SamplingParams, jsonfile, model_sampling_defaults, paths

from .atomic import leftovers, write_json_atomic

FORMAT_VERSION = 1
MAX_BYTES, MAX_DEPTH = 1 << 20, 8


def settings_path() -> Path:
    return paths.config_dir() / "settings.json"


def session_path() -> Path:
    return paths.state_dir() / "session.json"


def load_settings() -> tuple[EngineSettings, str | None]:
    """The saved settings, or the defaults and a notice saying why the saved ones were not used."""
    path = settings_path()
    if not path.exists():
        return EngineSettings(), None
    try:
        raw = jsonfile.read(path, MAX_DEPTH, MAX_BYTES)
        engine = raw["engine"]
        if isinstance(engine, dict):  # the app leaves the prompt chunk to the backend; older files hold 128
            engine = {k: v for k, v in engine.items() if k != "prefill_chunk"}
        return EngineSettings.from_dict(engine).validate(), None
    except (OSError, ValueError, KeyError, TypeError, LanechatError) as e:
        return EngineSettings(), f"Settings in {path} could not be used ({e}); using the defaults."


def save_settings(settings: EngineSettings, chosen: set[str] | None = None) -> None:
    """`chosen`: the sampling fields the user set; None: all of them (the values are theirs)."""
    chosen = set(MODEL_SAMPLING) if chosen is None else chosen
    write_json_atomic(settings_path(), {"format_version": FORMAT_VERSION, "engine": settings.to_dict(),
                                        "sampling_chosen": sorted(chosen & set(MODEL_SAMPLING))})


# Sampling values a model may recommend; the user's own choice wins over the model's.
MODEL_SAMPLING = ("temperature", "top_p", "top_k")


def load_sampling_chosen() -> set[str]:
    """The sampling fields the user set. Files from before this was recorded: those that differ
    from Lanechat's defaults (the dialog wrote every field, so equal ones were not changed)."""
    try:
        raw = jsonfile.read(settings_path(), MAX_DEPTH, MAX_BYTES)
        chosen = raw.get("sampling_chosen")
        if isinstance(chosen, list):
            return {n for n in chosen if n in MODEL_SAMPLING}
        stored, default = raw["engine"].get("sampling") or {}, asdict(SamplingParams())
        return {n for n in MODEL_SAMPLING if n in stored and stored[n] != default[n]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, LanechatError):
        return set()


def recommended_sampling(from_model: dict[str, Any]) -> dict[str, Any]:
    """Every model-recommendable field: the model's value where it gives one, else Lanechat's."""
    defaults = asdict(SamplingParams())
    return {n: from_model.get(n, defaults[n]) for n in MODEL_SAMPLING}


def with_model_sampling(settings: EngineSettings, chosen: set[str]) -> EngineSettings:
    """The settings a reply runs with: the user's sampling values where they chose one, the model's
    recommendation (or Lanechat's default) for the rest. Reads the model's files: not on the GUI
    thread for a big GGUF."""
    out = copy.deepcopy(settings)
    for name, value in recommended_sampling(model_sampling_defaults(settings.model)).items():
        if name not in chosen:
            setattr(out.sampling, name, value)
    return out


@dataclass
class Session:
    open_tabs: list[str] = field(default_factory=list)  # conversation ids, in tab order
    active: int = 0
    geometry: str = ""  # QWidget.saveGeometry(), base64
    splitter: str = ""  # sidebar/chat split, QSplitter.saveState(), base64
    sidebar: bool = True


def load_session() -> Session:
    """The saved session; a field of the wrong type takes its default (a damaged session only costs
    the tab layout: conversations are separate files)."""
    try:
        raw: Any = jsonfile.read(session_path(), MAX_DEPTH, MAX_BYTES)
    except (OSError, ValueError):
        return Session()
    if not isinstance(raw, dict):
        return Session()
    tabs, active = raw.get("open_tabs"), raw.get("active")
    session = Session()
    if isinstance(tabs, list):
        session.open_tabs = [t for t in tabs if isinstance(t, str)]
    if isinstance(active, int) and not isinstance(active, bool):
        session.active = active
    for name in ("geometry", "splitter"):  # base64 from Qt: ASCII or nothing
        value = raw.get(name)
        if isinstance(value, str) and value.isascii():
            setattr(session, name, value)
    if isinstance(raw.get("sidebar"), bool):
        session.sidebar = raw["sidebar"]
    return session


def save_session(session: Session) -> None:
    write_json_atomic(session_path(), asdict(session))


def remove_leftovers() -> None:
    """Temp files of settings and session writes that a kill cut short: the old file still stands."""
    for folder in (settings_path().parent, session_path().parent):
        if folder.is_dir():
            for tmp in leftovers(folder):
                tmp.unlink(missing_ok=True)
