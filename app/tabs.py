"""The tab strip: movable, closable, renamed in place by double-click, a dot per tab that is
waiting (amber) or generating (accent), so parallel streams are visible at a glance. Tabs keep
their width; when they do not fit, the strip scrolls."""
from __future__ import annotations

from functools import cache

from PySide6.QtCore import QEvent, QObject, QSize, Qt, Signal
from PySide6.QtGui import QColor, QIcon, QPainter, QPixmap
from PySide6.QtWidgets import QLineEdit, QTabBar, QTabWidget, QWidget

from .chat_tab import ChatTab
from .reply import ERROR, GENERATING, IDLE, WAITING

_DOT_COLOURS = {WAITING: "#e8a317", GENERATING: "#2e7dd7", ERROR: "#c62828"}


@cache
def _dot(state: str) -> QIcon:
    pixmap = QPixmap(12, 12)
    pixmap.fill(Qt.GlobalColor.transparent)
    if state != IDLE:
        p = QPainter(pixmap)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setBrush(QColor(_DOT_COLOURS[state]))
        p.setPen(Qt.PenStyle.NoPen)
        p.drawEllipse(2, 2, 8, 8)
        p.end()
    return QIcon(pixmap)


class _TabBar(QTabBar):
    MAX_WIDTH = 240  # long titles are elided; a few tabs stay readable side by side

    def tabSizeHint(self, index: int) -> QSize:  # noqa: N802 - Qt override
        hint = super().tabSizeHint(index)
        return QSize(min(hint.width(), self.MAX_WIDTH), hint.height())

    def minimumTabSizeHint(self, index: int) -> QSize:  # noqa: N802 - Qt override
        # Many tabs scroll (the arrows appear) instead of shrinking every label to "Nam…".
        return self.tabSizeHint(index)


class ConversationTabs(QTabWidget):
    new_tab_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setTabBar(_TabBar())
        # Not a Tab stop: tabs switch with Ctrl+Tab / Ctrl+PgUp, as in browsers.
        self.tabBar().setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.setMovable(True)
        self.setTabsClosable(True)
        self.setDocumentMode(True)
        self.setUsesScrollButtons(True)
        self.tabBar().setExpanding(False)
        self.tabBar().setElideMode(Qt.TextElideMode.ElideRight)
        self.tabBarDoubleClicked.connect(self._double_clicked)
        self._editor: QLineEdit | None = None

    def tabs(self) -> list[ChatTab]:
        return [self.widget(i) for i in range(self.count())]

    def add(self, tab: ChatTab, activate: bool = True) -> None:
        index = self.addTab(tab, _dot(tab.state), tab.title)
        self.setTabToolTip(index, tab.title)
        tab.title_changed.connect(lambda title, t=tab: self._retitle(t, title))
        tab.state_changed.connect(lambda state, t=tab: self.setTabIcon(self.indexOf(t), _dot(state)))
        if activate:
            self.setCurrentIndex(index)

    def start_rename(self, index: int) -> None:
        """An editor over the tab's label: Enter or clicking away keeps the name, Esc cancels."""
        if index < 0:
            return
        self._finish_rename(commit=False)
        bar = self.tabBar()
        editor = QLineEdit(self.tabText(index), bar)
        editor.setGeometry(bar.tabRect(index).adjusted(4, 3, -4, -3))
        editor.selectAll()
        editor.returnPressed.connect(lambda: self._finish_rename(commit=True))
        editor.installEventFilter(self)
        editor.setProperty("tab", self.widget(index))
        editor.show()
        editor.setFocus()
        self._editor = editor

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt override
        if obj is self._editor:
            if event.type() == QEvent.Type.ShortcutOverride and event.key() == Qt.Key.Key_Escape:
                event.accept()  # Esc is ours here, not the window's Stop shortcut
                return True
            if event.type() == QEvent.Type.KeyPress and event.key() == Qt.Key.Key_Escape:
                self._finish_rename(commit=False)
                return True
            if event.type() == QEvent.Type.FocusOut:
                self._finish_rename(commit=True)
        return super().eventFilter(obj, event)

    def _finish_rename(self, commit: bool) -> None:
        editor, self._editor = self._editor, None
        if editor is None:
            return
        tab = editor.property("tab")
        if commit and self.indexOf(tab) >= 0:
            tab.rename(editor.text())
        editor.removeEventFilter(self)
        editor.deleteLater()
        if self.indexOf(tab) >= 0:
            tab.setFocus()

    def _double_clicked(self, index: int) -> None:
        if index < 0:  # on the empty part of the strip, like a browser
            self.new_tab_requested.emit()
        else:
            self.start_rename(index)

    def _retitle(self, tab: ChatTab, title: str) -> None:
        index = self.indexOf(tab)
        if index >= 0:
            self.setTabText(index, title)
            self.setTabToolTip(index, title)
