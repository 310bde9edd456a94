"""Qt's xcb libraries: what ldd cannot find becomes the apt command that installs it."""
from app.qt_deps import advice, missing_libraries, not_found, qt_files

LDD = """\tlinux-vdso.so.1 (0x00007ffc)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f10)
\tlibxcb-cursor.so.0 => not found
\tlibxcb-icccm.so.4 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f00)
\tlibxcb-imdkit.so.1 => not found
"""


def test_ldd_lines_that_are_not_found():
    assert not_found(LDD) == ["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-imdkit.so.1"]
    assert not_found("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n") == []


def test_advice_names_packages_and_what_it_cannot_map():
    text = advice(not_found(LDD))
    assert "sudo apt-get install libxcb-cursor0 libxcb-icccm4" in text
    assert "apt-file search libxcb-imdkit.so.1" in text


def test_the_installed_pyside6_has_an_xcb_plugin_to_check():
    files = qt_files()
    assert any(f.name == "libqxcb.so" for f in files) and any(f.name.startswith("QtWidgets.") for f in files)
    assert missing_libraries([]) == []
