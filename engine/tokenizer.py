"""Tokenizer: a `tokenizers` tokenizer, the model's stop ids and its chat template (sandboxed Jinja)."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable

import jinja2.ext
import tokenizers
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import ModelError

# For models that ship no template: ChatML, the format of SmolLM2 and Qwen.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # transformers' tojson, not Jinja's: no HTML escaping, so templates render byte-identically
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class Tokenizer:
    """Encode, decode, stream-decode and render chats the way the model's own Hugging Face tokenizer does."""

    def __init__(self, tk: tokenizers.Tokenizer, *, source: str, chat_template: str | None = None,
                 eos_ids: Iterable[int] = (), bos_id: int | None = None, eos_token: str | None = None):
        self._tk = tk
        self.source = source
        vocab = tk.get_vocab(with_added_tokens=True)
        self.vocab_size: int = len(vocab)
        self.max_id: int = max(vocab.values(), default=-1)
        self.eos_ids: set[int] = {int(i) for i in eos_ids}
        self.bos_id: int | None = bos_id
        self.has_chat_template = bool(chat_template)
        self.chat_template = chat_template or CHATML
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
        try:
            self._template = env.from_string(self.chat_template)
        except TemplateError as e:
            raise ModelError(f"{source}: the chat template does not parse ({e})") from None
        # the strings templates see as bos_token / eos_token
        self.bos_token = (self.id_to_token(bos_id) if bos_id is not None else None) or ""
        if eos_token is None and self.eos_ids:
            eos_token = self.id_to_token(min(self.eos_ids))
        self.eos_token = eos_token or ""

    # --- construction from a Hugging Face folder -------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path) -> "Tokenizer":
        """tokenizer.json + tokenizer_config.json (+ chat_template.jinja, generation_config.json, config.json)."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise ModelError(f"{folder}: no tokenizer.json")
        try:
            tk = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust side reports any malformed file as a plain Exception
            raise ModelError(f"{path}: not a readable tokenizer ({e})") from None
        tc = _read_json(folder / "tokenizer_config.json")
        template = _chat_template(folder, tc)
        eos_ids: set[int] = set()
        eos_text = _token_text(tc.get("eos_token"))
        if eos_text is not None and tk.token_to_id(eos_text) is not None:
            eos_ids.add(tk.token_to_id(eos_text))
        for extra in (_read_json(folder / "generation_config.json"), _read_json(folder / "config.json")):
            ids = extra.get("eos_token_id")
            eos_ids.update(ids if isinstance(ids, list) else [ids] if isinstance(ids, int) else [])
        bos_text = _token_text(tc.get("bos_token"))
        bos_id = tk.token_to_id(bos_text) if bos_text is not None else None
        return cls(tk, source=str(path), chat_template=template, eos_ids=eos_ids, bos_id=bos_id, eos_token=eos_text)

    # --- encode / decode -------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return self._tk.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=skip_special)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tk.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    def stream(self, skip_special: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)

    # --- chat --------------------------------------------------------------------------------------
    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text, rendered like transformers' apply_chat_template(tokenize=False)."""
        ctx = {"bos_token": self.bos_token, "eos_token": self.eos_token, **extra,
               "messages": messages, "add_generation_prompt": add_generation_prompt}
        try:
            return self._template.render(**ctx)
        except Exception as e:  # a template is untrusted code: any failure becomes one line for the user
            raise ModelError(f"{self.source}: the chat template failed ({type(e).__name__}: {e})") from None

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> list[int]:
        # the rendered template carries its own BOS where the model wants one, as in transformers
        return self.encode(self.render_chat(messages, add_generation_prompt, **extra), add_special=False)


class StreamDecoder:
    """Token ids in, text deltas out. Text is emitted only once it cannot change: a token that ends in
    an incomplete UTF-8 sequence is held back until the rest arrives.

    Decoding restarts from the last emitted token (the "prefix") so that decoders which strip a leading
    space from the first token (SentencePiece) see the same start both times.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tok = tokenizer
        self._skip = skip_special
        self._ids: list[int] = []
        self._prefix = 0  # start of the window re-decoded each step
        self._read = 0    # ids before this were emitted

    def _texts(self) -> tuple[str, str]:
        d = self._tok.decode
        return d(self._ids[self._prefix:self._read], self._skip), d(self._ids[self._prefix:], self._skip)

    def push(self, token_id: int) -> str:
        self._ids.append(int(token_id))
        done, now = self._texts()
        if len(now) > len(done) and not now.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return now[len(done):]
        return ""

    def flush(self) -> str:
        """Whatever is held back (an incomplete character comes out as U+FFFD), then start afresh."""
        done, now = self._texts()
        self._ids, self._prefix, self._read = [], 0, 0
        return now[len(done):]


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: not readable JSON ({e})") from None
    return raw if isinstance(raw, dict) else {}


def _token_text(value: Any) -> str | None:
    """tokenizer_config writes special tokens as a string or as an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _chat_template(folder: Path, tc: dict) -> str | None:
    """Newer transformers save chat_template.jinja; older ones put it in tokenizer_config.json."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    template = tc.get("chat_template") or _read_json(folder / "chat_template.json").get("chat_template")
    if isinstance(template, list):  # named templates: the default one is the chat template
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None
