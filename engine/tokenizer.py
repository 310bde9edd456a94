"""Tokenizer: a `tokenizers` tokenizer, the model's stop ids and its chat template (engine.chat_template)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Iterable

import tokenizers

from . import chat_template as templates
from . import jsonfile, thinking
from .config import Fields, read_json
from .errors import ContextLengthError, ModelError, RequestError

# For models that ship no template: ChatML, the format of SmolLM2 and Qwen.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MAX_TOKENIZER_BYTES = 256 << 20  # tokenizer.json of a 256K vocabulary is ~30 MB
MAX_TOKENIZER_CONFIG_BYTES = 64 << 20  # added_tokens_decoder can list every special token
MAX_GENERATION_CONFIG_BYTES = 1 << 20
MAX_STOP_IDS = 1024
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Text a tokenizer can take: surrogate pairs joined, lone surrogates (which no UTF-8 text holds)
    replaced by U+FFFD, as any UTF-8 decoder replaces bytes it cannot read."""
    if not isinstance(text, str):
        raise RequestError(f"text must be a string, not {type(text).__name__}")
    if _SURROGATE.search(text) is None:
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


class Tokenizer:
    """Encode, decode, stream-decode and render chats the way the model's own Hugging Face tokenizer does."""

    def __init__(self, tk: tokenizers.Tokenizer, *, source: str, chat_template: str | None = None,
                 eos_ids: Iterable[int] = (), bos_id: int | None = None, eos_token: str | None = None):
        self._tk = tk
        self.source = source
        vocab = tk.get_vocab(with_added_tokens=True)
        self.vocab_size: int = len(vocab)
        self.max_id: int = max(vocab.values(), default=-1)
        # no token decodes to more characters than its vocabulary entry has (+1: a SentencePiece space)
        self.max_token_chars: int = max(map(len, vocab), default=0) + 1
        self.eos_ids: set[int] = {int(i) for i in eos_ids}
        self.bos_id: int | None = bos_id
        self.has_chat_template = bool(chat_template)
        self.chat_template = chat_template or CHATML
        self.thinks = thinking.supports(self.chat_template)  # replies may open with a <think> block
        try:
            templates.check(self.chat_template)
        except templates.ChatTemplateError as e:
            raise ModelError(f"{source}: the chat template {e}") from None
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
            text = _read_text(path, MAX_TOKENIZER_BYTES)
            jsonfile.check(text, max_bytes=MAX_TOKENIZER_BYTES)  # before the Rust parser, which recurses too
            tk = tokenizers.Tokenizer.from_str(text)
        except ModelError:
            raise
        except Exception as e:  # the Rust side reports any malformed file as a plain Exception
            raise ModelError(f"{path}: not a readable tokenizer ({templates.one_line(e)})") from None
        tc = _optional_json(folder / "tokenizer_config.json", MAX_TOKENIZER_CONFIG_BYTES)
        fields = Fields(tc, str(folder / "tokenizer_config.json"))
        template = _chat_template(folder, fields)
        eos_ids: set[int] = set()
        eos_text = _token_text(fields, "eos_token")
        if eos_text is not None and tk.token_to_id(eos_text) is not None:
            eos_ids.add(tk.token_to_id(eos_text))
        for name, cap in (("generation_config.json", MAX_GENERATION_CONFIG_BYTES), ("config.json", jsonfile.MAX_BYTES)):
            eos_ids.update(stop_ids(_optional_json(folder / name, cap), str(folder / name)))
        bos_text = _token_text(fields, "bos_token")
        bos_id = tk.token_to_id(bos_text) if bos_text is not None else None
        return cls(tk, source=str(path), chat_template=template, eos_ids=eos_ids, bos_id=bos_id, eos_token=eos_text)

    # --- encode / decode -------------------------------------------------------------------------
    def encode(self, text: str, add_special: bool = False) -> list[int]:
        return self._tk.encode(clean_text(text), add_special_tokens=add_special).ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=skip_special)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tk.id_to_token(token_id)

    def token_to_id(self, token: str) -> int | None:
        # no vocabulary entry holds a lone surrogate (and the Rust side cannot take one)
        return None if _SURROGATE.search(token) else self._tk.token_to_id(token)

    def stream(self, skip_special: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)

    # --- chat --------------------------------------------------------------------------------------
    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt text, rendered like transformers' apply_chat_template(tokenize=False), in the
        template worker (engine.chat_template): a template that fails or runs past its limits is a
        ModelError of one line."""
        ctx = {"bos_token": self.bos_token, "eos_token": self.eos_token, **extra,
               "messages": messages, "add_generation_prompt": add_generation_prompt}
        try:
            return templates.render(self.chat_template, ctx)
        except templates.ChatTemplateError as e:
            raise ModelError(f"{self.source}: the chat template {e}") from None

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True, limit: int | None = None,
                    **extra: Any) -> list[int]:
        """The rendered chat as ids (see `chat_prompt`)."""
        return self.chat_prompt(messages, add_generation_prompt, limit, **extra)[1]

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True, limit: int | None = None,
                    **extra: Any) -> tuple[str, list[int]]:
        """The rendered chat and its ids. With `limit` (the tokens a context can take), a text too long
        to fit in that many tokens is refused before it is encoded: encoding costs memory per token."""
        text = self.render_chat(messages, add_generation_prompt, **extra)
        if limit is not None and len(text) > limit * self.max_token_chars:
            raise ContextLengthError(f"the conversation ({len(text)} characters) does not fit the context of "
                                     f"{limit} tokens; shorten the conversation or raise the context in settings")
        # the rendered template carries its own BOS where the model wants one, as in transformers
        return text, self.encode(text, add_special=False)


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


def stop_ids(config: dict, source: str) -> list[int]:
    """A config's `eos_token_id`: one id or a flat list of ids; null or missing is none."""
    value = config.get("eos_token_id")
    if value is None:
        return []
    ids = value if isinstance(value, list) else [value]
    if len(ids) > MAX_STOP_IDS or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise Fields(config, source).error("eos_token_id", f"a token id or a list of at most {MAX_STOP_IDS} ids",
                                           value)
    return ids


