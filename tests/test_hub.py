"""Downloads from the Hub (engine.hub) against a local server in the Hub's URL layout: listing, the plan
before downloading, a whole download that loads, a cut connection, pause/resume, cancel, a full disk
and a bad checksum, GGUF repos."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from engine import hub
from engine.errors import ModelError
from engine.hub import Download, DownloadStoppedError, HubError
from engine.loader import describe, load_model
from engine.settings import EngineSettings

import ckpt
import ckpt_gguf
from hub_server import HubServer, Repo

REPO = "tiny-org/tiny-qwen3"
CHUNK = 10 * 1024 * 1024  # huggingface_hub writes (and reports) a transfer in pieces of this size


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("LANECHAT_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, Repo]:
    folder = tmp_path_factory.mktemp("tiny-hf")
    # 12 MB of weights: more than one of huggingface_hub's 10 MiB transfer chunks, so a transfer can stop mid-file
    ckpt.write_hf(folder, {**ckpt.tiny_gguf_config("qwen3"), "num_hidden_layers": 5}, seed=1, dtype="f32")
    (folder / "README.md").write_text("# not part of the model\n")
    gg = tmp_path_factory.mktemp("tiny-gguf")
    cfg = ckpt.tiny_gguf_config("qwen3")
    for q in ("Q4_K_M", "Q8_0"):
        ckpt_gguf.write_gguf(gg / f"Tiny-{q}.gguf", cfg, qtype="Q4_K" if q == "Q4_K_M" else q,
                             embed_qtype="Q8_0", mix=ckpt_gguf.MIX_Q4_K_M if q == "Q4_K_M" else None)
    (gg / "mmproj-Tiny-F16.gguf").write_bytes(b"GGUF" + bytes(60))
    (gg / "Tiny-BF16-00001-of-00002.gguf").write_bytes(b"GGUF" + bytes(60))
    return {REPO: Repo.from_folder(folder), "tiny-org/tiny-GGUF": Repo.from_folder(gg)}


@pytest.fixture
def server(repos, monkeypatch):
    with HubServer(repos) as s:
        monkeypatch.setenv("HF_ENDPOINT", s.url)
        yield s


def test_listing_files_plan_and_label(server, home):
    lst = hub.listing(REPO)
    assert lst.revision == server.repos[REPO].sha and lst.kind == "safetensors"
    files = hub.wanted(lst)
    assert {f.path for f in files} == {"config.json", "generation_config.json", "tokenizer.json",
                                       "tokenizer_config.json", "model.safetensors"}  # not the README
    weights = lst.file("model.safetensors")
    assert weights.size == len(server.repos[REPO].files["model.safetensors"]) and len(weights.sha256) == 64
    config = hub.remote_config(lst)
    assert config[1].arch == "qwen3" and hub.format_label(lst, files, config[0]) == "HF f32"
    plan = hub.plan_before_download(lst, files, EngineSettings(context=512, memory_gib=1), config)
    assert plan.fits and plan.line.startswith("plan:")
    too_long = hub.plan_before_download(lst, files, EngineSettings(context=4096, memory_gib=1), config)
    assert not too_long.fits and "beyond the model's maximum of 512" in too_long.line


def test_a_download_installs_a_model_that_loads(server, home):
    lst = hub.listing(REPO)
    seen = []
    d = Download(lst, hub.wanted(lst))
    path = d.run(seen.append)
    assert path == home / "data" / "models" / "tiny-org--tiny-qwen3" and not d.staging.exists()
    assert load_model(path).config.arch == "qwen3" and (path / hub.SOURCE_FILE).is_file()
    stages = [p.stage for p in seen]
    assert stages[-1] == "installing" and "verifying" in stages and seen[-1].done == seen[-1].total == d.total
    fetched = [p.done for p in seen if p.stage == "downloading"]
    assert fetched == sorted(fetched)
    with pytest.raises(HubError, match="already exists"):
        Download(lst, hub.wanted(lst)).run()


def test_a_cut_connection_resumes_where_it_stopped(server, home):
    server.cut_after["model.safetensors"] = CHUNK + 5000
    lst = hub.listing(REPO)
    path = Download(lst, hub.wanted(lst)).run()
    assert server.ranges("model.safetensors") == [None, f"bytes={CHUNK}-"]  # what had arrived was kept
    assert load_model(path).config.arch == "qwen3"


def run_until(d: Download, bytes_: int, action) -> BaseException | None:
    """Run `d` on a thread and call `action(d)` once `bytes_` have arrived; the exception run raised."""
    out: list = []

    def progress(p):
        if p.stage == "downloading" and p.done >= bytes_ and not out:
            out.append(None)
            action(d)

    def go():
        try:
            d.run(progress)
        except BaseException as e:  # noqa: BLE001
            out.append(e)
    t = threading.Thread(target=go)
    t.start()
    t.join(60)
    return out[-1] if out else None


def test_pause_keeps_the_part_and_resume_continues_it(server, home):
    lst = hub.listing(REPO)
    files = hub.wanted(lst)
    d = Download(lst, files)
    stopped = run_until(d, CHUNK, Download.pause)
    assert isinstance(stopped, DownloadStoppedError) and stopped.reason == "paused"
    assert (d.staging / "model.safetensors.part").stat().st_size == CHUNK and not d.dest.exists()
    assert CHUNK < d.done_bytes() < d.total
    path = Download(lst, files).run()  # a new run, as after a restart of the app
    assert server.ranges("model.safetensors") == [None, f"bytes={CHUNK}-"]
    assert load_model(path).config.arch == "qwen3"


def test_cancel_removes_everything(server, home):
    lst = hub.listing(REPO)
    d = Download(lst, hub.wanted(lst))
    stopped = run_until(d, CHUNK, Download.cancel)
    assert isinstance(stopped, DownloadStoppedError) and stopped.reason == "cancelled"
    assert not d.staging.exists() and not d.dest.exists()
    paused = Download(lst, hub.wanted(lst))
    run_until(paused, CHUNK, Download.pause)
    assert paused.staging.exists()
    paused.cancel()  # a paused download is forgotten at once
    assert not paused.staging.exists()


def test_a_full_disk_is_a_clear_error_and_leaves_nothing(server, home):
    lst = hub.listing(REPO)
    files = hub.wanted(lst)
    d = Download(lst, files, disk_free=lambda p: 10 << 20)
    with pytest.raises(HubError, match=r"the disk is full \(0.01 GiB free .*needs"):
        d.run()
    assert server.ranges("model.safetensors") == [] and not d.staging.exists()
    # the disk fills up while it downloads: it stops, and no half file stays anywhere
    looks = iter([1 << 40] * 3 + [1 << 20] * 100)
    d = Download(lst, files, disk_free=lambda p: next(looks))
    with pytest.raises(HubError, match="the disk is full"):
        d.run()
    assert not d.staging.exists() and not d.dest.exists()
    assert not any((home / "data" / "models").iterdir())


def test_a_file_that_does_not_match_its_hash_is_removed(server, home):
    server.corrupt.add("model.safetensors")
    lst = hub.listing(REPO)
    d = Download(lst, hub.wanted(lst))
    with pytest.raises(HubError, match="model.safetensors does not match the Hub's checksum"):
        d.run()
    assert not (d.staging / "model.safetensors").exists() and not d.dest.exists()


def test_unknown_and_malformed_repos(server, home):
    with pytest.raises(HubError, match="tiny-org/nope: no such model"):
        hub.listing("tiny-org/nope")
    with pytest.raises(HubError, match="is not a Hugging Face repo id"):
        hub.listing("not a repo")


def load_config_of(server, repo: str, name: str, home: Path):
    from engine.loader import load_config
    path = home / "whole" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(server.repos[repo].files[name])
    return load_config(path)


def test_a_gguf_config_from_its_first_bytes_asks_for_more_until_the_metadata_ends(server, home):
    lst = hub.listing("tiny-org/tiny-GGUF")
    f = lst.file("Tiny-Q8_0.gguf")
    assert hub.gguf_config(lst, f, first=64) == load_config_of(server, "tiny-org/tiny-GGUF", f.path, home)
    asked = [r for m, p, r in server.log if p.endswith(f.path) and m == "GET"]
    assert asked[:3] == ["bytes=0-63", "bytes=0-255", "bytes=0-1023"] and len(asked) < 12
    assert not list((home / "cache" / "downloads").glob(".*"))  # the probe file is gone
    with pytest.raises(ModelError, match=r"tiny-org/tiny-GGUF/mmproj-Tiny-F16.gguf: not a readable GGUF"):
        hub.gguf_config(lst, lst.file("mmproj-Tiny-F16.gguf"))


def test_a_gguf_repo(server, home):
    lst = hub.listing("tiny-org/tiny-GGUF")
    assert lst.kind == "gguf" and {f.path for f in lst.ggufs} == {
        "Tiny-Q4_K_M.gguf", "Tiny-Q8_0.gguf", "Tiny-BF16-00001-of-00002.gguf"}  # not the vision projector
    files = hub.wanted(lst)
    assert [f.path for f in files] == ["Tiny-Q4_K_M.gguf"] and hub.format_label(lst, files, None) == "GGUF Q4_K_M"
    assert hub.wanted(lst, "Tiny-Q8_0.gguf")[0].path == "Tiny-Q8_0.gguf"
    with pytest.raises(HubError, match="split GGUF"):
        hub.wanted(lst, "Tiny-BF16-00001-of-00002.gguf")
    config = hub.remote_config(lst, files=files)  # from the file's first bytes, before downloading it
    assert config[1] == load_config_of(server, "tiny-org/tiny-GGUF", "Tiny-Q4_K_M.gguf", home)
    assert hub.plan_before_download(lst, files, EngineSettings(context=256, memory_gib=1), config).fits
    path = Download(lst, files).run()
    assert path.name == "tiny-org--tiny-GGUF--Q4_K_M" and describe(path).endswith("GGUF Q4_K_M")
