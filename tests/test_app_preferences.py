"""preferences.json: one key written keeps the others; an unreadable file reads as empty."""
import json

from app import preferences


def test_a_write_keeps_the_other_keys(app_home):
    assert preferences.load() == {}
    preferences.save("idle_unload_minutes", 15)
    preferences.save("theme", "dark")
    preferences.save("idle_unload_minutes", None)
    assert json.loads(preferences.preferences_path().read_text()) == {"idle_unload_minutes": None, "theme": "dark"}


def test_an_unreadable_file_reads_as_empty_and_the_next_write_replaces_it(app_home):
    path = preferences.preferences_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    for bad in ("{not json", "[1, 2]", "x" * (preferences.MAX_BYTES + 1)):
        path.write_text(bad)
        assert preferences.load() == {}
    preferences.save("theme", "light")
    assert preferences.load() == {"theme": "light"}
