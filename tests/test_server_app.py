"""The OpenAI API as the official `openai` client sees it, against `python -m engine serve` (tiny
random llama on numpy; one test with the default model): replies, streams, usage, overlapping
requests, stop strings, every error case, a client leaving mid-stream, the engine going away."""
import threading
import time

import httpx
import openai
import pytest

from engine import Engine, EngineSettings
from engine.server import EngineSlot, OpenAIServer, ServerThread
from engine.synthetic import ByteTokenizer

from served import TINY, Served

HELLO = [{"role": "user", "content": "hello there"}]
LONG = {"ignore_eos": True}  # vLLM's extension: replies run to max_tokens


@pytest.fixture(scope="module")
def server():
    s = Served(*TINY, "--parallel", "4", "--context", "4096", "--kv-pages", "16")
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def one_lane():
    """One stream at a time and one request allowed to wait: the lane and queue tests."""
    s = Served(*TINY, "--parallel", "1", "--context", "4096", "--max-waiting", "1")
    yield s
    assert s.stop() == 0


def client(s: Served, **kw) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.v1, api_key=kw.pop("api_key", "unused"), max_retries=0, timeout=60, **kw)


def health(s: Served) -> dict:
    return httpx.get(s.url + "/health", timeout=10).json()


def chat(c: openai.OpenAI, model: str, max_tokens: int = 24, **kw):
    return c.chat.completions.create(model=model, messages=kw.pop("messages", HELLO), max_tokens=max_tokens,
                                     temperature=kw.pop("temperature", 0), **kw)


def streamed(c: openai.OpenAI, model: str, max_tokens: int = 24, **kw) -> tuple[str, list]:
    chunks = list(chat(c, model, max_tokens, stream=True, **kw))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    return text, chunks


# --- replies --------------------------------------------------------------------------------------

def test_models_and_health(server):
    c = client(server)
    models = c.models.list().data
    assert [m.id for m in models] == ["tiny-llama"] == [server.model]
    h = health(server)
    assert h["status"] == "ok" and h["model"] == "tiny-llama" and h["active"] == 0


def test_a_reply_and_its_usage(server):
    r = chat(client(server), server.model, max_tokens=20, extra_body=LONG)
    assert r.object == "chat.completion" and r.model == "tiny-llama" and r.id.startswith("chatcmpl-")
    choice = r.choices[0]
    assert choice.message.role == "assistant" and choice.message.content and choice.finish_reason == "length"
    assert r.usage.completion_tokens == 20 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + 20


def test_max_completion_tokens_wins_over_max_tokens(server):
    r = client(server).chat.completions.create(model=server.model, messages=HELLO, temperature=0, max_tokens=30,
                                               max_completion_tokens=7, extra_body=LONG)
    assert r.usage.completion_tokens == 7


def test_a_stream_says_what_the_reply_says_and_ends_with_usage(server):
    c = client(server)
    whole = chat(c, server.model, 32, extra_body=LONG).choices[0].message.content
    text, chunks = streamed(c, server.model, 32, extra_body=LONG, stream_options={"include_usage": True})
    assert text == whole
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 32
    assert all(ch.usage is None for ch in chunks[:-1])
    _, plain = streamed(c, server.model, 8, extra_body=LONG)
    assert all(ch.usage is None for ch in plain), "usage only when stream_options asks for it"


def test_seed_repeats_a_sampled_reply_and_another_seed_differs(server):
    c = client(server)
    kw = dict(temperature=1.0, top_p=1.0, max_tokens=40, extra_body=LONG)
    a = chat(c, server.model, seed=7, **kw).choices[0].message.content
    b = chat(c, server.model, seed=7, **kw).choices[0].message.content
    other = chat(c, server.model, seed=8, **kw).choices[0].message.content
    assert a == b and a != other


def test_overlapping_streams_run_at_once_and_each_equals_its_solo_reply(server):
    c = client(server)
    prompts = [[{"role": "user", "content": f"question number {i}"}] for i in range(4)]
    solo = [chat(c, server.model, 200, messages=p, extra_body=LONG).choices[0].message.content for p in prompts]
    spans, texts = [None] * 4, [None] * 4
    go = threading.Barrier(4)

    def run(i):
        go.wait()
        first = last = None
        parts = []
        for ch in chat(c, server.model, 200, messages=prompts[i], stream=True, extra_body=LONG):
            if ch.choices and ch.choices[0].delta.content:
                first = first or time.monotonic()
                last = time.monotonic()
                parts.append(ch.choices[0].delta.content)
        spans[i], texts[i] = (first, last), "".join(parts)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert texts == solo
    assert max(s[0] for s in spans) < min(s[1] for s in spans), f"the four streams never overlapped: {spans}"


