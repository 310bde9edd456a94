"""The sidebar: every saved conversation, pinned ones first, then newest first. Click or Enter
opens it (or shows its tab); the context menu pins, exports (one or all, Markdown or JSON),
imports, or deletes (Undo in the notice brings it back); Delete deletes too. The search box
above (Ctrl+K) keeps only the conversations whose title or messages hold what is typed, each with
the line around its hit."""
from __future__ import annotations

from datetime import datetime

from PySide6.QtCore import QModelIndex, QPoint, QRect, QSize, Qt, Signal
from PySide6.QtGui import QFont, QFontMetrics, QKeyEvent, QPainter
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from . import search, theme
from .conversation import Conversation

_ID = Qt.ItemDataRole.UserRole
_WHEN = Qt.ItemDataRole.UserRole + 1
_OPEN = Qt.ItemDataRole.UserRole + 2
_PINNED = Qt.ItemDataRole.UserRole + 3
_HIT = Qt.ItemDataRole.UserRole + 4  # the line around a search hit, shown instead of the date


def when(iso: str) -> str:
    """'14:05' today, 'Yesterday', 'Mon' within a week, '3 Mar 2025' before."""
    try:
        t = datetime.fromisoformat(iso).astimezone()
    except ValueError:
        return ""
    days = (datetime.now().astimezone().date() - t.date()).days
    if days <= 0:
        return f"{t:%H:%M}"
    if days == 1:
        return "Yesterday"
    if days < 7:
        return f"{t:%A}"
    return f"{t.day} {t:%b %Y}"


class _Delegate(QStyledItemDelegate):
    """Two lines per conversation: its title, and when it was last used (muted)."""

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:  # noqa: N802
        h = option.fontMetrics.lineSpacing()
        return QSize(200, 2 * h + 14)

    def paint(self, painter: QPainter, option: QStyleOptionViewItem, index: QModelIndex) -> None:
        opt = QStyleOptionViewItem(option)
        self.initStyleOption(opt, index)
        opt.text = ""
        opt.widget.style().drawControl(QStyle.ControlElement.CE_ItemViewItem, opt, painter, opt.widget)
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        pal = option.palette
        r = option.rect.adjusted(12, 6, -10, -6)
        h = option.fontMetrics.lineSpacing()
        title_font = QFont(option.font)
        if index.data(_OPEN):
            title_font.setWeight(QFont.Weight.DemiBold)
        painter.save()
        painter.setFont(title_font)
        painter.setPen(pal.highlightedText().color() if selected else pal.text().color())
        title = QFontMetrics(title_font).elidedText(index.data(Qt.ItemDataRole.DisplayRole),
                                                    Qt.TextElideMode.ElideRight, r.width())
        painter.drawText(QRect(r.left(), r.top(), r.width(), h), Qt.AlignmentFlag.AlignVCenter, title)
        painter.setFont(option.font)
        painter.setPen(pal.highlightedText().color() if selected else theme.muted(pal))
        sub = index.data(_HIT) or (("Pinned  ·  " if index.data(_PINNED) else "") + index.data(_WHEN)
                                   + ("  ·  open" if index.data(_OPEN) else ""))
        sub = QFontMetrics(option.font).elidedText(sub, Qt.TextElideMode.ElideRight, r.width())
        painter.drawText(QRect(r.left(), r.top() + h + 2, r.width(), h), Qt.AlignmentFlag.AlignVCenter, sub)
        painter.restore()


class _List(QListWidget):
    delete_pressed = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:  # noqa: N802 - Qt override
        if event.key() == Qt.Key.Key_Delete:
            self.delete_pressed.emit()
        elif event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and self.currentItem():
            self.itemActivated.emit(self.currentItem())
        else:
            super().keyPressEvent(event)


