"""A row of widgets that wraps onto further lines where the width runs out, so every widget keeps
its full size (its text is never cut); one widget may sit at the right end of its line."""
from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QWidget, QWidgetItem


class FlowLayout(QLayout):
    def __init__(self, parent: QWidget | None = None, spacing: int = 6) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self._right: QLayoutItem | None = None  # the one at the right end of its line
        self._spacing = spacing
        self.setContentsMargins(0, 0, 0, 0)

    def add_right(self, widget: QWidget) -> None:
        """`widget` last, at the right end of its line."""
        self.addChildWidget(widget)
        self._right = QWidgetItem(widget)
        self._items.append(self._right)
        self.invalidate()

    def addItem(self, item: QLayoutItem) -> None:  # noqa: N802 - Qt's name
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 - Qt's name
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:  # noqa: N802 - Qt's name
        if not 0 <= index < len(self._items):
            return None
        item = self._items.pop(index)
        if item is self._right:
            self._right = None
        return item

    def expandingDirections(self) -> Qt.Orientation:  # noqa: N802 - Qt's name
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:  # noqa: N802 - Qt's name
        return True

    def heightForWidth(self, width: int) -> int:  # noqa: N802 - Qt's name
        return self._place(QRect(0, 0, width, 0), move=False)

    def setGeometry(self, rect: QRect) -> None:  # noqa: N802 - Qt's name
        super().setGeometry(rect)
        self._place(rect, move=True)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        """One line of everything."""
        shown = self._shown()
        m = self.contentsMargins()
        width = sum(i.sizeHint().width() for i in shown) + self._spacing * max(len(shown) - 1, 0)
        height = max((i.sizeHint().height() for i in shown), default=0)
        return QSize(width + m.left() + m.right(), height + m.top() + m.bottom())

    def minimumSize(self) -> QSize:  # noqa: N802 - Qt's name
        """The widest widget: the others go onto lines of their own."""
        size = QSize()
        for item in self._shown():
            size = size.expandedTo(item.sizeHint())
        m = self.contentsMargins()
        return size + QSize(m.left() + m.right(), m.top() + m.bottom())

    def _shown(self) -> list[QLayoutItem]:
        return [i for i in self._items if not (i.widget() and i.widget().isHidden())]

    def _place(self, rect: QRect, move: bool) -> int:
        """Lays the widgets out in lines within `rect` (when `move`); the height they take."""
        m = self.contentsMargins()
        area = rect.adjusted(m.left(), m.top(), -m.right(), -m.bottom())
        lines: list[list[QLayoutItem]] = [[]]
        x = 0
        for item in self._shown():
            w = item.sizeHint().width()
            if lines[-1] and x + w > area.width():
                lines.append([])
                x = 0
            lines[-1].append(item)
            x += w + self._spacing
        y = area.y()
        for line in lines:
            height = max((i.sizeHint().height() for i in line), default=0)
            x = area.x()
            for item in line:
                size = item.sizeHint()
                left = area.right() + 1 - size.width() if item is self._right else x
                if move:  # centred on the line's height
                    item.setGeometry(QRect(QPoint(left, y + (height - size.height()) // 2), size))
                x += size.width() + self._spacing
            y += height + self._spacing
        return y - self._spacing - area.y() + m.top() + m.bottom() if self._shown() else 0
