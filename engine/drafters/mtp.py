"""MTP: the Qwen3.5 / 3.6 checkpoint's own multi-token-prediction head as a drafter.

One full-attention decoder layer (MLP or MoE as the model) between the model's embedding and head:
x = fc([pre_fc_norm_embedding(embed(t_{p+1})) ‖ pre_fc_norm_hidden(h_p)]), x = layer(x at position p),
logits = lm_head(mtp.norm(x)): the token at p + 2. h_p is the target's final-normed hidden state at
p; later drafts feed back the head's own normed output. Its K/V is one more attention layer on the
stream's own pages (the cache's layer after the model's; the plan counts it), written for every
position the stream passes through: the target's hidden states of each prompt chunk and of each
step's accepted rows are fed as soon as the token after them is known. Draft rows write K/V past
the accepted position, which the next rows fed write over before anything reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..config import FULL
from ..errors import ModelError
from ..rows import Rows
from ..settings import SamplingParams
from .base import Drafter

_GREEDY = SamplingParams(temperature=0)  # drafts are the head's argmax whatever the stream samples with


@dataclass
class MtpState:
    """Per stream: target hidden rows waiting for the token after them, and the head's next draft."""
    pending: list = field(default_factory=list)  # (first position, hidden [n, H]) blocks, in order
    fed: int = 0  # positions whose head K/V is written
    next: tuple | None = None  # (position, draft token, the head's normed output [1, H]) for drafting on


class MtpDrafter(Drafter):
    name = "mtp"
    wants_hidden = True

    def __init__(self, model, backend):
        if getattr(model, "mtp", None) is None or len(model.mtp["layers"]) != 1:
            raise ModelError("the model has no MTP head of one layer (mtp.* weights)")
        self.model, self.b = model, backend
        p, W = backend.prepare, model.mtp
        self.fc = p(W["fc"])
        self.norm_e = p(W["pre_fc_norm_embedding"], "norm")
        self.norm_h = p(W["pre_fc_norm_hidden"], "norm")
        self.norm = p(W["norm"], "norm")
        self.layer = model.load_block(W["layers"][0], "", FULL)
        self.kv_index = len(model.cfg.attention_layers)  # the cache's attention layer after the model's
        self.cache = self.lanes = None

    def bind(self, sched) -> None:
        """The scheduler's cache (layer `kv_index` holds the head's K/V) and lanes (page tables)."""
        self.cache, self.lanes = sched.cache, sched.lanes

    # --- the head ----------------------------------------------------------------------------
    def head(self, tokens: np.ndarray, hidden, positions: np.ndarray, table: np.ndarray, lane: int):
        """Logits of the last row [1, vocab] and its normed output [1, H], after writing the head's
        K/V for every row (each row: the token after its position, the hidden state at it)."""
        b, m, eps, L = self.b, self.model, self.model.cfg.rms_eps, self.layer
        n = len(tokens)
        rows = Rows(tokens, positions, np.tile(table, (n, 1)), np.full(n, lane), False, window=n)
        e = b.rmsnorm(b.embed(m.embed, b.asarray(rows.tokens)), self.norm_e, eps)
        x = b.linear(b.concat([e, b.rmsnorm(hidden, self.norm_h, eps)]), self.fc)
        a = m.attention(self.kv_index, L, b.rmsnorm(x, L["in_norm"], eps), rows, self.cache)
        # Only the last row goes on: the earlier ones ran for their K/V.
        h, res = b.add_rmsnorm(a[n - 1:], x[n - 1:], L["post_norm"], eps)
        out, _ = b.add_rmsnorm(m.mlp(L, h, rows), res, self.norm, eps)
        return m.head(out), out

    # --- the drafter ---------------------------------------------------------------------------
    def state(self, seq) -> MtpState:
        if not isinstance(seq.draft, MtpState):
            seq.draft = MtpState(fed=seq.computed)
        return seq.draft

    def observe(self, seq, first: int, hidden) -> None:
        st = self.state(seq)
        if first == 0:  # a fresh stream, or one recomputed from its start
            st.pending, st.fed, st.next = [], 0, None
        st.pending.append((first, hidden))
        self.feed(seq)

    def feed(self, seq) -> None:
        """Run the head over every pending row whose next token is known; the last gives a draft."""
        st = self.state(seq)
        known = len(seq.tokens) - 1  # positions below this have their next token
        blocks, keep = [], []
        for first, h in st.pending:
            n = min(len(h), known - first)
            if n > 0:
                blocks.append(h[:n] if n < len(h) else h)
            if n < len(h):
                keep.append((first + max(n, 0), h[max(n, 0):]))
        if not blocks:
            return
        start = st.pending[0][0]
        end = start + sum(len(h) for h in blocks)
        hidden = blocks[0] if len(blocks) == 1 else self.b.concat(blocks, axis=0)
        pos = np.arange(start, end, dtype=np.int32)
        toks = np.asarray(seq.tokens[start + 1:end + 1], np.int32)
        logits, out = self.head(toks, hidden, pos, self.table(seq), seq.lane.index)
        st.pending, st.fed = keep, end
        st.next = (end, int(self.b.choose(logits, [_GREEDY], [end + 1])[0]), out)

    def table(self, seq) -> np.ndarray:
        return self.lanes.table(seq.lane)

    def propose(self, seq, k: int) -> list[int]:
        st = self.state(seq)
        self.feed(seq)
        if st.next is None or st.next[0] != seq.computed:
            return []
        pos, tok, out = st.next
        drafts = [tok]
        table, lane = self.table(seq), seq.lane.index
        while len(drafts) < k:
            logits, out = self.head(np.array([drafts[-1]], np.int32), out, np.array([pos], np.int32), table, lane)
            pos += 1
            drafts.append(int(self.b.choose(logits, [_GREEDY], [pos + 1])[0]))
        return drafts

