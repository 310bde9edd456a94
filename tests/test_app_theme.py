"""The look: light and dark palettes that read well, the type scale, View → Theme switching the
palette at once and keeping the choice, and System following the desktop's colour scheme."""
import json

import pytest
from fake_engine import _stop_fake_engines, fake_window  # noqa: F401 - the fixture applies here
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFontMetricsF, QPalette, QTextCursor
from PySide6.QtWidgets import QLabel
from test_app_menus import menu_action

from app import theme
from app.message_view import CodeBlock
from app.preferences import preferences_path
from app.text_view import TextView

R = QPalette.ColorRole


@pytest.fixture
def app_look(qapp, app_home):
    """The application's look as it was before the test, put back after it (one QApplication
    serves every test)."""
    saved = qapp.palette(), qapp.styleSheet(), qapp.font(), qapp.style().name()
    yield qapp
    current = theme.current(qapp)
    if current is not None:
        qapp.styleHints().colorSchemeChanged.disconnect(current._system_changed)
        current.setParent(None)
    qapp.setStyleSheet(saved[1])
    qapp.setPalette(saved[0])
    qapp.setFont(saved[2])
    qapp.setStyle(saved[3])


def contrast(a: QColor, b: QColor) -> float:
    """WCAG's contrast ratio."""
    def luminance(c: QColor) -> float:
        lin = [v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4 for v in (c.redF(), c.greenF(), c.blueF())]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


@pytest.mark.parametrize("scheme", [theme.LIGHT, theme.DARK])
def test_both_palettes_read_well(scheme):
    p = theme.palette(scheme)
    base, window = p.color(R.Base), p.color(R.Window)
    assert theme.is_dark(p) == (scheme == theme.DARK)
    assert contrast(p.color(R.Text), base) >= 7 and contrast(p.color(R.WindowText), window) >= 7  # AAA
    for secondary in (theme.muted(p), p.color(R.PlaceholderText), p.color(R.Link), theme.error_color(p)):
        assert contrast(secondary, base) >= 4.5, secondary.name()  # AA
    assert contrast(p.color(R.HighlightedText), p.color(R.Highlight)) >= 4.5


def test_the_type_scale(app_look):
    theme.apply(app_look, theme.LIGHT)
    sizes = [theme.size_pt(role) for role in (theme.SMALL, theme.BODY, theme.PROSE, theme.TITLE)]
    assert sizes == sorted(set(sizes)) and sizes[0] >= 9 and sizes[1] >= theme.BODY_MIN_PT
    assert app_look.font().pointSizeF() == theme.size_pt(theme.BODY)
    assert TextView().font().pointSizeF() == theme.size_pt(theme.PROSE)  # message text, a step up
    code = CodeBlock("x = 1", "python")
    mono = QFontMetricsF(code.view.font())
    assert mono.horizontalAdvance("iiii") == mono.horizontalAdvance("MMMM")  # monospace
    assert code.view.font().pointSizeF() == theme.size_pt(theme.BODY)
    meta, title = QLabel("12 tokens", objectName="meta"), QLabel("Lanechat", objectName="title")
    for label in (meta, title):
        label.ensurePolished()
    assert meta.font().pointSizeF() == theme.size_pt(theme.SMALL)
    assert title.font().pointSizeF() == theme.size_pt(theme.TITLE)


def _keyword_colour(block: CodeBlock) -> str:
    cursor = QTextCursor(block.view.document())
    cursor.setPosition(1)  # inside "def"
    return cursor.charFormat().foreground().color().name()


def test_view_theme_switches_the_palette_at_once_and_is_kept(qtbot, app_look):
    window = fake_window(qtbot)
    theme.apply(app_look)  # as the app starts: the saved choice (none yet), so the system's
    assert theme.current(app_look).choice == theme.SYSTEM and window.menus.themes[theme.SYSTEM].isChecked()
    notice = window.notices.add("A notice")
    code = CodeBlock("def f():\n    return 1\n", "python")
    qtbot.addWidget(code)
    code.finish()
    light_notice, light_keyword = notice.styleSheet(), _keyword_colour(code)

    assert menu_action(window, "View", "Theme").menu().actions() == list(window.menus.themes.values())
    window.menus.themes[theme.DARK].trigger()
    assert app_look.palette().color(R.Base) == theme.palette(theme.DARK).color(R.Base)
    assert window.menus.themes[theme.DARK].isChecked() and not window.menus.themes[theme.SYSTEM].isChecked()
    assert json.loads(preferences_path().read_text())["theme"] == theme.DARK
    # Widgets with colours of their own follow: the notice's background, the code's syntax colours.
    assert notice.styleSheet() != light_notice and _keyword_colour(code) != light_keyword
    assert window.history.palette().color(R.Window) == theme.palette(theme.DARK).color(R.Window)

    window.close()
    app_look.styleHints().colorSchemeChanged.disconnect(theme.current(app_look)._system_changed)
    theme.current(app_look).setParent(None)
    theme.apply(app_look)  # the next start
    assert theme.current(app_look).scheme == theme.DARK and theme.is_dark(app_look.palette())
    window = fake_window(qtbot)
    assert window.menus.themes[theme.DARK].isChecked()
    window.menus.themes[theme.LIGHT].trigger()
    assert not theme.is_dark(app_look.palette()) and _keyword_colour(code) == light_keyword
    assert notice.styleSheet() == light_notice


def test_system_follows_the_desktops_colour_scheme_unless_overridden(app_look):
    hints = app_look.styleHints()
    theme.choose(app_look, theme.SYSTEM)
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)  # what Qt emits when the desktop turns dark
    assert theme.is_dark(app_look.palette())
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert not theme.is_dark(app_look.palette())
    theme.choose(app_look, theme.LIGHT)
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert not theme.is_dark(app_look.palette()) and theme.current(app_look).system == theme.DARK
    theme.choose(app_look, theme.SYSTEM)
    assert theme.is_dark(app_look.palette())
    with pytest.raises(ValueError, match="not one of system, light, dark"):
        theme.choose(app_look, "sepia")
    assert json.loads(preferences_path().read_text())["theme"] == theme.SYSTEM
