"""A tab's remote engine against our own `python -m engine serve`: replies stream as local ones do,
stop cancels on the server, the server's errors reach the tab, and a server that dies mid-reply
fails that tab alone while a local tab goes on."""
import httpx
import pytest
from PySide6.QtCore import Qt

from app.app_settings import save_settings
from app.connections import Connections, RemoteConfig, save_connections
from app.main import create_window
from app.remote_engine import RemoteEngine, RemoteError, list_models
from engine import EngineSettings, SamplingParams
from engine.synthetic import ByteTokenizer

from served import TINY, Served

HELLO = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def server():
    s = Served(*TINY, "--parallel", "2", "--context", "4096")
    yield s
    assert s.stop() == 0


class Sink:
    def __init__(self):
        self.calls, self.text, self.finished, self.failed = [], "", None, None

    def on_queued(self, ahead, reason):
        self.calls.append("queued:" + reason)

    def on_started(self, prompt_tokens, reused=0):
        self.calls.append("started")

    def on_text(self, text, tokens):
        self.calls.append("text")
        self.text += text
        self.tokens = tokens

    def on_finished(self, event):
        self.finished = event

    def on_failed(self, message):
        self.failed = message

    @property
    def done(self):
        return self.finished is not None or self.failed is not None


def remote(server, max_tokens=40, **config) -> RemoteEngine:
    cfg = RemoteConfig(**{"name": "test", "base_url": server.url, "model": server.model, **config})
    return RemoteEngine(cfg, lambda: SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))


def server_reply(server, max_tokens: int) -> str:
    body = {"messages": HELLO, "temperature": 0, "max_tokens": max_tokens, "ignore_eos": True}
    return httpx.post(server.v1 + "/chat/completions", json=body, timeout=30).json()["choices"][0]["message"]["content"]


def run(qtbot, engine: RemoteEngine, messages=HELLO, timeout=30000) -> Sink:
    sink = Sink()
    engine.submit(messages, None, sink)
    qtbot.waitUntil(lambda: sink.done, timeout=timeout)
    return sink


def test_a_remote_reply_streams_what_the_server_writes(qtbot, qasync_loop, server):
    sink = run(qtbot, remote(server, 60))
    assert sink.failed is None
    assert sink.calls[0] == f"queued:connecting to {server.url.split('//')[1]}" and sink.calls[1] == "started"
    assert sink.calls.count("text") >= 1 and sink.text == server_reply(server, 60)
    f = sink.finished
    assert f.reason == "length" and f.tokens == 60 and f.text == sink.text and f.prompt_tokens > 0 and f.decode_tps > 0


def test_a_reply_continued_goes_on_as_the_same_turn_on_the_server(qtbot, qasync_loop, server):
    """Sent as continue_final_message: the server reads the reply as the open assistant turn, so
    its prompt is the first request's and the reply's tokens (not a new turn)."""
    first = run(qtbot, remote(server, 6))
    engine = remote(server, 5)
    sink = Sink()
    engine.submit(HELLO + [{"role": "assistant", "content": first.text}], None, sink, continue_final_message=True)
    qtbot.waitUntil(lambda: sink.done, timeout=30000)
    assert sink.failed is None and sink.finished.tokens == 5
    assert sink.finished.prompt_tokens == first.finished.prompt_tokens + len(ByteTokenizer(272).encode(first.text))


def test_stop_cancels_the_request_on_the_server(qtbot, qasync_loop, server):
    engine = remote(server, 4000)
    before = httpx.get(server.url + "/health").json()["requests"]["cancelled"]
    sink = Sink()
    ticket = engine.submit(HELLO, None, sink)
    qtbot.waitUntil(lambda: bool(sink.text), timeout=30000)
    engine.cancel(ticket)
    qtbot.waitUntil(lambda: sink.done, timeout=10000)
    assert sink.finished.reason == "cancelled" and sink.finished.text == sink.text and 0 < sink.finished.tokens < 4000

    def freed():
        h = httpx.get(server.url + "/health").json()
        return h["active"] == 0 and h["requests"]["cancelled"] == before + 1
    qtbot.waitUntil(freed, timeout=10000)


def test_the_servers_own_message_reaches_the_tab(qtbot, qasync_loop, server):
    sink = run(qtbot, remote(server, model="gpt-17"))
    assert "answered 404" in sink.failed and "does not exist here" in sink.failed
    sink = run(qtbot, remote(server), messages=[{"role": "user", "content": "x" * 5000}])
    assert "answered 400" in sink.failed and "does not fit the context" in sink.failed
    with pytest.raises(RemoteError, match="No model is chosen"):
        remote(server, model="").submit(HELLO, None, Sink())


