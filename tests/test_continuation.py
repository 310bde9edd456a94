"""Continuing a reply cut short: from a snapshot or the prompt cache it is the uninterrupted
stream's output (token for token, computing only the one sampled token never fed); without
either, the reply's text is encoded and read again; a thinking model's block continues as
reasoning."""
import queue
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest

from engine.continuation import continuation, raw_reply, reply_text
from engine.engine import Engine, Runner, run_to_end
from engine.errors import RequestError
from engine.events import Failed, Finished, Started, Token
from engine.settings import EngineSettings, SamplingParams
from engine.thinking import Splitter

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about pages."}]
MODELS = ["synthetic:tiny-llama", "synthetic:tiny-qwen3.5"]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


@lru_cache(maxsize=None)
def runner(model: str) -> Runner:
    return Runner(EngineSettings(model=model, backend="numpy", parallel=1, context=512, memory_gib=1),
                  log=lambda m: None)


def settings(model: str, **kw) -> EngineSettings:
    return EngineSettings(**{**dict(model=model, backend="numpy", parallel=2, context=512, paging="all",
                                    page_tokens=16, prefill_chunk=32, memory_gib=1), **kw})


class Run:
    """One request run to its end on `sched`: its sequence, its events, what it generated."""

    def __init__(self, r: Runner, sched, messages, n: int, **kw):
        self.events: list = []
        self.seq = r.sequence(1, sched.s, messages, greedy(n), self.events.append, **kw)
        run_to_end(sched, [self.seq])
        self.done = next(e for e in self.events if isinstance(e, (Finished, Failed)))
        self.started = next((e for e in self.events if isinstance(e, Started)), None)

    @property
    def generated(self) -> list[int]:
        return [e.token_id for e in self.events if isinstance(e, Token) and e.token_id != Token.NO_TOKEN]


def then(reply: Finished) -> list[dict]:
    return CHAT + [{"role": "assistant", "content": reply.text,
                    **({"reasoning_content": reply.reasoning} if reply.reasoning else {})}]


@pytest.mark.parametrize("model", MODELS)
def test_continuing_from_the_snapshot_is_the_uninterrupted_reply(model):
    r, s = runner(model), settings(model)
    whole = Run(r, r.scheduler(s), CHAT, 14)
    cut_sched = r.scheduler(s)
    cut = Run(r, cut_sched, CHAT, 6, snapshot_at_end=True)
    assert cut.done.reason == "length"
    snap = cut_sched.snapshots.pop(1)
    sched = r.scheduler(s)
    more = Run(r, sched, then(cut.done), 8, resume=snap, continue_final_message=True)
    assert more.done.reason == "length"
    assert cut.generated + more.generated == whole.generated
    assert cut.done.text + more.done.text == whole.done.text
    # Nothing computed again: the snapshot's positions restored, the last sampled token fed.
    assert more.started.reused == snap.cache.n == len(cut.seq.tokens) - 1
    assert sched.prompt_positions == 1
    assert more.done.tokens == 8 and more.done.prompt_tokens == len(cut.seq.tokens)


@pytest.mark.parametrize("model", MODELS)
def test_continuing_from_the_prompt_cache_is_the_uninterrupted_reply(model):
    r, s = runner(model), settings(model, prompt_cache_gib=0.1)
    whole = Run(r, r.scheduler(replace(s, prompt_cache_gib=0.0)), CHAT, 14)
    sched = r.scheduler(s)
    cut = Run(r, sched, CHAT, 6)
    before = sched.prompt_positions
    more = Run(r, sched, then(cut.done), 8, continue_final_message=True, known=sched.prompt_cache.ends())
    assert cut.generated + more.generated == whole.generated
    assert more.started.reused == len(cut.seq.tokens) - 1 and sched.prompt_positions - before == 1


def test_a_cancelled_reply_continues_from_its_snapshot_too():
    model = MODELS[0]
    r, s = runner(model), settings(model)
    whole = Run(r, r.scheduler(s), CHAT, 12)
    sched = r.scheduler(s)
    events: list = []
    seq = r.sequence(1, s, CHAT, greedy(12), events.append, snapshot_at_end=True)
    sched.add(seq)
    while len(seq.tokens) - seq.prompt_len < 5:
        sched.step()
    sched.cancel(1)
    cut = next(e for e in events if isinstance(e, Finished))
    assert cut.reason == "cancelled"
    more = Run(r, r.scheduler(s), then(cut), 12 - cut.tokens, resume=sched.snapshots.pop(1),
               continue_final_message=True)
    assert [e.token_id for e in events if isinstance(e, Token) and e.token_id >= 0] + more.generated == whole.generated


