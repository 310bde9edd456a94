"""File → Export / Import and the conversation list's: through the real menu items and file
dialogs, a round trip into a fresh home, plain {role, content} lists, ids in use, bad files."""
import json

from fake_engine import _stop_fake_engines, fake_window  # noqa: F401 - the fixture applies here
from modal import answer_file_dialog, when_modal
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QComboBox, QFileDialog, QLineEdit
from test_app_menus import menu_action

from app.conversation import Conversation, Message
from app.transfer import FILTERS, JSON


def answer_with_filter(path: str, name_filter: str) -> None:
    """Pick `name_filter` in the next file dialog's type box, type `path` and accept."""
    def answer(dialog: QFileDialog) -> None:
        types = dialog.findChild(QComboBox, "fileTypeCombo")
        while types.currentText() != name_filter:  # the arrow key on the box, as a user may
            QTest.keyClick(types, Qt.Key.Key_Down)
        dialog.findChild(QLineEdit, "fileNameEdit").setText(path)
        dialog.accept()
    when_modal(QFileDialog, answer)


def seed(home) -> list[Conversation]:
    folder = home / "data" / "conversations"
    folder.mkdir(parents=True)
    convs = []
    for i, title in enumerate(["Packing list", "Paged KV caches"]):
        c = Conversation(id=f"c{i}", title=title, system_prompt="Be brief." if i else "",
                         updated=f"2025-05-0{i + 1}T10:00:00+00:00")
        c.add(Message("user", f"Tell me about {title.lower()}"))
        c.add(Message("assistant", f"**{title}**, in short.", tokens=9, tok_s=40.0))
        (folder / f"{c.id}.json").write_text(json.dumps(c.to_dict()))
        convs.append(c)
    return convs


def test_export_from_the_menus_then_import_into_a_fresh_home(qtbot, app_home, tmp_path, monkeypatch):
    originals = seed(app_home)
    window = fake_window(qtbot)
    window.open_conversation("c1")
    seen = []
    answer_file_dialog(str(tmp_path / "one"), seen)  # no ending: the dialog's filter (Markdown) names it
    menu_action(window, "File", "Export conversation").trigger()
    assert seen[0][1] == "Paged KV caches"
    assert (tmp_path / "one.md").read_text() == originals[1].to_markdown()
    answer_with_filter(str(tmp_path / "all"), FILTERS[JSON])
    menu_action(window, "File", "Export all conversations").trigger()
    assert [c["title"] for c in json.loads((tmp_path / "all.json").read_text())] == ["Paged KV caches",
                                                                                     "Packing list"]
    answer_file_dialog(str(tmp_path / "all.md"))
    next(a for a in window.history.context_menu(None).actions() if a.text() == "Export all…").trigger()
    text = (tmp_path / "all.md").read_text()
    assert text.index("# Paged KV caches") < text.index("# Packing list")
    window.close()

    fresh = tmp_path / "fresh-home"
    monkeypatch.setenv("LANECHAT_HOME", str(fresh))
    window = fake_window(qtbot)
    answer_file_dialog(str(tmp_path / "all.json"))
    menu_action(window, "File", "Import conversations").trigger()
    assert sorted(window.history.ids()) == ["c0", "c1"]
    for c in originals:
        assert json.loads((fresh / "data" / "conversations" / f"{c.id}.json").read_text()) == c.to_dict()

    # The same file again: every id is in use now, so the copies get new ones and nothing is overwritten.
    window.transfers.import_files([str(tmp_path / "all.json")])
    assert len(window.history.ids()) == 4
    copies = [window.history.conversation(cid) for cid in window.history.ids()[:2]]
    assert {c.title for c in copies} == {"Packing list", "Paged KV caches"}
    assert not {c.id for c in copies} & {"c0", "c1"}


def test_a_plain_list_imports_from_the_context_menu_and_opens(qtbot, app_home, tmp_path):
    window = fake_window(qtbot)
    source = tmp_path / "chat.json"
    source.write_text(json.dumps([{"role": "system", "content": "You are a pirate."},
                                  {"role": "user", "content": "Where is the treasure?"},
                                  {"role": "assistant", "content": "Under the palm tree, arr."}]))
    answer_file_dialog(str(source))
    next(a for a in window.history.context_menu(None).actions() if a.text() == "Import…").trigger()
    tab = window.current_tab()
    assert tab.conversation.title == "Where is the treasure?" and tab.conversation.system_prompt == "You are a pirate."
    assert [(m.role, m.text) for m in tab.conversation.messages] == [("user", "Where is the treasure?"),
                                                                     ("assistant", "Under the palm tree, arr.")]
    assert window.history.ids() == [tab.conversation.id]
    assert window.store.load(tab.conversation.id) == tab.conversation


def test_a_bad_file_says_why_imports_nothing_and_stays_as_it_was(qtbot, app_home, tmp_path):
    seed(app_home)
    window = fake_window(qtbot)
    bad = tmp_path / "notes.json"
    bad.write_text('[{"role": "user", "content": "fine"}, {"role": "tool", "content": "x"}]')
    before = sorted(p.name for p in (app_home / "data" / "conversations").iterdir())
    assert window.transfers.import_files([str(bad), str(tmp_path / "missing.json")]) == []
    texts = [n.text for n in window.notices.notices()]
    assert ("Could not import notes.json: message 2: role 'tool' is not system, user or assistant. "
            "Nothing was imported from it.") in texts
    assert any(t.startswith("Could not import missing.json: ") for t in texts)
    assert sorted(p.name for p in (app_home / "data" / "conversations").iterdir()) == before
    assert sorted(window.history.ids()) == ["c0", "c1"]
    assert bad.read_text() == '[{"role": "user", "content": "fine"}, {"role": "tool", "content": "x"}]'


def test_export_of_one_from_the_list_and_a_failed_write(qtbot, app_home, tmp_path):
    seed(app_home)
    window = fake_window(qtbot)
    answer_file_dialog(str(tmp_path / "packing.json"))
    next(a for a in window.history.context_menu(window.history.item("c0")).actions()
         if a.text() == "Export…").trigger()
    assert json.loads((tmp_path / "packing.json").read_text())["title"] == "Packing list"
    answer_file_dialog("/proc/x.md")  # a folder where no file can be written, even by root
    assert window.transfers.export_one("c0") is None
    assert any(n.text.startswith("Could not export to /proc/x.md: ") for n in window.notices.notices())
