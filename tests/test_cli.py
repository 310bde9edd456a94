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
        lines = [line for line in run.stderr.splitlines() if line.startswith("error: ")]
        assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr


def test_cupy_backend_without_a_gpu_is_a_clear_error():
    from engine.ops import cuda_available
    if cuda_available()[0]:
        pytest.skip("a GPU is present here")
    run = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", TINY, "--prompt", "x",
                          "--backend", "cupy"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "error: --backend cupy" in run.stderr


@pytest.mark.parametrize("args", [
    ["logits", "--prompt-ids", "a,b"], ["logits", "--prompt-ids", "1.5"], ["logits", "--prompt-ids", "-1,2"],
    ["bench", "--prompt-lengths", "abc"], ["bench", "--streams", "0"],
    ["generate", "--prompt", "x", "--memory-gib", "nan"], ["generate", "--prompt", "x", "--memory-gib", "inf"],
    ["generate", "--prompt", "x", "--memory-gib", "-1"], ["generate", "--prompt", "x", "--prefill-chunk", str(2**30)],
    ["generate", "--prompt", "x", "--prefill-chunk", "3"], ["generate", "--prompt", "x", "--temperature", "nan"],
    ["generate", "--prompt", "x", "--top-p", "0"], ["generate", "--prompt", "x", "--top-k", "-1"],
    ["generate", "--prompt", "x", "--seed", "-1"], ["generate", "--prompt", "x", "--max-tokens", "0"],
    ["generate", "--prompt", "x", "--parallel", "100000"], ["generate", "--prompt", "x", "--kv-pages", "17"],
    ["generate", "--prompt", "caf\udce9"], ["generate", "--prompt", "x", "--system", "\ud800"],
    ["generate", "--prompt", "x", "--draft-tokens", "0"], ["generate", "--prompt", "x", "--draft-tokens", "17"],
    ["generate", "--prompt", "x", "--drafter", "oracle"], ["bench", "--drafter", "dflash9"],
    ["gates", "--draft-tokens", "99"],
    ["serve", "--port", "99999"], ["serve", "--port", "-1"], ["serve", "--max-body-mib", "nan"],
    ["serve", "--max-body-mib", "0"], ["serve", "--max-waiting", "-3"], ["serve", "--host", "\udcff"],
    ["serve", "--api-key", "k\udcff"], ["bench-serve", "--streams", "abc"], ["bench-serve", "--streams", "0"],
    ["bench-serve", "--max-tokens", "0"], ["bench-resume", "--history", "x"], ["bench-start", "--runs", "-1"],
])
def test_every_argument_is_checked_by_its_type(args, tmp_path, capsys):
    if args[0] == "logits":
        args = args + ["--out", str(tmp_path / "o.npy")]
    assert main(args + ["--model", TINY, "--backend", "numpy"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "argument --" in err[0], err


@pytest.mark.parametrize("out, words", [("missing/l.npy", "is not a file in an existing folder"),
                                        (".", "is not a file in an existing folder"),
                                        ("/dev/full", "cannot write /dev/full: No space left on device")])
def test_logits_out_that_cannot_be_written(out, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["logits", "--model", TINY, "--backend", "numpy", "--prompt-ids", "1,2", "--out", out,
                 "--context", "256"]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("error: ") == 1


@pytest.mark.parametrize("folder", ["/dev/full/x", "/proc/x"])
def test_write_synthetic_where_nothing_can_be_written(folder, capsys):
    assert main(["write-synthetic", "tiny-llama", folder]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: cannot write {folder}: "), err


def test_non_utf8_prompt_bytes_are_one_line():
    run = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", TINY, "--backend", "numpy",
                          "--prompt", b"caf\xe9 \xff"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip() == "error: generate: argument --prompt: is not UTF-8 text (byte 0xe9 at character 3)"


def test_generate_after_a_failed_stream_prints_its_error(capsys, monkeypatch):
    from engine.models.llama import Llama

    def forward(self, rows, cache):
        raise RuntimeError("poisoned weights")
    monkeypatch.setattr(Llama, "forward", forward)
    assert main(["generate", "--model", TINY, "--backend", "numpy", "--prompt", "hi", "--context", "256"]) == 2
    err = capsys.readouterr().err
    assert "error: the reply failed: engine error: RuntimeError: poisoned weights" in err and "KeyError" not in err