def test_an_unreachable_server_says_so(qtbot, qasync_loop):
    engine = RemoteEngine(RemoteConfig(base_url="http://127.0.0.1:9", model="m"), SamplingParams)
    sink = run(qtbot, engine)
    assert sink.failed.startswith("Could not reach the remote engine at http://127.0.0.1:9/v1/chat/completions")


class Replay:
    """A server that answers every POST with the given server-sent event lines, whatever they say."""

    def __init__(self, lines: list[str]):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                self.wfile.write("".join(f"data: {line}\n\n" for line in lines).encode())

            def log_message(self, *args):
                pass
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


END = '{"choices": [{"delta": {}, "finish_reason": "stop"}]}'


@pytest.mark.parametrize("lines, failed", [
    (['{"choices": "x"}', '{"choices": [5, {"delta": "s"}, {"delta": {"content": 7, "reasoning": ["r"]}}]}',
      '{"choices": [{"delta": {"content": "ok"}, "finish_reason": 7}]}',
      '{"usage": {"completion_tokens": "many", "prompt_tokens": -4, "completion_tokens_details": '
      '{"reasoning_tokens": true}}}', END, "[DONE]"], None),
    (["[" * 100_000 + "]" * 100_000, END, "[DONE]"], "sent a line that is not JSON"),
])
def test_a_server_sending_what_no_openai_server_sends_ends_the_reply_cleanly(qtbot, qasync_loop, lines, failed):
    """A chunk of the wrong shape raised inside the reply's task, and its tab waited for ever."""
    fake = Replay(lines)
    try:
        sink = run(qtbot, RemoteEngine(RemoteConfig(base_url=fake.url, model="m"), SamplingParams), timeout=15000)
    finally:
        fake.close()
    if failed is None:
        assert sink.failed is None and sink.text == "ok" and sink.finished.reason == "stop"
    else:
        assert failed in sink.failed and "\n" not in sink.failed


def test_models_are_listed_from_the_server(run_async, server):
    assert run_async(list_models(server.url)) == ["tiny-llama"]
    assert run_async(list_models(server.v1 + "/")) == ["tiny-llama"]
    with pytest.raises(RemoteError, match="Could not reach"):
        run_async(list_models("http://127.0.0.1:9"))


# --- the window: a remote tab and a local tab side by side ----------------------------------------

def send(qtbot, tab, text):
    tab.composer.set_text(text)
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)


def test_a_remote_tab_and_a_local_tab_at_once_and_the_server_dying_fails_only_its_tab(
        qtbot, run_async, app_home, app_model):
    dying = Served(*TINY, "--parallel", "1", "--context", "4096")
    try:
        save_connections(Connections([RemoteConfig(id="box1", name="Box", base_url=dying.url, model=dying.model)]))
        # The local tiny model stops at its 512-token context; the remote runs until it is killed.
        save_settings(EngineSettings(model=app_model, backend="numpy", parallel=2, context=512,
                                     sampling=SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)))
        window = create_window()
        qtbot.addWidget(window)
        window.show()
        assert run_async(window.start_engine(), timeout=120)
        far = window.current_tab()
        far.engine_picker.setCurrentIndex(far.engine_picker.findData("box1"))
        far.engine_picker.activated.emit(far.engine_picker.currentIndex())
        assert far.conversation.engine == "box1" and isinstance(far.bridge, RemoteEngine)
        assert window.status.remote.text() == f"remote: {dying.url}  ·  tiny-llama"
        near = window.new_tab()
        assert near.bridge is window.bridge and not window.status.remote.isVisible()
        assert window.status.plan.isVisible() and window.status.plan.toolTip().startswith("plan:")
        window.tabs.setCurrentWidget(far)
        assert window.status.remote.isVisible() and not window.status.plan.isVisible()

        send(qtbot, far, "Tell me a long story")
        far_reply = far.conversation.messages[-1]
        # the local reply ends at its 512-token context: it starts once the remote one streams
        qtbot.waitUntil(lambda: bool(far_reply.text), timeout=60000)
        send(qtbot, near, "And you a short one")
        near_reply = near.conversation.messages[-1]
        both = []

        def streaming():
            both.append(bool(far_reply.text) and bool(near_reply.text) and far.generating and near.generating)
            return both[-1]
        qtbot.waitUntil(streaming, timeout=60000)
        dying.kill()
        qtbot.waitUntil(lambda: not far.generating, timeout=20000)
        assert far_reply.error and f"The connection to {dying.url.split('//')[1]} broke mid-reply" in far_reply.error
        assert far_reply.text and far_reply.interrupted and far.state == "error"
        qtbot.waitUntil(lambda: not near.generating, timeout=60000)
        assert near_reply.error is None and not near_reply.interrupted and near_reply.tokens > 100
        saved = window.store.load(far.conversation.id)
        assert saved.engine == "box1" and saved.messages[-1].error == far_reply.error
        assert "api_key" not in str(saved.settings)
        window.close()
    finally:
        dying.kill()


