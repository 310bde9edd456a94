"""bench-start: every stage of a start measured, in fresh processes, as a table or JSON."""
import json
import subprocess
import sys

from engine.bench_start import STAGES, measure
from engine.settings import EngineSettings


def test_measure_has_every_stage_and_ready_is_their_sum():
    t = measure(EngineSettings(model="synthetic:tiny-qwen3.5", backend="numpy", context=256), log=lambda m: None)
    assert set(t) == set(STAGES) and all(v >= 0 for v in t.values())
    assert t["ready"] >= t["backend"] + t["weights"] + t["prepare"] + t["kv"] + t["graphs"] - 1e-6
    assert t["first-step stall"] == max(0.0, t["first decode step"] - t["steady decode step"])


def test_runs_in_fresh_processes(tmp_path):
    cmd = [sys.executable, "-m", "engine", "bench-start", "--model", "synthetic:tiny-llama", "--backend", "numpy",
           "--context", "256"]
    done = subprocess.run(cmd + ["--runs", "2", "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)
    assert len(runs) == 2 and all(set(r) == set(STAGES) for r in runs)
    table = subprocess.run(cmd + ["--runs", "1"], capture_output=True, text=True, timeout=300).stdout
    assert "| ready |" in table and "| graphs |" in table and "| first-step stall |" in table
