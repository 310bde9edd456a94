"""The message box: grows with wrapped lines up to a limit, then scrolls with a visible scroll bar;
Send, Stop and the edit line's Cancel by real clicks."""
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor

from app import theme
from app.composer import MAX_LINES, Composer


def shown(qtbot, qapp) -> Composer:
    theme.apply(qapp)
    c = Composer()
    qtbot.addWidget(c)
    c.resize(500, 300)
    c.show()
    qtbot.waitExposed(c)
    return c


def lines_shown(c: Composer) -> float:
    return (c.edit.height() - 2 * c.edit.document().documentMargin()) / c.edit.fontMetrics().lineSpacing()


def test_grows_by_wrapped_line_not_by_paragraph(qtbot, qapp):
    c = shown(qtbot, qapp)
    one = c.edit.height()
    c.set_text("a long paragraph that wraps " * 6)  # one paragraph, several lines on screen
    qtbot.waitUntil(lambda: c.edit.height() > one)
    assert 2.5 < lines_shown(c) <= MAX_LINES
    assert c.edit.verticalScrollBar().maximum() == 0  # all of it visible, nothing hidden above


def test_long_text_stops_growing_and_scrolls_with_a_visible_bar(qtbot, qapp):
    c = shown(qtbot, qapp)
    c.set_text("word " * 600)  # one paragraph of many wrapped lines
    qtbot.waitUntil(lambda: c.edit.verticalScrollBar().isVisible())
    assert round(lines_shown(c)) == MAX_LINES
    bar = c.edit.verticalScrollBar()
    assert bar.maximum() > 0
    image = bar.grab().toImage()
    darkest = min(QColor(image.pixel(x, y)).lightness() for x in range(image.width()) for y in range(image.height()))
    assert darkest > 60, "the scroll bar handle draws black"


def test_buttons(qtbot, qapp):
    c = shown(qtbot, qapp)
    c.set_text("hello")
    with qtbot.waitSignal(c.send_requested) as sent:
        qtbot.mouseClick(c.send_button, Qt.MouseButton.LeftButton)
    assert sent.args == ["hello"] and c.text() == ""
    c.set_generating(True)
    c.stop_button.setFocus()  # as a click in a window that has the keyboard gives it
    with qtbot.waitSignal(c.stop_requested):
        qtbot.mouseClick(c.stop_button, Qt.MouseButton.LeftButton)
    c.set_generating(False)
    assert c.focusWidget() is c.edit  # the clicked button went away: the keyboard is back in the box
    c.start_edit("old words")
    assert c.edit_bar.isVisible() and c.text() == "old words"
    c.cancel_edit_button.setFocus()
    with qtbot.waitSignal(c.edit_cancelled):
        qtbot.mouseClick(c.cancel_edit_button, Qt.MouseButton.LeftButton)
    c.end_edit("my draft")
    assert not c.edit_bar.isVisible() and c.text() == "my draft"
    assert c.focusWidget() is c.edit


def test_the_box_shows_when_the_keyboard_is_in_it(qtbot, qapp):
    c = shown(qtbot, qapp)
    c.send_button.setFocus()
    unfocused = c.box.grab().toImage()
    c.edit.setFocus()
    qtbot.waitUntil(lambda: c.box.objectName() == "composerFocused")
    assert c.box.grab().toImage() != unfocused
