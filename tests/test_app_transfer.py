"""Export and import formats: Markdown and JSON out, our JSON (every version) and plain
{role, content} lists in, and bad files refused whole with the reason."""
import json

import pytest

from app.attachments import Attachment
from app.conversation import FORMAT_VERSION, Conversation, FormatError, Message
from app.transfer import JSON, MARKDOWN, export_bytes, export_path, kind_of, parse_import, read_import, write_export


def _conv(title: str, *texts: str, system: str = "") -> Conversation:
    c = Conversation(title=title, system_prompt=system, model="tiny")
    for i, text in enumerate(texts):
        c.add(Message("user" if i % 2 == 0 else "assistant", text, tokens=None if i % 2 == 0 else 7))
    return c


def test_json_round_trip_of_one_and_of_all(tmp_path):
    a = _conv("Alpha", "Hi", "Hello **there**", system="Be brief.")
    a.messages[1].reasoning = "thinking about it"
    a.messages[0].attachments = [Attachment("notes.md", "# notes\n", 3)]  # format 3: files, own sampling
    a.messages[1].finish_reason, a.sampling = "length", {"temperature": 0.3, "max_tokens": 99}
    b = _conv("Beta", "Ünïcödé \ud800 and a lone surrogate", "ok")
    write_export([a], tmp_path / "one.json")
    assert read_import(tmp_path / "one.json") == [a]
    write_export([a, b], tmp_path / "all.json", several=True)
    assert json.loads((tmp_path / "all.json").read_text())[0]["format_version"] == FORMAT_VERSION
    assert read_import(tmp_path / "all.json") == [a, b]
    write_export([b], tmp_path / "all-of-one.json", several=True)  # an export of all that holds one
    assert read_import(tmp_path / "all-of-one.json") == [b]


def test_markdown_of_one_and_of_all(tmp_path):
    a, b = _conv("Alpha", "Hi", "Hello"), _conv("Beta", "Question", "Answer")
    write_export([a], tmp_path / "one.md")
    assert (tmp_path / "one.md").read_text() == a.to_markdown()
    text = export_bytes([a, b], MARKDOWN, several=True).decode()
    assert text.index("# Alpha") < text.index("\n---\n") < text.index("# Beta")
    assert "## You\n\nQuestion" in text and "## Assistant\n\nAnswer" in text


def test_every_format_version_the_store_reads_imports():
    v1 = {"format_version": 1, "id": "old", "title": "Old one", "messages": [
        {"role": "user", "text": "Q"}, {"role": "assistant", "text": "A", "tokens": 3}]}
    [conv] = parse_import(v1)
    assert [(m.role, m.text, m.id, m.parent) for m in conv.messages] == [("user", "Q", 1, None),
                                                                        ("assistant", "A", 2, 1)]
    with pytest.raises(FormatError, match="newer"):
        parse_import({**v1, "format_version": 99})


def test_a_plain_list_of_role_and_content_imports_as_one_conversation():
    plain = [{"role": "system", "content": "You are terse."},
             {"role": "user", "content": "What is 2+2? Answer with a number please, nothing else at all"},
             {"role": "assistant", "content": [{"type": "text", "text": "4"}, {"type": "text", "text": "."}],
              "reasoning_content": "easy"}]
    [conv] = parse_import(plain)
    assert conv.system_prompt == "You are terse."
    assert [(m.role, m.text) for m in conv.messages] == [("user", plain[1]["content"]), ("assistant", "4.")]
    assert conv.messages[1].reasoning == "easy" and conv.messages[1].parent == conv.messages[0].id
    assert conv.title == "What is 2+2? Answer with a number please…"  # from the first question
    [same] = parse_import({"messages": plain, "model": "gpt"})  # an OpenAI request body
    assert [m.text for m in same.messages] == [m.text for m in conv.messages]


@pytest.mark.parametrize("raw, reason", [
    ({}, "not a Lanechat conversation"),
    ([], "not a Lanechat conversation"),
    ("text", "not a Lanechat conversation"),
    ([{"role": "tool", "content": "x"}], "message 1: role 'tool' is not system, user or assistant"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": 5}], "message 2: content is not text"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "content is not text"),
    ([{"role": "system", "content": "only a system prompt"}], "no user or assistant messages"),
    ([{"role": "user", "content": "a"}, 3], "item 2 is neither"),
    ([{"format_version": 2, "id": "a", "messages": []}, {"format_version": 2, "id": "b"}],
     "conversation 2: missing id or messages"),
    ([{"format_version": 2, "id": "a", "messages": []}, {"role": "user", "content": "x"}], "item 1 is neither"),
])
def test_bad_imports_say_why(raw, reason):
    with pytest.raises(FormatError, match=reason.replace("?", r"\?").replace("(", r"\(")):
        parse_import(raw)


def test_bad_files_say_why_and_stay_as_they_were(tmp_path):
    cases = {"broken.json": b'{"format_version": 2, "id": ', "latin1.json": b'["caf\xe9"]',
             "deep.json": b"[" * 40 + b"]" * 40}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    with pytest.raises(FormatError, match="not valid JSON at line 1"):
        read_import(tmp_path / "broken.json")
    with pytest.raises(FormatError, match="not UTF-8 text at byte 5"):
        read_import(tmp_path / "latin1.json")
    with pytest.raises(FormatError, match="nested more than 16 levels"):
        read_import(tmp_path / "deep.json")
    with pytest.raises(FormatError, match="No such file"):
        read_import(tmp_path / "missing.json")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == cases  # nothing moved or changed


def test_export_names_and_kinds(tmp_path):
    assert export_path(Conversation(title="a/b: c*d"), tmp_path, JSON) == tmp_path / "a b c d.json"
    assert export_path(None, tmp_path) == tmp_path / "Lanechat conversations.md"
    assert kind_of(tmp_path / "x.JSON") == JSON and kind_of(tmp_path / "x.md", JSON) == MARKDOWN
    assert kind_of(tmp_path / "x", JSON) == JSON and kind_of(tmp_path / "x.txt") == MARKDOWN
