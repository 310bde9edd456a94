"""Shared fixtures. Engine section first, then the app's."""
import asyncio as _asyncio
import gc
import os as _os
from pathlib import Path as _Path

import pytest

# Under pytest-xdist (make test) each worker takes one core: OpenBLAS's own threads would spin
# against the other worker's and multiply the time of every numpy test. Set before numpy loads.
if "PYTEST_XDIST_WORKER" in _os.environ:
    _os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _default_model_or_none():
    from engine import default_model_path
    path = default_model_path()
    return path if path.is_file() else None


_ENGINE_DEFAULT_MODEL = _default_model_or_none()  # before any test moves LANECHAT_HOME


@pytest.fixture(autouse=True)
def _collect_on_the_main_thread():
    """As in the app (app.main): cyclic garbage is collected on the main thread only. Left to
    itself, Python collects in whichever thread allocates, and an engine thread deleting a Qt
    object of an earlier test crashed the process."""
    gc.disable()
    yield
    # This test's garbage: objects that outlived an earlier test's collection (a session's models
    # and tokenizers, half a million of them) are not walked again after every test, only by the
    # full collection at each module's end (_collect_everything_at_the_modules_end).
    gc.collect(1)


@pytest.fixture(scope="module", autouse=True)
def _collect_everything_at_the_modules_end():
    """All cyclic garbage, the module's fixtures' included (torn down before this), on the main thread."""
    yield
    gc.collect()


@pytest.fixture(scope="session")
def default_model() -> str:
    """The embedded SmolLM2-135M-Instruct GGUF (`make test` fetches it); skip where it is absent."""
    if _ENGINE_DEFAULT_MODEL is None:
        pytest.skip("default model not fetched (python -m engine fetch-default)")
    return str(_ENGINE_DEFAULT_MODEL)


@pytest.fixture(scope="module")
def gb(request):
    """The module's CuPy backend: graphs off, so each op launches on its own (the kernels' contract
    tests), unless the module sets GB_GRAPHS = True (decode steps replay captured graphs)."""
    from engine.ops.cupy_backend import CupyBackend
    b = CupyBackend()
    b.graphs = getattr(request.module, "GB_GRAPHS", False)
    return b


# ---------------------------------------------------------------------------------------------
# App fixtures (tests/test_app_*.py): Qt offscreen, a private LANECHAT_HOME, a model for the
# numpy backend, and a qasync loop that runs inside pytest-qt's event processing.
# ---------------------------------------------------------------------------------------------
_os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture
def app_home(tmp_path, monkeypatch) -> _Path:
    """A fresh LANECHAT_HOME: settings, session and conversations of this test only."""
    home = tmp_path / "lanechat-home"
    monkeypatch.setenv("LANECHAT_HOME", str(home))
    return home


@pytest.fixture(scope="module")
def thinking_runner(tmp_path_factory):
    """A Runner of a tiny random qwen3 whose chat template thinks (<think> blocks), numpy backend."""
    from engine.engine import Runner
    from engine.settings import EngineSettings

    import ckpt
    folder = tmp_path_factory.mktemp("think-model")
    ckpt.write_hf(folder, ckpt.tiny_qwen3_config(), seed=2, chat_template=ckpt.THINK_TEMPLATE)
    return Runner(EngineSettings(model=str(folder), backend="numpy", parallel=2, context=256, memory_gib=1),
                  log=lambda m: None)


@pytest.fixture(scope="session")
def app_model(tmp_path_factory) -> str:
    """A model the numpy backend runs quickly: a tiny random llama, else the default model."""
    try:
        from ckpt import tiny_llama_config, write_hf
    except ImportError:
        if _ENGINE_DEFAULT_MODEL is None:
            pytest.skip("no tiny checkpoint writer (tests/ckpt.py) and no default model (make fetch-default)")
        return str(_ENGINE_DEFAULT_MODEL)
    path = tmp_path_factory.mktemp("tiny-llama")
    write_hf(path, tiny_llama_config(), seed=0)
    return str(path)


@pytest.fixture(scope="session")
def qasync_loop(qapp):
    """One asyncio loop on Qt's for the whole session, as the app has one for its lifetime:
    coroutines advance whenever qtbot lets Qt process events. (A loop per test left the Qt objects
    of closed loops behind, and a later test's event processing crashed on them.)"""
    import qasync

    loop = qasync.QEventLoop(qapp, already_running=True)
    _asyncio.set_event_loop(loop)
    yield loop
    # stop() would quit the QApplication (it calls app.exit()); only mark the loop not running.
    loop._QEventLoop__is_running = False
    loop.close()  # joins its executor threads (model loading ran there)
    _asyncio.events._set_running_loop(None)
    _asyncio.set_event_loop(None)


@pytest.fixture
def run_async(qtbot, qasync_loop):
    """run_async(coro, timeout_s) -> its result, driving Qt (and so the loop) until it is done."""
    def run(coro, timeout: float = 60.0):
        future = _asyncio.ensure_future(coro, loop=qasync_loop)
        qtbot.waitUntil(future.done, timeout=int(timeout * 1000))
        return future.result()
    return run
