"""The Models window (app.models_page) against a local Hub: look a repo up, see its files, format and
plan, download with progress, pause and resume, cancel, use it; the installed list, its folder,
deleting after asking."""
import asyncio

import pytest
from fake_engine import _stop_fake_engines, bridge_with  # noqa: F401 - the fixture applies here
from modal import when_modal
from PySide6.QtWidgets import QMessageBox

from app.models_page import ModelsPage
from engine import EngineInfo, EngineSettings, installed
from engine.paths import models_dir

import ckpt
import ckpt_gguf
from hub_server import HubServer, Repo

CHUNK = 10 * 1024 * 1024  # huggingface_hub's transfer piece


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    ckpt.write_hf(folder, {**ckpt.tiny_gguf_config("qwen3"), "num_hidden_layers": 5}, seed=1, dtype="f32")
    gg = tmp_path_factory.mktemp("gguf")
    for q in ("Q4_K", "Q8_0"):
        ckpt_gguf.write_gguf(gg / f"Tiny-{q}.gguf", ckpt.tiny_gguf_config("llama"), qtype=q, embed_qtype="Q8_0")
    return {"org/tiny": Repo.from_folder(folder), "org/tiny-GGUF": Repo.from_folder(gg)}


@pytest.fixture
def page(qtbot, app_home, repos, monkeypatch, run_async):
    with HubServer(repos) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        bridge, _ = bridge_with(info=EngineInfo("fake-model", "numpy", "CPU", "plan: one window", 10, 512, 1,
                                                timings=(("weights", 0.5), ("prepare", 0.25))))
        run_async(bridge.start(EngineSettings()))
        p = ModelsPage(bridge, lambda: EngineSettings(context=512, memory_gib=1))
        qtbot.addWidget(p)
        p.show()
        p.hub = hub
        yield p


def look_up(qtbot, run_async, page, repo):
    d = page.downloads
    page.tabs.setCurrentWidget(d)
    d.repo.setText(repo)
    run_async(d.look())
    return d


def test_look_up_shows_files_format_and_plan(qtbot, run_async, page):
    d = look_up(qtbot, run_async, page, "org/tiny")
    files = [d.files.item(r, 0).text() for r in range(d.files.rowCount())]
    assert "model.safetensors" in files and "config.json" in files
    assert d.summary.text().startswith("org/tiny · HF f32 · 5 files")
    assert "chat" in d.plan.text() and "Disk:" in d.plan.text() and d.plan.toolTip().startswith("plan:")
    assert d.start_button.isEnabled()
    d = look_up(qtbot, run_async, page, "org/nothing")
    assert "no such model" in d.status.text() and not d.start_button.isEnabled()


def test_a_suggestion_fills_in_the_repo(qtbot, page):
    d = page.downloads
    d.suggestions.setCurrentRow(0)
    d.repo.setText(d.suggestions.item(0).text().split()[0])
    assert d.repo.text() == "mlx-community/Qwen3.5-27B-4bit"


def test_download_pause_resume_and_use(qtbot, run_async, page):
    page.hub.chunk_delay = 0.001  # about a second for the weights: time to press Pause
    d = look_up(qtbot, run_async, page, "org/tiny")
    task = asyncio.ensure_future(d.start())
    qtbot.waitUntil(lambda: d.running and d.bar.value() > 0, timeout=20000)
    assert d.status.text().startswith("Downloading ")
    d.pause_button.click()
    qtbot.waitUntil(task.done, timeout=20000)
    assert d.pause_button.text() == "Resume" and "Paused at" in d.status.text(), d.status.text()
    assert not (models_dir() / "org--tiny").exists()
    page.hub.chunk_delay = 0.0
    d.pause_button.click()
    qtbot.waitUntil(lambda: d.use_button.isVisible() or d.start_button.isVisible(), timeout=20000)
    assert d.status.text().startswith("Installed in"), d.status.text()
    assert (models_dir() / "org--tiny" / "config.json").is_file()
    assert any(r and r != "bytes=0-" for r in page.hub.ranges("model.safetensors"))  # it resumed
    chosen = []
    page.model_chosen.connect(chosen.append)
    d.use_button.click()
    assert chosen == [str(models_dir() / "org--tiny")]
    names = [page.installed.table.item(r, 0).text() for r in range(page.installed.table.rowCount())]
    assert "org--tiny" in names
    look_up(qtbot, run_async, page, "org/tiny-GGUF")  # the next one starts afresh
    assert d.start_button.isVisible() and d.start_button.isEnabled()
    assert not d.bar.isVisible() and not d.use_button.isVisible()


