"""The window and models: a thinking model's replies (section, toggle, file), opening a model from the
models page, the recent list or a drop, cancelling a load, unloading while idle and loading again.
Qt offscreen; the real engine on numpy."""
import json
import time

import pytest
from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl
from PySide6.QtGui import QDropEvent
from PySide6.QtWidgets import QApplication, QProgressDialog, QPushButton
from test_app_window import click, conv_file, launch, send, settings_for  # noqa: F401 - launch is a fixture

from app.model_menu import RecentModelsMenu, dropped_model
from app.preferences import preferences_path

import ckpt


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("thinking-qwen3")
    ckpt.write_hf(folder, ckpt.tiny_qwen3_config(), seed=2, chat_template=ckpt.THINK_TEMPLATE)
    return str(folder)


def test_a_thinking_reply_streams_into_a_closed_section_and_is_saved(qtbot, launch, app_home, thinking_model):
    window = launch(model=thinking_model, max_tokens=12)
    tab = window.current_tab()
    assert tab.thinking_toggle.isVisible() and tab.thinking_toggle.isChecked()  # the template's default: on
    send(qtbot, tab, "Hello there")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    reply = tab.conversation.messages[-1]
    widget = tab.view.widget_for(len(tab.conversation.messages) - 1)
    assert reply.reasoning and reply.text == "" and reply.reasoning_tokens == 12
    assert widget.thinking is not None and not widget.thinking.is_open
    assert widget.thinking.header.text() == "▸ Thinking  ·  12 tokens"
    qtbot.waitUntil(widget.thinking.header.isVisible, timeout=5000)  # shown with the reply's last layout pass
    click(qtbot, widget.thinking.header)
    assert reply.reasoning.strip() in widget.thinking.view.text()
    saved = conv_file(app_home, tab)["messages"][-1]
    assert saved["reasoning"] == reply.reasoning and saved["reasoning_tokens"] == 12
    click(qtbot, tab.thinking_toggle)  # off for this conversation
    assert tab.conversation.thinking is False and conv_file(app_home, tab)["thinking"] is False
    send(qtbot, tab, "Again, briefly")
    qtbot.waitUntil(lambda: not tab.generating, timeout=30000)
    assert tab.conversation.messages[-1].text and not tab.conversation.messages[-1].reasoning


def test_open_a_model_from_the_models_page_recent_list_and_a_drop(qtbot, launch, run_async, app_home, app_model,
                                                                  thinking_model):
    window = launch()
    window.open_models()
    page = window.models_page
    assert page.isVisible() and page.installed.current.text().startswith(window.bridge.info.model_name)
    assert "Ready in" in page.installed.current.text()
    page.model_chosen.emit(thinking_model)
    qtbot.waitUntil(lambda: window.bridge.state == "ready" and window.bridge.settings.model == thinking_model,
                    timeout=60000)
    row = next(r for r in range(page.installed.table.rowCount())
               if str(page.installed.models[r].path) == thinking_model)
    assert page.installed.table.item(row, 5).text() != "never"  # the list shows it was used now
    menu = RecentModelsMenu(window.open_model, window)
    menu.rebuild()
    labels = [a.text() for a in menu.actions()]
    assert labels[0].endswith(thinking_model.rsplit("/", 1)[-1])  # the newest first
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(app_model + "/config.json")])
    assert str(dropped_model(mime)) == app_model
    drop = QDropEvent(QPoint(10, 10), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    window.dropEvent(drop)
    qtbot.waitUntil(lambda: window.bridge.state == "ready" and window.bridge.settings.model == app_model,
                    timeout=60000)


@pytest.fixture(scope="module")
def slow_model(tmp_path_factory) -> str:
    """A model that takes most of a second to load here: time to press Cancel."""
    folder = tmp_path_factory.mktemp("slow-qwen3")
    ckpt.write_hf(folder, {**ckpt.tiny_gguf_config("qwen3"), "num_hidden_layers": 24}, seed=0)
    return str(folder)


def test_cancel_in_the_load_dialog_stops_the_load(qtbot, launch, run_async, slow_model):
    window = launch()

    def cancel_when_shown():
        dialog = next((w for w in QApplication.topLevelWidgets() if isinstance(w, QProgressDialog) and w.isVisible()),
                      None)
        if dialog is None or window.bridge.state != "starting":
            return False
        dialog.findChild(QPushButton).click()  # its Cancel button, as a person presses it
        return True
    settings = settings_for(slow_model)
    ok = run_async(_apply_and(window, settings, qtbot, cancel_when_shown), timeout=60)
    assert not ok and window.bridge.state == "failed" and window.bridge.error == "loading was cancelled"


async def _apply_and(window, settings, qtbot, act):
    import asyncio
    task = asyncio.ensure_future(window.apply_settings(settings))
    acted = False
    while not task.done():
        if act():
            acted = True
            break
        await asyncio.sleep(0.001)
    assert acted, "the load ended before the dialog could be used"
    return await task


def test_an_idle_model_is_unloaded_and_the_next_message_loads_it_again(qtbot, launch, run_async):
    window = launch()
    window.idle.set_choice(1)
    assert json.loads(preferences_path().read_text()) == {"idle_unload_minutes": 1}
    assert not window.idle.check()  # it was just used
    window.bridge.last_active = time.monotonic() - 120
    assert window.idle.check()
    qtbot.waitUntil(lambda: window.bridge.state == "unloaded", timeout=10000)
    assert "unloaded while idle" in window.status.model.text()
    tab = window.current_tab()
    send(qtbot, tab, "Are you there?")
    widget = tab.view.widget_for(len(tab.conversation.messages) - 1)
    assert widget._status.text().startswith("Loading the model again")  # the reply says why it waits
    qtbot.waitUntil(lambda: not tab.generating, timeout=60000)
    assert tab.conversation.messages[-1].text and window.bridge.state == "ready"
