"""The tree of a conversation's messages, walked from the branch shown (Conversation.messages).

Regenerating a reply or editing a user message adds a sibling: the message it replaces, and
everything after it, move to Conversation.branches, where they stay (in the file too) until the
user switches back (‹ 1/2 ›). Siblings are the messages with the same parent, oldest first.
"""
from __future__ import annotations

import copy

from .conversation import Conversation, Message


def siblings(conv: Conversation, index: int) -> list[Message]:
    """The alternatives at messages[index] (itself among them), oldest first."""
    here = conv.messages[index]
    same = [m for m in conv.branches if m.parent == here.parent] + [here]
    return sorted(same, key=lambda m: m.id)


def set_aside(conv: Conversation, index: int) -> None:
    """Move messages[index:] off the branch shown, into the tree's other branches."""
    conv.branches.extend(conv.messages[index:])
    conv.branches.sort(key=lambda m: m.id)
    del conv.messages[index:]


def switch(conv: Conversation, index: int, target: Message) -> None:
    """Show the branch through `target`, a sibling of messages[index]: it and, below it, the
    newest reply at every turn."""
    if target is conv.messages[index]:
        return
    set_aside(conv, index)
    children: dict[int | None, list[Message]] = {}
    for m in conv.branches:
        children.setdefault(m.parent, []).append(m)
    node: Message | None = target
    while node is not None:
        conv.messages.append(node)
        node = max(children.get(node.id, ()), key=lambda m: m.id, default=None)
    shown = {id(m) for m in conv.messages[index:]}
    conv.branches = [m for m in conv.branches if id(m) not in shown]


def reveal(conv: Conversation, target: Message) -> int | None:
    """Show the branch through `target` (a message of any branch): switched at every turn where
    it is not the one shown; its index then, or None when it is not in the tree."""
    for _ in range(len(conv.messages) + len(conv.branches)):  # one turn switched per pass
        shown = {m.id: i for i, m in enumerate(conv.messages)}
        if target.id in shown and conv.messages[shown[target.id]] is target:
            return shown[target.id]
        by_id = {m.id: m for m in conv.branches}
        node = target
        while node.parent is not None and node.parent not in shown and node.parent in by_id:
            node = by_id[node.parent]
        index = 0 if node.parent is None else shown.get(node.parent, -2) + 1
        if not 0 <= index < len(conv.messages) or all(m is not node for m in siblings(conv, index)):
            return None
        switch(conv, index, node)
    return None


def fork(conv: Conversation, index: int) -> Conversation:
    """A new conversation holding the branch shown up to messages[index] (its own copy, one branch)."""
    new = Conversation(title=f"{conv.title or 'Conversation'} (fork)", model=conv.model,
                       settings=copy.deepcopy(conv.settings), engine=conv.engine,
                       system_prompt=conv.system_prompt)
    for m in conv.messages[:index + 1]:
        new.add(copy.copy(m))
    return new
