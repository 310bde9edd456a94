"""Models from the Hugging Face Hub, through `huggingface_hub`: a repo's files and sizes, the memory plan
from its config.json before anything big is fetched, and a download with progress, pause/resume and
cancel that verifies every file and only then moves the model into the models folder.

A download keeps its files in the cache folder (`downloads/<name>`) until all of them are complete
and match the Hub's size and hash (LFS sha256, or the git blob id of small files); the models folder
never holds half a model. Each file is fetched with huggingface_hub's `http_get` into a `.part` file
that a later run (a resume, or a retry after a cut connection) continues with a Range request.
The Hub is $HF_ENDPOINT when set (tests point it at a local server), else huggingface.co.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

from . import paths
from .config import ModelConfig, read_json, shown
from .errors import LanechatError, ModelError
from .plan import Plan, make_plan
from .settings import EngineSettings

DEFAULT_ENDPOINT = "https://huggingface.co"
REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")
# What a safetensors model folder needs besides its weights.
FOLDER_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "chat_template.jinja", "chat_template.json", "model.safetensors.index.json")
DISK_MARGIN = 256 << 20  # a download stops before it leaves less than this free
DISK_CHECK_BYTES = 32 << 20  # free space is looked at again after this many bytes
# A GGUF's metadata is read from the file's first bytes; a 150k-token vocabulary takes a few MiB.
HEADER_FIRST, HEADER_MAX = 1 << 20, 64 << 20
SOURCE_FILE = "lanechat-source.json"
_DTYPES = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}  # config.json's names → safetensors'
  # beside an installed model: where it came from
_QUANT = re.compile(r"(?:^|[-_.])((?:UD-)?I?Q\d_[A-Z0-9_]+|Q\d_\d|BF16|F16|F32)(?=\.gguf$|-\d{5}-of-)", re.IGNORECASE)


@dataclass(frozen=True)
class Suggestion:
    repo: str
    note: str


# A short list to start from; any repo id can be typed instead.
CURATED = (
    Suggestion("mlx-community/Qwen3.5-27B-4bit", "Qwen3.5 27B · MLX 4-bit · ~16 GB"),
    Suggestion("unsloth/Qwen3.5-27B-GGUF", "Qwen3.5 27B · GGUF (pick a quantization) · ~17 GB at Q4_K_M"),
    Suggestion("Qwen/Qwen3.5-27B", "Qwen3.5 27B · HF bf16 · ~54 GB"),
    Suggestion("mlx-community/Qwen3.6-35B-A3B-4bit", "Qwen3.6 35B-A3B MoE · MLX 4-bit · ~20 GB"),
    Suggestion("unsloth/Qwen3.6-35B-A3B-GGUF", "Qwen3.6 35B-A3B MoE · GGUF"),
    Suggestion("Qwen/Qwen3-0.6B", "Qwen3 0.6B · HF bf16 · small, thinks"),
    Suggestion("Qwen/Qwen3-0.6B-GGUF", "Qwen3 0.6B · GGUF Q8_0 · small"),
    Suggestion("HuggingFaceTB/SmolLM2-360M-Instruct", "SmolLM2 360M · HF · tiny, quick on a CPU"),
)


class HubError(LanechatError):
    """The Hub cannot be reached, refuses, or a download cannot finish (the message says what to do)."""


class DownloadStoppedError(LanechatError):
    """A download that was paused (its files so far are kept) or cancelled (they are gone)."""

    def __init__(self, reason: str):
        super().__init__(f"the download was {reason}")
        self.reason = reason


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None = None  # LFS files
    blob_id: str | None = None  # git's sha1 of a small file's blob


@dataclass
class Listing:
    """A repo at one commit: its files, and what kind of model they make."""
    repo: str
    revision: str
    files: list[RemoteFile]

    @property
    def ggufs(self) -> list[RemoteFile]:
        return [f for f in self.files if f.path.endswith(".gguf") and "mmproj" not in f.path.lower()
                and "/" not in f.path]

    @property
    def kind(self) -> str:
        """"safetensors" (a HF or MLX folder), "gguf" (pick a file) or "none"."""
        names = {f.path for f in self.files}
        if "config.json" in names and any(n.endswith(".safetensors") and "/" not in n for n in names):
            return "safetensors"
        return "gguf" if self.ggufs else "none"

    def file(self, path: str) -> RemoteFile | None:
        return next((f for f in self.files if f.path == path), None)


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def gib(n: int) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def quant_of(filename: str) -> str:
    """llama.cpp's quantization name in a GGUF file name ('Q4_K_M'), or ''."""
    m = _QUANT.search(PurePosixPath(filename).name)
    return m[1].upper() if m else ""


