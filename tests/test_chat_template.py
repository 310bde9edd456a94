"""Chat templates render in a worker process with a time, size and memory limit: a hostile or
broken template is one line of refusal, and the worker is replaced after a timeout."""
import pytest

from engine import chat_template as ct

CTX = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}


def test_renders_like_jinja_and_keeps_lone_surrogates():
    src = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{{ add_generation_prompt }}"
    assert ct.render(src, CTX) == "<user>hi</user>True".replace("</user>", "")
    assert ct.render("{{ messages[0].content }}", {"messages": [{"content": "a\ud800b\n"}]}) == "a\ud800b\n"


@pytest.mark.parametrize("template, words", [
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "took longer than 1 s"),
    ("{{ (' ' * 10**8) * 20 }}", "needs more than 1 GiB of memory"),
    ("{{ " + "(" * 10_000 + "1" + ")" * 10_000 + " }}", "does not parse (nested too deeply)"),
    ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "failed (it recursed too deeply)"),
    ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
     "needs more than 1 GiB"),
    ("{{ 'x' * 20000000 }}", "renders more than 16777216 characters"),
    ("{{ raise_exception('line one\nline two\n\tthree') }}", "failed (TemplateError: line one line two three)"),
    ("{{ ''.__class__.__mro__ }}", "SecurityError"),
    ("{% include 'other' %}", "failed (TypeError"),
])
def test_hostile_templates_are_refused_in_one_line(template, words):
    with pytest.raises(ct.ChatTemplateError) as e:
        ct.render(template, CTX, limit_s=1 if "range(100000)" in template else ct.LIMIT_S)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_worker_is_replaced_after_a_timeout():
    with pytest.raises(ct.ChatTemplateError, match="took longer"):
        ct.render("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", CTX, limit_s=0.5)
    assert ct.render("{{ 1 + 1 }}", CTX) == "2"


def test_what_cannot_be_sent_is_refused():
    with pytest.raises(ct.ChatTemplateError, match="cannot be given these values"):
        ct.render("{{ x }}", {"x": object()})
    with pytest.raises(ct.ChatTemplateError, match="longer than 1048576 characters"):
        ct.check("x" * (ct.MAX_TEMPLATE + 1))
    with pytest.raises(ct.ChatTemplateError, match="must be text"):
        ct.check(5)
