"""The status bar: the plan in words with the exact line as tooltip, and what the streams are doing
as the app knows it (a prompt being read is not "idle")."""
import pytest
from fake_engine import Sink, _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here
from PySide6.QtCore import Qt

from app.plan_words import plan_summary
from app.status_bar import StatusBar
from engine import EngineInfo, EngineSettings, plan


@pytest.fixture
def status(qtbot, run_async):
    bridge, engines = bridge_with(n=100000, gap=0.001, reading=True,
                                  info=EngineInfo("fake", "numpy", "cpu", "plan: fake", 10, 512, 1))
    run_async(bridge.start(EngineSettings()))
    bar = StatusBar(bridge)
    qtbot.addWidget(bar)
    bar.show()
    return bar, bridge, engines


def test_a_prompt_being_read_is_not_idle(qtbot, status):
    bar, bridge, engines = status
    bridge.usage_changed.emit(engines[0].usage())
    assert bar.pages.text().endswith("idle")
    bridge.submit([], None, Sink())
    qtbot.waitUntil(lambda: bar.pages.text().endswith("1 reading a prompt"), timeout=5000)
    engines[0].read.set()
    qtbot.waitUntil(lambda: bar.pages.text().endswith("1 generating"), timeout=5000)
    assert bar.pages.text().startswith("pages 1 / 10")


def test_the_plan_shows_in_words_with_the_line_as_tooltip(qtbot, run_async, app_model):
    p = plan(EngineSettings(model=app_model, backend="numpy", parallel=3, context=512))
    bridge, _ = bridge_with(info=EngineInfo("tiny", "numpy", "cpu", p.line, p.pages_total, 512, 3, p))
    run_async(bridge.start(EngineSettings()))
    bar = StatusBar(bridge)
    qtbot.addWidget(bar)
    assert bar.plan.text() == plan_summary(p)
    assert bar.plan.text().startswith("3 chats at once · 512 tokens each · ")
    assert bar.plan.toolTip() == p.line


def test_the_fix_button_asks_for_settings(qtbot, run_async):
    bridge, _ = bridge_with(fail_start="model.gguf: not a GGUF file")
    with pytest.raises(Exception):
        run_async(bridge.start(EngineSettings()))
    bar = StatusBar(bridge)
    qtbot.addWidget(bar)
    bar.show()
    assert bar.error.text() == "model.gguf: not a GGUF file"
    with qtbot.waitSignal(bar.settings_requested, timeout=1000):
        qtbot.mouseClick(bar.fix, Qt.MouseButton.LeftButton)


def test_cancel_shows_while_a_model_loads_and_stops_the_load(qtbot, qasync_loop):
    import asyncio
    bridge, _ = bridge_with(hold=True)
    bar = StatusBar(bridge)
    qtbot.addWidget(bar)
    bar.show()
    assert not bar.cancel.isVisible()
    future = asyncio.ensure_future(bridge.start(EngineSettings()))
    qtbot.waitUntil(lambda: bar.cancel.isVisible(), timeout=2000)
    qtbot.mouseClick(bar.cancel, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(future.done, timeout=5000)
    assert "cancelled" in str(future.exception())
    assert bridge.error == "loading was cancelled" and bar.error.text() == "loading was cancelled"
    assert not bar.cancel.isVisible() and bar.fix.isVisible()