def _hub_error(repo: str, e: Exception) -> HubError:
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
    if isinstance(e, GatedRepoError):
        return HubError(f"{repo} is gated: accept its terms on the Hub, then give an access token")
    if isinstance(e, RepositoryNotFoundError):
        return HubError(f"{repo}: no such model on {endpoint()} (or it is private: give an access token)")
    if isinstance(e, RevisionNotFoundError):
        return HubError(f"{repo}: no such revision")
    if isinstance(e, HfHubHTTPError):
        return HubError(f"{repo}: the Hub answered {' '.join(str(e).split())[:200]}")
    return HubError(f"cannot reach {endpoint()} ({type(e).__name__}: {' '.join(str(e).split())[:160]})")


def listing(repo: str, revision: str | None = None, token: str | None = None) -> Listing:
    """The repo's files with their sizes and hashes, at one commit (later downloads use that commit)."""
    repo = repo.strip()
    if not REPO_ID.fullmatch(repo):
        raise HubError(f"{shown(repo)} is not a Hugging Face repo id (owner/name)")
    from huggingface_hub import HfApi
    try:
        info = HfApi(endpoint=endpoint(), token=token).model_info(repo, revision=revision, files_metadata=True)
    except Exception as e:  # noqa: BLE001 - the library and the network raise many kinds; each becomes one line
        raise _hub_error(repo, e) from None
    files = []
    for s in info.siblings or []:
        name = s.rfilename
        p = PurePosixPath(name) if isinstance(name, str) else None
        if p is None or p.is_absolute() or ".." in p.parts or not name or "\\" in name:
            raise HubError(f"{repo}: the Hub lists a file named {shown(name)}, which no model folder can hold")
        size = s.lfs.size if s.lfs is not None else s.size
        if not isinstance(size, int) or size < 0:
            raise HubError(f"{repo}: the Hub gives no size for {name}")
        files.append(RemoteFile(name, size, s.lfs.sha256 if s.lfs is not None else None,
                                None if s.lfs is not None else s.blob_id))
    if not isinstance(info.sha, str) or not info.sha:
        raise HubError(f"{repo}: the Hub gives no commit for this revision")
    return Listing(repo, info.sha, files)


def wanted(lst: Listing, gguf: str | None = None) -> list[RemoteFile]:
    """The files a model needs: a folder's config, tokenizer and safetensors, or one GGUF file (`gguf`,
    else the Q4_K_M one, else the first)."""
    if lst.kind == "safetensors":
        return [f for f in lst.files
                if f.path in FOLDER_FILES or (f.path.endswith(".safetensors") and "/" not in f.path)]
    if lst.kind == "gguf":
        choices = lst.ggufs
        pick = (next((f for f in choices if f.path == gguf), None) if gguf
                else next((f for f in choices if quant_of(f.path) == "Q4_K_M"), choices[0]))
        if pick is None:
            raise HubError(f"{lst.repo} has no GGUF file {shown(gguf)}")
        if re.search(r"-\d{5}-of-\d{5}\.gguf$", pick.path):
            raise HubError(f"{pick.path} is one part of a split GGUF; split files are not supported (pick another "
                           f"quantization, or merge the parts with llama-gguf-split)")
        return [pick]
    raise HubError(f"{lst.repo} holds no model this engine loads (config.json with *.safetensors, or a .gguf file)")


def remote_config(lst: Listing, token: str | None = None,
                  files: list[RemoteFile] | None = None) -> tuple[dict, ModelConfig] | None:
    """The repo's config.json (downloaded to the cache: it is small) and the ModelConfig it gives;
    for a GGUF repo (`files`: the chosen file) the config from that file's metadata ({} as the raw)."""
    if lst.kind == "gguf" and files:
        return {}, gguf_config(lst, files[0], token)
    if lst.file("config.json") is None:
        return None
    from huggingface_hub import hf_hub_download
    try:
        path = hf_hub_download(lst.repo, "config.json", revision=lst.revision, token=token, endpoint=endpoint(),
                               cache_dir=paths.cache_dir() / "hub")
    except Exception as e:  # noqa: BLE001
        raise _hub_error(lst.repo, e) from None
    raw = read_json(path)
    return raw, ModelConfig.from_hf(raw, f"{lst.repo}/config.json")


