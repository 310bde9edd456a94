"""The headless face of the engine: python -m engine
generate|logits|plan|gates|bench|bench-resume|bench-start|write-synthetic|serve|bench-serve|fetch-default|doctor.

Every argument is checked by its argparse type, so bad input is one line `error: ...` and exit code 2
before any work, like every other refusal.
"""
from __future__ import annotations

import argparse
import io
import math
import os
import re
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import LanechatError, RequestError
from .settings import (
    MAX_CONTEXT,
    MAX_DRAFT_TOKENS,
    MAX_MEMORY_GIB,
    MAX_PAGE_TOKENS,
    MAX_PARALLEL,
    MAX_PREFILL_CHUNK,
    MAX_TEMPERATURE,
    MAX_TOKEN_ID,
    MAX_TOKENS,
    PREFILL_PRECISIONS,
    EngineSettings,
    SamplingParams,
)

MAX_BODY_MIB, MAX_WAITING = 1024.0, 1 << 16  # serve: past these a value is a typo, not a setting


class UsageError(LanechatError):
    """A command line argparse refuses."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog.removeprefix('python -m engine').strip() or 'usage'}: {message}")


def whole(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be a whole number from {low} to {high}, got {text!r}")
        return value
    return parse


def power_of_two(low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        value = whole(low, high)(text)
        if value & (value - 1):
            raise argparse.ArgumentTypeError(f"must be a power of two from {low} to {high}, got {text!r}")
        return value
    return parse


def number(low: float, high: float, open_low: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (value > low if open_low else value >= low) or not value <= high:
            span = f"({low:g}, {high:g}]" if open_low else f"[{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"must be a number in {span}, got {text!r}")
        return value
    return parse


def whole_list(low: int, high: int) -> Callable[[str], list[int]]:
    """'1,2,3' → [1, 2, 3]: at least one whole number, each in [low, high]."""
    def parse(text: str) -> list[int]:
        parts = [t.strip() for t in text.split(",") if t.strip()]
        try:
            values = [int(t) for t in parts]
        except ValueError:
            values = []
        if not values or not all(low <= v <= high for v in values):
            raise argparse.ArgumentTypeError(f"must be comma-separated whole numbers from {low} to {high}, "
                                             f"got {text!r}")
        return values
    return parse


def text_arg(text: str) -> str:
    """Command-line text must be UTF-8 (Python hands undecodable bytes over as lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise argparse.ArgumentTypeError(f"is not UTF-8 text (byte 0x{ord(text[e.start]) & 0xFF:02x} at "
                                         f"character {e.start})") from None
    return text


def regex_arg(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise argparse.ArgumentTypeError(f"is not a regular expression ({e}): {text!r}") from None
    return text


def out_file(text: str) -> Path:
    path = Path(text)
    if path.is_dir() or not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a file in an existing folder")
    return path


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="GGUF file or model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"])


def add_kv(p: argparse.ArgumentParser, parallel: int = 1, context: int = 4096,
           drafters: tuple[str, ...] = ("none", "ngram", "mtp", "dflash2")) -> None:
    p.add_argument("--parallel", type=whole(1, MAX_PARALLEL), default=parallel,
                   help="streams that may generate at once")
    p.add_argument("--context", type=whole(16, MAX_CONTEXT), default=context, help="tokens per stream")
    p.add_argument("--kv-dtype", default="bf16", choices=["bf16", "fp8"])
    p.add_argument("--kv-pages", type=power_of_two(16, MAX_PAGE_TOKENS), metavar="PAGE_TOKENS",
                   help="put the other streams on pool pages of this many tokens")
    p.add_argument("--kv-pages-all", action="store_true", help="the engine's own stream on pages too")
    p.add_argument("--memory-gib", type=number(0, MAX_MEMORY_GIB, open_low=True),
                   help="KV memory budget (default: a safe share of free memory)")
    p.add_argument("--prefill-chunk", type=power_of_two(1, MAX_PREFILL_CHUNK), default=0,
                   help="rows a prompt chunk runs (default: the backend's, 1,024 on the GPU and 128 on the CPU)")
    add_prefill_precision(p)
    p.add_argument("--prompt-cache-gib", type=number(0, MAX_MEMORY_GIB), default=0.0,
                   help="pool pages the prompt cache may keep for reuse (part of the KV budget; 0 = off)")
    add_drafter(p, drafters)


def add_prefill_precision(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefill-precision", default="fp16", choices=PREFILL_PRECISIONS,
                   help="prompt products: fp16 tensor cores (GPU; fast) or exact (near-fp32, as decode)")


