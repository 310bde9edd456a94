"""TextStream: stop strings found wherever they form, text held back only while it could still stop."""
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.textstream import TextStream


class Pieces:
    """A detokenizer whose token i decodes to pieces[i]; `tail` comes out at flush."""

    def __init__(self, pieces: list[str], tail: str = ""):
        self.pieces, self.tail = pieces, tail

    def push(self, token_id: int) -> str:
        return self.pieces[token_id]

    def flush(self) -> str:
        return self.tail


def whole_text_reference(pieces: list[str], stops: list[str], tail: str) -> tuple[list[str], str, bool]:
    """The plain algorithm: search the whole text for every stop string after each token."""
    text, shown, out = "", 0, []
    hold = max((len(s) - 1 for s in stops if s), default=0)
    for p in pieces:
        text += p
        at = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=-1)
        if at >= 0:
            text = text[:at]
        upto = max(shown, len(text) - (0 if at >= 0 else hold))
        out.append(text[shown:upto])
        shown = upto
        if at >= 0:
            return out + [text[shown:]], text, True
    text += tail
    return out + [text[shown:]], text, False


def run(pieces: list[str], stops: list[str], tail: str = "") -> tuple[list[str], str, bool]:
    ts = TextStream(Pieces(pieces, tail), stops)
    out = []
    for i in range(len(pieces)):
        out.append(ts.push(i))
        if ts.stopped:
            break
    out.append(ts.finish())
    return out, ts.text, ts.stopped


def test_a_stop_string_across_tokens_cuts_the_text_and_ends():
    out, text, stopped = run(["Hello", " wo", "rld", "!", " more"], ["world"])
    assert stopped and text == "Hello " and "".join(out) == "Hello "
    assert out[0] == "H"  # the last len("world") - 1 characters wait
    assert run(["ab", "c"], ["zz"]) == (["a", "b", "c"], "abc", False)


def test_held_back_text_comes_out_at_the_end_with_the_detokenizer_rest():
    out, text, stopped = run(["x", "wor"], ["world"], tail="\ufffd")
    assert not stopped and out == ["", "", "xwor\ufffd"] and text == "xwor\ufffd"


def test_no_stop_strings_hold_nothing():
    assert run(["a", "b"], [])[0] == ["a", "b", ""]
    assert run(["a", "b"], [""])[0] == ["a", "b", ""]


@settings(max_examples=400, deadline=None)
@given(pieces=st.lists(st.text("abc", max_size=4), max_size=12),
       stops=st.lists(st.text("abc", max_size=4), max_size=3), tail=st.text("abc", max_size=2))
def test_searching_only_the_tail_equals_searching_everything(pieces, stops, tail):
    assert run(pieces, stops, tail) == whole_text_reference(pieces, stops, tail)
