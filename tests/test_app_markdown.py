"""Splitting a reply into prose and fenced code; prose HTML never runs model-written HTML."""
from app.markdown import Block, prose_html, split_blocks


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


def test_prose_html_renders_markdown_but_not_raw_html(qapp):
    html = prose_html("**bold** <b>raw</b>")
    assert 'font-weight:700;">bold' in html
    assert "&lt;b&gt;raw" in html