def add_drafter(p: argparse.ArgumentParser, choices: tuple[str, ...], default: str = "none",
                draft_tokens: int = 4) -> None:
    p.add_argument("--drafter", default=default, choices=choices,
                   help="speculative decoding: ngram (prompt lookup), mtp (the checkpoint's MTP head), dflash2 "
                        "(a DFlash2 checkpoint, --drafter-model)")
    p.add_argument("--drafter-model", metavar="PATH",
                   help="the DFlash2 drafter's checkpoint folder (synthetic:dflash2: random weights for the model)")
    p.add_argument("--draft-tokens", type=whole(1, MAX_DRAFT_TOKENS), default=draft_tokens, metavar="K",
                   help="drafts per verify window (1..%d)" % MAX_DRAFT_TOKENS)


def settings_from(a: argparse.Namespace) -> EngineSettings:
    paging = "all" if a.kv_pages_all else ("pages" if a.kv_pages else "off")
    s = EngineSettings(model=getattr(a, "model", None), backend=getattr(a, "backend", "auto"), parallel=a.parallel,
                       context=a.context, kv_dtype=a.kv_dtype, paging=paging, page_tokens=a.kv_pages or 256,
                       memory_gib=a.memory_gib, prefill_chunk=a.prefill_chunk,
                       prefill_precision=a.prefill_precision, drafter=a.drafter,
                       drafter_model=a.drafter_model, draft_tokens=a.draft_tokens, prompt_cache_gib=a.prompt_cache_gib)
    return s.validate()


def cmd_generate(a: argparse.Namespace) -> int:
    from .engine import Runner, run_to_end
    from .events import Failed, Token
    s = settings_from(a)
    runner = Runner(s, log=lambda m: print(m, file=sys.stderr))
    sched = runner.scheduler(s)
    print(sched.plan.line, file=sys.stderr)
    msgs = ([{"role": "system", "content": a.system}] if a.system else []) + [{"role": "user", "content": a.prompt}]
    sp = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_tokens=a.max_tokens, seed=a.seed)

    def show(e):
        if isinstance(e, Token) and (e.text or e.reasoning):
            sys.stdout.write(e.reasoning + e.text)  # a thinking model's block first, as it streams
            sys.stdout.flush()
    seq = runner.sequence(1, s, msgs, sp, show, thinking=False if a.no_thinking else None)
    done = run_to_end(sched, [seq])[seq.id]
    print()
    if isinstance(done, Failed):
        raise RequestError(f"the reply failed: {done.message}")
    print(f"prompt: {done.prompt_tokens} tokens at {done.prompt_tps:.1f} tok/s; "
          f"decode: {done.tokens} tokens at {done.decode_tps:.1f} tok/s ({done.reason}; {runner.backend.device})"
          + (f"; mean accepted length {done.accepted_length:.2f}" if done.accepted_length else ""), file=sys.stderr)
    return 0


def cmd_logits(a: argparse.Namespace) -> int:
    from .engine import Runner
    s = settings_from(a)
    runner = Runner(s, log=lambda m: print(m, file=sys.stderr))
    ids = a.prompt_ids or runner.tokenizer.encode_chat([{"role": "user", "content": a.prompt}], limit=s.context)
    if a.print_ids:
        print(",".join(map(str, ids)))
    seq = runner.sequence(0, s, None, SamplingParams(temperature=0), lambda e: None, ids)
    logits = runner.scheduler(s).prompt_logits(seq.tokens)
    save_npy(a.out, logits)
    print(f"wrote {a.out}: {logits.shape[0]} logits, argmax {int(np.argmax(logits))}", file=sys.stderr)
    return 0


def save_npy(path: Path, array: np.ndarray) -> None:
    """np.save, but a full disk or a vanished folder is an error, not a silent short file."""
    buf = io.BytesIO()
    np.save(buf, array)
    try:
        with open(path, "wb") as f:
            f.write(buf.getbuffer())
    except OSError as e:
        raise RequestError(f"cannot write {path}: {e.strerror or e}") from None


def cmd_plan(a: argparse.Namespace) -> int:
    from .config import ModelConfig
    from .plan import make_plan, model_config, weights_bytes
    s = settings_from(a)
    if a.config:
        cfg, wbytes = ModelConfig.from_file(a.config), 0
    else:
        cfg, wbytes = model_config(a.model), weights_bytes(a.model)
    print(make_plan(cfg, s, weight_bytes=wbytes).line)
    return 0


def cmd_fetch(a: argparse.Namespace) -> int:
    from .fetch import fetch_default
    print(fetch_default())
    return 0


def cmd_doctor(a: argparse.Namespace) -> int:
    """What `make run` will get: the GPU and its CUDA pieces, the backend, and the fix for a wrong piece."""
    from .doctor import gather, report
    for line in report(gather()):
        print(f"doctor: {line}")
    return 0


def cmd_gates(a: argparse.Namespace) -> int:
    from .gates import main as gates_main
    return gates_main(a)


