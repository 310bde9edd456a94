"""Notices: shown at once, an action button and a dismiss button that work when clicked, and a
widget of their own (a download with its progress)."""
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QPushButton, QToolButton

from app.notice_bar import NoticeBar


def test_action_and_dismiss_buttons(qtbot):
    bar = NoticeBar()
    qtbot.addWidget(bar)
    bar.show()
    clicked = []
    notice = bar.add("Something happened", error=True, action=("Fix it", lambda: clicked.append(1)))
    assert bar.notices() == [notice]
    qtbot.mouseClick(notice.findChild(QPushButton), Qt.MouseButton.LeftButton)
    assert clicked == [1]
    dismiss = next(b for b in notice.findChildren(QToolButton) if b.toolTip() == "Dismiss")
    qtbot.mouseClick(dismiss, Qt.MouseButton.LeftButton)
    assert bar.notices() == []


def test_a_notice_can_hold_a_widget_and_is_dismissed_by_prefix(qtbot):
    bar = NoticeBar()
    qtbot.addWidget(bar)
    bar.show()
    extra = QLabel("progress here")
    notice = bar.add("Downloading", widget=extra)
    assert extra.parent() is notice and extra.isVisible()
    bar.dismiss("Down")
    assert bar.notices() == []
