"""Golden logits from Hugging Face transformers, committed as small fixtures (run by hand, CPU is enough).

    python3 -m venv /tmp/venvtf
    /tmp/venvtf/bin/pip install torch transformers gguf tokenizers ml_dtypes numpy
    /tmp/venvtf/bin/python tests/make_golden.py [--gguf PATH_TO_SmolLM2-135M-Instruct.Q4_1.gguf]

For each tiny architecture it writes tests/fixtures/<name>/, a Hugging Face checkpoint made by
tests/ckpt.py (config.json, model.safetensors, tokenizer files), loads it with AutoModelForCausalLM
in float32 (eager attention) and saves tests/fixtures/<name>/golden.npz. With --gguf (default: the
engine's default model path, when present) it also loads the real default model through transformers'
own GGUF import (dequantized to float32) and saves tests/fixtures/smollm2_q4_1/golden.npz; no weights
are written there, tests load the GGUF from the models folder.

golden.npz keys:
    input_ids  int64 [P, L]    the prompts, right-padded with -1
    lengths    int64 [P]       each prompt's length
    logits     float32 [P, V]  logits at each prompt's last position
    greedy     int64 [P, 8]    greedy continuation: argmax, appended, re-run; no stop token
    versions   str             "transformers X / torch Y"
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import ckpt  # noqa: E402

FIXTURES = HERE / "fixtures"
GREEDY = 8
# name: (config, seed, stored dtype)
TINY = {
    "tiny_llama": (ckpt.tiny_llama_config(), 11, "f32"),
    "tiny_qwen3": (ckpt.tiny_qwen3_config(), 12, "bf16"),
}  # the Qwen3.5 fixtures (tiny_qwen3_5, tiny_qwen3_5_moe) come from tests/make_golden_qwen3_5.py
# Fixed id sequences (all < 300, the tiny vocabulary); the last crosses 64 positions so RoPE is exercised.
PROMPTS = [
    [1, 42, 7],
    [5],
    [17, 42, 42, 42, 0, 299, 13, 7, 8, 64, 100, 200, 150],
    [(i * 37 + 11) % 297 + 3 for i in range(97)],
]
SMOLLM_CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count: 1, 2, 3,"}],
]


@torch.no_grad()
def golden(model: torch.nn.Module, prompts: list[list[int]]) -> dict[str, np.ndarray]:
    lengths = np.array([len(p) for p in prompts], dtype=np.int64)
    ids = np.full((len(prompts), lengths.max()), -1, dtype=np.int64)
    logits, greedy = [], []
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = p
        seq = list(p)
        for step in range(GREEDY):
            out = model(torch.tensor([seq])).logits[0, -1].float()
            if step == 0:
                logits.append(out.numpy().astype(np.float32))
            seq.append(int(out.argmax()))
        greedy.append(seq[len(p):])
    return {"input_ids": ids, "lengths": lengths, "logits": np.stack(logits),
            "greedy": np.array(greedy, dtype=np.int64),
            "versions": np.array(f"transformers {transformers.__version__} / torch {torch.__version__}")}


def load(folder: Path, **kw) -> torch.nn.Module:
    model, info = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True, **kw)
    missing = [k for k in info["missing_keys"] if "visual" not in k]
    unexpected = [k for k in info["unexpected_keys"] if not k.startswith("mtp.")]
    if missing or unexpected or info["mismatched_keys"]:
        raise SystemExit(f"{folder}: transformers did not load every weight: missing {missing}, "
                         f"unexpected {unexpected}, mismatched {info['mismatched_keys']}")
    return model.eval()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, default=None, help="the default model's GGUF (optional)")
    ap.add_argument("--only", nargs="*", default=list(TINY), help="tiny fixtures to (re)build")
    args = ap.parse_args()
    torch.manual_seed(0)
    for name in args.only:
        cfg, seed, dtype = TINY[name]
        folder = FIXTURES / name
        ckpt.write_hf(folder, cfg, seed=seed, dtype=dtype)
        np.savez(folder / "golden.npz", **golden(load(folder), PROMPTS))
        print(f"{folder}: {sum(f.stat().st_size for f in folder.iterdir()) / 1024:.0f} KiB")
    gguf = args.gguf
    if gguf is None:
        from engine.fetch import default_model_path
        gguf = default_model_path()
    if gguf.is_file():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        prompts = [tok.apply_chat_template(c, add_generation_prompt=True, tokenize=True, return_dict=False)
                   for c in SMOLLM_CHATS]
        prompts = [list(p["input_ids"]) if isinstance(p, dict) else list(p) for p in prompts]
        model = load(gguf.parent, gguf_file=gguf.name)
        folder = FIXTURES / "smollm2_q4_1"
        folder.mkdir(parents=True, exist_ok=True)
        np.savez(folder / "golden.npz", **golden(model, prompts))
        print(f"{folder}: from {gguf}")
    else:
        print(f"{gguf}: not present, SmolLM2 golden skipped")


if __name__ == "__main__":
    main()
