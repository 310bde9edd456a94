"""A GGUF file's vocabulary → a `tokenizers` byte-level BPE equal to the model's own tokenizer.json.

The metadata holds the tokens, their types, the merges and llama.cpp's name for the pre-tokenizer;
each name maps to the normalizer and pre-tokenizer of the models that use it.
"""
from __future__ import annotations

from typing import Any, Mapping

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors

from ..config import MAX_VOCAB, Fields, shown
from ..errors import ModelError
from ..tokenizer import Tokenizer

CONTROL, USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values
# llama.cpp ends generation on these control tokens whatever the metadata's eos id says.
END_OF_GENERATION = {"<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<EOT>"}

# Pre-tokenizers as the models' own tokenizer.json files define them, keyed by llama.cpp's name.
_DIGITS_BYTELEVEL = ("smollm", "starcoder", "refact", "codeshell")
_SPLIT_RE = {
    "llama-bpe": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+",
    # Qwen3.5: qwen2's split with combining marks (\p{M}) kept with their letters
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+",
}
_NFC = ("qwen2", "qwen35")


def _pre_tokenizer(pre: str, path: str) -> tuple[Any, Any]:
    """(normalizer, pre-tokenizer) for llama.cpp's pre-tokenizer name."""
    if pre in _DIGITS_BYTELEVEL:
        return None, pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                              pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    if pre in ("gpt-2", "default"):
        return None, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _SPLIT_RE:
        split = pre_tokenizers.Split(Regex(_SPLIT_RE[pre]), behavior="isolated", invert=False)
        seq = pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        return (normalizers.NFC() if pre in _NFC else None), seq
    known = ", ".join((*_DIGITS_BYTELEVEL, "gpt-2", *_SPLIT_RE))
    raise ModelError(f"{path}: tokenizer pre-tokenizer {shown(pre)} is not supported (supported: {known})")


def from_metadata(meta: Mapping[str, Any], source: str) -> Tokenizer:
    m = Fields(meta, source, kind="metadata", scope="tokenizer.")
    model = m.str("ggml.model")
    if model != "gpt2":
        raise ModelError(f"{source}: tokenizer model {shown(model)} is not supported (only gpt2-style BPE)")
    tokens = m.array("ggml.tokens", str)
    if not tokens or len(tokens) > MAX_VOCAB:
        raise m.error("ggml.tokens", f"a list of 1..{MAX_VOCAB} strings", len(tokens))
    types = m.array("ggml.token_type", int) or [1] * len(tokens)
    if len(types) != len(tokens):
        raise m.error("ggml.token_type", f"one type per token ({len(tokens)})", len(types))
    merges = [tuple(x.split(" ", 1)) for x in m.array("ggml.merges", str)]
    if any(len(x) != 2 for x in merges):
        raise m.error("ggml.merges", "a list of 'left right' pairs")
    pre = m.str("ggml.pre", "default")
    normalizer, pre_tok = _pre_tokenizer(pre, source)
    ids = {name: m.int(f"ggml.{name}_token_id", None, hi=len(tokens) - 1) for name in ("bos", "eos", "eot", "eom")}
    bos = ids["bos"]
    try:
        bpe = tokenizers.models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges,
                                    ignore_merges=pre == "llama-bpe")
        tk = tokenizers.Tokenizer(bpe)
        if normalizer is not None:
            tk.normalizer = normalizer
        tk.pre_tokenizer = pre_tok
        tk.decoder = decoders.ByteLevel()
        tk.add_tokens([AddedToken(t, special=y == CONTROL, normalized=False)
                       for t, y in zip(tokens, types) if y in (CONTROL, USER_DEFINED)])
        if bos is not None and m.bool("ggml.add_bos_token", False):
            tk.post_processor = processors.TemplateProcessing(single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B",
                                                              special_tokens=[(tokens[bos], bos)])
    except Exception as e:  # the Rust side reports a vocabulary it cannot build as a plain Exception
        raise ModelError(f"{source}: the tokenizer cannot be built from the metadata ({_one_line(e)})") from None
    eos_ids = {i for k, i in ids.items() if k != "bos" and i is not None}
    eos_ids |= {i for i, (t, y) in enumerate(zip(tokens, types)) if y == CONTROL and t in END_OF_GENERATION}
    eos = ids["eos"]
    return Tokenizer(tk, source=source, chat_template=m.str("chat_template"), eos_ids=eos_ids,
                     bos_id=bos, eos_token=tokens[eos] if eos is not None else None)


def _one_line(e: Exception) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) <= 160 else text[:157] + "..."