def test_without_a_state_the_reply_text_is_read_again():
    model = MODELS[0]
    r, s = runner(model), settings(model)
    cut = Run(r, r.scheduler(s), CHAT, 6)
    sched = r.scheduler(s)
    more = Run(r, sched, then(cut.done), 4, continue_final_message=True)
    prompt = r.tokenizer.chat_prompt(CHAT)[1]
    assert more.seq.tokens[:more.seq.prompt_len] == prompt + r.tokenizer.encode(cut.done.text)
    assert more.started.reused == 0 and sched.prompt_positions == more.seq.prompt_len
    assert more.done.reason == "length" and more.done.tokens == 4


def test_a_state_whose_reply_is_not_this_one_is_not_taken():
    """The reply was edited (or the history before it changed): its snapshot does not continue it."""
    model = MODELS[0]
    r, s = runner(model), settings(model)
    sched = r.scheduler(s)
    cut = Run(r, sched, CHAT, 6, snapshot_at_end=True)
    snap = sched.snapshots.pop(1)
    edited = then(cut.done)
    edited[-1]["content"] += "!"
    c = continuation(r.tokenizer, edited, s.context, {}, [snap.tokens])
    assert not c.exact and c.ids[:c.reply_start] == snap.tokens[:cut.seq.prompt_len]
    other = [CHAT[0], {"role": "user", "content": "Something else."}, then(cut.done)[-1]]
    assert not continuation(r.tokenizer, other, s.context, {}, [snap.tokens]).exact
    assert continuation(r.tokenizer, then(cut.done), s.context, {}, [snap.tokens]).exact


def test_the_last_message_must_be_a_reply():
    model = MODELS[0]
    r = runner(model)
    with pytest.raises(RequestError, match="assistant message last"):
        r.sequence(1, settings(model), CHAT, greedy(4), lambda e: None, continue_final_message=True)


@pytest.mark.parametrize("reasoning,content,inside,raw", [
    ("", "Plain.", None, "Plain."),
    ("hmm", "", True, "hmm"),
    ("hmm", "Yes.", True, "hmm\n</think>\n\nYes."),
    ("hmm", "", False, "<think>\nhmm"),
    ("", "Yes.", True, "\n</think>\n\nYes."),
    ("", "Yes.", False, "Yes."),
])
def test_the_raw_reply_splits_back_into_what_it_came_from(reasoning, content, inside, raw):
    assert raw_reply(reasoning, content, inside) == raw
    if inside is not None:
        think = Splitter(inside)
        think.take(raw, end=True)
        assert (think.reasoning, think.content) == (reasoning, content)


# --- a thinking model ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def thinker(thinking_runner) -> Runner:
    return thinking_runner


def test_a_reply_cut_inside_its_thinking_goes_on_thinking(thinker):
    s = replace(settings(thinker.loaded.source), context=256)
    chat = CHAT[1:]
    whole = Run(thinker, thinker.scheduler(s), chat, 14)
    sched = thinker.scheduler(s)
    cut = Run(thinker, sched, chat, 6, snapshot_at_end=True)
    assert cut.done.reasoning and not cut.done.text
    more = Run(thinker, thinker.scheduler(s), chat + [{"role": "assistant", "content": "",
                                                       "reasoning_content": cut.done.reasoning}], 8,
               resume=sched.snapshots.pop(1), continue_final_message=True)
    assert cut.generated + more.generated == whole.generated
    assert more.done.reasoning_tokens == 8 and more.done.reasoning and not more.done.text
    assert reply_text(thinker.tokenizer, whole.generated, True) == (whole.done.reasoning, whole.done.text)


# --- through the engine thread --------------------------------------------------------------------

def test_the_engine_continues_a_reply_from_its_snapshot_file(tmp_path: Path):
    model = MODELS[1]
    engine = Engine(settings(model), log=lambda m: None)
    engine.start()
    try:
        def ask(messages, n, **kw):
            box: queue.Queue = queue.Queue()
            rid = engine.submit(messages, greedy(n), on_event=box.put, **kw)
            events = []
            while not isinstance(events[-1] if events else None, (Finished, Failed)):
                events.append(box.get(timeout=60))
            return rid, events
        _, whole = ask(CHAT, 10)
        rid, cut = ask(CHAT, 4, snapshot_at_end=True)
        path = tmp_path / f"c.{engine.info.fingerprint}.kv"
        written: queue.Queue = queue.Queue()
        engine.save_snapshot(rid, path, 1 << 30, written.put)
        assert written.get(timeout=60) is None
        _, more = ask(then(cut[-1]), 6, resume=path, continue_final_message=True)
        assert next(e for e in more if isinstance(e, Started)).reused == cut[-1].prompt_tokens + 3
        def ids(events):
            return [e.token_id for e in events if isinstance(e, Token) and e.token_id != Token.NO_TOKEN]
        assert ids(cut) + ids(more) == ids(whole)
    finally:
        engine.shutdown()
