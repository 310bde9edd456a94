"""Look: Fusion everywhere (the same on every desktop), colours derived from the palette so a
dark system theme stays readable, one stylesheet for the chat's own widgets."""
from __future__ import annotations

from PySide6.QtGui import QColor, QFont, QFontDatabase, QPalette
from PySide6.QtWidgets import QApplication, QWidget


def mix(a: QColor, b: QColor, t: float) -> QColor:
    """`t` of the way from a to b."""
    return QColor.fromRgbF(a.redF() + (b.redF() - a.redF()) * t, a.greenF() + (b.greenF() - a.greenF()) * t,
                           a.blueF() + (b.blueF() - a.blueF()) * t)


def muted(palette: QPalette) -> QColor:
    """Secondary text: timestamps, token counts, hints."""
    return mix(palette.color(QPalette.ColorRole.Text), palette.color(QPalette.ColorRole.Base), 0.45)


def error_color(palette: QPalette) -> QColor:
    return QColor("#ff8a80") if is_dark(palette) else QColor("#b3261e")


def is_dark(palette: QPalette) -> bool:
    return palette.color(QPalette.ColorRole.Base).lightnessF() < 0.5


def find_color(palette: QPalette) -> QColor:
    """The background of a search hit in the text."""
    return QColor("#7a5d00") if is_dark(palette) else QColor("#ffe27a")


def restyle(widget: QWidget, object_name: str) -> None:
    """Switch a widget to another stylesheet rule (the rules select on object names)."""
    widget.setObjectName(object_name)
    widget.style().unpolish(widget)
    widget.style().polish(widget)


def code_font() -> QFont:
    return QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)


def apply(app: QApplication) -> None:
    app.setStyle("Fusion")
    p = app.palette()
    text, base = p.color(QPalette.ColorRole.Text), p.color(QPalette.ColorRole.Base)
    accent = p.color(QPalette.ColorRole.Highlight)
    window = p.color(QPalette.ColorRole.Window)
    user_bg = mix(base, accent, 0.10)
    code_bg = mix(base, text, 0.05)
    border = mix(base, text, 0.14)
    focus = mix(accent, text, 0.55)  # a ring that shows on the accent-coloured button too
    app.setStyleSheet(f"""
        QScrollArea#chatView, QWidget#chatColumn {{ background: {base.name()}; border: none; }}
        QFrame#userMessage {{ background: {user_bg.name()}; border: 1px solid {mix(user_bg, accent, 0.25).name()};
                              border-radius: 12px; }}
        QFrame#assistantMessage {{ background: transparent; border: none; }}
        QLabel#role {{ font-weight: 600; }}
        QLabel#meta, QLabel#hint {{ color: {muted(p).name()}; }}
        QLabel#status {{ color: {muted(p).name()}; font-style: italic; }}
        QLabel#error {{ color: {error_color(p).name()}; }}
        QFrame#thinking QTextBrowser {{ color: {muted(p).name()}; border-left: 2px solid {border.name()}; }}
        QToolButton#thinkingHeader {{ border: 1px solid transparent; border-radius: 4px; padding: 2px 6px;
                                      color: {muted(p).name()}; }}
        QToolButton#thinkingHeader:hover {{ background: {mix(base, text, 0.08).name()}; color: {text.name()}; }}
        QToolButton#thinkingHeader:focus {{ border: 1px solid {accent.name()}; }}
        QFrame#codeBlock {{ background: {code_bg.name()}; border: 1px solid {border.name()}; border-radius: 8px; }}
        QFrame#codeBlock QLabel#lang {{ color: {muted(p).name()}; }}
        QFrame#codeHeader {{ border: none; border-bottom: 1px solid {border.name()}; }}
        QFrame#composer {{ background: {base.name()}; border: 1px solid {border.name()}; border-radius: 10px; }}
        QFrame#composerFocused {{ background: {base.name()}; border: 2px solid {accent.name()}; border-radius: 10px; }}
        QWidget#composerBar {{ background: {base.name()}; }}
        QPushButton {{ background: {mix(window, base, 0.5).name()}; border: 1px solid {mix(border, text, 0.15).name()};
                       border-radius: 6px; padding: 4px 12px; }}
        QPushButton:hover {{ background: {mix(base, accent, 0.08).name()}; }}
        QPushButton:pressed {{ background: {mix(base, accent, 0.18).name()}; }}
        QPushButton:disabled {{ color: {muted(p).name()}; }}
        QPushButton:focus {{ border: 2px solid {accent.name()}; padding: 3px 11px; }}
        QPushButton:flat {{ border: none; background: transparent; }}
        QPushButton:flat:focus {{ border: 2px solid {accent.name()}; }}
        QToolButton#messageAction {{ border: 1px solid transparent; padding: 2px 6px; color: {muted(p).name()};
                                     border-radius: 4px; }}
        QToolButton#messageAction:hover {{ background: {mix(base, text, 0.08).name()}; color: {text.name()}; }}
        QToolButton#messageAction:focus {{ border: 1px solid {accent.name()}; color: {text.name()}; }}
        QPushButton#primary {{ background: {accent.name()}; color: {p.color(QPalette.ColorRole.HighlightedText).name()};
                               border: 2px solid {accent.name()}; border-radius: 6px; padding: 5px 15px;
                               font-weight: 600; }}
        QPushButton#primary:focus {{ border: 2px solid {focus.name()}; }}
        QPushButton#primary:disabled {{ background: {mix(accent, window, 0.6).name()};
                                        border-color: {mix(accent, window, 0.6).name()}; }}
        QPushButton#stop {{ border: 1px solid {border.name()}; border-radius: 6px; padding: 6px 16px; }}
        QPushButton#stop:focus {{ border: 2px solid {accent.name()}; padding: 5px 15px; }}
        QWidget#systemPromptBar {{ background: {base.name()}; border-bottom: 1px solid {border.name()}; }}
        QFrame#planBox {{ border: 1px solid {border.name()}; border-radius: 6px; background: {code_bg.name()}; }}
        QStatusBar QLabel {{ padding: 0 6px; }}
        QListView#history {{ border: none; background: {window.name()}; }}
    """)
