"""Look: Fusion everywhere (the same on every desktop), a light and a dark palette of our own, one
stylesheet for the chat's own widgets with colours derived from the palette, and a type scale.

The theme follows the system's colour scheme (Qt's style hints, updated live) unless the user
picks Light or Dark in View → Theme; the choice is kept in the preferences ("theme"). Widgets that
keep colours of their own (notices, coloured code) redo them on a PaletteChange event.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QColor, QFont, QFontDatabase, QPalette
from PySide6.QtWidgets import QApplication, QWidget

from . import preferences

SYSTEM, LIGHT, DARK = "system", "light", "dark"
CHOICES = (SYSTEM, LIGHT, DARK)

# The type scale, in multiples of the body size (the system's UI font, never under BODY_MIN_PT):
# secondary lines a step down, message text a step up (it is what people read), dialog titles.
BODY_MIN_PT = 10.0
SMALL, BODY, PROSE, TITLE = "small", "body", "prose", "title"
SCALE = {SMALL: 0.9, BODY: 1.0, PROSE: 1.1, TITLE: 1.5}

_R = QPalette.ColorRole
# role: (light, dark). Fusion draws frames in the window colour darkened by 1.4, so the dark
# window is kept that much lighter than the base, or the frames of text boxes vanish into it.
_COLOURS = {
    _R.Window: ("#f3f3f5", "#303136"), _R.WindowText: ("#1c1c1f", "#e8e8ea"),
    _R.Base: ("#ffffff", "#18191c"), _R.AlternateBase: ("#f6f6f8", "#202125"),
    _R.ToolTipBase: ("#ffffff", "#2a2b2f"), _R.ToolTipText: ("#1c1c1f", "#e8e8ea"),
    _R.PlaceholderText: ("#6b6b73", "#8e8f96"), _R.Text: ("#1c1c1f", "#e8e8ea"),
    _R.Button: ("#ebebee", "#3a3b40"), _R.ButtonText: ("#1c1c1f", "#e8e8ea"),
    _R.BrightText: ("#ffffff", "#ffffff"), _R.Light: ("#ffffff", "#4a4b51"),
    _R.Midlight: ("#e4e4e8", "#404147"), _R.Mid: ("#c4c4ca", "#26272b"),
    _R.Dark: ("#9a9aa2", "#141518"), _R.Shadow: ("#5a5a60", "#000000"),
    _R.Highlight: ("#2b63d9", "#3a6fd8"), _R.HighlightedText: ("#ffffff", "#ffffff"),
    _R.Link: ("#1f57c7", "#8ab4f8"), _R.LinkVisited: ("#6a3fb5", "#c58af9"),
}
_DISABLED = {LIGHT: "#9a9aa2", DARK: "#6b6c72"}  # text of disabled widgets


def mix(a: QColor, b: QColor, t: float) -> QColor:
    """`t` of the way from a to b."""
    return QColor.fromRgbF(a.redF() + (b.redF() - a.redF()) * t, a.greenF() + (b.greenF() - a.greenF()) * t,
                           a.blueF() + (b.blueF() - a.blueF()) * t)


def muted(palette: QPalette) -> QColor:
    """Secondary text: timestamps, token counts, hints (still 4.5:1 on the base, WCAG's AA)."""
    return mix(palette.color(QPalette.ColorRole.Text), palette.color(QPalette.ColorRole.Base), 0.35)


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


def body_pt() -> float:
    return max(QFontDatabase.systemFont(QFontDatabase.SystemFont.GeneralFont).pointSizeF(), BODY_MIN_PT)


def size_pt(role: str) -> float:
    return round(body_pt() * SCALE[role], 1)


def scaled(font: QFont, role: str) -> QFont:
    """`font` at a step of the type scale."""
    out = QFont(font)
    out.setPointSizeF(size_pt(role))
    return out


def code_font() -> QFont:
    return scaled(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont), BODY)


def palette(scheme: str) -> QPalette:
    """The light or dark palette (DARK or LIGHT)."""
    p = QPalette()
    for role, colours in _COLOURS.items():
        p.setColor(role, QColor(colours[scheme == DARK]))
    for role in (_R.Text, _R.WindowText, _R.ButtonText):
        p.setColor(QPalette.ColorGroup.Disabled, role, QColor(_DISABLED[scheme]))
    return p


