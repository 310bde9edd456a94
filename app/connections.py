"""Remote engines the tabs may use, and the local server's settings: connections.json (config dir).

The file holds API keys: it is written atomically through a temp file that mkstemp creates
readable by its owner only, so it stays 0600. An unreadable file falls back to no remotes and
no server, with a notice, instead of stopping the app.
"""
from __future__ import annotations

import secrets
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from engine import jsonfile, paths

from .atomic import write_json_atomic

FORMAT_VERSION = 1
MAX_BYTES, MAX_DEPTH = 1 << 20, 8


def connections_path() -> Path:
    return paths.config_dir() / "connections.json"


def new_api_key() -> str:
    return "lc-" + secrets.token_urlsafe(24)


@dataclass
class RemoteConfig:
    """An OpenAI-compatible server: vLLM, SGLang, llama-server, or another Lanechat."""
    id: str = field(default_factory=lambda: secrets.token_hex(4))
    name: str = ""
    base_url: str = ""  # as typed; requests go to api_base (…/v1)
    api_key: str = ""
    model: str = ""

    @property
    def label(self) -> str:
        return self.name.strip() or self.base_url.strip() or "Unnamed remote engine"

    @property
    def api_base(self) -> str:
        """The URL that /chat/completions and /models follow: the typed one, ending in /v1."""
        return api_base(self.base_url)


def api_base(url: str) -> str:
    url = url.strip().rstrip("/")
    if url and "://" not in url:
        url = "http://" + url
    return url if url.endswith("/v1") else url + "/v1"


@dataclass
class ServerConfig:
    """"Serve on localhost": this computer's engine over the OpenAI API, for other programs."""
    enabled: bool = False
    port: int = 8080
    lan: bool = False  # listen on every address, not only loopback: then the API key is required
    api_key: str = ""

    @property
    def host(self) -> str:
        return "0.0.0.0" if self.lan else "127.0.0.1"


@dataclass
class Connections:
    remotes: list[RemoteConfig] = field(default_factory=list)
    server: ServerConfig = field(default_factory=ServerConfig)


def _build(cls: type, raw: Any) -> Any:
    """A dataclass from a dict, ignoring unknown keys; TypeError when a known one has a wrong type."""
    if not isinstance(raw, dict):
        raise TypeError(f"{cls.__name__} is not an object")
    kw = {}
    for f in fields(cls):
        if f.name in raw:
            value, want = raw[f.name], type(getattr(cls(), f.name))
            if type(value) is not want:
                raise TypeError(f"{cls.__name__}.{f.name} is not a {want.__name__}")
            if isinstance(value, str) and not value.isprintable():  # URLs, keys and names go into HTTP headers
                raise TypeError(f"{cls.__name__}.{f.name} holds a control character or a lone surrogate")
            kw[f.name] = value
    return cls(**kw)


def load_connections() -> tuple[Connections, str | None]:
    path = connections_path()
    if not path.exists():
        return Connections(), None
    try:
        raw = jsonfile.read(path, MAX_DEPTH, MAX_BYTES)
        if not isinstance(raw, dict) or not isinstance(raw.get("remotes", []), list):
            raise TypeError("not an object with a list of remotes")
        remotes = [_build(RemoteConfig, r) for r in raw.get("remotes", [])]
        server = _build(ServerConfig, raw.get("server", {}))
        if not 0 <= server.port <= 65535:
            raise TypeError(f"server port {server.port} is not in 0..65535")
        return Connections(remotes, server), None
    except (OSError, ValueError, TypeError, AttributeError) as e:
        return Connections(), f"Remote engines in {path} could not be read ({e}); none are set up."


def save_connections(c: Connections) -> None:
    write_json_atomic(connections_path(), {"format_version": FORMAT_VERSION, **asdict(c)})
