"""Which engine a tab uses: the registry, the picker at the top of each tab, and the window
applying Engines and server (remotes come and go, the status bar and the local server follow)."""
import httpx

from app.app_settings import save_settings
from app.connections import Connections, RemoteConfig, ServerConfig, save_connections
from app.engine_bridge import EngineBridge
from app.engine_picker import ADD, EnginePicker
from app.engines import LOCAL, LOCAL_LABEL, EngineChoices
from app.main import create_window
from app.remote_engine import RemoteEngine
from engine import EngineSettings, SamplingParams


def test_the_registry_keeps_remotes_by_id_and_falls_back_to_this_computer(qtbot, qasync_loop):
    local = EngineBridge()
    engines = EngineChoices(local, SamplingParams)
    a, b = RemoteConfig(id="a1", name="A", base_url="h:1", model="m"), RemoteConfig(id="b2", base_url="h:2")
    engines.set_remotes([a, b])
    assert engines.choices() == [(LOCAL, LOCAL_LABEL), ("a1", "A"), ("b2", "h:2")]
    first = engines.get("a1")
    assert isinstance(first, RemoteEngine) and engines.id_of(first) == "a1" and engines.get("zz") is local
    renamed = RemoteConfig(id="a1", name="A again", base_url="h:9", model="m")
    engines.set_remotes([renamed])
    assert engines.get("a1") is first and first.config.base_url == "h:9" and engines.get("b2") is local


def test_the_picker_picks_offers_to_add_and_falls_back_when_its_remote_goes(qtbot, qasync_loop):
    engines = EngineChoices(EngineBridge(), SamplingParams)
    engines.set_remotes([RemoteConfig(id="a1", name="A", base_url="h:1")])
    picker = EnginePicker(engines, "a1")
    qtbot.addWidget(picker)
    picked, adds = [], []
    picker.picked.connect(picked.append)
    picker.add_requested.connect(lambda: adds.append(1))
    assert [picker.itemText(i) for i in range(picker.count())] == [LOCAL_LABEL, "A", "Add a remote engine…"]
    assert picker.currentData() == "a1"
    picker.activated.emit(picker.findData(ADD))
    assert adds == [1] and picker.currentData() == "a1" and picked == []
    picker.activated.emit(picker.findData(LOCAL))
    assert picked == [LOCAL]
    picker.activated.emit(picker.findData("a1"))
    engines.set_remotes([])
    assert picked == [LOCAL, "a1", LOCAL] and picker.currentData() == LOCAL


def test_the_window_applies_remotes_and_the_local_server(qtbot, run_async, app_home, app_model):
    save_settings(EngineSettings(model=app_model, backend="numpy", context=512))
    save_connections(Connections([RemoteConfig(id="a1", name="A", base_url="http://127.0.0.1:9", model="m")]))
    window = create_window()
    qtbot.addWidget(window)
    window.show()
    assert run_async(window.start_engine(), timeout=120)
    tab = window.current_tab()
    tab.set_engine("a1")
    assert tab.engine_picker.currentData() == "a1"
    assert window.status.remote.text() == "remote: http://127.0.0.1:9  ·  m"
    window.apply_connections(Connections(server=ServerConfig(enabled=True, port=0)))
    assert tab.bridge is window.bridge and tab.conversation.engine == LOCAL
    assert not window.status.remote.isVisible() and window.status.plan.isVisible()
    assert window.status.plan.toolTip().startswith("plan:")  # the plan in words, the exact line as tooltip
    url = window.local_server.url
    assert window.status.serving.text() == f"Serving on {url}" and not window.status.serving.isHidden()
    assert httpx.get(url + "/models").json()["data"][0]["id"] == window.bridge.info.model_name
    window.apply_connections(Connections())
    assert window.local_server.url is None and window.status.serving.isHidden()
    window.close()
