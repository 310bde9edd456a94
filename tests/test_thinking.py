"""Thinking blocks (engine.thinking): the splitter on any cut of a reply, the template's default and
toggle, and the engine's events and results for a thinking model."""
from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.engine import Runner, run_to_end
from engine.events import Finished, Token
from engine.settings import EngineSettings, SamplingParams
from engine.thinking import Splitter, opens_inside, supports, template_default
from engine.tokenizer import Tokenizer

import ckpt


def split(pieces: list[str], inside: bool) -> tuple[str, str, Splitter]:
    s = Splitter(inside)
    r, c = [], []
    for p in pieces:
        a, b = s.push(p)
        r.append(a)
        c.append(b)
    a, b = s.finish()
    return "".join(r) + a, "".join(c) + b, s


@pytest.mark.parametrize("text, inside, reasoning, content", [
    ("<think>\nLet me see.\n</think>\n\nParis.", False, "Let me see.", "Paris."),  # Qwen3: the model opens it
    ("Let me see.\n</think>\n\nParis.", True, "Let me see.", "Paris."),  # Qwen3.5: the template opened it
    ("  <think>a</think>b", False, "a", "b"),
    ("\n\n</think>\n\nJust this.", True, "", "Just this."),  # an empty block
    ("Plain answer with <think> in it.", False, "", "Plain answer with <think> in it."),  # not at the start
    ("Paris. <think>x</think>", False, "", "Paris. <think>x</think>"),
    ("Still thinking when the reply ended\n", True, "Still thinking when the reply ended\n", ""),
    ("a < b </thin and more</think>c", True, "a < b </thin and more", "c"),  # a partial tag that is text
    ("<thi", False, "", "<thi"),  # the reply ended on what looked like a tag
    ("x\n\ny</think>z\n\n", True, "x\n\ny", "z\n\n"),
])
def test_split(text: str, inside: bool, reasoning: str, content: str) -> None:
    assert split([text], inside)[:2] == (reasoning, content)
    assert split(list(text), inside)[:2] == (reasoning, content)  # one character at a time


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab\n <>/thinkTHINK", max_size=40), st.booleans(), st.data())
def test_any_cut_of_a_reply_splits_the_same(text: str, inside: bool, data) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=8)))
    pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
    assert split(pieces, inside)[:2] == split([text], inside)[:2]


def test_tags_count_as_thinking_tokens() -> None:
    _, _, s = split(["<think>", "\n", "Hmm", ".", "</think>", "\n\n", "Yes", "."], False)
    assert s.tokens == 5  # <think>, \n, Hmm, ., </think>
    _, _, s = split(["Hmm", "</think>", "Yes"], True)
    assert s.tokens == 2


def test_opens_inside() -> None:
    assert opens_inside("<|im_start|>assistant\n<think>\n")
    assert not opens_inside("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not opens_inside("<|im_start|>assistant\n")
    assert opens_inside("<think>old</think> then <think>\n")


def thinking_tokenizer(tmp_path: Path, template: str) -> Tokenizer:
    tmp_path.mkdir(exist_ok=True)
    ckpt.write_tokenizer(tmp_path, chat_template=template)
    return Tokenizer.from_folder(tmp_path)


def test_template_default_and_toggle(tmp_path: Path) -> None:
    tok = thinking_tokenizer(tmp_path / "think", ckpt.THINK_TEMPLATE)
    assert supports(tok.chat_template) and tok.thinks
    assert template_default(lambda chat, **kw: tok.render_chat(chat, **kw)) is True
    off = ckpt.THINK_TEMPLATE.replace("enable_thinking is defined and enable_thinking is false",
                                      "not (enable_thinking is defined and enable_thinking)")
    tok_off = thinking_tokenizer(tmp_path / "off", off)
    assert template_default(lambda chat, **kw: tok_off.render_chat(chat, **kw)) is False
    plain = thinking_tokenizer(tmp_path / "plain", ckpt.CHAT_TEMPLATE)
    assert not plain.thinks
    assert template_default(lambda chat, **kw: plain.render_chat(chat, **kw)) is None


def test_reasoning_of_earlier_turns_is_the_templates_to_keep(tmp_path: Path) -> None:
    tok = thinking_tokenizer(tmp_path, ckpt.THINK_TEMPLATE)
    chat = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1", "reasoning_content": "R1"},
            {"role": "user", "content": "Q2"}]
    assert "R1" not in tok.render_chat(chat)  # before the last user message: dropped
    tool_turn = chat[:2] + [{"role": "tool", "content": "42"}]
    assert "<think>\nR1\n</think>" in tok.render_chat(chat[:1] + tool_turn[1:])


# --- the engine -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runner(thinking_runner) -> Runner:
    return thinking_runner


def run(runner: Runner, thinking: bool | None, tokens: int = 12) -> tuple[list[Token], Finished]:
    s = runner_settings(runner)
    events: list = []
    seq = runner.sequence(1, s, [{"role": "user", "content": "Hello there"}],
                          SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True), events.append,
                          thinking=thinking)
    run_to_end(runner.scheduler(s), [seq])
    return [e for e in events if isinstance(e, Token)], next(e for e in events if isinstance(e, Finished))


def runner_settings(runner: Runner) -> EngineSettings:
    return EngineSettings(model=runner.loaded.source, backend="numpy", parallel=2, context=256, memory_gib=1)


def test_a_reply_inside_an_open_block_is_reasoning(runner: Runner) -> None:
    assert runner.thinking_default() is True
    tokens, done = run(runner, None)
    text = runner.tokenizer.decode(done_tokens(runner, None))
    assert done.reasoning and done.text == "" and done.reasoning == text.strip("\n")
    assert all(t.thinking for t in tokens) and done.reasoning_tokens == done.tokens == 12
    assert "".join(t.reasoning for t in tokens) == done.reasoning and not any(t.text for t in tokens)


def test_thinking_off_is_content(runner: Runner) -> None:
    tokens, done = run(runner, False)
    assert done.reasoning == "" and done.reasoning_tokens == 0 and done.text
    assert "".join(t.text for t in tokens) == done.text and not any(t.thinking for t in tokens)


def done_tokens(runner: Runner, thinking: bool | None) -> list[int]:
    s = runner_settings(runner)
    seq = runner.sequence(1, s, [{"role": "user", "content": "Hello there"}],
                          SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), lambda e: None,
                          thinking=thinking)
    run_to_end(runner.scheduler(s), [seq])
    return seq.tokens[seq.prompt_len:]


def test_a_model_without_thinking_is_untouched(tmp_path: Path) -> None:
    ckpt.write_hf(tmp_path, ckpt.tiny_llama_config(), seed=0)
    r = Runner(EngineSettings(model=str(tmp_path), backend="numpy", parallel=1, context=128, memory_gib=1),
               log=lambda m: None)
    assert r.thinking_default() is None
    seq = r.sequence(1, runner_settings(r), [{"role": "user", "content": "hi"}],
                     SamplingParams(temperature=0, max_tokens=4), lambda e: None)
    assert seq.think is None