def gguf_config(lst: Listing, f: RemoteFile, token: str | None = None, first: int = HEADER_FIRST) -> ModelConfig:
    """A GGUF's ModelConfig from the first bytes of the file (its metadata, vocabulary included, then
    the tensors' names and shapes), fetched with Range requests, `first` bytes and four times more
    until the metadata ends inside them (at most HEADER_MAX). The bytes go into a sparse file of
    the whole size, so the reader finds every tensor's place; 0xFF bytes right after them make a
    metadata cut short unreadable rather than quietly zero."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    from .loader import gguf as gguf_loader
    where = f"{lst.repo}/{f.path}"
    probe = paths.cache_dir() / "downloads" / f".{folder_name(lst, [f])}.header.gguf"
    probe.parent.mkdir(parents=True, exist_ok=True)
    url = hf_hub_url(lst.repo, f.path, revision=lst.revision, endpoint=endpoint())
    n = min(first, f.size)
    try:
        location = get_hf_file_metadata(url, token=token, endpoint=endpoint()).location
        while True:
            with open(probe, "wb") as out:
                http_get(location, out, headers={**build_hf_headers(token=token), "Range": f"bytes=0-{n - 1}"},
                         displayed_filename=f.path)
                out.truncate(n)  # a server that ignores Range sends it all: keep what was asked for
                out.seek(n)
                out.write(b"\xff" * min(1 << 20, f.size - n))
                out.truncate(f.size)
            try:
                reader = gguf_loader.read(probe)
                if reader.data_offset <= n:
                    return gguf_loader.config_from_metadata(gguf_loader.Metadata(reader, probe),
                                                            {t.name for t in reader.tensors}, where)
            except ModelError as e:
                if n >= min(HEADER_MAX, f.size):
                    raise ModelError(str(e).replace(str(probe), where)) from None
            if n >= min(HEADER_MAX, f.size):
                raise ModelError(f"{where}: its metadata takes more than {HEADER_MAX >> 20} MiB; download it to "
                                 "see its plan")
            n = min(4 * n, HEADER_MAX, f.size)
    except ModelError:
        raise
    except Exception as e:  # noqa: BLE001 - the network's errors, as one line
        raise _hub_error(lst.repo, e) from None
    finally:
        probe.unlink(missing_ok=True)


def format_label(lst: Listing, files: list[RemoteFile], raw: dict | None) -> str:
    """'GGUF Q4_K_M', 'MLX 4-bit g64' or 'HF bf16', as the installed model's description will say."""
    if lst.kind == "gguf":
        return f"GGUF {quant_of(files[0].path) or 'unknown'}"
    q = (raw or {}).get("quantization")
    if isinstance(q, dict):
        return f"MLX {q.get('bits', 4)}-bit g{q.get('group_size', 64)}"
    text = (raw or {}).get("text_config") or raw or {}
    dtype = (raw or {}).get("torch_dtype") or (raw or {}).get("dtype") or text.get("torch_dtype") or "?"
    return f"HF {_DTYPES.get(dtype, dtype)}"


def plan_before_download(lst: Listing, files: list[RemoteFile], settings: EngineSettings,
                         config: tuple[dict, ModelConfig] | None) -> Plan:
    """The memory plan for these settings from the repo's config and the weights' size, never raising:
    a plan that cannot be made says why (fits=False)."""
    if config is None:
        return Plan(line="plan: this repo has no config.json; the plan is known once the file is here", fits=False,
                    error="no config.json")
    weights = sum(f.size for f in files if f.path.endswith((".safetensors", ".gguf")))
    try:
        return make_plan(config[1], settings, None, weights)
    except LanechatError as e:
        return Plan(line=f"plan: does not fit: {e}", fits=False, error=str(e))


