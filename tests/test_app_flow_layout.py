"""The wrapping row: every widget keeps its full width, lines break where the width runs out, and
the widget placed at the right sits at its line's right end."""
from PySide6.QtWidgets import QLabel, QWidget

from app.flow_layout import FlowLayout


def row_of(qtbot, texts):
    host = QWidget()
    qtbot.addWidget(host)
    layout = FlowLayout(host)
    labels = [QLabel(t) for t in texts]
    for label in labels[:-1]:
        layout.addWidget(label)
    layout.add_right(labels[-1])
    return host, layout, labels


def test_a_wide_row_is_one_line_with_the_last_widget_at_the_right(qtbot):
    host, layout, labels = row_of(qtbot, ["System prompt: none", "Sampling: 5 own", "Context 1,900 / 2,048", "Engine"])
    host.resize(layout.sizeHint().width() + 200, 40)
    host.show()
    qtbot.waitExposed(host)
    assert len({label.y() for label in labels}) == 1
    assert labels[-1].geometry().right() == host.width() - 1
    assert all(label.width() == label.sizeHint().width() for label in labels)


def test_a_narrow_row_wraps_and_cuts_no_widget(qtbot):
    host, layout, labels = row_of(qtbot, ["System prompt: none", "Sampling: 5 own", "Context 1,900 / 2,048", "Engine"])
    width = labels[0].sizeHint().width() + labels[1].sizeHint().width() + 20
    assert layout.heightForWidth(width) > layout.heightForWidth(layout.sizeHint().width())
    host.resize(width, layout.heightForWidth(width))
    host.show()
    qtbot.waitExposed(host)
    assert labels[2].y() > labels[0].y()  # the meter went onto the next line, whole
    assert all(label.width() == label.sizeHint().width() for label in labels)
    assert all(label.geometry().right() < host.width() for label in labels)
    before = layout.sizeHint().width()
    labels[2].hide()  # a hidden widget takes no room
    assert layout.sizeHint().width() == before - labels[2].sizeHint().width() - 6
