"""Serve on localhost: HTTP requests are more streams of the tabs' engine, follow it through a
restart (open streams end with an error event), and other addresses need the API key."""
import httpx
import openai
import pytest

from app.connections import ServerConfig
from app.engine_bridge import EngineBridge
from app.local_server import LocalServer
from engine import EngineSettings, LanechatError, SamplingParams

HELLO = [{"role": "user", "content": "hello there"}]
LONG = {"ignore_eos": True}


def tiny(parallel: int = 2) -> EngineSettings:
    return EngineSettings(model="synthetic:tiny-llama", backend="numpy", parallel=parallel, context=4096)


class Sink:
    def __init__(self):
        self.text, self.done = "", None

    def on_queued(self, ahead, reason): ...
    def on_started(self, prompt_tokens, reused=0): ...

    def on_text(self, text, tokens):
        self.text += text

    def on_finished(self, event):
        self.done = event.reason

    def on_failed(self, message):
        self.done = message


@pytest.fixture
def bridge(run_async):
    b = EngineBridge()
    run_async(b.start(tiny()))
    yield b
    b.shutdown_now()


def test_an_http_stream_and_a_tab_share_the_engine_and_a_restart_ends_the_http_stream(qtbot, run_async, bridge):
    server = LocalServer(bridge)
    server.apply(ServerConfig(enabled=True, port=0))
    url = server.url
    try:
        c = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=30)
        tab = Sink()
        bridge.submit(HELLO, SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True), tab)
        chunks = iter(c.chat.completions.create(model="tiny-llama", messages=HELLO, max_tokens=4000, stream=True,
                                                extra_body=LONG))
        next(chunks)
        qtbot.waitUntil(lambda: bridge.engine.usage().active == 2, timeout=10000)
        run_async(bridge.start(tiny(parallel=1)))  # Apply in Settings: a new engine
        with pytest.raises(openai.APIError, match="the engine stopped"):
            for _ in chunks:
                pass
        assert tab.done == "shutdown"  # the tab keeps its text, as with any restart
        r = c.chat.completions.create(model="tiny-llama", messages=HELLO, max_tokens=5, extra_body=LONG)
        assert r.usage.completion_tokens == 5
        assert httpx.get(server.url.removesuffix("/v1") + "/health").json()["model"] == "tiny-llama"
    finally:
        server.stop()
    assert server.url is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(url + "/models")


def test_503_while_the_engine_loads_or_failed(run_async):
    b = EngineBridge()
    server = LocalServer(b)
    server.apply(ServerConfig(enabled=True, port=0))
    try:
        health = server.url.removesuffix("/v1") + "/health"
        assert httpx.get(health).status_code == 503
        with pytest.raises(LanechatError):
            run_async(b.start(EngineSettings(model="/no/such/model.gguf", backend="numpy")))
        r = httpx.post(server.url + "/chat/completions", json={"messages": HELLO})
        assert r.status_code == 503 and "no model is loaded" in r.json()["error"]["message"]
    finally:
        server.stop()


def test_other_computers_only_with_the_key_and_a_taken_port_says_so(bridge):
    server = LocalServer(bridge)
    server.apply(ServerConfig(enabled=True, port=0, lan=True, api_key="lc-secret"))
    try:
        assert server.slot is not None
        models = server.url + "/models"
        assert httpx.get(models).status_code == 401
        assert httpx.get(models, headers={"Authorization": "Bearer lc-secret"}).json()["data"][0]["id"] == "tiny-llama"
        port = int(server.url.split(":")[2].split("/")[0])
        other = LocalServer(bridge)
        with pytest.raises(LanechatError, match=f"cannot listen on 127.0.0.1:{port}"):
            other.apply(ServerConfig(enabled=True, port=port))
        assert other.url is None
    finally:
        server.stop()
