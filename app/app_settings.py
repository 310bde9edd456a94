"""What the app remembers between runs: engine settings (config dir) and the session (state dir).

settings.json holds the EngineSettings the user applied; session.json the open tabs, the active
tab and the window geometry. Both honour LANECHAT_HOME through engine.paths. An unreadable file
falls back to defaults with a notice instead of stopping the app.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from engine import EngineSettings, LanechatError, paths

from .atomic import write_json_atomic

FORMAT_VERSION = 1


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
        raw = json.loads(path.read_text(encoding="utf-8"))
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
    try:
        raw: Any = json.loads(session_path().read_text(encoding="utf-8"))
        known = {f.name for f in fields(Session)}
        session = Session(**{k: v for k, v in raw.items() if k in known})
        if not all(isinstance(t, str) for t in session.open_tabs):
            return Session()
        return session
    except (OSError, ValueError, TypeError, AttributeError):
        # A missing or damaged session only costs the tab layout; conversations are separate files.
        return Session()


def save_session(session: Session) -> None:
    write_json_atomic(session_path(), asdict(session))