def test_stop_strings_cut_the_reply_in_a_reply_and_in_a_stream(server):
    c = client(server)
    full = chat(c, server.model, 60, extra_body=LONG).choices[0].message.content
    stop = full[20:23]
    cut = full[:full.find(stop)]
    r = chat(c, server.model, 60, stop=[stop, "never-there"], extra_body=LONG)
    assert r.choices[0].message.content == cut and r.choices[0].finish_reason == "stop"
    text, chunks = streamed(c, server.model, 60, stop=stop, extra_body=LONG)
    assert text == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_continue_final_message_goes_on_with_the_reply(server):
    """vLLM's continue_final_message: the reply's text follows the prompt as the same assistant turn
    (no state kept here: it is read again) and only the new text comes back."""
    c = client(server)
    first = chat(c, server.model, 5, extra_body=LONG)
    reply = first.choices[0].message.content
    more = chat(c, server.model, 4, messages=HELLO + [{"role": "assistant", "content": reply}],
                extra_body={**LONG, "continue_final_message": True, "add_generation_prompt": False})
    assert more.choices[0].finish_reason == "length" and more.usage.completion_tokens == 4
    assert more.usage.prompt_tokens == first.usage.prompt_tokens + len(ByteTokenizer(272).encode(reply))


def test_completions_take_text_or_token_ids_and_stream(server):
    c = client(server)
    r = c.completions.create(model=server.model, prompt="Once upon a time", max_tokens=12, temperature=0,
                             extra_body=LONG)
    assert r.object == "text_completion" and r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 12
    streamed_text = "".join(ch.choices[0].text for ch in c.completions.create(
        model=server.model, prompt="Once upon a time", max_tokens=12, temperature=0, stream=True, extra_body=LONG))
    assert streamed_text == r.choices[0].text
    ids = c.completions.create(model=server.model, prompt=[20, 21, 22, 23], max_tokens=5, temperature=0,
                               extra_body=LONG)
    assert ids.usage.prompt_tokens == 4 and ids.usage.completion_tokens == 5


@pytest.mark.slow
def test_a_real_model_stops_before_the_stop_string(default_model):
    s = Served("--model", default_model, "--backend", "numpy", "--context", "512")
    try:
        c = client(s)
        ask = [{"role": "user", "content": "What is the capital of France?"}]
        plain = chat(c, s.model, 16, messages=ask).choices[0].message.content
        assert "Paris" in plain
        r = chat(c, s.model, 16, messages=ask, stop=["Paris"])
        assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content == plain[:plain.find("Paris")]
    finally:
        assert s.stop() == 0


# --- bad requests ---------------------------------------------------------------------------------

def post(s: Served, body, path: str = "/v1/chat/completions", **kw) -> httpx.Response:
    if not isinstance(body, (dict, list)):  # raw bytes, or a generator (sent chunked)
        return httpx.post(s.url + path, content=body, headers={"Content-Type": "application/json"}, timeout=30, **kw)
    return httpx.post(s.url + path, json=body, timeout=30, **kw)


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"] and "type" in err
    return err


