"""The CLI: generate, logits, bad input as one line and exit code 2."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.__main__ import main

TINY = str(Path(__file__).parent / "fixtures" / "tiny_llama")


def test_generate_streams_text_and_reports_speed(capsys):
    assert main(["generate", "--model", TINY, "--backend", "numpy", "--prompt", "hi", "--max-tokens", "5",
                 "--context", "256"]) == 0
    out, err = capsys.readouterr()
    assert "decode: " in err and "tok/s" in err and "plan: 1 window of 256 tokens" in err


def test_logits_writes_float32_of_the_last_position(tmp_path, capsys):
    out = tmp_path / "l.npy"
    assert main(["logits", "--model", TINY, "--backend", "numpy", "--prompt-ids", "1,5,9,12", "--out", str(out),
                 "--context", "256"]) == 0
    logits = np.load(out)
    assert logits.dtype == np.float32 and logits.ndim == 1 and np.isfinite(logits).all()
    assert main(["logits", "--model", TINY, "--backend", "numpy", "--prompt", "hello", "--print-ids",
                 "--out", str(out), "--context", "256"]) == 0
    assert capsys.readouterr().out.strip().split(",")[0].isdigit()


def test_bad_input_is_one_line_and_exit_code_2(tmp_path):
    bad = tmp_path / "nothing.gguf"
    bad.write_bytes(b"GGUF" + b"\0" * 10)
    for args in (["generate", "--model", str(tmp_path / "missing"), "--prompt", "x"],
                 ["generate", "--model", str(bad), "--prompt", "x"],
                 ["generate", "--model", TINY, "--prompt", "x", "--context", "100000"],
                 ["logits", "--model", TINY, "--prompt-ids", "1,999999", "--out", str(tmp_path / "o.npy"),
                  "--context", "256"]):
        run = subprocess.run([sys.executable, "-m", "engine", *args, "--backend", "numpy"], capture_output=True,
                             text=True, timeout=120)
        assert run.returncode == 2, (args, run.stderr)
        lines = [l for l in run.stderr.splitlines() if l.startswith("error: ")]
        assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr


def test_cupy_backend_without_a_gpu_is_a_clear_error():
    from engine.ops import cuda_available
    if cuda_available()[0]:
        pytest.skip("a GPU is present here")
    run = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", TINY, "--prompt", "x",
                          "--backend", "cupy"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "error: --backend cupy" in run.stderr
