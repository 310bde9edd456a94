"""`make fuzz`: mutated model files, conversation files, KV snapshot files, chat templates, requests
(the engine's and the OpenAI API's), command lines and app starts,
each case run in a forked child under a memory limit and a timeout; prints the counts.

    .venv/bin/python tests/fuzz.py --seconds 1200 [--seed N] [--out build/fuzz] [--only gguf,cli]

Outcomes: clean (a one-line refusal: LanechatError, FormatError), valid (accepted and worked),
wrong (accepted although it must be refused), traceback (any other exception, or a crash), hang
(past --timeout), blowup (MemoryError, or more than --memory-mib resident). Every distinct cause of
a bad outcome keeps one reproducer under --out/causes/. Exit code 0 only with no bad outcome.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path

# One thread for BLAS and the tokenizers: children are forked, and a forked thread pool deadlocks.
os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                  RAYON_NUM_THREADS="1", QT_QPA_PLATFORM="offscreen")
sys.path.insert(0, str(Path(__file__).parent))

from app.conversation import FormatError  # noqa: E402
from engine import EngineSettings  # noqa: E402
from engine.engine import Runner  # noqa: E402
from engine.errors import LanechatError  # noqa: E402

import fuzz_app  # noqa: E402
import fuzz_targets as ft  # noqa: E402

TINY = str(Path(__file__).parent / "fixtures" / "tiny_llama")
WEIGHTS = {"gguf": 18, "hf": 16, "mlx": 8, "dflash2": 8, "template": 10, "request": 10, "api": 6, "cli": 14,
           "conversation": 14, "app-start": 5, "kill-9": 6, "snapshot": 6}
BAD = ("wrong", "traceback", "hang", "blowup")


def classify(case: ft.Case) -> dict:
    """In the child: run the case, name its outcome."""
    try:
        got = case.run()
        return {"outcome": "wrong" if case.must_refuse else got}
    except (LanechatError, FormatError) as e:
        return {"outcome": "clean", "detail": str(e)[:200]}
    except MemoryError:
        return {"outcome": "blowup", "cause": "MemoryError", "detail": traceback.format_exc()[-600:]}
    except ft.BugError as e:
        return {"outcome": "traceback", "cause": f"BugError: {str(e)[:60]}", "detail": str(e)}
    except BaseException as e:  # noqa: BLE001 - every escape is a finding
        frame = traceback.extract_tb(e.__traceback__)[-1]
        return {"outcome": "traceback", "cause": f"{type(e).__name__} at {Path(frame.filename).name}:{frame.lineno}",
                "detail": traceback.format_exc()[-1500:]}


def run_case(case: ft.Case, timeout: float, memory_bytes: int, rss_limit_kib: int) -> dict:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(read)
        try:
            log = os.open(case.folder / "child.log", os.O_WRONLY | os.O_CREAT, 0o644)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.nice(5)
            resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
            result = classify(case)
        except BaseException as e:  # noqa: BLE001
            result = {"outcome": "traceback", "cause": f"harness: {type(e).__name__}", "detail": repr(e)}
        os.write(write, json.dumps(result).encode()[:60000])
        os._exit(0)
    os.close(write)
    # A hang is measured in the child's CPU seconds: on a shared, loaded machine a niced child may
    # wait far longer than it computes. Wall time past ten times the limit counts too (a sleep).
    deadline, chunks = time.monotonic() + 10 * timeout, []
    status = usage = None
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if _cpu_seconds(pid) > timeout or time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            os.close(read)
            return {"outcome": "hang", "cause": "timeout", "detail": f"past {timeout:g} CPU seconds"}
        time.sleep(0.02)
    os.set_blocking(read, False)
    try:
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
    except BlockingIOError:
        pass
    os.close(read)
    if not chunks:
        return {"outcome": "traceback", "cause": f"child died (status {status})", "detail": ""}
    result = json.loads(b"".join(chunks))
    if usage.ru_maxrss > rss_limit_kib and result["outcome"] not in BAD:
        result = {"outcome": "blowup", "cause": "resident memory",
                  "detail": f"{usage.ru_maxrss >> 10} MiB resident (was {result['outcome']})"}
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--out", default="build/fuzz")
    ap.add_argument("--only", help="comma-separated targets (" + ", ".join(WEIGHTS) + ")")
    ap.add_argument("--timeout", type=float, default=30.0, help="CPU seconds a case may take")
    ap.add_argument("--memory-mib", type=int, default=1536, help="resident memory a case may add")
    ap.add_argument("--skip", action="append", default=[], metavar="TEXT",
                    help="do not run cases whose description contains TEXT (a known cause owned elsewhere)")
    a = ap.parse_args(argv)
    targets = a.only.split(",") if a.only else list(WEIGHTS)
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    (out / "causes").mkdir(parents=True)
    work = Path(tempfile.mkdtemp(prefix="lanechat-fuzz-"))
    print(f"fuzz: seed {a.seed}, {a.seconds:g} s, targets {', '.join(targets)}; writing the bases", flush=True)
    bases = ft.write_bases(work / "bases")
    settings = EngineSettings(model=TINY, backend="numpy", parallel=2, context=256, paging="all", page_tokens=16,
                              memory_gib=0.25)
    runner = Runner(settings, log=lambda m: None)  # loaded once, shared by the forked children
    bases["snapshot"] = ft.write_snapshot(work / "bases", runner, settings)
    base_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    base_vm = _virtual_bytes()
    rng = random.Random(a.seed)
    counts: dict[str, Counter] = {t: Counter() for t in targets}
    causes: dict[str, dict] = {}
    start, n = time.monotonic(), 0
    while time.monotonic() - start < a.seconds:
        target = rng.choices(targets, [WEIGHTS[t] for t in targets])[0]
        folder = work / "cases" / f"{n:06d}"
        folder.mkdir(parents=True)
        case_rng = random.Random(f"{a.seed}-{n}")
        case = make(target, case_rng, bases, folder, runner, settings)
        if any(text in case.what for text in a.skip):
            counts[target]["skipped"] += 1
            shutil.rmtree(folder, ignore_errors=True)
            n += 1
            continue
        result = run_case(case, a.timeout, base_vm + (3 << 30), base_rss + (a.memory_mib << 10))
        counts[target][result["outcome"]] += 1
        if result["outcome"] in BAD:
            key = f"{target}: {result['outcome']}: {result.get('cause', '')}"
            if key not in causes:
                causes[key] = {"case": n, "what": case.what, "detail": result.get("detail", "")}
                keep = out / "causes" / f"{len(causes):03d}"
                shutil.copytree(folder, keep)
                (keep / "what.txt").write_text(f"{key}\n{case.what}\n\n{result.get('detail', '')}\n")
                print(f"  new cause [{len(causes)}] {key}\n      case {n}: {case.what}", flush=True)
        shutil.rmtree(folder, ignore_errors=True)
        n += 1
        if n % 100 == 0:
            print(f"  {n} cases, {time.monotonic() - start:.0f} s: {_line(counts)}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    report = {"seed": a.seed, "seconds": round(time.monotonic() - start), "cases": n, "skip": a.skip,
              "counts": {t: dict(c) for t, c in counts.items()}, "causes": causes}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(_table(counts))
    print(f"fuzz: {n} cases in {report['seconds']} s, {len(causes)} distinct bad causes; report {out / 'report.json'}")
    return 1 if any(sum(c[b] for b in BAD) for c in counts.values()) else 0


def make(target: str, rng: random.Random, bases: dict, folder: Path, runner, settings) -> ft.Case:
    if target in ("hf", "mlx"):
        return ft.folder_case(rng, bases, folder, target)
    return {"gguf": lambda: ft.gguf_case(rng, bases, folder),
            "template": lambda: ft.template_case(rng, bases, folder),
            "dflash2": lambda: ft.dflash2_case(rng, bases, folder),
            "request": lambda: ft.request_case(rng, runner, settings, folder),
            "api": lambda: ft.api_case(rng, runner, settings, folder),
            "snapshot": lambda: ft.snapshot_case(rng, bases, runner, settings, folder),
            "cli": lambda: ft.cli_case(rng, bases, folder, TINY),
            "conversation": lambda: fuzz_app.conversation_case(rng, folder),
            "app-start": lambda: fuzz_app.app_start_case(rng, folder),
            "kill-9": lambda: fuzz_app.leftovers_case(rng, folder)}[target]()


def _cpu_seconds(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _virtual_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")


def _line(counts: dict[str, Counter]) -> str:
    total = sum(counts.values(), Counter())
    return ", ".join(f"{k} {total[k]}" for k in ("clean", "valid", *BAD))


def _table(counts: dict[str, Counter]) -> str:
    cols = ("clean", "valid", *BAD, "skipped")
    rows = ["target\t" + "\t".join(cols)]
    for t, c in counts.items():
        rows.append(t + "\t" + "\t".join(str(c[k]) for k in cols))
    total = sum(counts.values(), Counter())
    rows.append("total\t" + "\t".join(str(total[k]) for k in cols))
    return "\n".join(rows)


if __name__ == "__main__":
    sys.exit(main())