def cmd_bench(a: argparse.Namespace) -> int:
    from .bench import main as bench_main
    return bench_main(a)


def cmd_bench_start(a: argparse.Namespace) -> int:
    from .bench_start import main as bench_main
    return bench_main(a.argv, settings_from(a), a.runs, a.json)


def cmd_write_synthetic(a: argparse.Namespace) -> int:
    from .synthetic_files import write
    try:
        print(write(a.folder, a.name))
    except OSError as e:
        raise RequestError(f"cannot write {a.folder}: {e.strerror or e}") from None
    return 0


def cmd_bench_resume(a: argparse.Namespace) -> int:
    from .bench_resume import main as bench_resume_main
    return bench_resume_main(a)


def cmd_serve(a: argparse.Namespace) -> int:
    from .server.serve import serve
    s = settings_from(a)
    return serve(s, a.host, a.port, a.api_key or os.environ.get("LANECHAT_API_KEY"), int(a.max_body_mib * (1 << 20)),
                 a.max_waiting)


def cmd_bench_serve(a: argparse.Namespace) -> int:
    from .server.bench import main as bench_main
    return bench_main(a, settings_from(a))


def parser() -> argparse.ArgumentParser:
    ap = Parser(prog="python -m engine", description="Lanechat's engine, headless")
    sub = ap.add_subparsers(dest="cmd", required=True)
    tokens = whole(1, MAX_TOKENS)

    g = sub.add_parser("generate", help="answer one prompt, streaming")
    add_model(g)
    add_kv(g)
    g.add_argument("--prompt", required=True, type=text_arg)
    g.add_argument("--system", type=text_arg)
    g.add_argument("--max-tokens", type=tokens, default=256)
    g.add_argument("--temperature", type=number(0, MAX_TEMPERATURE), default=0.0)
    g.add_argument("--top-p", type=number(0, 1, open_low=True), default=1.0)
    g.add_argument("--top-k", type=whole(0, MAX_TOKEN_ID), default=0)
    g.add_argument("--seed", type=whole(0, (1 << 64) - 1), default=0)
    g.add_argument("--no-thinking", action="store_true", help="the chat template's enable_thinking=false")
    g.set_defaults(fn=cmd_generate)

    lg = sub.add_parser("logits", help="float32 logits of the last prompt position to a .npy file")
    add_model(lg)
    add_kv(lg)
    src = lg.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", type=text_arg)
    src.add_argument("--prompt-ids", type=whole_list(0, MAX_TOKEN_ID - 1), metavar="ID,ID,...")
    lg.add_argument("--out", required=True, type=out_file)
    lg.add_argument("--print-ids", action="store_true")
    lg.set_defaults(fn=cmd_logits)

    pl = sub.add_parser("plan", help="the memory plan, without loading weights")
    src = pl.add_mutually_exclusive_group()
    src.add_argument("--model")
    src.add_argument("--config", help="a Hugging Face config.json")
    add_kv(pl, parallel=1)
    pl.set_defaults(fn=cmd_plan)

    gt = sub.add_parser("gates", help="the exactness gates (exit 0 only if every cell passes)")
    add_model(gt)
    gt.add_argument("--prompts", help="JSON list of conversations (each a list of {role, content})")
    gt.add_argument("--max-tokens", type=tokens, default=24)
    gt.add_argument("--context", type=whole(16, MAX_CONTEXT), default=2048)  # the cache row: a prompt past 1,024
    gt.add_argument("--quick", action="store_true", help="fewer arms (tests)")
    add_prefill_precision(gt)
    add_drafter(gt, ("all", "none", "ngram", "mtp", "dflash2", "oracle"), "all", 3)
    gt.add_argument("--offsets", type=whole_list(1, MAX_CONTEXT), metavar="N,N,...",
                    help="long prompts ending at these positions (e.g. 4796,8192,8292,8448 with --context "
                         "16384), each with a follow-up turn: only the resume and prompt-cache rows")
    gt.set_defaults(fn=cmd_gates)

    b = sub.add_parser("bench", help="prompt and decode throughput, with the memory roofline")
    add_model(b)
    add_kv(b, parallel=8, context=16384, drafters=("none", "ngram", "mtp", "dflash2", "oracle"))  # oracle: the ceiling
    b.add_argument("--synthetic", help="random weights of a real model's shapes (see engine/synthetic.py)")
    b.add_argument("--prompt-lengths", type=whole_list(1, MAX_CONTEXT), default=[2048, 9216, 15000])
    b.add_argument("--streams", type=whole_list(1, MAX_PARALLEL), default=[1, 4, 8])
    b.add_argument("--decode-tokens", type=tokens, default=256)
    b.add_argument("--interleave", type=whole(0, MAX_PARALLEL), default=4, metavar="S",
                   help="S streams decoding while a prompt of the longest --prompt-lengths is read (0: no cell)")
    b.add_argument("--history", type=whole_list(1, MAX_CONTEXT), default=[8192], metavar="N,N,...",
                   help="cells of one stream decoding after a prompt of N tokens (a chat with history)")
    b.add_argument("--profile", action="store_true",
                   help="the per-kernel breakdown of one decode step (1 stream and the most --streams), "
                        "one verify window (with --drafter) and one prompt chunk (GPU)")
    b.add_argument("--no-pdl", action="store_true",
                   help="graphs without programmatic dependent launches (GPU; the A/B of kernels/pdl.py)")
    b.add_argument("--no-run-ahead", action="store_true",
                   help="every decode step's tokens read before the next is queued (GPU; the A/B of "
                        "engine/run_ahead.py)")
    b.add_argument("--double", type=regex_arg, metavar="REGEX",
                   help="launch the decode graphs' kernels whose names match REGEX twice: the step's growth is "
                        "their cost on its critical path (GPU; kernels whose second run repeats the first)")
    b.add_argument("--trace", action="store_true",
                   help="each decode graph's launches by their time on its critical path, from stamps the "
                        "kernels write as their waits return (GPU; kernels/trace.py)")
    b.add_argument("--prompt-gemm", choices=("auto", "qgemm", "cublas"), default="auto",
                   help="fp16 prompt products (GPU): the device's choice, qgemm, or cuBLAS over a dequantized copy")
    b.set_defaults(fn=cmd_bench)

    st = sub.add_parser("bench-start", help="time from launch to ready and to the first token, by stage")
    add_model(st)
    add_kv(st)
    st.add_argument("--runs", type=whole(0, 20), default=2, help="fresh processes, one after another "
                    "(0: measure this one and print JSON)")
    st.add_argument("--json", action="store_true")
    st.set_defaults(fn=cmd_bench_start)

    ws = sub.add_parser("write-synthetic", help="a synthetic model's random weights as an MLX 4-bit folder")
    ws.add_argument("name", help="a synthetic shape (engine/synthetic.py), e.g. qwen3.5-27b")
    ws.add_argument("folder", type=Path)
    ws.set_defaults(fn=cmd_write_synthetic)

    br = sub.add_parser("bench-resume", help="time to first token of a follow-up turn: cold, prompt-cache hit, "
                                             "restored from a snapshot file")
    add_model(br)
    add_kv(br, parallel=1, context=32768)
    br.set_defaults(prompt_cache_gib=4.0)
    br.add_argument("--synthetic", help="random weights of a real model's shapes (see engine/synthetic.py)")
    br.add_argument("--history", type=whole_list(1, MAX_CONTEXT), default=[8192, 16384],
                    help="history lengths before the follow-up turn")
    br.set_defaults(fn=cmd_bench_resume)

    sv = sub.add_parser("serve", help="the OpenAI-compatible HTTP API (chat completions, completions, models)")
    add_model(sv)
    add_kv(sv, parallel=4)
    sv.add_argument("--host", default="127.0.0.1", type=text_arg,
                    help="address to listen on (any but loopback needs an API key)")
    sv.add_argument("--port", type=whole(0, 65535), default=8080, help="0: any free port")
    sv.add_argument("--api-key", type=text_arg,
                    help="every request must send it as a bearer token (default: $LANECHAT_API_KEY)")
    sv.add_argument("--max-body-mib", type=number(0, MAX_BODY_MIB, open_low=True), default=4.0,
                    help="larger request bodies get 413")
    sv.add_argument("--max-waiting", type=whole(0, MAX_WAITING), default=64,
                    help="requests waiting for a stream before 429")
    sv.set_defaults(fn=cmd_serve)

    bs = sub.add_parser("bench-serve", help="concurrent streaming requests over HTTP against the same load in-process")
    add_model(bs)
    add_kv(bs, parallel=8)
    bs.add_argument("--streams", type=whole_list(1, MAX_WAITING), default=[1, 4, 8, 16],
                    help="concurrent requests per cell")
    bs.add_argument("--max-tokens", type=tokens, default=128, help="tokens per request (greedy, ignore_eos)")
    bs.set_defaults(fn=cmd_bench_serve)

    f = sub.add_parser("fetch-default", help="download the embedded default model (once)")
    f.set_defaults(fn=cmd_fetch)
    d = sub.add_parser("doctor", help="the GPU, driver, CuPy and NVRTC this machine has, and the fix for a wrong one")
    d.set_defaults(fn=cmd_doctor)
    return ap


def main(argv: list[str] | None = None) -> int:
    try:
        argv = sys.argv[1:] if argv is None else argv
        a = parser().parse_args(argv)
        a.argv = argv
        return a.fn(a)
    except LanechatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