def test_cancel_keeps_nothing(qtbot, run_async, page):
    page.hub.chunk_delay = 0.001
    d = look_up(qtbot, run_async, page, "org/tiny")
    task = asyncio.ensure_future(d.start())
    qtbot.waitUntil(lambda: d.running and d.bar.value() > 0, timeout=20000)
    d.cancel_button.click()
    qtbot.waitUntil(task.done, timeout=20000)
    assert d.status.text() == "Cancelled; nothing was kept." and d.start_button.isVisible()
    assert not (models_dir() / "org--tiny").exists()


def test_a_gguf_repo_picks_a_quantization(qtbot, run_async, page):
    d = look_up(qtbot, run_async, page, "org/tiny-GGUF")
    assert d.gguf.isVisible() and d.gguf.count() == 2
    assert d.summary.text().startswith("org/tiny-GGUF · GGUF Q4_K")
    assert "tokens long" in d.plan.text() and "Memory for" in d.plan.text()  # from the file's first bytes
    d.gguf.setCurrentIndex(d.gguf.findData("Tiny-Q8_0.gguf"))
    run_async(d.look("Tiny-Q8_0.gguf"))
    assert [d.files.item(r, 0).text() for r in range(d.files.rowCount())] == ["Tiny-Q8_0.gguf"]
    run_async(d.start())
    assert (models_dir() / "org--tiny-GGUF--Q8_0" / "Tiny-Q8_0.gguf").is_file()


def test_installed_list_and_delete_after_asking(qtbot, run_async, page):
    ckpt.write_hf(models_dir() / "to-delete", ckpt.tiny_llama_config())
    installed.mark_used(models_dir() / "to-delete", when=0.0)
    panel = page.installed
    panel.refresh()
    row = next(r for r in range(panel.table.rowCount()) if panel.table.item(r, 0).text() == "to-delete")
    assert [panel.table.item(row, c).text() for c in (1, 2, 4)] == ["HF bf16", "llama", "512"]
    panel.table.selectRow(row)
    assert panel.use_button.isEnabled() and panel.delete_button.isEnabled()
    qtbot.waitUntil(lambda: "to-delete with your settings: " in panel.plan.text(), timeout=5000)
    assert "tokens long" in panel.plan.text() and "Memory for" in panel.plan.text()  # before loading it
    when_modal(QMessageBox, lambda box: box.reject())
    panel.delete_button.click()
    assert (models_dir() / "to-delete").exists()  # asked, and not confirmed
    panel.table.selectRow(row)

    def confirm(box):
        next(b for b in box.buttons() if b.text() == "Delete").click()
    when_modal(QMessageBox, confirm)
    panel.delete_button.click()
    qtbot.waitUntil(lambda: not (models_dir() / "to-delete").exists(), timeout=5000)
    qtbot.waitUntil(lambda: all(panel.table.item(r, 0).text() != "to-delete"
                                for r in range(panel.table.rowCount())), timeout=5000)
    assert panel.current.text().startswith("fake-model on CPU\nplan: one window\nReady in ")
    assert "(weights 0.5 s, prepare 0.2 s)" in panel.current.text()


def test_a_model_used_from_elsewhere_is_listed_and_not_deleted_here(qtbot, page, tmp_path):
    elsewhere = tmp_path / "lmstudio" / "Elsewhere-Q8_0.gguf"
    elsewhere.parent.mkdir()
    ckpt_gguf.write_gguf(elsewhere, ckpt.tiny_gguf_config("llama"), qtype="Q8_0")
    installed.mark_used(elsewhere)
    panel = page.installed
    panel.refresh()
    row = next(r for r in range(panel.table.rowCount()) if panel.table.item(r, 0).text() == "Elsewhere")
    assert panel.table.item(row, 1).text() == "GGUF Q8_0" and panel.table.item(row, 5).text() != "never"
    assert panel.table.item(row, 6).text() == str(elsewhere.parent)
    panel.table.selectRow(row)
    assert panel.use_button.isEnabled() and not panel.delete_button.isEnabled()
    assert "Only models in the models folder are deleted here" in panel.delete_button.toolTip()
    qtbot.waitUntil(lambda: "Elsewhere with your settings: " in panel.plan.text(), timeout=5000)