def _read_text(path: Path, max_bytes: int) -> str:
    try:
        if path.stat().st_size > max_bytes:
            raise ModelError(f"{path}: larger than the {max_bytes >> 20} MiB a file of its kind may be")
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ModelError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise ModelError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _optional_json(path: Path, max_bytes: int) -> dict:
    return read_json(path, max_bytes) if path.is_file() else {}


def _token_text(fields: Fields, key: str) -> str | None:
    """tokenizer_config writes special tokens as a string or as an AddedToken dict; null is none."""
    value = fields.get(key)
    if isinstance(value, dict):
        value = value.get("content")
    if value is not None and (not isinstance(value, str) or _SURROGATE.search(value)):
        raise fields.error(key, "a token string (UTF-8) or {\"content\": string}", fields.get(key))
    return value


def _chat_template(folder: Path, tc: Fields) -> str | None:
    """Newer transformers save chat_template.jinja; older ones put it in tokenizer_config.json
    (a string, or a list of named templates whose "default" is the chat template)."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return _read_text(jinja, templates.MAX_TEMPLATE * 4)
    if tc.get("chat_template") is None and (folder / "chat_template.json").is_file():
        tc = Fields(read_json(folder / "chat_template.json"), str(folder / "chat_template.json"))
    template = tc.get("chat_template")
    if isinstance(template, list):
        if not all(isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)
                   for t in template):
            raise tc.error("chat_template", 'a string or a list of {"name": string, "template": string}', template)
        template = {t["name"]: t["template"] for t in template}.get("default")
    elif template is not None and not isinstance(template, str):
        raise tc.error("chat_template", "a string or a list of named templates", template)
    return template or None