class HistoryPanel(QWidget):
    open_requested = Signal(str)
    export_requested = Signal(str)
    export_all_requested = Signal()
    import_requested = Signal()
    delete_requested = Signal(str)
    new_requested = Signal()
    pin_requested = Signal(str, bool)
    search_opened = Signal(str, str)  # a conversation opened from the search, and the query
    search_cleared = Signal()  # the search box emptied: the marks it left in the tabs go

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._active: str | None = None  # the conversation of the current tab: the one highlighted
        self._convs: dict[str, Conversation] = {}  # what the search reads
        self.list = _List(objectName="history")
        self.list.setItemDelegate(_Delegate(self.list))
        self.list.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.list.itemActivated.connect(self._open)
        self.list.itemClicked.connect(self._open)
        self.search = QLineEdit(placeholderText="Search conversations (Ctrl+K)", clearButtonEnabled=True,
                                objectName="search")
        self.search.textChanged.connect(self._filter)
        self.search.returnPressed.connect(self._open_first_hit)
        self.list.delete_pressed.connect(self._delete_current)
        self.new_button = new = QPushButton("New chat", toolTip="Open a new tab (Ctrl+T)")
        new.clicked.connect(self.new_requested)
        head = QHBoxLayout()
        head.setContentsMargins(12, 10, 8, 6)
        head.addWidget(QLabel("Conversations", objectName="role"))
        head.addStretch()
        head.addWidget(new)
        self._empty = QLabel("Saved conversations appear here.", objectName="hint", wordWrap=True,
                             alignment=Qt.AlignmentFlag.AlignCenter)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(0)
        layout.addLayout(head)
        search_row = QHBoxLayout()
        search_row.setContentsMargins(8, 0, 8, 6)
        search_row.addWidget(self.search)
        layout.addLayout(search_row)
        layout.addWidget(self._empty)
        layout.addWidget(self.list, 1)
        self._empty.setContentsMargins(12, 24, 12, 0)

    def set_conversations(self, convs: list[Conversation], open_ids: set[str]) -> None:
        self.list.clear()
        self._convs.clear()
        for conv in reversed(convs):  # upsert puts each on top (of the pinned or of the others)
            self.upsert(conv, conv.id in open_ids)
        self._empty.setVisible(not convs)
        self._highlight()

    def upsert(self, conv: Conversation, is_open: bool, on_top: bool = True) -> None:
        """Add or refresh one conversation and move it to the top (it was just used); not
        `on_top`: to its place by when it was last used (one that comes back from the trash)."""
        item = self.item(conv.id)
        if item is None:
            item = QListWidgetItem()
            item.setData(_ID, conv.id)
        else:
            self.list.takeItem(self.list.row(item))
        item.setText(conv.title or "New chat")
        item.setData(_WHEN, when(conv.updated))
        item.setData(_OPEN, is_open)
        item.setData(_PINNED, conv.pinned)
        item.setToolTip(conv.title)
        self._convs[conv.id] = conv
        pinned = sum(1 for i in range(self.list.count()) if self.list.item(i).data(_PINNED))
        row = 0 if conv.pinned else pinned
        if not on_top:  # past the newer ones of its group
            end = pinned if conv.pinned else self.list.count()
            while row < end and self._convs[self.list.item(row).data(_ID)].updated > conv.updated:
                row += 1
        self.list.insertItem(row, item)
        self._empty.hide()
        self._filter_item(item)
        self._highlight()

    def set_open(self, cid: str, is_open: bool) -> None:
        item = self.item(cid)
        if item is not None:
            item.setData(_OPEN, is_open)

    def set_active(self, cid: str | None) -> None:
        """The conversation of the current tab: it stays the highlighted one, whatever else
        moves in the list (None: the current tab has no saved conversation yet)."""
        self._active = cid
        self._highlight()

    def remove(self, cid: str) -> None:
        item = self.item(cid)
        if item is not None:
            self.list.takeItem(self.list.row(item))
        self._convs.pop(cid, None)
        self._empty.setVisible(self.list.count() == 0)
        self._highlight()

    def highlighted(self) -> str | None:
        """The id of the highlighted conversation, if any."""
        items = self.list.selectedItems()
        return items[0].data(_ID) if items else None

    def conversation(self, cid: str) -> Conversation | None:
        """The listed conversation of that id, as last saved (an open tab's is its own)."""
        return self._convs.get(cid)

    def conversations(self) -> list[Conversation]:
        """Every listed conversation, in the list's order."""
        return [self._convs[cid] for cid in self.ids()]

    def ids(self) -> list[str]:
        return [self.list.item(i).data(_ID) for i in range(self.list.count())]

    def shown_ids(self) -> list[str]:
        """The ids the search leaves in the list, in order."""
        return [cid for i, cid in enumerate(self.ids()) if not self.list.item(i).isHidden()]

    def start_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def _filter(self) -> None:
        for i in range(self.list.count()):
            self._filter_item(self.list.item(i))
        if not self.search.text().strip():
            self.search_cleared.emit()

    def _filter_item(self, item: QListWidgetItem) -> None:
        query = self.search.text()
        hit = search.find(self._convs[item.data(_ID)], query) if query.strip() else None
        item.setData(_HIT, hit.snippet if hit is not None else "")
        item.setHidden(bool(query.strip()) and hit is None)

    def _open(self, item: QListWidgetItem) -> None:
        self.open_requested.emit(item.data(_ID))
        if self.search.text().strip():
            self.search_opened.emit(item.data(_ID), self.search.text().strip())

    def _open_first_hit(self) -> None:
        shown = self.shown_ids()
        if shown:
            self._open(self.item(shown[0]))

    def _highlight(self) -> None:
        item = self.item(self._active) if self._active else None
        if item is not None:
            self.list.setCurrentItem(item)
        else:
            self.list.clearSelection()
            self.list.setCurrentItem(None)

    def item(self, cid: str) -> QListWidgetItem | None:
        return next((self.list.item(i) for i in range(self.list.count()) if self.list.item(i).data(_ID) == cid), None)

    def _delete_current(self) -> None:
        if self.list.currentItem():
            self.delete_requested.emit(self.list.currentItem().data(_ID))

    def context_menu(self, item: QListWidgetItem | None) -> QMenu:
        """The right-click menu of a conversation (or, for None, of the list around them)."""
        menu = QMenu(self)
        if item is not None:
            cid = item.data(_ID)
            menu.addAction("Open", lambda: self._open(item))
            pinned = bool(item.data(_PINNED))
            menu.addAction("Unpin" if pinned else "Pin to top", lambda: self.pin_requested.emit(cid, not pinned))
            menu.addAction("Export…", lambda: self.export_requested.emit(cid))
        menu.addAction("Export all…", self.export_all_requested.emit)
        menu.addAction("Import…", self.import_requested.emit)
        if item is not None:
            menu.addSeparator()
            menu.addAction("Delete", lambda: self.delete_requested.emit(cid))
        return menu

    def _menu(self, pos: QPoint) -> None:
        menu = self.context_menu(self.list.itemAt(pos))
        menu.exec(self.list.viewport().mapToGlobal(pos))
        menu.deleteLater()
