"""Splitting a reply into prose and fenced code, incrementally as it streams; rendered prose keeps
single line breaks and never runs model-written HTML."""
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from PySide6.QtGui import QTextDocument

from app.markdown import CHUNK_CHARS, LINE_SEPARATOR, Block, BlockReader, keep_line_breaks, render, split_blocks


def test_prose_and_code_in_order():
    md = "Here:\n\n```python\ndef f():\n    return 1\n```\nDone."
    assert split_blocks(md) == [Block("text", "Here:"), Block("code", "def f():\n    return 1", "python"),
                                Block("text", "Done.")]


def test_tilde_fences_longer_closers_and_indent():
    md = "  ~~~~\n  a\n   b\n  ~~~~~~\nafter"
    assert split_blocks(md) == [Block("code", "a\n b", ""), Block("text", "after")]


def test_backtick_fence_is_not_closed_by_tildes_and_unclosed_runs_to_end():
    assert split_blocks("```\nx\n~~~\ny") == [Block("code", "x\n~~~\ny", "")]


def test_inline_backticks_are_prose():
    assert split_blocks("use `x` and ``y``") == [Block("text", "use `x` and ``y``")]


def test_long_prose_is_cut_into_chunks_at_paragraphs():
    paragraphs = [f"Paragraph {i} " + "word " * 60 for i in range(12)]
    blocks = split_blocks("\n\n".join(paragraphs))
    assert len(blocks) > 2 and all(b.kind == "text" for b in blocks)
    assert all(len(b.text) < CHUNK_CHARS + 400 for b in blocks)
    assert "\n\n".join(b.text for b in blocks) == "\n\n".join(paragraphs)  # nothing lost or moved


REPLY = ("Intro line\nsecond line\n\n```py\nx = 1\n\ny = 2\n```\n- a\n- b\n\n" + "more text " * 200
         + "\n\n~~~\nunclosed")


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=200))
@settings(max_examples=60, deadline=None)
def test_streamed_in_any_pieces_gives_the_same_blocks(cuts):
    reader, at, i = BlockReader(), 0, 0
    while at < len(REPLY):
        step = cuts[i % len(cuts)]
        reader.feed(REPLY[at:at + step])
        at, i = at + step, i + 1
        if reader.in_code:
            code, _lang = reader.open_code()
            assert "```" not in code
        else:
            done, tail = reader.open_prose()
            assert "\n\n" not in tail  # the paragraph being written is one paragraph
    assert reader.finish() == split_blocks(REPLY)


def test_open_block_is_what_has_arrived():
    reader = BlockReader()
    reader.feed("First paragraph.\n\nSecond, half")
    assert reader.open_prose() == ("First paragraph.", "Second, half")
    reader.feed(" done\n```sh\nls -")
    assert reader.blocks == [Block("text", "First paragraph.\n\nSecond, half done")]
    assert reader.in_code and reader.open_code() == ("ls -", "sh")


def test_single_newlines_stay_line_breaks_but_structure_stays():
    poem = "Roses are red\nViolets are blue\n  Sugar is sweet"
    assert keep_line_breaks(poem) == f"Roses are red{LINE_SEPARATOR}Violets are blue{LINE_SEPARATOR}Sugar is sweet"
    for md in ("- a\n- b", "1. a\n2. b", "# Title\ntext", "Title\n=====", "| a | b |\n|---|---|", "a\n\nb",
               "quote\n> more", "hard  \nbreak", "hard\\\nbreak", "text\n    code"):
        assert LINE_SEPARATOR not in keep_line_breaks(md), md


def _lines(doc: QTextDocument) -> list[str]:
    out, block = [], doc.begin()
    while block.isValid():
        layout = block.layout()
        out += [block.text()[layout.lineAt(i).textStart():][:layout.lineAt(i).textLength()].strip(LINE_SEPARATOR)
                for i in range(layout.lineCount())]
        block = block.next()
    return out


def test_a_rendered_poem_keeps_its_lines(qapp):
    doc = QTextDocument()
    doc.setTextWidth(600)
    render(doc, "Roses are red\nViolets are **blue**\nSugar is sweet")
    doc.size()  # lay it out
    assert _lines(doc) == ["Roses are red", "Violets are blue", "Sugar is sweet"]


def test_rendering_runs_no_raw_html(qapp):
    doc = QTextDocument()
    render(doc, "**bold** <b>raw</b>")
    assert doc.toPlainText() == "bold <b>raw</b>"
    assert doc.begin().begin().fragment().charFormat().fontWeight() == 700


def test_random_markdown_never_breaks_the_reader():
    rnd = random.Random(3)
    pieces = ["```", "~~~", "\n", "\n\n", "text", "  ", "# h", "- i", "`x`", "|"]
    for _ in range(200):
        md = "".join(rnd.choice(pieces) for _ in range(rnd.randint(0, 30)))
        blocks = split_blocks(md)
        assert all(b.kind in ("text", "code") for b in blocks)
