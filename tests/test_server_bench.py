"""bench-serve on a tiny model: the table, and every HTTP reply equal to its in-process twin."""
import subprocess
import sys

from engine.server import bench


def test_percentiles_are_nearest_rank():
    xs = [float(i) for i in range(1, 17)]
    assert bench.percentile(xs, 50) == 8.0 and bench.percentile(xs, 99) == 16.0
    assert bench.percentile([3.0], 99) == 3.0


def test_serve_args_run_the_same_settings():
    from engine import EngineSettings
    from engine.__main__ import parser, settings_from
    s = EngineSettings(model="synthetic:tiny-llama", backend="numpy", parallel=3, context=512, kv_dtype="fp8",
                       paging="all", page_tokens=32, memory_gib=0.5, prefill_chunk=64)
    again = settings_from(parser().parse_args(["serve", *bench.serve_args(s)]))
    assert again == s


def test_a_small_run_prints_the_table_with_nothing_lost():
    run = subprocess.run([sys.executable, "-m", "engine", "bench-serve", "--model", "synthetic:tiny-llama",
                          "--backend", "numpy", "--parallel", "2", "--context", "512", "--streams", "1,3",
                          "--max-tokens", "12"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith("bench-serve: tiny-llama · numpy")
    rows = [ln for ln in lines if ln.startswith("| 1 |") or ln.startswith("| 3 |")]
    assert len(rows) == 2 and rows[0].endswith("| 1 / 1 |") and rows[1].endswith("| 3 / 3 |")
    assert lines[-1] == "lost or extra tokens: 0; replies that differ from in-process: 0; errors: 0"
