"""The exactness gates: greedy (and sampled) output must not depend on paging, page size, company
or interruption. Every arm runs the same prompts; token ids are compared as SHA-256.

Per arm: solo prompts (chat prompts plus prompts ending at, just after and well past a page
boundary), the same prompts concurrently 1/2/4/8 at a time, resumes (a stream stopped mid-way,
snapshotted, and continued on another lane), follow-up turns (a finished turn's snapshot, in
memory and through a file on disk, continued by the next turn's prompt), and prompts sharing
prefixes through the prompt cache (paged arms; the contiguous arm computes them cold). The
reference is the contiguous arm (paging off). With drafters, each one that fits the model runs the solo prompts,
four at once, and the sampled ones again in verify windows: "drafted == plain" (n-gram, MTP and
DFlash2 exercise rejection; the oracle, which proposes the plain run's own tokens, full acceptance).
A synthetic model gets a random DFlash2 drafter of its shapes unless --drafter-model names one.
"""
from __future__ import annotations

import hashlib
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from . import drafters, jsonfile
from .drafters.dflash2_config import SYNTHETIC
from .engine import Runner, run_to_end
from .errors import LanechatError
from .kv import snapshots
from .settings import EngineSettings, SamplingParams

CHATS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain recursion to a child in two sentences.",
    "List three prime numbers greater than 100.",
    "def fib(n):\n    # complete this function",
    "Translate 'good morning' into German, Spanish and Italian.",
    "Why is the sky blue?",
    "Summarize the plot of Hamlet in one line.",
    "Give me a short packing list for a weekend hike.",
    "What does HTTP 404 mean?",
]
FILLER = ("The quick brown fox jumps over the lazy dog while the committee reviews its quarterly numbers, "
          "and every page of the report carries a footnote about memory, latency and bandwidth. ")

# (name, paging, page_tokens): the reference first.
ARMS = [("contiguous", "off", 256), ("pages p16", "pages", 16), ("pages p256", "pages", 256),
        ("all p16", "all", 16), ("all p256", "all", 256)]
QUICK_ARMS = [ARMS[0], ARMS[1], ARMS[3]]
GROUPS = (1, 2, 4, 8)
DRAFTERS = ("ngram", "mtp", "dflash2", "oracle")
FOLLOW_UP = "\nAnd what follows from that? Answer in one line."
FOLLOW_UPS = 2  # prompts continued by a follow-up turn, per arm
PROMPT_CACHE_GIB = 0.5  # the paged arms' prompt cache for the "cache hit == cold" row


def sha(tokens: list[int]) -> str:
    return hashlib.sha256(np.asarray(tokens, np.int32).tobytes()).hexdigest()


