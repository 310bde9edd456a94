"""Engines and server: add a remote, list its models from our own server, generate the API key
once for other computers, refuse a remote without a URL."""
import pytest

from app.connections import Connections, RemoteConfig, ServerConfig
from app.engines_dialog import EnginesDialog

from served import TINY, Served


@pytest.fixture(scope="module")
def server():
    s = Served(*TINY, "--context", "512")
    yield s
    assert s.stop() == 0


def dialog_for(qtbot, connections: Connections) -> EnginesDialog:
    d = EnginesDialog(connections)
    qtbot.addWidget(d)
    return d


def test_a_remote_is_added_and_its_models_listed(qtbot, run_async, server):
    d = dialog_for(qtbot, Connections())
    assert not d.form.isEnabled() and "Add a remote engine" in d.remote_note.text()
    d.add_remote()
    qtbot.keyClicks(d.url, server.url)
    run_async(d.refresh_models())
    assert d.model.currentText() == "tiny-llama" and d.remote_note.text().startswith("1 model on ")
    qtbot.keyClicks(d.key, "k")
    remote = d.connections().remotes[0]
    assert (remote.name, remote.base_url, remote.api_key, remote.model) == (
        "Remote engine 1", server.url, "k", "tiny-llama")
    assert d.list.item(0).text() == "Remote engine 1"


def test_listing_an_unreachable_server_says_why(qtbot, run_async):
    d = dialog_for(qtbot, Connections([RemoteConfig(name="Gone", base_url="http://127.0.0.1:9", model="m")]))
    assert d.name.text() == "Gone" and d.model.currentText() == "m"
    run_async(d.refresh_models())
    assert "Could not reach http://127.0.0.1:9/v1/models" in d.remote_note.text()
    assert d.remote_note.objectName() == "error" and d.connections().remotes[0].model == "m"


def test_save_refuses_a_remote_without_a_url(qtbot):
    d = dialog_for(qtbot, Connections())
    d.add_remote()
    d.save_button.click()
    assert not d.result() and "needs a base URL" in d.remote_note.text()
    d.remove.click()
    assert d.connections().remotes == []
    d.save_button.click()
    assert d.result()


def test_other_computers_get_a_key_shown_once(qtbot):
    d = dialog_for(qtbot, Connections())
    assert not d.port.isEnabled() and d.server_note.text().startswith("Off.")
    d.serve.setChecked(True)
    d.port.setValue(8123)
    assert "http://127.0.0.1:8123/v1" in d.server_note.text() and not d.key_shown.isVisible()
    d.lan.setChecked(True)
    key = d.connections().server.api_key
    assert key.startswith("lc-") and d.key_shown.text() == key and not d.key_shown.isHidden()
    assert "shown only this once" in d.server_note.text()
    assert d.connections().server == ServerConfig(enabled=True, port=8123, lan=True, api_key=key)
    again = dialog_for(qtbot, d.connections())
    assert again.key_shown.isHidden() and "shown only this once" not in again.server_note.text()
    again.new_key.click()
    assert again.connections().server.api_key not in ("", key) and not again.key_shown.isHidden()
