"""The tree of messages: alternatives kept by regenerate and edit, switching, forking, the format
(version 2) and the migration of version 1 files written by the Lanechat before it."""
import json
import shutil
from pathlib import Path

import pytest
from fake_engine import _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here
from PySide6.QtCore import Qt
from tab_actions import ask, click, shown

from app import branches
from app.chat_tab import ChatTab
from app.conversation import FORMAT_VERSION, Conversation, Message
from app.store import ConversationStore
from engine import EngineSettings, SamplingParams

V1 = Path(__file__).parent / "fixtures" / "conversations" / "v1.json"


def tree() -> Conversation:
    """q1 → a1 → q2 → a2, then a2 regenerated (a2'), then q1 edited (q1' → a1')."""
    c = Conversation()
    for role, text in (("user", "q1"), ("assistant", "a1"), ("user", "q2"), ("assistant", "a2")):
        c.add(Message(role, text))
    branches.set_aside(c, 3)
    c.add(Message("assistant", "a2'"))
    branches.set_aside(c, 0)
    c.add(Message("user", "q1'"))
    c.add(Message("assistant", "a1'"))
    return c


def texts(c: Conversation) -> list[str]:
    return [m.text for m in c.messages]


def test_alternatives_are_siblings_oldest_first_and_switching_walks_the_newest_replies():
    c = tree()
    assert texts(c) == ["q1'", "a1'"]
    assert [m.text for m in branches.siblings(c, 0)] == ["q1", "q1'"]
    branches.switch(c, 0, branches.siblings(c, 0)[0])
    assert texts(c) == ["q1", "a1", "q2", "a2'"]  # the newest reply at the regenerated turn
    assert [m.text for m in branches.siblings(c, 3)] == ["a2", "a2'"]
    branches.switch(c, 3, branches.siblings(c, 3)[0])
    assert texts(c) == ["q1", "a1", "q2", "a2"]
    assert len(c.messages) + len(c.branches) == 7  # nothing was lost on the way


def test_the_tree_survives_the_file_and_the_branch_shown_stays():
    c = tree()
    branches.switch(c, 0, branches.siblings(c, 0)[0])
    raw = json.loads(json.dumps(c.to_dict()))
    assert raw["format_version"] == FORMAT_VERSION
    back = Conversation.from_dict(raw)
    assert back == c and texts(back) == ["q1", "a1", "q2", "a2'"]
    assert sorted(m.text for m in back.branches) == ["a1'", "a2", "q1'"]


def test_a_fork_is_the_branch_up_to_the_message_alone():
    c = tree()
    new = branches.fork(c, 0)
    assert texts(new) == ["q1'"] and not new.branches and new.id != c.id
    assert [m.parent for m in new.messages] == [None] and new.title.endswith("(fork)")


def test_a_version_1_file_written_by_the_previous_lanechat_loads_unchanged(tmp_path):
    """tests/fixtures/conversations/v1.json was written by ConversationStore.save of format 1."""
    raw = json.loads(V1.read_text())
    assert raw["format_version"] == 1
    shutil.copy(V1, tmp_path / V1.name)
    store = ConversationStore(tmp_path)
    c = store.load("v1")
    assert [(m.role, m.text, m.tokens, m.tok_s, m.interrupted) for m in c.messages] == [
        (m["role"], m["text"], m["tokens"], m["tok_s"], m["interrupted"]) for m in raw["messages"]]
    for k in ("title", "model", "settings", "system_prompt", "draft", "created", "updated", "engine"):
        assert getattr(c, k) == raw[k]
    assert [(m.id, m.parent) for m in c.messages] == [(1, None), (2, 1), (3, 2), (4, 3)]
    # Written back it is a file of the current version that reads the same, and it grows a branch
    # like any other.
    store.save(c)
    again = store.load("v1")
    assert json.loads((tmp_path / "v1.json").read_text())["format_version"] == FORMAT_VERSION and again == c
    branches.set_aside(again, 3)
    again.add(Message("assistant", "Less waste, again"))
    assert [m.text for m in branches.siblings(again, 3)] == ["Less waste", "Less waste, again"]


@pytest.mark.parametrize("bad", [
    {"messages": [{"id": 1, "parent": None}, {"id": 1, "parent": 1}]},  # a repeated id
    {"messages": [{"id": 1, "parent": None}, {"id": 5, "parent": 9}]},  # a broken chain
])
def test_a_branch_shown_that_does_not_chain_is_renumbered_and_loses_no_message(bad):
    raw = {"format_version": 2, "id": "x", "messages": [dict(role="user", text="q", **bad["messages"][0]),
                                                        dict(role="assistant", text="a", **bad["messages"][1])],
           "branches": [{"role": "assistant", "text": "orphan", "id": 3, "parent": 1}]}
    c = Conversation.from_dict(raw)
    assert texts(c) == ["q", "a"] and [(m.id, m.parent) for m in c.messages] == [(1, None), (2, 1)]
    assert c.branches == []