def prompt_set(runner: Runner, chats: list[list[dict]], context: int, max_tokens: int) -> list[list[int]]:
    """Chat prompts as ids, plus id prompts ending at, just after and well past page boundaries."""
    tok = runner.tokenizer
    prompts = [tok.encode_chat(c) for c in chats]
    long = tok.encode_chat([{"role": "user", "content": FILLER * 40}])
    for p in (16, 256):
        for n in (p, p + 1, 2 * p + p // 2):
            if n + max_tokens < context:
                prompts.append(long[:n])
    return prompts


def fitting(runner: Runner, names: tuple[str, ...], drafter_model: str | None = None) -> list[str]:
    """The drafters of `names` that fit the loaded model (DFlash2: the checkpoint `drafter_model`)."""
    fit = [d for d in names if drafters.fit(runner.loaded.config, d, drafter_model).drafter == d]
    s = EngineSettings(drafter="dflash2", drafter_model=drafter_model)
    return [d for d in fit if d != "dflash2" or runner.drafter_weights(s)[0] is not None]


def offset_prompts(runner: Runner, offsets: list[int]) -> list[list[int]]:
    """Long prompts ending exactly at these positions (the seed's resume offsets)."""
    tok = runner.tokenizer
    unit = tok.encode(FILLER)
    long = tok.encode_chat([{"role": "user", "content": FILLER}])
    while len(long) < max(offsets):
        long += unit
    return [long[:n] for n in offsets]


def run_arm(runner: Runner, s: EngineSettings, prompts: list[list[int]], max_tokens: int,
            drafted: tuple[str, ...] = (), draft_tokens: int = 3, long_only: bool = False) -> dict[tuple, str]:
    """Every output of one arm, keyed ('solo', i), ('conc', n, i), ('resume', i), ('sampled', ...),
    ('follow', i), ('disk', i), ('cache', i), and per drafter ('drafted', name, 'solo' | 'conc' |
    'sampled', i). `long_only`: solo, follow-ups and the prompt cache."""
    sched = runner.scheduler(s)
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    hot = SamplingParams(temperature=1.0, top_p=1.0, top_k=0, max_tokens=max_tokens, seed=1234, ignore_eos=True)
    out: dict[tuple, str] = {}
    rid = iter(range(1, 1 << 30))

    def go(ids: list[list[int]], params: SamplingParams, on=None, **kw) -> list:
        seqs = [runner.sequence(next(rid), s, None, params, lambda e: None, p, **kw) for p in ids]
        run_to_end(on or sched, seqs)
        return seqs

    half = replace(greedy, max_tokens=max_tokens // 2)
    if long_only:
        for i, p in enumerate(prompts):
            out[("solo", i)] = sha(go([p], greedy)[0].tokens)
        out.update(follow_ups(runner, s, sched, prompts, go, greedy, half))
        out.update(cache_hits(runner, s, prompts, greedy))
        return out
    plain = {}
    for i, p in enumerate(prompts):
        plain[i] = go([p], greedy)[0].tokens
        out[("solo", i)] = sha(plain[i])
    for n in GROUPS:
        for i, seq in enumerate(go(prompts[:n], greedy)):
            out[("conc", n, i)] = sha(seq.tokens)
    # Resumes: stop half-way with a snapshot, continue from it on whichever lane is free.
    for i, p in enumerate(prompts[: len(prompts) // 2]):
        first = go([p], half, snapshot_at_end=True)[0]
        snap = sched.snapshots.pop(first.id)
        out[("resume", i)] = sha(go([None], greedy, resume=snap)[0].tokens)
    for i, seq in enumerate(go(prompts[:4], hot)):
        out[("sampled", i)] = sha(seq.tokens)
        plain[("sampled", i)] = seq.tokens
    for name in drafted:
        ds = runner.scheduler(replace(s, drafter=name, draft_tokens=draft_tokens))
        if name == "oracle":
            for tokens in plain.values():
                ds.verifier.drafter.learn(tokens)
        for i, p in enumerate(prompts):
            out[("drafted", name, "solo", i)] = sha(go([p], greedy, ds)[0].tokens)
        for i, seq in enumerate(go(prompts[:4], greedy, ds)):
            out[("drafted", name, "conc", i)] = sha(seq.tokens)
        for i, seq in enumerate(go(prompts[:4], hot, ds)):
            out[("drafted", name, "sampled", i)] = sha(seq.tokens)
    out.update(follow_ups(runner, s, sched, prompts[:FOLLOW_UPS], go, greedy, half))
    out.update(cache_hits(runner, s, prompts, greedy))
    return out


def follow_ups(runner: Runner, s: EngineSettings, sched, prompts: list[list[int]], go, greedy: SamplingParams,
               half: SamplingParams) -> dict:
    """The next prompt extends a finished turn; its snapshot continues it, once as it left the
    engine and once after a round trip through a file."""
    out = {}
    follow = runner.tokenizer.encode(FOLLOW_UP)
    with tempfile.TemporaryDirectory(prefix="lanechat-gates-") as tmp:
        for i, p in enumerate(prompts):
            first = go([p], half, snapshot_at_end=True)[0]
            snap = sched.snapshots.pop(first.id)
            path = Path(tmp) / f"{i}.kv"
            snapshots.save(path, snap, runner.fingerprint, s.page_tokens)
            disk = snapshots.load(path, runner.fingerprint, s.kv_dtype, runner.backend.landing())  # as the app
            ids = first.tokens + follow
            out[("follow", i)] = sha(go([ids], greedy, resume=snap)[0].tokens)
            out[("disk", i)] = sha(go([ids], greedy, resume=disk)[0].tokens)
    return out


def cache_granule(runner: Runner, s: EngineSettings) -> int:
    """The largest prompt-cache granule of any arm: hits land on multiples of max(chunk, page)."""
    return max(s.with_chunk(runner.backend.prompt_chunk).prefill_chunk, *(page for _, _, page in ARMS))


def shared_prefixes(runner: Runner, prompts: list[list[int]], granule: int, room: int) -> list[list[int]]:
    """The longest prompt (lengthened with filler past `granule`, so that it holds a hit, within
    `room` tokens), the same again, and it cut short with another ending: each after the first
    shares its prefix."""
    p = max(prompts, key=len)
    if len(p) <= granule:
        filler = runner.tokenizer.encode(FILLER)
        p = (p + filler * (granule // len(filler) + 2))[: min(granule + granule // 4, max(room, len(p)))]
    return [p, list(p), p[: len(p) * 3 // 4] + runner.tokenizer.encode(FOLLOW_UP)]


def cache_hits(runner: Runner, s: EngineSettings, prompts: list[list[int]], greedy: SamplingParams) -> dict:
    """Prompts sharing prefixes, one after another: through the prompt cache on a paged arm, cold
    on the contiguous one. ('cache-reused',) counts the positions the cache gave."""
    ids = shared_prefixes(runner, prompts, cache_granule(runner, s), s.context - greedy.max_tokens - 1)
    cached = s.paging != "off"
    sched = runner.scheduler(replace(s, prompt_cache_gib=PROMPT_CACHE_GIB if cached else 0.0))
    out, reused = {}, 0
    for i, p in enumerate(ids):
        seq = runner.sequence(i + 1, s, None, greedy, lambda e: None, p)
        run_to_end(sched, [seq])
        out[("cache", i)] = sha(seq.tokens)
    if cached:
        reused = sched.prompt_cache.reused
    out[("cache-reused",)] = reused
    return out


def compare(ref: dict, arms: dict[str, dict]) -> dict[str, tuple[int, int]]:
    """Gate rows: (passed, total) over the arms each row speaks of."""
    rows: dict[str, list[bool]] = {}

    def add(row: str, ok: bool) -> None:
        rows.setdefault(row, []).append(ok)

    for name, out in arms.items():
        for key, h in out.items():
            kind = key[0]
            if kind == "solo":
                if name != "contiguous":
                    add(f"{name.split()[0]} == contiguous (solo)", h == ref[key])
            elif kind == "conc":
                add("concurrent 1/2/4/8 == solo", h == ref[("solo", key[2])])
            elif kind == "resume":
                add("resumed == uninterrupted", h == ref[("solo", key[1])])
            elif kind == "sampled":
                add("sampled T 1.0: every arm == contiguous", h == ref[key])
            elif kind == "drafted":
                _, drafter, how, i = key
                plain = ref[("sampled", i)] if how == "sampled" else ref[("solo", i)]
                add(f"drafted == plain: {drafter} (solo, 4 at once, T 1.0)", h == plain)
            elif kind == "follow":
                add("follow-up turn: every arm == contiguous", h == ref[key])
            elif kind == "cache" and name != "contiguous":
                add("prompt-cache hit == cold", h == ref[key] and out[("cache-reused",)] > 0)
            elif kind == "disk":
                add("resumed from disk == uninterrupted", h == out[("follow", key[1])] == ref[("follow", key[1])])
    return {row: (sum(v), len(v)) for row, v in rows.items()}


def run(settings: EngineSettings, chats: list[list[dict]], max_tokens: int, quick: bool, log=print,
        drafted: tuple[str, ...] = (), draft_tokens: int = 3, offsets: list[int] | None = None,
        dtypes: tuple[str, ...] = ("bf16", "fp8")):
    """The table as {column: {row: (passed, total)}} for bf16 and fp8 KV; `drafted`: the drafters
    to gate (those that fit the model run). With `offsets`, long prompts ending there instead of
    the chats (solo, follow-up and prompt-cache rows only)."""
    runner = Runner(settings, log=log)
    drafted = tuple(fitting(runner, drafted, settings.drafter_model))
    arms = QUICK_ARMS if quick else ARMS
    if offsets:
        if max(offsets) + 2 * max_tokens + len(runner.tokenizer.encode(FOLLOW_UP)) >= settings.context:
            raise LanechatError(f"offsets up to {max(offsets)} and their follow-ups need a context above "
                                f"{settings.context}; raise --context")
        prompts = offset_prompts(runner, offsets)
    else:
        prompts = prompt_set(runner, chats, settings.context, max_tokens)
    granule = cache_granule(runner, settings)
    if len(shared_prefixes(runner, prompts, granule, settings.context - max_tokens - 1)[0]) <= granule:
        raise LanechatError(f"the prompt-cache row needs a prompt past {granule} tokens (the largest prefill chunk "
                            f"or page) and {max_tokens} tokens after it; raise --context above "
                            f"{granule + granule // 4 + max_tokens}")
    table = {}
    for dtype in dtypes:
        outs = {}
        for name, paging, page in arms:
            t = time.perf_counter()
            s = replace(settings, kv_dtype=dtype, paging=paging, page_tokens=page)
            outs[name] = run_arm(runner, s, prompts, max_tokens, drafted, draft_tokens, long_only=bool(offsets))
            dt = time.perf_counter() - t
            log(f"gates: {runner.loaded.name} {dtype} {name}: {len(outs[name])} outputs in {dt:.1f} s")
        table[f"{runner.loaded.name} {dtype}"] = compare(outs["contiguous"], outs)
    return table


def render(table: dict) -> str:
    cols = list(table)
    rows = list(dict.fromkeys(r for col in table.values() for r in col))
    lines = ["gate\t" + "\t".join(cols)]
    for r in rows:
        lines.append(r + "\t" + "\t".join("%d/%d" % table[c].get(r, (0, 0)) for c in cols))
    return "\n".join(lines)


def passed(table: dict) -> bool:
    return all(p == t and t > 0 for col in table.values() for p, t in col.values())


def load_chats(path: str | None) -> list[list[dict]]:
    if not path:
        return [[{"role": "user", "content": c}] for c in CHATS]
    try:
        raw = jsonfile.read(path)
    except (OSError, ValueError) as e:
        raise LanechatError(f"{path}: not a readable JSON prompt file ({e})") from None
    ok = isinstance(raw, list) and raw and all(
        isinstance(c, list) and c and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                          and isinstance(m.get("content"), str) for m in c) for c in raw)
    if not ok:
        raise LanechatError(f"{path}: expected a JSON list of conversations, each a list of {{role, content}}")
    return raw


def main(a) -> int:
    synthetic = a.model is not None and a.model.startswith("synthetic:")
    s = EngineSettings(model=a.model, backend=a.backend, parallel=8, context=a.context, memory_gib=None,
                       prefill_precision=a.prefill_precision,
                       drafter_model=a.drafter_model or (SYNTHETIC if synthetic else None)).validate()
    names = DRAFTERS if a.drafter == "all" else () if a.drafter == "none" else (a.drafter,)
    table = run(s, load_chats(a.prompts), a.max_tokens, a.quick, log=lambda m: print(m, file=sys.stderr),
                drafted=names, draft_tokens=a.draft_tokens, offsets=a.offsets)
    print(render(table))
    ok = passed(table)
    print("gates: " + ("every cell passes" if ok else "FAILED"), file=sys.stderr)
    return 0 if ok else 1
