"""connections.json: remotes and server settings round-trip, stay private, and a bad file costs
only a notice."""
import json
import stat

from app.connections import (
    Connections,
    RemoteConfig,
    ServerConfig,
    api_base,
    connections_path,
    load_connections,
    new_api_key,
    save_connections,
)


def test_round_trip_and_owner_only(app_home):
    c = Connections([RemoteConfig(name="Box", base_url="http://box:8000/v1", api_key="k", model="m")],
                    ServerConfig(enabled=True, port=9000, lan=True, api_key=new_api_key()))
    save_connections(c)
    assert load_connections() == (c, None)
    mode = stat.S_IMODE(connections_path().stat().st_mode)
    assert mode == 0o600, oct(mode)
    assert json.loads(connections_path().read_text())["format_version"] == 1


def test_missing_file_means_nothing_set_up(app_home):
    assert load_connections() == (Connections(), None)


def test_a_bad_file_costs_a_notice_only(app_home):
    connections_path().parent.mkdir(parents=True, exist_ok=True)
    for text in ("{nope", '{"remotes": [{"base_url": 5}]}', '{"server": {"port": "80"}}', '{"remotes": 3}'):
        connections_path().write_text(text)
        c, notice = load_connections()
        assert c == Connections() and "could not be read" in notice


def test_a_file_too_deep_a_port_out_of_range_or_text_no_header_takes_costs_a_notice_only(app_home):
    """Found by fuzzing: JSON nested 10⁵ deep was a RecursionError at every start, and an enabled
    server on port 99999 hung the start for good (the server thread died before saying so)."""
    connections_path().parent.mkdir(parents=True, exist_ok=True)
    for text in ("[" * 100_000 + "]" * 100_000, '{"server": {"enabled": true, "port": 99999}}',
                 '{"server": {"port": -1}}', '{"remotes": [{"api_key": "k\\udcff"}]}',
                 '{"remotes": [{"base_url": "http://h\\n/v1"}]}', "[]"):
        connections_path().write_text(text)
        c, notice = load_connections()
        assert c == Connections() and "could not be read" in notice, text[:40]


def test_unknown_keys_are_ignored(app_home):
    connections_path().parent.mkdir(parents=True, exist_ok=True)
    connections_path().write_text('{"remotes": [{"base_url": "h:1", "colour": "red"}], "later": 1}')
    c, notice = load_connections()
    assert notice is None and c.remotes[0].base_url == "h:1"


def test_api_base_ends_in_v1():
    assert api_base("http://box:8000") == "http://box:8000/v1"
    assert api_base("http://box:8000/v1/") == "http://box:8000/v1"
    assert api_base("box:8000") == "http://box:8000/v1"
    assert api_base("https://host/api/v1") == "https://host/api/v1"
    assert RemoteConfig(base_url="").label == "Unnamed remote engine"
    assert ServerConfig(lan=True).host == "0.0.0.0" and ServerConfig().host == "127.0.0.1"
    assert new_api_key() != new_api_key()