def scheme_of(hint: Qt.ColorScheme) -> str:
    """Qt's colour scheme hint as a theme; light where the system says none."""
    return DARK if hint == Qt.ColorScheme.Dark else LIGHT


def load_choice() -> str:
    choice = preferences.load().get("theme")
    return choice if choice in CHOICES else SYSTEM


class Theme(QObject):
    """The app's look, one per QApplication (its child): applies the choice, and re-applies it when
    the system's colour scheme changes while the choice is SYSTEM."""

    def __init__(self, app: QApplication, choice: str = SYSTEM) -> None:
        super().__init__(app, objectName="lanechatTheme")
        self.app, self.choice = app, choice
        self.system = scheme_of(app.styleHints().colorScheme())  # what the desktop uses
        app.styleHints().colorSchemeChanged.connect(self._system_changed)

    @property
    def scheme(self) -> str:
        """LIGHT or DARK: what the app shows."""
        return self.system if self.choice == SYSTEM else self.choice

    def set_choice(self, choice: str) -> None:
        if choice not in CHOICES:
            raise ValueError(f"theme {choice!r} is not one of {', '.join(CHOICES)}")
        self.choice = choice
        self.apply()

    def apply(self) -> None:
        app = self.app
        app.setStyle("Fusion")
        app.setFont(scaled(app.font(), BODY))
        app.setPalette(palette(self.scheme))
        app.setStyleSheet(stylesheet(app.palette()))

    def _system_changed(self, hint: Qt.ColorScheme) -> None:
        self.system = scheme_of(hint)
        if self.choice == SYSTEM:
            self.apply()


def current(app: QApplication) -> Theme | None:
    return app.findChild(Theme, "lanechatTheme")


def apply(app: QApplication, choice: str | None = None) -> Theme:
    """Give `app` its look: `choice` (None: the saved one), following the system for SYSTEM."""
    theme = current(app) or Theme(app)
    theme.set_choice(load_choice() if choice is None else choice)
    return theme


def choose(app: QApplication, choice: str) -> Theme:
    """The user's pick: applied now and saved for the next start."""
    theme = apply(app, choice)
    preferences.save("theme", choice)
    return theme


def stylesheet(p: QPalette) -> str:
    text, base = p.color(QPalette.ColorRole.Text), p.color(QPalette.ColorRole.Base)
    accent = p.color(QPalette.ColorRole.Highlight)
    window = p.color(QPalette.ColorRole.Window)
    user_bg = mix(base, accent, 0.10)
    code_bg = mix(base, text, 0.05)
    border = mix(base, text, 0.14)
    focus = mix(accent, text, 0.55)  # a ring that shows on the accent-coloured button too
    return f"""
        QScrollArea#chatView, QWidget#chatColumn {{ background: {base.name()}; border: none; }}
        QFrame#userMessage {{ background: {user_bg.name()}; border: 1px solid {mix(user_bg, accent, 0.25).name()};
                              border-radius: 12px; }}
        QFrame#assistantMessage {{ background: transparent; border: none; }}
        QLabel#role {{ font-weight: 600; }}
        QLabel#meta, QLabel#hint {{ color: {muted(p).name()}; font-size: {size_pt(SMALL)}pt; }}
        QLabel#status {{ color: {muted(p).name()}; font-style: italic; }}
        QLabel#title {{ font-size: {size_pt(TITLE)}pt; font-weight: 600; }}
        QLabel#error {{ color: {error_color(p).name()}; }}
        QFrame#thinking QTextBrowser {{ color: {muted(p).name()}; border-left: 2px solid {border.name()}; }}
        QToolButton#thinkingHeader {{ border: 1px solid transparent; border-radius: 4px; padding: 2px 6px;
                                      color: {muted(p).name()}; }}
        QToolButton#thinkingHeader:hover {{ background: {mix(base, text, 0.08).name()}; color: {text.name()}; }}
        QToolButton#thinkingHeader:focus {{ border: 1px solid {accent.name()}; }}
        QFrame#codeBlock {{ background: {code_bg.name()}; border: 1px solid {border.name()}; border-radius: 8px; }}
        QFrame#codeBlock QLabel#lang {{ color: {muted(p).name()}; }}
        QFrame#chip {{ background: {code_bg.name()}; border: 1px solid {border.name()}; border-radius: 6px; }}
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
    """
