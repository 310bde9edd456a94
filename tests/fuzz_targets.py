"""The targets of `make fuzz` (tests/fuzz.py): each maker writes one mutated case under a folder and
returns a Case whose `run` exercises a public entry point the way the app or the CLI does.

`run` returns "valid" when the input was accepted and worked; it raises a LanechatError or
FormatError for a clean refusal; anything else it raises is a bug the runner counts. A case with
`must_refuse` is wrong if it is accepted (NaN temperature, a write to /dev/full).
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from engine.errors import LanechatError

import ckpt
import ckpt_gguf
import fuzz_files as ff


@dataclass
class Case:
    target: str
    what: str
    run: Callable[[], str]
    folder: Path
    must_refuse: bool = False


class BugError(Exception):
    """A stream failed with a Python exception inside the engine (its Failed message says so)."""


# --- bases, written once per run ---------------------------------------------------------------

def write_bases(root: Path) -> dict[str, Path]:
    root.mkdir(parents=True)
    bases: dict[str, Path] = {}
    for name, cfg, q in (("llama-q4_1", ckpt.tiny_llama_config(), "Q4_1"),
                         ("qwen3-q8_0", ckpt.tiny_qwen3_config(), "Q8_0"),
                         ("llama-f16", ckpt.tiny_llama_config(), "F16")):
        bases["gguf/" + name] = root / f"{name}.gguf"
        ckpt_gguf.write_gguf(bases["gguf/" + name], cfg, qtype=q)
    for name, arch in (("qwen35-q4_k_m", "qwen3_5"), ("qwen35moe-q4_k_m", "qwen3_5_moe")):  # K-quants, DeltaNet,
        bases["gguf/" + name] = root / f"{name}.gguf"  # the MTP head, experts
        ckpt_gguf.write_gguf(bases["gguf/" + name], ckpt.tiny_gguf_config(arch), qtype="Q4_K", mix=ckpt_gguf.MIX_Q4_K_M)
    for name, cfg in (("llama", ckpt.tiny_llama_config()), ("qwen3", ckpt.tiny_qwen3_config()),
                      ("qwen3_5", ckpt.tiny_qwen3_5_config()), ("qwen3_5_moe", ckpt.tiny_qwen3_5_moe_config())):
        bases["hf/" + name] = root / f"hf-{name}"
        ckpt.write_hf(bases["hf/" + name], cfg)
    from engine.config import ModelConfig
    bases["dflash2/qwen3_5"] = root / "dflash2-qwen3_5"  # a drafter for hf/qwen3_5
    ckpt.write_dflash2(bases["dflash2/qwen3_5"], ModelConfig.from_hf(ckpt.tiny_qwen3_5_config()))
    for name, cfg, bits in (("qwen3_5-4bit", ckpt.tiny_qwen3_5_config(), 4),
                            ("llama-8bit", ckpt.tiny_llama_config(), 8)):
        bases["mlx/" + name] = root / f"mlx-{name}"
        ckpt.write_mlx(bases["mlx/" + name], cfg, bits=bits)
    return bases


def run_model(path: Path) -> str:
    """List, describe, plan and generate two tokens on the numpy backend, as the app would."""
    from engine import EngineSettings, SamplingParams, describe_model, installed, model_sampling_defaults, plan
    from engine.engine import Runner, run_to_end
    from engine.events import Failed
    s = EngineSettings(model=str(path), backend="numpy", parallel=1, context=256, paging="off", memory_gib=0.25)
    installed.listing(path.parent)  # the models page: an unreadable model is listed with its error
    model_sampling_defaults(str(path))
    describe_model(str(path))
    p = plan(s)
    if not p.fits:
        raise LanechatError(p.error)
    runner = Runner(s, log=lambda m: None)
    seq = runner.sequence(1, s, [{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=2),
                          lambda e: None)
    end = run_to_end(runner.scheduler(s), [seq])[1]
    if isinstance(end, Failed):
        raise (BugError if end.message.startswith("engine error") else LanechatError)(end.message)
    return "valid"


# --- model files -------------------------------------------------------------------------------

def gguf_case(rng: random.Random, bases: dict, folder: Path) -> Case:
    src = bases[rng.choice([k for k in bases if k.startswith("gguf/")])]
    dst = folder / "model.gguf"
    what = ff.mutate_gguf(rng, src, dst)
    return Case("gguf", f"{src.name}: {what}", lambda: run_model(dst), folder)


HF_FOCUS = [("num_hidden_layers",), ("vocab_size",), ("num_attention_heads",), ("num_key_value_heads",),
            ("hidden_size",), ("head_dim",), ("rope_theta",), ("max_position_embeddings",), ("rms_norm_eps",),
            ("tie_word_embeddings",), ("intermediate_size",), ("model_type",), ("rope_parameters",),
            ("text_config", "layer_types"), ("text_config", "layer_types", 0), ("text_config", "num_hidden_layers"),
            ("text_config", "linear_num_value_heads"), ("text_config", "linear_conv_kernel_dim"),
            ("text_config", "num_experts"), ("text_config", "num_experts_per_tok"),
            ("text_config", "rope_parameters", "partial_rotary_factor"), ("text_config", "full_attention_interval"),
            ("text_config", "mtp_num_hidden_layers"), ("quantization", "bits"), ("quantization", "group_size"),
            ("quantization", "mode"), ("text_config",), ("quantization",)]
TOKENIZER_FOCUS = [("chat_template",), ("eos_token",), ("bos_token",), ("eos_token", "content")]


def folder_case(rng: random.Random, bases: dict, folder: Path, kind: str) -> Case:
    key = rng.choice([k for k in bases if k.startswith(kind + "/")])
    model = folder / "model"
    shutil.copytree(bases[key], model)
    what = _mutate_folder(rng, model)
    return Case(kind, f"{key}: {what}", lambda: run_model(model), folder)


def _mutate_folder(rng: random.Random, model: Path) -> str:
    r = rng.random()
    if r < 0.35:
        return "config.json " + _edit_json(rng, model / "config.json", HF_FOCUS)
    if r < 0.45:
        return "tokenizer_config.json " + _edit_json(rng, model / "tokenizer_config.json", TOKENIZER_FOCUS)
    if r < 0.55:
        gen = {"bos_token_id": 1, "eos_token_id": rng.choice([[[2]], None, 2.0, -1, [2, "x"], 10**9, [True], "2",
                                                              list(range(5000)), {"id": 2}])}
        (model / "generation_config.json").write_text(json.dumps(gen))
        return f"generation_config eos_token_id = {ff._short(gen['eos_token_id'])}"
    if r < 0.6:
        cfg = json.loads((model / "config.json").read_text())
        (cfg.get("text_config") or cfg)["num_hidden_layers"] = 2_000_000
        (model / "config.json").write_text(json.dumps(cfg))
        (model / "generation_config.json").write_text(json.dumps({"eos_token_id": list(range(2_000_000))}))
        return "num_hidden_layers 2,000,000 and a 20 MB generation_config"
    if r < 0.75:
        return "model.safetensors " + ff.mutate_safetensors(rng, model / "model.safetensors")
    if r < 0.8:
        (model / "model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": rng.choice([{"model.norm.weight": "../../etc/passwd"}, [], {"x": 1},
                                       {"model.norm.weight": "missing.safetensors"}])}))
        return "a lying shard index"
    name = rng.choice([n for n in ("config.json", "tokenizer_config.json", "generation_config.json", "tokenizer.json")
                       if (model / n).is_file()])
    data, what = ff.mutate_json_text(rng, (model / name).read_text())
    (model / name).write_bytes(data)
    return f"{name} {what}"


def _edit_json(rng: random.Random, path: Path, focus: list[tuple]) -> str:
    obj = json.loads(path.read_text())
    what = ff.mutate_json_value(rng, obj, focus)
    path.write_text(ff.dump(obj))
    return what


DFLASH2_FOCUS = [("hidden_size",), ("num_hidden_layers",), ("num_attention_heads",), ("num_key_value_heads",),
                 ("head_dim",), ("intermediate_size",), ("vocab_size",), ("sliding_window",), ("layer_types",),
                 ("layer_types", 0), ("is_causal",), ("rope_parameters",), ("dflash_config",),
                 ("dflash_config", "block_size"), ("dflash_config", "mask_token_id"),
                 ("dflash_config", "target_layer_ids"), ("dflash_config", "target_layer_ids", 0),
                 ("dflash_config", "conv_kernel_size"), ("dflash_config", "conv_group_size"),
                 ("dflash_config", "selector_rank"), ("dflash_config", "selector_top_k"),
                 ("dflash_config", "output_multiplier"), ("dflash_config", "final_logit_softcapping")]


def dflash2_case(rng: random.Random, bases: dict, folder: Path) -> Case:
    """A mutated DFlash2 checkpoint as the drafter of hf/qwen3_5: refused at start (the plan says
    why, the engine runs plain), or drafting; either way two tokens come out."""
    drafter = folder / "drafter"
    shutil.copytree(bases["dflash2/qwen3_5"], drafter)
    if rng.random() < 0.5:
        what = "config.json " + _edit_json(rng, drafter / "config.json", DFLASH2_FOCUS)
    else:
        what = "model.safetensors " + ff.mutate_safetensors(rng, drafter / "model.safetensors")
    return Case("dflash2", what, lambda: run_drafter(bases["hf/qwen3_5"], drafter), folder)


def run_drafter(model: Path, drafter: Path) -> str:
    from engine import EngineSettings, SamplingParams
    from engine.engine import Runner, run_to_end
    from engine.events import Failed
    s = EngineSettings(model=str(model), backend="numpy", parallel=1, context=256, paging="off", memory_gib=0.25,
                       drafter="dflash2", drafter_model=str(drafter), draft_tokens=7)
    runner = Runner(s, log=lambda m: None)
    sched = runner.scheduler(s)
    seq = runner.sequence(1, s, [{"role": "user", "content": "hi"}], SamplingParams(temperature=0, max_tokens=4),
                          lambda e: None)
    end = run_to_end(sched, [seq])[1]
    if isinstance(end, Failed):
        raise (BugError if end.message.startswith("engine error") else LanechatError)(end.message)
    if seq.draft is not None:  # the drafter raised mid-stream: a checkpoint the loader let through
        raise BugError(f"the drafter failed on a checkpoint it accepted ({sched.plan.line})")
    if sched.verifier is None:
        raise LanechatError(sched.plan.drafter_note)  # refused at start, the engine plain: a clean refusal
    return "valid"


# --- chat templates ----------------------------------------------------------------------------

SENTINEL = "/tmp/lanechat-fuzz-pwned"
TEMPLATES = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{{ ' ' * 10**9 | center }}", "{{ (' ' * 10**8) * 20 }}", "{{ 'x' | center(10**9) }}",
    "{{ '(' * 10000 }}", "{{ " + "(" * 10_000 + "1" + ")" * 10_000 + " }}",
    "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.system('touch " + SENTINEL + "') }}",
    "{{ lipsum.__globals__['os'].popen('touch " + SENTINEL + "').read() }}",
    "{{ joiner.__init__.__globals__ }}", "{{ self.__dict__ }}", "{{ namespace.__init__.__globals__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}", "{% include 'x' %}", "{% extends 'base' %}",
    "{% import 'os' as os %}", "{{ raise_exception('line one\\nline two\\n\\tthree') }}",
    "{{ messages | tojson(indent=10**8) }}", "{{ '%999999999d' | format(1) }}", "{{ 'a b' | indent(10**9) }}",
    "{{ 'x' | wordwrap(1) * 1000 }}", "{{ strftime_now('%Y' * 1000000) }}", "{{ range(10**9) | list }}",
    "{{ 10 ** 10 ** 10 ** 10 }}", "{% for %}", "{{ messages[0]['content'] + 1 }}", "{{ bos_token }}{{ undefined.x }}",
    "{% for m in messages %}{{ m['role'] }}{{ m['content'] }}{% endfor %}", ckpt.CHAT_TEMPLATE, "",
]


def template_case(rng: random.Random, bases: dict, folder: Path) -> Case:
    if rng.random() < 0.6:
        template = rng.choice(TEMPLATES)
        what = ff._short(template)
    else:  # a real template with a few characters changed
        chars = list(ckpt.CHAT_TEMPLATE)
        for _ in range(rng.randint(1, 6)):
            chars[rng.randrange(len(chars))] = rng.choice("{}%()[]'\"|.~ x")
        template, what = "".join(chars), "mangled SmolLM2 template"
    where = rng.choice(["tokenizer_config", "jinja", "list", "gguf"])
    if where == "gguf":
        kvs, tensors = ff.read_gguf(bases["gguf/llama-q4_1"])
        kvs = [kv for kv in kvs if kv.key != "tokenizer.chat_template"]
        kvs.append(ff.KV("tokenizer.chat_template", ff.STR, template))
        path = folder / "model.gguf"
        ff.write_gguf(path, kvs, tensors)

        def load():
            from engine.loader import gguf
            return gguf.tokenizer(path)
    else:
        path = folder / "tok"
        path.mkdir()
        ckpt.write_tokenizer(path, chat_template=None if where == "jinja" else template)
        if where == "jinja":
            (path / "chat_template.jinja").write_text(template)
        if where == "list":
            tc = json.loads((path / "tokenizer_config.json").read_text())
            tc["chat_template"] = [{"name": "default", "template": template}, rng.choice([{"name": 1}, "x", None])]
            (path / "tokenizer_config.json").write_text(json.dumps(tc))

        def load():
            from engine.tokenizer import Tokenizer
            return Tokenizer.from_folder(path)

    def run() -> str:
        try:
            load().encode_chat([{"role": "system", "content": "sys"}, {"role": "user", "content": "hi \ud800"}],
                               limit=4096)  # as the engine asks: the tokens its context can take
        except LanechatError as e:
            if "\n" in str(e):
                raise BugError(f"a refusal of several lines: {str(e)[:80]!r}") from None
            raise
        finally:
            if os.path.exists(SENTINEL):
                os.unlink(SENTINEL)
                raise BugError("the template ran code outside the sandbox")
        return "valid"
    return Case("template", f"{where}: {what}", run, folder)


# --- requests ----------------------------------------------------------------------------------

REQUEST_VALUES = {
    "temperature": [math.nan, math.inf, -1.0, -0.0, 1e9, "0.5", None, True, 0.0, 0.7],
    "top_p": [0.0, 1.5, math.nan, -0.1, 1, 0.9, "1", None],
    "top_k": [-1, 10**20, 1.5, "4", None, 0, 40],
    "max_tokens": [0, -1, 10**12, 2.5, "3", None, 2],
    "seed": [-1, 2**64, 2**70, "1", 1.0, None, 7],
    "stop": [[1], "x", [""], ["a"] * 1000, None, ["\n"], [["x"]]],
    "ignore_eos": ["yes", 1, None, True],
}
MESSAGES = [
    "not a list", [{"role": "user"}], [{"role": "user", "content": 5}], [{"content": "x"}], [["user", "x"]],
    [{"role": "user", "content": "lone \ud800 surrogate"}], [{"role": "user", "content": os.fsdecode(b"bad \xff\xfe")}],
    [{"role": "user", "content": "x" * 200_000}], [], [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "\udcff" * 10}, {"role": "user", "content": "hi"}], None,
]
PROMPT_IDS = [[-1], [10**9], [1.5], ["1"], [], [True], None, [1, 2, 3], list(range(300)), [2**63]]
THINKING = [None, None, True, False, "yes", 1, 0.0]
REASONING = [None, "thought", 5, ["x"], "\ud800", ""]


def request_case(rng: random.Random, runner, settings, folder: Path) -> Case:
    from engine import SamplingParams
    kw = {k: v for k, v in SamplingParams().__dict__.items()}
    kw.update(temperature=0.0, max_tokens=2)
    changed = rng.sample(sorted(REQUEST_VALUES), rng.randint(0, 2))
    for k in changed:
        kw[k] = rng.choice(REQUEST_VALUES[k])
    params = SamplingParams(**{k: v for k, v in kw.items() if v is not None})
    bad = [k for k in changed if not _fine(k, kw[k])]
    messages, ids = rng.choice(MESSAGES), None
    if rng.random() < 0.3:
        ids, messages = rng.choice(PROMPT_IDS), None
    thinking = rng.choice(THINKING)
    reasoning = rng.choice(REASONING) if isinstance(messages, list) and rng.random() < 0.3 else None
    bad_input = (ids is not None and not _fine_ids(ids)) or (ids is None and not _fine_messages(messages)) \
        or not isinstance(thinking, (bool, type(None))) or not isinstance(reasoning, (str, type(None)))
    what = f"sampling {', '.join(f'{k}={ff._short(kw[k])}' for k in changed) or 'plain'}; " + (
        f"prompt_ids {ff._short(ids)}" if ids is not None else f"messages {ff._short(messages)}") + (
        f"; thinking {thinking!r}" if thinking is not None else "") + (
        f"; after a reply with reasoning_content {ff._short(reasoning)}" if reasoning is not None else "")
    if reasoning is not None:  # an earlier reply's thinking, sent back for the template to keep or drop
        messages = [{"role": "assistant", "content": "", "reasoning_content": reasoning}] + messages

    def run() -> str:
        from engine.engine import run_to_end
        from engine.events import Failed
        seq = runner.sequence(1, settings, messages, params, lambda e: None, ids, thinking=thinking)
        end = run_to_end(runner.scheduler(settings), [seq])[1]
        if isinstance(end, Failed):
            raise (BugError if end.message.startswith("engine error") else LanechatError)(end.message)
        return "valid"
    return Case("request", what, run, folder, must_refuse=bool(bad) or bad_input)


def _fine(key: str, value) -> bool:
    if value is None:
        return True  # left at its default
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return {"temperature": number and 0 <= value <= 100, "top_p": number and 0 < value <= 1,
            "top_k": isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**31,
            "max_tokens": isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 2**24,
            "seed": isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64,
            "stop": isinstance(value, list) and len(value) <= 16 and all(isinstance(s, str) and s for s in value),
            "ignore_eos": isinstance(value, bool)}[key]


def _fine_ids(ids) -> bool:
    return bool(ids) and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 320 for t in ids) \
        and len(ids) < 64


def _fine_messages(messages) -> bool:
    return isinstance(messages, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                              and isinstance(m.get("content"), str) for m in messages) \
        and sum(len(m["content"]) for m in messages) < 20


# --- KV snapshot files ---------------------------------------------------------------------------

def write_snapshot(root: Path, runner, settings) -> Path:
    """A snapshot of one finished turn of the shared runner, as the app writes one."""
    from engine import SamplingParams
    from engine.engine import run_to_end
    from engine.kv import snapshots
    sched = runner.scheduler(settings)
    seq = runner.sequence(1, settings, None, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                          lambda e: None, [1] + list(range(20, 50)), snapshot_at_end=True)
    run_to_end(sched, [seq])
    path = root / "c.kv"
    snapshots.save(path, sched.snapshots.pop(1), runner.fingerprint, settings.page_tokens)
    return path


SNAPSHOT_META = {"n": ["0", "-1", "1", "9999", "x", ""], "prompt_len": ["-3", "0", "9999", "x"],
                 "kv_layers": ["0", "1", "99", "-1"], "state_layers": ["1", "7"], "kv_dtype": ["fp8", "f32", ""],
                 "page_tokens": ["0", "x"], "version": ["2"], "format": ["x"]}


def snapshot_case(rng: random.Random, bases: dict, runner, settings, folder: Path) -> Case:
    """A snapshot file damaged, or rewritten with a consistent checksum so that only its contents lie."""
    import numpy as np

    from engine.kv import snapshots
    path = folder / "c.kv"
    shutil.copy(bases["snapshot"], path)
    r, what = rng.random(), ""
    if r < 0.3:
        what = "snapshot " + ff.mutate_raw_bytes(rng, path)

    def change(meta: dict, tensors: dict) -> None:
        nonlocal what
        if r < 0.55:
            key = rng.choice(sorted(SNAPSHOT_META))
            meta[key] = rng.choice(SNAPSHOT_META[key])
            what = f"header {key} = {meta[key]!r}"
            return
        name = rng.choice(sorted(tensors))
        a = tensors[name]
        kind = rng.choice(["rows", "width", "dtype", "drop", "extra", "ids"])
        if kind == "rows":
            fewer = a[: max(len(a) - rng.randint(1, 3), 0)]
            tensors[name] = fewer if rng.random() < 0.5 else np.concatenate([a, a])
        elif kind == "width" and a.ndim > 1:
            tensors[name] = np.ascontiguousarray(a[..., :1] if rng.random() < 0.5 else np.concatenate([a, a], -1))
        elif kind == "dtype":
            tensors[name] = a.astype(rng.choice([np.float32, np.uint8, np.int64, np.float16]))
        elif kind == "drop":
            tensors.pop(name)
        elif kind == "extra":
            tensors[rng.choice(["kv.99.0", "state.5.0", "kv.0.9", "junk"])] = np.zeros(4, np.float32)
        else:
            tensors["tokens"] = np.asarray(rng.choice([[-1] * len(a), [10**9] * len(a), [1]]), np.int32)
        what = f"tensor {name}: {kind}"
    if r >= 0.3:
        ff.rewrite_snapshot(path, change)
    follow = rng.random() < 0.5

    def run() -> str:
        from engine import SamplingParams
        from engine.engine import run_to_end
        from engine.events import Failed
        snap = snapshots.load(path, runner.fingerprint, settings.kv_dtype)
        ids = snap.tokens + [5, 6] if follow else None
        seq = runner.sequence(1, settings, None, SamplingParams(temperature=0, max_tokens=2), lambda e: None, ids,
                              resume=snap)
        end = run_to_end(runner.scheduler(settings), [seq])[1]  # the scheduler checks the snapshot fits
        if isinstance(end, Failed):
            raise (BugError if end.message.startswith("engine error") else LanechatError)(end.message)
        return "valid"
    return Case("snapshot", what + ("; a follow-up turn" if follow else "; resumed alone"), run, folder)


# --- the OpenAI API's request bodies ------------------------------------------------------------

API_FOCUS = [("messages",), ("messages", 0), ("messages", 0, "content"), ("messages", 0, "role"),
             ("messages", 2, "content", 0), ("messages", 2, "content", 0, "text"), ("messages", 1, "reasoning_content"),
             ("prompt",), ("prompt", 0), ("max_tokens",), ("max_completion_tokens",), ("temperature",), ("top_p",),
             ("top_k",), ("seed",), ("stop",), ("n",), ("stream",), ("stream_options",),
             ("stream_options", "include_usage"), ("chat_template_kwargs",),
             ("chat_template_kwargs", "enable_thinking"), ("ignore_eos",), ("model",), ("response_format",),
             ("logprobs",), ("best_of",), ("echo",)]


def api_case(rng: random.Random, runner, settings, folder: Path) -> Case:
    """A chat or completion body with one value changed, parsed as the server does and run."""
    from engine.server.protocol import parse_chat, parse_completion
    chat = rng.random() < 0.6
    stream = rng.random() < 0.5
    body: dict = {"model": "tiny", "max_tokens": 2, "temperature": 0, "top_p": 1.0, "top_k": 0, "seed": 1, "n": 1,
                  "stop": ["\n\n"], "ignore_eos": False, "stream": stream,
                  **({"stream_options": {"include_usage": True}} if stream else {})}
    if chat:
        body["chat_template_kwargs"] = {"enable_thinking": False}
        body["messages"] = [{"role": "system", "content": "Be brief."},
                            {"role": "assistant", "content": "ok", "reasoning_content": "hm"},
                            {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    else:
        body["prompt"] = rng.choice(["Once upon", [1, 2, 3]])
    what = ff.mutate_json_value(rng, body, API_FOCUS) if rng.random() < 0.9 else "as it is"
    what = f"{'chat' if chat else 'completion'}: {what}"

    def run() -> str:
        from engine.engine import run_to_end
        from engine.events import Failed
        from engine.server.protocol import ApiError
        try:
            job = (parse_chat if chat else parse_completion)(body, settings.sampling, settings.context)
            ids = job.prompt_ids if job.prompt is None else runner.tokenizer.encode(job.prompt, add_special=True)
            seq = runner.sequence(1, settings, job.messages, job.sampling, lambda e: None, ids, thinking=job.thinking)
        except ApiError as e:
            if e.status != 400 or "\n" in e.message:
                raise BugError(f"answered {e.status}: {e.message[:80]!r}") from None
            raise LanechatError(e.message) from None
        end = run_to_end(runner.scheduler(settings), [seq])[1]
        if isinstance(end, Failed):
            raise (BugError if end.message.startswith("engine error") else LanechatError)(end.message)
        return "valid"
    return Case("api", what, run, folder)


# --- the command line --------------------------------------------------------------------------

CLI_BAD = {
    "--prompt-ids": ["a,b", "1.5", "", "-1", "99999999999999999999", "1,,x", "1;2"],
    "--prompt-lengths": ["abc", "0", "-5", "1e3", ""],
    "--streams": ["0", "x", "100000"],
    "--memory-gib": ["nan", "inf", "-1", "0", "1e300", "-inf", "x"],
    "--prefill-chunk": [str(2**30), "0", "3", "-8", "x", "1e9"],
    "--parallel": ["0", str(10**9), "x", "-1", "1.5"],
    "--context": ["0", "15", str(2**40), "x"],
    "--kv-pages": ["0", "17", str(2**40), "x"],
    "--temperature": ["nan", "-1", "inf", "x"],
    "--top-p": ["0", "2", "nan", "-0.5"],
    "--top-k": ["-1", "x", "1.5"],
    "--seed": ["-1", str(2**70), "x"],
    "--max-tokens": ["0", "-1", str(10**20), "x"],
    "--prompt": [os.fsdecode(b"\xff\xfe bad"), "\ud800"],
    "--system": [os.fsdecode(b"caf\xe9")],
    "--drafter": ["x", "", "oracle"],
    "--draft-tokens": ["0", "17", "x", "-1", "2.5"],
    "--prompt-cache-gib": ["nan", "-1", "inf", "x", "1e300"],
    "--kv-dtype": ["fp16", ""],
    "--port": ["-1", "65536", "99999", "x", "80.5"],
    "--max-body-mib": ["nan", "inf", "0", "-1", "x", "1e300"],
    "--max-waiting": ["-1", "x", str(2**40)],
    "--host": [os.fsdecode(b"\xff"), "", "bad host\n", "nohost.invalid"],
    "--api-key": [os.fsdecode(b"k\xff")],
    "--streams ": ["abc", "0", "-1", "1,,x"],  # bench-serve's (the trailing space keeps it apart from bench's)
    "--max-tokens ": ["0", "-1", "x"],
    "--history": ["0", "x", "", "-5"],
    "--runs": ["-1", "21", "x"],
}
# Commands that run until stopped or for long: only refusals are tried on them (a refusal that does
# not come is a hang, which is what it would be for a person too).
REFUSE_ONLY = ("serve", "bench-serve", "bench-resume", "bench-start")


def cli_case(rng: random.Random, bases: dict, folder: Path, tiny: str) -> Case:
    cmd = rng.choice(["generate", "logits", "plan", "bench", "serve", "bench-serve", "bench-resume", "bench-start",
                      "write-synthetic"])
    out = folder / "l.npy"
    small = ["--model", tiny, "--context", "256"]
    argv = {"generate": ["generate", *small, "--prompt", "hi", "--max-tokens", "2"],
            "logits": ["logits", *small, "--prompt-ids", "1,2,3", "--out", str(out)],
            "plan": ["plan", *small],
            "bench": ["bench", "--synthetic", "tiny-llama", "--prompt-lengths", "8", "--streams", "1",
                      "--decode-tokens", "2", "--parallel", "1", "--context", "64"],
            "serve": ["serve", *small, "--port", "0"],
            "bench-serve": ["bench-serve", *small, "--streams", "1", "--max-tokens", "2"],
            "bench-resume": ["bench-resume", "--synthetic", "tiny-llama", "--context", "256", "--history", "32"],
            "bench-start": ["bench-start", *small, "--runs", "0"],
            "write-synthetic": ["write-synthetic", "tiny-llama", str(folder / "written")]}[cmd]
    argv += [] if cmd in ("plan", "write-synthetic") else ["--backend", "numpy"]
    kv = ["--memory-gib", "--prefill-chunk", "--parallel", "--context", "--kv-pages", "--drafter", "--draft-tokens",
          "--prompt-cache-gib", "--kv-dtype"]
    allowed = {"generate": kv + ["--temperature", "--top-p", "--top-k", "--seed", "--max-tokens", "--prompt",
                                 "--system"],
               "logits": kv + ["--prompt-ids"], "plan": kv, "bench": ["--prompt-lengths", "--streams", *kv],
               "serve": ["--port", "--max-body-mib", "--max-waiting", "--host", "--api-key", *kv],
               "bench-serve": ["--streams ", "--max-tokens ", *kv], "bench-resume": ["--history", *kv],
               "bench-start": ["--runs", *kv], "write-synthetic": []}[cmd]
    must_refuse, what = False, f"{cmd} as it is"
    r = 0.5 if cmd in REFUSE_ONLY else rng.random()
    if cmd == "write-synthetic":
        dest = rng.choice(["/dev/full/x", "/proc/x", str(folder / "child.log"), str(folder / "written")])
        argv = ["write-synthetic", rng.choice(["tiny-llama", "nope", ""]), dest]
        must_refuse = argv[1] != "tiny-llama" or dest != str(folder / "written")
        what = f"write-synthetic {argv[1]!r} {dest!r}"
    elif r > 0.95:
        pass
    elif cmd == "plan" and r < 0.3:  # a mutated Hugging Face config.json, read without any weights
        key = rng.choice([k for k in bases if k.startswith(("hf/", "mlx/"))])
        config = folder / "config.json"
        shutil.copy(bases[key] / "config.json", config)
        what = f"plan --config {key} " + _edit_json(rng, config, HF_FOCUS)
        argv = ["plan", "--config", str(config), "--context", "256"]
    elif r < 0.7:
        flag = rng.choice(allowed)
        value = rng.choice(CLI_BAD[flag])
        if flag == "--host":  # any address but loopback needs a key: let the address itself be what fails
            argv = _set_flag(argv, "--api-key", "k")
        if flag == "--drafter" and value == "oracle" and cmd == "bench":
            value = "x"  # bench takes the oracle
        argv, must_refuse = _set_flag(argv, flag.strip(), value), True
        what = f"{cmd} {flag.strip()} {value!r}"
    elif r < 0.85 and cmd == "logits":
        dest = rng.choice([str(folder / "missing" / "l.npy"), "/dev/full", str(folder), ""])
        argv, must_refuse = _set_flag(argv, "--out", dest), True
        what = f"logits --out {dest!r}"
    elif r < 0.95:
        model = rng.choice([str(folder / "nothing"), "/dev/null", str(folder), "synthetic:nope", ""])
        argv, must_refuse = _set_flag(argv, "--model", model), cmd != "bench"
        what = f"{cmd} --model {model!r}"

    def run() -> str:
        from engine.__main__ import main
        err = folder / "stderr"
        with open(err, "w") as f, open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            os.dup2(f.fileno(), 2)
            rc = main(argv)
        text = err.read_text(errors="replace")
        if "Traceback" in text:
            raise BugError(f"traceback on stderr (rc {rc}): {text.strip().splitlines()[-1][:120]}")
        if rc == 0:
            return "valid"
        errors = [ln for ln in text.splitlines() if ln.startswith("error: ")]
        if rc != 2 or len(errors) != 1:
            raise BugError(f"rc {rc} with {len(errors)} error lines: {text[:120]!r}")
        raise LanechatError(errors[0])
    return Case("cli", what, run, folder, must_refuse)


def _set_flag(argv: list[str], flag: str, value: str) -> list[str]:
    argv = list(argv)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    return argv