@pytest.mark.parametrize("body, param", [
    (b"{not json", None),
    (b"[1, 2]", None),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', None),
    ({"messages": "hello"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]"),
    ({"messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"messages": HELLO, "temperature": 3}, "temperature"),
    ({"messages": HELLO, "top_p": 0}, "top_p"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": True}, "max_tokens"),
    ({"messages": HELLO, "seed": 1.5}, "seed"),
    ({"messages": HELLO, "stop": [1]}, "stop"),
    ({"messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"messages": HELLO, "n": 2}, "n"),
    ({"messages": HELLO, "stream": "yes"}, "stream"),
    ({"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": HELLO, "tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
])
def test_bad_requests_get_a_400_naming_the_field(server, body, param):
    assert error_of(post(server, body), 400)["param"] == param


def test_bad_completion_requests(server):
    for body, param in [({"prompt": ""}, "prompt"), ({"prompt": ["a", "b"]}, "prompt"), ({"prompt": 3}, "prompt"),
                        ({"prompt": "x", "echo": True}, "echo"), (b'{"prompt": "a\\udfff"}', "prompt"),
                        ({"prompt": "x", "logprobs": 2}, "logprobs")]:
        assert error_of(post(server, body, "/v1/completions"), 400)["param"] == param


def test_n_above_one_is_refused_through_the_client(server):
    with pytest.raises(openai.BadRequestError, match="n must be 1"):
        chat(client(server), server.model, n=2)


def test_unknown_fields_are_ignored(server):
    r = post(server, {"messages": HELLO, "max_tokens": 3, "frobnicate": {"x": 1}, "user": "me"})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] <= 3


def test_a_prompt_over_the_context_is_context_length_exceeded(server):
    with pytest.raises(openai.BadRequestError) as e:
        chat(client(server), server.model, messages=[{"role": "user", "content": "x" * 5000}])
    assert e.value.code == "context_length_exceeded" and "does not fit the context" in e.value.message


def test_an_unknown_model_is_404(server):
    with pytest.raises(openai.NotFoundError) as e:
        chat(client(server), "gpt-17")
    assert e.value.code == "model_not_found"
    assert error_of(httpx.get(server.url + "/v1/nothing-here"), 404)["code"] == "unknown_url"


def test_a_10_mb_body_is_refused_before_it_is_read_and_the_server_keeps_serving(server):
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * (10 << 20) + b'"}]}'
    assert error_of(post(server, big), 413)["code"] == "request_too_large"

    def chunks():  # no Content-Length: refused while reading, at the limit
        for _ in range(10):
            yield b"x" * (1 << 20)
    assert error_of(post(server, chunks()), 413)["code"] == "request_too_large"
    assert chat(client(server), server.model, 4).choices[0].finish_reason in ("length", "stop")


# --- lanes and the waiting queue ------------------------------------------------------------------

def wait_for(predicate, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_client_leaving_mid_stream_frees_its_lane(one_lane):
    c = client(one_lane)
    before = health(one_lane)["requests"]
    stream = chat(c, one_lane.model, 4000, stream=True, extra_body=LONG)
    chunks = iter(stream)
    for _ in range(3):
        next(chunks)
    stream.close()
    wait_for(lambda: health(one_lane)["active"] == 0)
    after = health(one_lane)["requests"]
    assert after["cancelled"] == before["cancelled"] + 1 and after["finished"] == before["finished"]
    assert chat(c, one_lane.model, 5, extra_body=LONG).usage.completion_tokens == 5


def test_over_the_waiting_limit_is_429_and_the_rest_still_run(one_lane):
    c = client(one_lane)
    running = chat(c, one_lane.model, 4000, stream=True, extra_body=LONG)
    next(iter(running))
    waiting = chat(c, one_lane.model, 4000, stream=True, extra_body=LONG)  # answered at once: it is queued
    with pytest.raises(openai.RateLimitError, match="already waiting"):
        chat(c, one_lane.model, 5)
    running.close()
    assert len([ch for _, ch in zip(range(3), waiting)]) == 3  # it got the lane
    waiting.close()
    wait_for(lambda: health(one_lane)["active"] == 0 and health(one_lane)["http_streams"] == 0)
    assert chat(c, one_lane.model, 5, extra_body=LONG).usage.completion_tokens == 5


# --- the API key ----------------------------------------------------------------------------------

def test_any_address_but_loopback_needs_an_api_key_checked_on_every_request():
    with pytest.raises(RuntimeError, match="exited 2.*needs an API key"):
        Served(*TINY, "--host", "0.0.0.0")
    s = Served(*TINY, "--host", "0.0.0.0", "--api-key", "sesame")
    try:
        s.url = s.url.replace("0.0.0.0", "127.0.0.1")  # reach it over loopback only
        with pytest.raises(openai.AuthenticationError) as e:
            client(s, api_key="wrong").models.list()
        assert e.value.code == "invalid_api_key"
        assert httpx.get(s.url + "/health").status_code == 401
        with pytest.raises(openai.AuthenticationError):
            chat(client(s, api_key="wrong"), s.model, 3)
        assert chat(client(s, api_key="sesame"), s.model, 3).usage.completion_tokens <= 3
    finally:
        assert s.stop() == 0


@pytest.mark.parametrize("host, port", [("127.0.0.1", 99999), ("127.0.0.1", -1), ("127.0.0.1", "80"),
                                        ("127.0.0.1", True), ("", 0), ("bad\nhost", 0), ("\udcff", 0)])
def test_an_address_no_socket_takes_is_refused_before_the_thread_starts(host, port):
    """Port 99999 raised OverflowError in the server thread, before it said it was listening:
    the app's start (serving on localhost from connections.json) waited for it for ever."""
    from engine.server.host import ServeError
    with pytest.raises(ServeError, match="the host to listen on|the port must be"):
        ServerThread(OpenAIServer(EngineSlot(), api_key="k"), host, port)


# --- no engine: loading, restarting (in this process: the slot is the app's hook) ----------------

@pytest.fixture
def in_process():
    slot = EngineSlot("the model is loading")
    thread = ServerThread(OpenAIServer(slot), port=0)
    thread.start()
    yield slot, openai.OpenAI(base_url=thread.url + "/v1", api_key="x", max_retries=0, timeout=30), thread
    thread.stop()


def tiny_engine() -> Engine:
    engine = Engine(EngineSettings(model="synthetic:tiny-llama", backend="numpy", parallel=2, context=4096),
                    log=lambda m: None)
    engine.start()
    return engine


def test_503_while_loading_then_serving(in_process):
    slot, c, thread = in_process
    with pytest.raises(openai.InternalServerError) as e:
        chat(c, "tiny-llama")
    assert e.value.status_code == 503 and "loading" in e.value.message
    assert httpx.get(thread.url + "/health").status_code == 503
    engine = tiny_engine()
    try:
        slot.set_engine(engine)
        assert chat(c, "tiny-llama", 3).choices[0].message.content is not None
    finally:
        slot.clear("stopped")
        engine.shutdown()


def test_a_restart_ends_open_streams_with_an_error_event_and_503s_until_back(in_process):
    slot, c, _ = in_process
    engine = tiny_engine()
    slot.set_engine(engine)
    chunks = iter(chat(c, "tiny-llama", 4000, stream=True, extra_body=LONG))
    next(chunks)
    next(chunks)
    slot.clear("the engine is restarting with new settings")
    with pytest.raises(openai.APIError, match="restarting with new settings"):
        for _ in chunks:
            pass
    with pytest.raises(openai.InternalServerError, match="restarting"):
        chat(c, "tiny-llama")
    wait_for(lambda: engine.usage().active == 0)  # the old engine's stream was cancelled too
    engine.shutdown()
    fresh = tiny_engine()
    try:
        slot.set_engine(fresh)
        assert chat(c, "tiny-llama", 3, extra_body=LONG).usage.completion_tokens == 3
    finally:
        slot.clear("stopped")
        fresh.shutdown()


# --- a thinking model: reasoning_content, as vLLM returns it --------------------------------------

@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    import ckpt
    folder = tmp_path_factory.mktemp("think")
    ckpt.write_hf(folder, ckpt.tiny_qwen3_config(), seed=2, chat_template=ckpt.THINK_TEMPLATE)
    engine = Engine(EngineSettings(model=str(folder), backend="numpy", parallel=2, context=512), log=lambda m: None)
    engine.start()
    slot = EngineSlot("loading")
    slot.set_engine(engine)
    thread = ServerThread(OpenAIServer(slot), port=0)
    thread.start()
    yield openai.OpenAI(base_url=thread.url + "/v1", api_key="x", max_retries=0, timeout=30), engine.info.model_name
    thread.stop()
    slot.clear("stopped")
    engine.shutdown()


def test_a_thinking_reply_is_reasoning_content_whole_and_streamed(thinking_server):
    c, model = thinking_server
    whole = chat(c, model, 8, extra_body=LONG)
    reasoning = whole.choices[0].message.model_extra["reasoning_content"]
    assert reasoning and whole.choices[0].message.content == ""  # the template opened <think>; it never closed
    assert whole.usage.completion_tokens_details.reasoning_tokens == 8
    chunks = list(chat(c, model, 8, stream=True, stream_options={"include_usage": True}, extra_body=LONG))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == reasoning
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 8


def test_enable_thinking_false_through_chat_template_kwargs(thinking_server):
    c, model = thinking_server
    r = chat(c, model, 8, extra_body={**LONG, "chat_template_kwargs": {"enable_thinking": False}})
    assert r.choices[0].message.content and "reasoning_content" not in (r.choices[0].message.model_extra or {})
    assert r.usage.completion_tokens_details is None
    history = HELLO + [{"role": "assistant", "content": "Hi.", "reasoning_content": "They greet me."},
                       {"role": "user", "content": "And?"}]
    assert chat(c, model, 2, messages=history).choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError, match="enable_thinking must be true or false"):
        chat(c, model, 2, extra_body={"chat_template_kwargs": {"enable_thinking": "no"}})
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\].reasoning_content must be a string"):
        chat(c, model, 2, messages=HELLO + [{"role": "assistant", "content": "x", "reasoning_content": 5}])