def folder_name(lst: Listing, files: list[RemoteFile]) -> str:
    """The installed folder's name: owner--name, and the quantization for a GGUF."""
    name = lst.repo.replace("/", "--")
    if lst.kind == "gguf":
        name += "--" + (quant_of(files[0].path) or PurePosixPath(files[0].path).stem)
    return name


# --- the download ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Progress:
    stage: str  # "downloading" | "verifying" | "installing"
    done: int  # bytes of every file, so far
    total: int
    file: str
    rate: float  # bytes per second over the last few seconds


def _git_blob_sha1(path: Path) -> str:
    h = hashlib.sha1()
    h.update(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _sha256(path: Path, step: Callable[[int], None]) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
            step(len(chunk))
    return h.hexdigest()


class Download:
    """One model from the Hub into the models folder. `run` blocks (call it on a worker thread);
    `pause` and `cancel` may be called from any thread and take effect within one chunk.

    `disk_free(path)` says how many bytes are free where `path` is (shutil.disk_usage by default).
    """

    def __init__(self, lst: Listing, files: list[RemoteFile], token: str | None = None,
                 models: Path | None = None, disk_free: Callable[[Path], int] | None = None):
        self.listing, self.files, self.token = lst, files, token
        self.name = folder_name(lst, files)
        self.dest = (models or paths.models_dir()) / self.name
        self.staging = paths.cache_dir() / "downloads" / self.name
        self.total = sum(f.size for f in files)
        self._disk_free = disk_free or (lambda p: shutil.disk_usage(p).free)
        self._stop: str | None = None
        self._lock = threading.Lock()

    def pause(self) -> None:
        self._stop = "paused"

    def cancel(self) -> None:
        """Stop and forget: a running download removes its files as it stops; a paused one, now."""
        self._stop = "cancelled"
        if self._lock.acquire(blocking=False):  # not running (a running one cleans up as it stops)
            try:
                shutil.rmtree(self.staging, ignore_errors=True)
            finally:
                self._lock.release()

    def done_bytes(self) -> int:
        """Bytes already here, complete files and parts (what a resume need not fetch again)."""
        n = 0
        for f in self.files:
            for p in (self.staging / f.path, self.staging / (f.path + ".part")):
                if p.is_file():
                    n += min(p.stat().st_size, f.size)
        return n

    def run(self, progress: Callable[[Progress], None] = lambda p: None) -> Path:
        """Download, verify and install; returns the installed folder. DownloadStoppedError when paused or
        cancelled, HubError when it cannot finish (a full disk, the network, a checksum)."""
        with self._lock:
            self._stop = None
            if self.dest.exists():
                raise HubError(f"{self.dest} already exists: delete it first to download {self.listing.repo} again")
            self.staging.mkdir(parents=True, exist_ok=True)
            try:
                self._fetch_all(progress)
                self._verify(progress)
                return self._install(progress)
            except DownloadStoppedError as e:
                if e.reason == "cancelled":
                    shutil.rmtree(self.staging, ignore_errors=True)
                raise
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise self._disk_full() from None
                raise HubError(f"the download of {self.listing.repo} failed ({e.strerror or e}); "
                               "it continues where it stopped") from None

    def _disk_full(self) -> HubError:
        shutil.rmtree(self.staging, ignore_errors=True)  # nothing half-written stays behind
        return HubError(f"the disk is full ({gib(self._disk_free(self.staging.parent))} free in "
                        f"{self.staging.parent}); {self.listing.repo} needs {gib(self.total)}: free some space and "
                        f"download again")

    def _check_space(self, done: int) -> None:
        if self._disk_free(self.staging) < self.total - done + DISK_MARGIN:
            raise self._disk_full()

    def _fetch_all(self, progress: Callable[[Progress], None]) -> None:
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.file_download import http_get
        from huggingface_hub.utils import build_hf_headers
        base = self.done_bytes()
        self._check_space(base)
        rate = _Rate(base)
        for f in self.files:
            target = self.staging / f.path
            if target.is_file():
                continue
            self._check_space(self.done_bytes())
            part = self.staging / (f.path + ".part")
            part.parent.mkdir(parents=True, exist_ok=True)
            have = part.stat().st_size if part.is_file() else 0
            if have > f.size:
                part.unlink()
                have = 0
            url = hf_hub_url(self.listing.repo, f.path, revision=self.listing.revision, endpoint=endpoint())
            try:
                meta = get_hf_file_metadata(url, token=self.token, endpoint=endpoint())
                before = self.done_bytes() - have
                meter = _meter(lambda n: self._step(progress, rate, before + n, f.path))
                with open(part, "ab") as out:
                    http_get(meta.location, out, resume_size=have, headers=build_hf_headers(token=self.token),
                             expected_size=f.size, displayed_filename=f.path, tqdm_class=meter)
            except (DownloadStoppedError, HubError):
                raise
            except OSError as e:
                if e.errno == errno.ENOSPC:
                    raise self._disk_full() from None
                raise _hub_error(self.listing.repo, e) from None
            except Exception as e:  # noqa: BLE001 - network errors of every kind: the part file stays for a resume
                raise HubError(f"{f.path}: the download stopped ({type(e).__name__}: "
                               f"{' '.join(str(e).split())[:160]}); download again to continue") from None
            os.replace(part, target)

    def _step(self, progress: Callable[[Progress], None], rate: "_Rate", done: int, file: str) -> None:
        if self._stop is not None:
            raise DownloadStoppedError(self._stop)
        if rate.due_check(done):
            self._check_space(done)
        progress(Progress("downloading", done, self.total, file, rate.per_second(done)))

    def _verify(self, progress: Callable[[Progress], None]) -> None:
        checked = 0
        for f in self.files:
            path = self.staging / f.path
            size = path.stat().st_size
            if size != f.size:
                path.unlink()
                raise HubError(f"{f.path} has {size} bytes, the Hub says {f.size}: it was removed; download again")

            def step(n: int, at=checked) -> None:
                if self._stop is not None:
                    raise DownloadStoppedError(self._stop)
                progress(Progress("verifying", at + n, self.total, f.path, 0.0))
            if f.sha256 is not None:
                good = _sha256(path, step) == f.sha256.lower()
            else:
                good = f.blob_id is None or _git_blob_sha1(path) == f.blob_id.lower()
            if not good:
                path.unlink()
                raise HubError(f"{f.path} does not match the Hub's checksum: it was removed; download again")
            checked += f.size

    def _install(self, progress: Callable[[Progress], None]) -> Path:
        progress(Progress("installing", self.total, self.total, "", 0.0))
        source = {"repo": self.listing.repo, "revision": self.listing.revision, "files": [f.path for f in self.files],
                  "endpoint": endpoint(), "downloaded": time.time()}
        (self.staging / SOURCE_FILE).write_text(json.dumps(source, indent=1))
        self.dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(self.staging, self.dest)  # one rename: the model appears whole
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
            # another file system: copy beside the destination under a hidden name, then rename
            hidden = self.dest.with_name(f".{self.name}.installing")
            shutil.rmtree(hidden, ignore_errors=True)
            shutil.copytree(self.staging, hidden)
            os.replace(hidden, self.dest)
            shutil.rmtree(self.staging, ignore_errors=True)
        return self.dest


class _Rate:
    """Bytes per second over a sliding window, and when free space is due another look."""

    def __init__(self, start: int):
        self._marks = [(time.monotonic(), start)]
        self._next_check = start + DISK_CHECK_BYTES

    def per_second(self, done: int) -> float:
        now = time.monotonic()
        self._marks.append((now, done))
        while len(self._marks) > 2 and now - self._marks[0][0] > 5.0:
            self._marks.pop(0)
        t0, d0 = self._marks[0]
        return (done - d0) / (now - t0) if now > t0 else 0.0

    def due_check(self, done: int) -> bool:
        if done < self._next_check:
            return False
        self._next_check = done + DISK_CHECK_BYTES
        return True


def _meter(on_bytes: Callable[[int], None]) -> type:
    """A progress-bar class for huggingface_hub's http_get: it reports this file's bytes so far (and
    raising from `on_bytes` stops the transfer, leaving the .part file for a resume)."""

    class Meter:
        def __init__(self, *args: Any, initial: int = 0, **kwargs: Any):
            self.n = initial

        def __enter__(self) -> "Meter":
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

        def update(self, n: int) -> None:
            self.n += n
            on_bytes(self.n)

        def close(self) -> None:
            pass
    return Meter