def test_a_remote_tab_works_without_a_local_model(qtbot, run_async, app_home, server):
    save_connections(Connections([RemoteConfig(id="box2", name="Box", base_url=server.url, model=server.model)]))
    save_settings(EngineSettings(model=str(app_home / "no-such-model.gguf"), backend="numpy",
                                 sampling=SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)))
    window = create_window()
    qtbot.addWidget(window)
    window.show()
    assert not run_async(window.start_engine(), timeout=60)
    assert window.bridge.state == "failed"
    tab = window.current_tab()
    tab.set_engine("box2")
    send(qtbot, tab, "hello there")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    reply = tab.conversation.messages[-1]
    assert reply.error is None and reply.tokens == 30 and reply.tok_s and reply.text == server_reply(server, 30)
    assert tab.conversation.model == "tiny-llama"
    window.close()
    again = create_window()
    qtbot.addWidget(again)
    restored = again.current_tab()
    assert restored.conversation.id == tab.conversation.id and isinstance(restored.bridge, RemoteEngine)
    assert restored.engine_picker.currentText() == "Box"
    again.close()


def test_removing_a_remote_mid_reply_stops_it_and_the_tab_goes_back_to_this_computer(
        qtbot, run_async, app_home, app_model, server):
    save_connections(Connections([RemoteConfig(id="box3", name="Box", base_url=server.url, model=server.model)]))
    save_settings(EngineSettings(model=app_model, backend="numpy", context=512,
                                 sampling=SamplingParams(temperature=0, max_tokens=4000, ignore_eos=True)))
    window = create_window()
    qtbot.addWidget(window)
    window.show()
    tab = window.current_tab()
    tab.set_engine("box3")
    send(qtbot, tab, "hello there")
    reply = tab.conversation.messages[-1]
    qtbot.waitUntil(lambda: bool(reply.text), timeout=30000)
    window.apply_connections(Connections())
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    assert reply.interrupted and reply.text and reply.error is None
    assert tab.bridge is window.bridge and tab.conversation.engine == "" and tab.engine_picker.currentIndex() == 0
    window.close()


# --- a thinking model behind the server: reasoning_content into the reply's thinking ----------------

class ThinkingSink(Sink):
    def __init__(self):
        super().__init__()
        self.reasoning, self.reasoning_tokens = "", 0

    def on_reasoning(self, text, tokens):
        self.calls.append("reasoning")
        self.reasoning += text
        self.reasoning_tokens = tokens


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    import ckpt
    folder = tmp_path_factory.mktemp("think")
    ckpt.write_hf(folder, ckpt.tiny_qwen3_config(), seed=2, chat_template=ckpt.THINK_TEMPLATE)
    s = Served("--model", str(folder), "--backend", "numpy", "--parallel", "2", "--context", "512")
    yield s
    assert s.stop() == 0


def test_a_remote_thinking_reply_streams_into_its_reasoning_and_the_toggle_reaches_the_template(
        qtbot, qasync_loop, thinking_server):
    engine = remote(thinking_server, 10)
    sink = ThinkingSink()
    engine.submit(HELLO, None, sink)  # the template's default: thinking on
    qtbot.waitUntil(lambda: sink.done, timeout=30000)
    f = sink.finished
    assert sink.failed is None and sink.reasoning and sink.text == "" and "reasoning" in sink.calls
    assert f.reasoning == sink.reasoning and f.reasoning_tokens == 10 and f.tokens == 10
    off = ThinkingSink()
    engine.submit(HELLO, None, off, thinking=False)  # sent as chat_template_kwargs.enable_thinking
    qtbot.waitUntil(lambda: off.done, timeout=30000)
    assert off.failed is None and off.text and off.reasoning == "" and off.finished.reasoning_tokens == 0