def test_other_branches_that_hang_nowhere_or_repeat_an_id_are_dropped():
    msgs = [{"role": "user", "text": "q", "id": 1, "parent": None},
            {"role": "assistant", "text": "a", "id": 2, "parent": 1}]
    others = [{"role": "assistant", "text": "child of a later one", "id": 6, "parent": 5},
              {"role": "assistant", "text": "b", "id": 5, "parent": 1},
              {"role": "assistant", "text": "same id as a", "id": 2, "parent": 1},
              {"role": "assistant", "text": "nowhere", "id": 7, "parent": 42},
              {"role": "assistant", "text": "its own parent", "id": 8, "parent": 8},
              "not a message" and {"role": "user", "text": "no id"}]
    c = Conversation.from_dict({"format_version": 2, "id": "x", "messages": msgs, "branches": others})
    assert [m.text for m in c.branches] == ["b", "child of a later one"]


def chain(first_id: int, parent: int, n: int) -> list[dict]:
    """n messages, each the child of the one before, listed child first (the last is the chain's top)."""
    return [{"role": ("user", "assistant")[i % 2], "text": f"m{i}", "id": first_id + i,
             "parent": first_id + i - 1 if i else parent} for i in range(n)][::-1]


def test_a_long_branch_listed_child_first_loads_and_switches_whole():
    """Placing a branch took a pass over the list per level: 30,000 messages listed child first
    took minutes to load, and as long again to switch to."""
    n = 30_000
    msgs = [{"role": "user", "text": "q", "id": 1, "parent": None},
            {"role": "assistant", "text": "a", "id": 2, "parent": 1}]
    c = Conversation.from_dict({"format_version": 2, "id": "x", "messages": msgs, "branches": chain(3, 1, n)})
    assert [m.id for m in c.branches] == list(range(3, n + 3))
    options = branches.siblings(c, 1)
    assert [m.text for m in options] == ["a", "m0"]
    branches.switch(c, 1, options[1])
    assert [m.id for m in c.messages] == [1, *range(3, n + 3)] and [m.text for m in c.branches] == ["a"]
    branches.switch(c, 1, branches.siblings(c, 1)[0])
    assert texts(c) == ["q", "a"] and len(c.branches) == n


def test_reveal_shows_the_branch_through_any_message_of_the_tree():
    c = tree()
    a2 = next(m for m in c.branches if m.text == "a2")  # under q1, and not the newest reply there
    assert branches.reveal(c, a2) == 3
    assert texts(c) == ["q1", "a1", "q2", "a2"] and {m.text for m in c.branches} == {"a2'", "q1'", "a1'"}
    assert branches.reveal(c, c.messages[1]) == 1 and texts(c)[-1] == "a2"  # shown already: nothing moves
    assert branches.reveal(c, Message("user", "not in this tree")) is None and texts(c)[-1] == "a2"


# --- in a tab ---------------------------------------------------------------------------------

@pytest.fixture
def tab(qtbot, tmp_path, run_async):
    bridge, _ = bridge_with(n=5)
    run_async(bridge.start(EngineSettings(sampling=SamplingParams(max_tokens=5))))
    return shown(qtbot, ChatTab(Conversation(), ConversationStore(tmp_path), bridge))


def test_regenerate_keeps_the_old_reply_and_the_arrows_switch_back(qtbot, tab):
    ask(qtbot, tab, "Hello")
    first = tab.conversation.messages[-1]
    click(qtbot, tab.view.widgets[-1]._regenerate)
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    switch = tab.view.widgets[-1].branch
    assert switch.isVisible() and switch.label.text() == "2/2" and not switch.next.isEnabled()
    click(qtbot, switch.previous)
    assert tab.conversation.messages[-1] is first and tab.view.widgets[-1].branch.label.text() == "1/2"
    saved = json.loads(tab.store.path(tab.conversation.id).read_text())
    assert saved["messages"][-1]["id"] == first.id and len(saved["branches"]) == 1


def test_editing_an_earlier_message_starts_a_branch_from_there(qtbot, tab):
    ask(qtbot, tab, "First")
    ask(qtbot, tab, "Second")
    first_widget = tab.view.widgets[0]
    assert first_widget._edit.isVisible()  # not only the last user message
    click(qtbot, first_widget._edit)
    assert tab.editing and tab.composer.text() == "First"
    tab.composer.set_text("First, edited")
    qtbot.keyClick(tab.composer.edit, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not tab.generating, timeout=10000)
    assert [m.text for m in tab.conversation.messages][0] == "First, edited" and len(tab.conversation.messages) == 2
    switch = tab.view.widgets[0].branch
    assert switch.label.text() == "2/2"
    click(qtbot, switch.previous)
    assert [m.text for m in tab.conversation.messages][::2] == ["First", "Second"]


def test_fork_opens_the_conversation_up_to_a_message(qtbot, tab):
    ask(qtbot, tab, "First")
    ask(qtbot, tab, "Second")
    with qtbot.waitSignal(tab.fork_requested, timeout=1000) as forked:
        click(qtbot, tab.view.widgets[1]._fork)
    new = forked.args[0]
    assert [m.text for m in new.messages] == [m.text for m in tab.conversation.messages[:2]]
