"""Speculative decoding: drafters propose tokens, the target checks them in verify windows.

`fit` says which drafter the settings get on a model (configs only, for the plan); `make` builds it
for a scheduler. A drafter only proposes: the verify window (`verify.Verifier`) accepts exactly
the tokens plain decoding would have produced, so drafted output == plain output at every
temperature and a bad draft costs time, never a token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import ModelError
from .base import Drafter

if TYPE_CHECKING:
    from ..config import ModelConfig
    from .dflash2_config import DFlashConfig

__all__ = ["Drafter", "Fit", "fit", "make", "refused"]


@dataclass
class Fit:
    """What a drafter asked for on a model comes to."""
    drafter: str  # the drafter that runs ("none": plain decoding)
    note: str | None = None  # why the one asked for is refused
    kv_layers: int = 0  # attention layers of its own on every stream's pages (MTP)
    dflash: DFlashConfig | None = None  # a DFlash2 drafter's config (its block and context ring)

    def most_drafts(self, k: int) -> int:
        """Drafts per window: k, or fewer where the drafter proposes fewer (a DFlash2 block's B - 1)."""
        return min(k, self.dflash.block - 1) if self.dflash else k


def refused(drafter: str, why: str) -> Fit:
    return Fit("none", f"drafter {drafter} refused: {why}; decoding plain")


def fit(cfg: ModelConfig, drafter: str, drafter_model: str | None = None) -> Fit:
    """The drafter the settings get: a drafter that does not fit the model runs plain, saying why."""
    if drafter == "mtp" and cfg.mtp_layers != 1:
        why = "ships no MTP head (mtp.* weights of a qwen3_5 or qwen3_5_moe model)" if not cfg.mtp_layers \
            else f"has an MTP head of {cfg.mtp_layers} layers (one is supported)"
        return refused("mtp", f"the checkpoint {why}")
    if drafter == "mtp":
        return Fit("mtp", kv_layers=cfg.mtp_layers)
    if drafter == "dflash2":
        if not drafter_model:
            return refused("dflash2", "no drafter checkpoint chosen (--drafter-model, or the settings' drafter model)")
        from .dflash2_config import DFlashConfig
        try:
            return Fit("dflash2", dflash=DFlashConfig.read(drafter_model, cfg))
        except ModelError as e:
            return refused("dflash2", str(e))
    return Fit(drafter)


def make(name: str, model, backend, weights=None) -> Drafter | None:
    """The drafter `name` (as `fit` returned it) for a scheduler's model; None for plain decoding.
    `weights`: a DFlash2 drafter's prepared checkpoint (`dflash2.DFlash2Weights`)."""
    if name == "none":
        return None
    if name == "ngram":
        from .ngram import NgramDrafter
        return NgramDrafter()
    if name == "oracle":
        from .oracle import OracleDrafter
        return OracleDrafter()
    if name == "dflash2":
        from .dflash2 import DFlash2Drafter
        if weights is None:
            raise ModelError("a DFlash2 drafter needs its checkpoint's weights")
        return DFlash2Drafter(weights, model, backend)
    from .mtp import MtpDrafter
    return MtpDrafter(model, backend)
