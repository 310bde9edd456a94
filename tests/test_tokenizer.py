"""Tokenizer: encode/decode, stream decoding, chat templates; parity with SmolLM2's own HF tokenizer."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.errors import ModelError
from engine.fetch import default_model_path
from engine.tokenizer import CHATML, Tokenizer

import ckpt

TRICKY = [
    "", " ", "  leading", "trailing  ", "a\n\nb", "\t tab", "2024-12-31 3.14159", "1,000,000",
    "café naïve Zürich", "日本語のテキスト", "emoji 😀👍🏽🇺🇸 ❤️",
    "def f(x):\n    return x ** 2\n",
    "<|im_start|>user\nhi<|im_end|>\n", "it's they're we'll", "a\u00a0b", "\r\n",
]
# Ids from Hugging Face's own SmolLM2-135M-Instruct tokenizer (AutoTokenizer on the hub repo, and
# transformers' GGUF import for the code lines), written here so the test needs neither.
SMOLLM2_IDS = [
    (" ", [216]),
    ("\n\n", [1116]),
    (" \n ", [3717, 216]),
    ("Hello", [19556]),
    (" hello ", [33662, 216]),
    ("a   b", [81, 256, 278]),
    ("trailing  ", [4861, 4966, 256]),
    ("many\n\n\n", [18431, 16506]),
    ("a                    b", [81, 42185, 278]),
    ("2023-2025", [34, 32, 34, 35, 29, 34, 32, 34, 37]),
    ("$250,000", [20, 34, 37, 32, 28, 32, 32, 32]),
    ("PHY302K", [16386, 73, 35, 32, 34, 59]),
    ("can't won't shan't", [4055, 982, 3763, 982, 443, 276, 982]),
    ("IT'S", [2901, 23, 67]),
    ("C++", [51, 11444]),
    ("a<b>c", [81, 44, 82, 46, 83]),
    ("«guillemets»", [39969, 6058, 3285, 93, 1175, 20306]),
    ("café", [83, 1939, 2756]),
    ("naïve", [3546, 46494]),
    ("日本語", [23274, 115, 40993, 179, 120, 248]),
    ("Привет", [155, 249, 46879, 16464, 32547]),
    ("🎉", [10813, 232, 227]),
    ("👨\u200d👩\u200d👧", [10813, 235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117]),
    ("e\u0301", [85, 151, 219]),
    ("not <|a special|> token", [1766, 2067, 108, 81, 1767, 108, 46, 9624]),
    ("<|im_start|>system\nhi<|im_end|>\n", [1, 9690, 198, 6004, 2, 198]),
    ("a\x04b", [81, 82]),  # bytes with no vocabulary entry are dropped, as HF does
    ("a\xa0b", [81, 15442, 82]),
    ("a\r\nb", [81, 201, 198, 82]),
    ("Developed early software infrastructure, including microcontroller firmware (C++).",
     [15568, 277, 1584, 3197, 5730, 28, 1285, 40762, 29218, 365, 51, 11444, 595]),
    ("def foo(x):\n    return x ** 2\n", [1604, 29856, 24, 104, 727, 472, 1003, 1792, 1903, 216, 34, 198]),
    ("for i in range(10):\n\tprint(i)", [1710, 2056, 281, 1845, 24, 33, 32, 727, 198, 197, 3272, 24, 89, 25]),
    ("if (a && b) { return -1; }", [342, 365, 81, 1456, 22, 278, 25, 1662, 1003, 731, 33, 43, 4029]),
    ("    indented\n        more", [333, 641, 6574, 448, 540]),
]
GOLDEN = Path(__file__).parent / "fixtures" / "smollm2_q4_1" / "golden.npz"
SMOLLM_CHATS = [  # the conversations tests/make_golden.py rendered with transformers
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count: 1, 2, 3,"}],
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Tokenizer:
    folder = tmp_path_factory.mktemp("tok")
    ckpt.write_tokenizer(folder)
    return Tokenizer.from_folder(folder)


@pytest.fixture(scope="module")
def smollm2() -> Tokenizer:
    path = default_model_path()
    if not path.is_file():
        pytest.skip(f"default model not downloaded ({path}); `python -m engine fetch-default`")
    from engine.loader import gguf
    return gguf.tokenizer(path)


def test_tiny_basics(tiny: Tokenizer) -> None:
    assert tiny.vocab_size == ckpt.TOKENIZER_VOCAB
    assert tiny.bos_id == 1 and tiny.eos_ids == {2}
    assert tiny.encode("<|im_start|><|im_end|>") == [1, 2]
    assert tiny.bos_token == "<|im_start|>" and tiny.eos_token == "<|im_end|>"


@pytest.mark.parametrize("text", TRICKY)
def test_roundtrip(tiny: Tokenizer, text: str) -> None:
    assert tiny.decode(tiny.encode(text)) == text


@pytest.mark.parametrize("text", TRICKY)
def test_stream_equals_decode(tiny: Tokenizer, text: str) -> None:
    ids = tiny.encode(text)
    s = tiny.stream(skip_special=False)
    pieces = [s.push(i) for i in ids]
    assert "".join(pieces) + s.flush() == tiny.decode(ids)
    assert not any("\ufffd" in p for p in pieces)


def test_stream_holds_back_partial_utf8(tiny: Tokenizer) -> None:
    ids = tiny.encode("😀")
    assert len(ids) > 1  # the tiny vocabulary spells the emoji in bytes
    s = tiny.stream()
    assert [s.push(i) for i in ids[:-1]] == [""] * (len(ids) - 1)
    assert s.push(ids[-1]) == "😀"
    s.push(ids[0])
    assert s.flush() == "\ufffd"  # an incomplete character at the very end still comes out
    assert s.flush() == ""


def test_stream_skips_specials(tiny: Tokenizer) -> None:
    s = tiny.stream()
    out = "".join(s.push(i) for i in tiny.encode("hi<|im_end|> there")) + s.flush()
    assert out == "hi there"


def test_render_smollm_template(tiny: Tokenizer) -> None:
    msgs = [{"role": "user", "content": "Hi!"}]
    assert tiny.render_chat(msgs) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n")
    sys_msgs = [{"role": "system", "content": "Be brief."}, *msgs]
    assert tiny.render_chat(sys_msgs, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n")
    ids = tiny.encode_chat(sys_msgs)
    assert ids[0] == 1 and ids.count(2) == 2 and tiny.decode(ids) == tiny.render_chat(sys_msgs)


def test_chatml_fallback(tmp_path: Path) -> None:
    ckpt.write_tokenizer(tmp_path, chat_template=None)
    tok = Tokenizer.from_folder(tmp_path)
    assert not tok.has_chat_template and tok.chat_template == CHATML
    rendered = tok.render_chat([{"role": "user", "content": "x"}])
    assert rendered == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_chat_template_jinja_file_wins(tmp_path: Path) -> None:
    ckpt.write_tokenizer(tmp_path)
    (tmp_path / "chat_template.jinja").write_text("{{ bos_token }}{{ messages[0]['content'] | tojson }}")
    tok = Tokenizer.from_folder(tmp_path)
    assert tok.render_chat([{"role": "user", "content": "<a & 'b'>"}]) == '<|im_start|>"<a & \'b\'>"'


def test_template_helpers(tmp_path: Path) -> None:
    ckpt.write_tokenizer(tmp_path, chat_template="{{ strftime_now('%Y') }}{% if tools %}T{% endif %}")
    tok = Tokenizer.from_folder(tmp_path)
    assert tok.render_chat([], tools=[{"name": "x"}]).endswith("T")
    assert len(tok.render_chat([])) == 4


@pytest.mark.parametrize("template, message", [
    ("{{ raise_exception('only user and assistant roles') }}", "only user and assistant roles"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError"),  # the sandbox blocks attribute games
    ("{% for m in messages %}{{ m.content + 1 }}{% endfor %}", "TypeError"),
])
def test_template_failures_are_model_errors(tmp_path: Path, template: str, message: str) -> None:
    ckpt.write_tokenizer(tmp_path, chat_template=template)
    with pytest.raises(ModelError, match=message):
        Tokenizer.from_folder(tmp_path).render_chat([{"role": "user", "content": "x"}])


def test_template_syntax_error(tmp_path: Path) -> None:
    ckpt.write_tokenizer(tmp_path, chat_template="{% for %}")
    with pytest.raises(ModelError, match="does not parse"):
        Tokenizer.from_folder(tmp_path)


def test_bad_tokenizer_files(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="no tokenizer.json"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelError, match="tokenizer.json: not a readable tokenizer"):
        Tokenizer.from_folder(tmp_path)


# --- the real default model (skipped until `python -m engine fetch-default`) -----------------------

@pytest.mark.parametrize("text, ids", SMOLLM2_IDS)
def test_smollm2_matches_hf(smollm2: Tokenizer, text: str, ids: list[int]) -> None:
    assert smollm2.encode(text) == ids


def test_smollm2_tokenizer_facts(smollm2: Tokenizer) -> None:
    assert smollm2.vocab_size == 49152
    assert smollm2.bos_id == 1 and smollm2.eos_ids == {0, 2}  # <|im_end|>, and <|endoftext|> as llama.cpp does
    assert smollm2.decode(smollm2.encode(" ".join(t for t in TRICKY))) == " ".join(TRICKY)


def test_smollm2_chat_matches_transformers(smollm2: Tokenizer) -> None:
    if not GOLDEN.is_file():
        pytest.skip("no SmolLM2 golden fixture")
    g = np.load(GOLDEN)
    for i, chat in enumerate(SMOLLM_CHATS):
        assert smollm2.encode_chat(chat) == g["input_ids"][i, : g["lengths"][i]].tolist()


def test_lone_surrogates_and_undecodable_text_encode_cleanly(tiny: Tokenizer) -> None:
    # Python hands undecodable bytes (argv, file names) over as lone surrogates; no tokenizer takes them
    assert tiny.decode(tiny.encode("caf\udce9 \ud800!")) == "caf\ufffd \ufffd!"
    assert tiny.encode("pair \ud83d\ude00") == tiny.encode("pair 😀")
    ids = tiny.encode_chat([{"role": "user", "content": "x\udcff"}], limit=512)
    assert "\ufffd" in tiny.decode(ids)


def test_a_chat_too_long_for_the_context_is_refused_before_encoding(tiny: Tokenizer) -> None:
    from engine.errors import RequestError
    with pytest.raises(RequestError, match=r"the conversation \(\d+ characters\) does not fit the context of 8 tokens"):
        tiny.encode_chat([{"role": "user", "content": "word " * 10_000}], limit=8)


def test_a_template_past_its_limits_is_one_line_of_model_error(tmp_path: Path) -> None:
    ckpt.write_tokenizer(tmp_path, chat_template="{{ (' ' * 10**8) * 20 }}")
    tok = Tokenizer.from_folder(tmp_path)
    with pytest.raises(ModelError, match=r"tokenizer.json: the chat template needs more than 1 GiB of memory$"):
        tok.render_chat([{"role": "user", "content": "x"}])
