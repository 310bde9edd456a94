"""The headless face of the engine: python -m engine generate|logits|plan|gates|bench|fetch-default|doctor."""
from __future__ import annotations

import argparse
import sys

import numpy as np

from .errors import LanechatError
from .settings import EngineSettings, SamplingParams


def add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", help="GGUF file or model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--backend", default="auto", choices=["auto", "numpy", "cupy"])


def add_kv(p: argparse.ArgumentParser, parallel: int = 1, context: int = 4096) -> None:
    p.add_argument("--parallel", type=int, default=parallel, help="streams that may generate at once")
    p.add_argument("--context", type=int, default=context, help="tokens per stream")
    p.add_argument("--kv-dtype", default="bf16", choices=["bf16", "fp8"])
    p.add_argument("--kv-pages", type=int, metavar="PAGE_TOKENS",
                   help="put the other streams on pool pages of this many tokens")
    p.add_argument("--kv-pages-all", action="store_true", help="the engine's own stream on pages too")
    p.add_argument("--memory-gib", type=float, help="KV memory budget (default: a safe share of free memory)")
    p.add_argument("--prefill-chunk", type=int, default=128)


def settings_from(a: argparse.Namespace) -> EngineSettings:
    paging = "all" if a.kv_pages_all else ("pages" if a.kv_pages else "off")
    s = EngineSettings(model=getattr(a, "model", None), backend=getattr(a, "backend", "auto"), parallel=a.parallel,
                       context=a.context, kv_dtype=a.kv_dtype, paging=paging, page_tokens=a.kv_pages or 256,
                       memory_gib=a.memory_gib, prefill_chunk=a.prefill_chunk)
    return s.validate()


def cmd_generate(a: argparse.Namespace) -> int:
    from .engine import Runner, run_to_end
    from .events import Token
    s = settings_from(a)
    runner = Runner(s, log=lambda m: print(m, file=sys.stderr))
    sched = runner.scheduler(s)
    print(sched.plan.line, file=sys.stderr)
    msgs = ([{"role": "system", "content": a.system}] if a.system else []) + [{"role": "user", "content": a.prompt}]
    sp = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k, max_tokens=a.max_tokens, seed=a.seed)

    def show(e):
        if isinstance(e, Token) and e.text:
            sys.stdout.write(e.text)
            sys.stdout.flush()
    seq = runner.sequence(1, s, msgs, sp, show)
    done = run_to_end(sched, [seq])[1]
    print()
    print(f"prompt: {done.prompt_tokens} tokens at {done.prompt_tps:.1f} tok/s; "
          f"decode: {done.tokens} tokens at {done.decode_tps:.1f} tok/s ({done.reason}; {runner.backend.device})",
          file=sys.stderr)
    return 0


def cmd_logits(a: argparse.Namespace) -> int:
    from .engine import Runner
    s = settings_from(a)
    runner = Runner(s, log=lambda m: print(m, file=sys.stderr))
    if a.prompt_ids:
        ids = [int(t) for t in a.prompt_ids.split(",") if t.strip()]
    else:
        ids = runner.tokenizer.encode_chat([{"role": "user", "content": a.prompt}])
    if a.print_ids:
        print(",".join(map(str, ids)))
    seq = runner.sequence(0, s, None, SamplingParams(temperature=0), lambda e: None, ids)
    logits = runner.scheduler(s).prompt_logits(seq.tokens)
    np.save(a.out, logits)
    print(f"wrote {a.out}: {logits.shape[0]} logits, argmax {int(np.argmax(logits))}", file=sys.stderr)
    return 0


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


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine", description="Lanechat's engine, headless")
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="answer one prompt, streaming")
    add_model(g)
    add_kv(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--system")
    g.add_argument("--max-tokens", type=int, default=256)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--seed", type=int, default=0)
    g.set_defaults(fn=cmd_generate)

    lg = sub.add_parser("logits", help="float32 logits of the last prompt position to a .npy file")
    add_model(lg)
    add_kv(lg)
    src = lg.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt")
    src.add_argument("--prompt-ids")
    lg.add_argument("--out", required=True)
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
    gt.add_argument("--max-tokens", type=int, default=24)
    gt.add_argument("--context", type=int, default=1024)
    gt.add_argument("--quick", action="store_true", help="fewer arms (tests)")
    gt.set_defaults(fn=cmd_gates)

    b = sub.add_parser("bench", help="prompt and decode throughput, with the memory roofline")
    add_model(b)
    add_kv(b, parallel=8, context=16384)
    b.add_argument("--synthetic", help="random weights of a real model's shapes (see engine/synthetic.py)")
    b.add_argument("--prompt-lengths", default="2048,9216,15000")
    b.add_argument("--streams", default="1,4,8")
    b.add_argument("--decode-tokens", type=int, default=256)
    b.set_defaults(fn=cmd_bench)

    f = sub.add_parser("fetch-default", help="download the embedded default model (once)")
    f.set_defaults(fn=cmd_fetch)
    d = sub.add_parser("doctor", help="the GPU, driver, CuPy and NVRTC this machine has, and the fix for a wrong one")
    d.set_defaults(fn=cmd_doctor)
    return ap


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except LanechatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
