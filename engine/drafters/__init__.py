"""Speculative decoding: drafters propose tokens, the target checks them in verify windows.

`fit` says which drafter the settings get on a model (config only, for the plan); `make` builds it
for a scheduler. A drafter only proposes: the verify window (`verify.Verifier`) accepts exactly
the tokens plain decoding would have produced, so drafted output == plain output at every
temperature and a bad draft costs time, never a token.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .base import Drafter

if TYPE_CHECKING:
    from ..config import ModelConfig

__all__ = ["Drafter", "fit", "make"]


def fit(cfg: ModelConfig, drafter: str) -> tuple[str, str | None]:
    """(the drafter that runs, why the one asked for is refused or None): the engine runs plain
    when a drafter does not fit the model."""
    if drafter == "mtp" and cfg.mtp_layers != 1:
        why = "ships no MTP head (mtp.* weights of a qwen3_5 or qwen3_5_moe model)" if not cfg.mtp_layers \
            else f"has an MTP head of {cfg.mtp_layers} layers (one is supported)"
        return "none", f"drafter mtp refused: the checkpoint {why}; decoding plain"
    return drafter, None


def kv_layers(cfg: ModelConfig, drafter: str) -> int:
    """Attention layers a drafter keeps on its streams' pages (MTP: its own layers)."""
    return cfg.mtp_layers if drafter == "mtp" else 0


def make(name: str, model, backend) -> Drafter | None:
    """The drafter `name` (as `fit` returned it) for a scheduler's model; None for plain decoding."""
    if name == "none":
        return None
    if name == "ngram":
        from .ngram import NgramDrafter
        return NgramDrafter()
    if name == "oracle":
        from .oracle import OracleDrafter
        return OracleDrafter()
    from .mtp import MtpDrafter
    return MtpDrafter(model, backend)
