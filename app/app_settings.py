"""What the app remembers between runs: engine settings (config dir) and the session (state dir).

settings.json holds the EngineSettings the user applied; session.json the open tabs, the active
tab and the window geometry. Both honour LANECHAT_HOME through engine.paths. An unreadable file
falls back to defaults with a notice instead of stopping the app.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from engine import EngineSettings, LanechatError, jsonfile, paths

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
        return EngineSettings.from_dict(raw["engine"]).validate(), None
    except (OSError, ValueError, KeyError, TypeError, LanechatError) as e:
        return EngineSettings(), f"Settings in {path} could not be used ({e}); using the defaults."


def save_settings(settings: EngineSettings) -> None:
    write_json_atomic(settings_path(), {"format_version": FORMAT_VERSION, "engine": settings.to_dict()})


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
