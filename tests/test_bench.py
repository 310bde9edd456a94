"""The bench's CPU side: byte counting, the table, and a whole run on a tiny model (numpy); on a GPU,
the profile's per-kernel breakdowns."""
import argparse

import numpy as np
import pytest

from engine import bench
from engine.config import ModelConfig
from engine.models import build
from engine.ops import cuda_available
from engine.ops.numpy_backend import NumpyBackend
from engine.synthetic import synthetic


def test_kv_bytes_count_every_key_of_every_row():
    cfg = ModelConfig(arch="llama", hidden=64, layers=3, heads=4, kv_heads=2, head_dim=16, vocab=100)
    per_token_bf16 = 3 * 2 * 2 * 16 * 2
    assert bench.step_kv_bytes(cfg, "bf16", [0, 9]) == (1 + 10) * per_token_bf16
    assert bench.step_kv_bytes(cfg, "fp8", [4]) == 5 * 3 * 2 * 2 * (16 + 4)


def test_weight_bytes_are_every_layer_plus_head_plus_gathered_rows():
    model = build(synthetic("tiny-llama"), NumpyBackend())
    layers = sum(a.nbytes for layer in model.layers for a in layer.values())
    head = model.lm_head.nbytes + model.norm.nbytes
    row = model.embed.nbytes // model.embed.shape[0]
    assert bench.step_weight_bytes(model, 0) == layers + head
    assert bench.step_weight_bytes(model, 3) == layers + head + 3 * row


def test_synthetic_bytes_match_the_real_format():
    from engine.synthetic import synthetic as host
    m = host("tiny-llama")
    assert bench.synthetic_bytes("tiny-llama") == m.nbytes


def test_table_format():
    cells = [bench.Cell(bench.prompt_cell_name(2048), tok_s=6123.46),
             bench.Cell(bench.decode_cell_name(1, True), tok_s=101.0, step_ms=9.876, bytes_per_step=4.5e9,
                        roofline=0.712),
             bench.Cell(bench.decode_cell_name(8, False), note="skipped: more than --parallel 4")]
    lines = bench.format_table(cells).splitlines()
    assert lines[0] == "cell\ttok/s\tstep ms\tGB read/step\troofline"
    assert lines[1] == "prefill 2,048 (tok/s)\t6,123.5\t\t\t"
    assert lines[2] == "1 stream, greedy\t101.0\t9.88\t4.500\t71.2 %"
    assert lines[3].startswith("8 streams, T 1.0\t") and lines[3].endswith("skipped: more than --parallel 4")


def test_bench_runs_on_the_cpu(capsys):
    a = argparse.Namespace(model=None, synthetic="tiny-llama", backend="numpy", parallel=2, context=512,
                           kv_dtype="fp8", kv_pages=16, kv_pages_all=True, memory_gib=None, prefill_chunk=64,
                           prompt_lengths=[48, 100, 600], streams=[1, 2, 4], decode_tokens=5, history=[200, 600],
                           profile=True)
    assert bench.main(a) == 0
    out = capsys.readouterr().out
    assert "plan: the engine's own and 1 more on" in out
    table = out[out.index("cell\t"):out.index("profile:")].splitlines()
    names = [line.split("\t")[0] for line in table[1:]]
    assert names == ["prefill 48 (tok/s)", "prefill 100 (tok/s)", "prefill 600 (tok/s)", "1 stream, greedy",
                     "1 stream, T 1.0", "2 streams, greedy", "2 streams, T 1.0", "4 streams, greedy",
                     "4 streams, T 1.0", "1 stream after 200, greedy", "1 stream after 600, greedy"]
    rows = {line.split("\t")[0]: line.split("\t") for line in table[1:]}
    assert float(rows["prefill 48 (tok/s)"][1].replace(",", "")) > 0
    assert "beyond --context" in rows["prefill 600 (tok/s)"][-1]
    assert rows["2 streams, greedy"][4].endswith("%") and float(rows["2 streams, greedy"][4][:-2]) > 0
    assert "more than --parallel" in rows["4 streams, greedy"][-1]
    after = rows["1 stream after 200, greedy"]
    assert float(after[1].replace(",", "")) > 0 and float(after[2]) > 0
    assert "beyond --context" in rows["1 stream after 600, greedy"][-1]
    assert "profile: the numpy backend launches no kernels" in out


def test_profile_groups_launches_by_kernel_and_grid_largest_first():
    from engine.bench_profile import format_profile
    launches = [("qmv<4, 2, 0, 2, 1>", (32, 1, 1), 10.0), ("rmsnorm_rows", (1,), 2.0),
                ("qmv<4, 2, 0, 2, 1>", (32, 1, 1), 14.0), ("qmv<4, 2, 0, 0, 1>", (8, 4, 1), 4.0)]
    lines = format_profile(launches, "cupy").splitlines()
    assert lines[0].endswith("4 launches, 30.0 µs of kernels")
    assert lines[2] == "qmv<4, 2, 0, 2, 1>\t32x1x1\t2\t12.0\t24.0\t80.0 %"
    assert lines[3].startswith("qmv<4, 2, 0, 0, 1>\t8x4x1\t1\t4.0\t4.0\t")
    assert lines[4].startswith("rmsnorm_rows\t1\t1\t2.0")


def test_cli_wiring(capsys):
    from engine.__main__ import main
    assert main(["bench", "--synthetic", "tiny-qwen3", "--backend", "numpy", "--parallel", "1", "--context", "256",
                 "--prompt-lengths", "40", "--streams", "1", "--decode-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "1 stream, greedy\t" in out and "prefill 40 (tok/s)" in out
    assert np.isfinite(float(out.split("1 stream, greedy\t")[1].split("\t")[0].replace(",", "")))


def test_double_and_trace_are_checked_and_need_the_gpu(capsys):
    """`--double`: a pattern that is no regular expression is refused by its type; on the numpy
    backend (no decode graphs) the bench refuses it, and `--trace`, in one line."""
    from engine.__main__ import main
    args = ["bench", "--synthetic", "tiny-qwen3", "--backend", "numpy", "--parallel", "1", "--context", "256",
            "--prompt-lengths", "40", "--streams", "1", "--decode-tokens", "3"]
    assert main(args + ["--double", "qmv<("]) == 2
    assert "argument --double: is not a regular expression" in capsys.readouterr().err
    assert main(args + ["--double", "moe_route"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "error: --double doubles launches in decode graphs: it needs the GPU backend"
    assert main(args + ["--trace"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == "error: --trace stamps launches in decode graphs: it needs the GPU backend"


def test_moe_steps_count_only_the_experts_rows_can_reach():
    model = build(synthetic("tiny-qwen3.5-moe"), NumpyBackend())
    experts = sum(v.nbytes for layer in model.layers for k, v in layer.items() if k.startswith("experts"))
    full = bench.step_weight_bytes(model, 4)  # 4 rows × top-2 = all 8 experts
    one = bench.step_weight_bytes(model, 1)  # 1 row reaches 2 of 8
    row = model.embed.nbytes // model.embed.shape[0]
    assert full - 3 * row - one == experts - experts * 2 // 8


def test_drafted_cells_report_acceptance_and_the_window_cost(capsys):
    a = argparse.Namespace(model=None, synthetic="tiny-qwen3.5", backend="numpy", parallel=2, context=256,
                           kv_dtype="bf16", kv_pages=None, kv_pages_all=False, memory_gib=None, prefill_chunk=64,
                           prompt_lengths=[40], streams=[1, 2], decode_tokens=9, drafter="oracle", draft_tokens=3,
                           profile=True)
    assert bench.main(a) == 0
    out = capsys.readouterr().out
    assert out.count("profile: the numpy backend launches no kernels") == 3  # a step, a verify window, a chunk
    table = out.split("cell\t", 1)[1].split("profile:")[0].splitlines()
    rows = {line.split("\t")[0]: line.split("\t") for line in table[1:]}
    for name in ("1 stream, greedy", "2 streams, T 1.0"):
        cell = rows[f"{name}, oracle k=3"]
        assert float(cell[1].replace(",", "")) > 0 and float(cell[2]) > 0
        # 9 tokens: the prompt's, then windows of 4 accepted in full (the last cut by the token limit)
        assert "mean accepted length 4.00, window " in cell[-1] and cell[-1].endswith("x one row's step")


def test_profile_rows_are_the_verifiers_windows(capsys):
    """bench --profile's rows for several streams and for verify windows run as the scheduler's own
    (a window's rows at consecutive positions of one lane, the drafter's hidden states with them)."""
    from engine.bench_profile import profile_rows
    from engine.settings import EngineSettings
    s = EngineSettings(model="synthetic:tiny-qwen3.5", backend="numpy", parallel=3, context=256, drafter="mtp",
                       draft_tokens=3).validate()
    runner = bench.build_runner(argparse.Namespace(synthetic=None), s, lambda m: None)
    sched = bench.ready_scheduler(runner, s)
    lanes = [sched.lanes.acquire() for _ in range(2)]
    assert all(sched.lanes.ensure(x, 40) for x in lanes)
    rows = profile_rows(sched, lanes, 30, 4)
    assert rows.positions.tolist() == [30, 31, 32, 33] * 2 and rows.hidden and rows.window == 4
    assert rows.lanes.tolist() == [lanes[0].index] * 4 + [lanes[1].index] * 4
    logits, hidden = runner.backend.decode_step(runner.model, rows, sched.cache)
    assert logits.shape[0] == 8 and hidden.shape[0] == 8 and np.isfinite(logits).all()
    plain = profile_rows(sched, lanes, 30)
    assert plain.positions.tolist() == [30, 30] and not plain.hidden and plain.window == 1


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available()[0], reason="no GPU")
def test_profile_breaks_down_a_step_of_several_streams_and_a_verify_window(capsys):
    a = argparse.Namespace(model=None, synthetic="tiny-qwen3.5", backend="cupy", parallel=3, context=2048,
                           kv_dtype="bf16", kv_pages=16, kv_pages_all=True, memory_gib=None, prompt_lengths=[40],
                           streams=[1, 2], decode_tokens=5, drafter="oracle", draft_tokens=3, profile=True)
    assert bench.main(a) == 0
    out = capsys.readouterr().out
    for what in ("one decode step, 1 stream", "one decode step, 2 streams", "one verify window of 4 rows, 1 stream"):
        kernels = out.split(f"profile: {what} at position 300, graphs off: ")[1].split("profile:")[0]
        assert "\nqmv<" in kernels and "\nsample_rows\t" in kernels


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available()[0], reason="no GPU")
def test_trace_stamps_every_launch_of_a_decode_graph():
    """`bench --trace` in a process of its own (the stamps are compiled in before any kernel): the
    1-stream graph's replays stamp every launch, and the classes' times add up to its span."""
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "engine", "bench", "--synthetic", "tiny-qwen3.5", "--backend", "cupy",
                          "--parallel", "1", "--context", "1024", "--prompt-lengths", "40", "--streams", "1",
                          "--decode-tokens", "12", "--history", "1", "--interleave", "0", "--trace"],
                         capture_output=True, text=True, timeout=600).stdout
    head = out.split("trace: graph of 1 row, ")[1].splitlines()
    span = float(head[0].split("first to last launch ")[1].split(" µs")[0])
    rows = [line.split() for line in head[1:] if line.startswith("  ")]
    assert rows and span > 0 and all(float(r[0]) >= 0 for r in rows)
    assert abs(sum(float(r[0]) for r in rows) - span) < 0.01 * span + 0.1  # every launch but the last


def test_mfu_counts_every_product_and_the_prompts_attention():
    from engine.bench_prefill import mfu_note, product_flops, prompt_flops_per_token
    model = build(synthetic("tiny-llama"), NumpyBackend())
    cfg = model.cfg
    weights = sum(a.size for layer in model.layers for a in layer.values() if a.ndim == 2)
    assert product_flops(model) == 2 * weights
    attention = 4 * cfg.layers * cfg.heads * cfg.head_dim * (100 + 1) / 2
    assert prompt_flops_per_token(model, 100) == 2 * weights + attention
    assert mfu_note(model, 100, 1e3, 2 * (2 * weights + attention) * 1e3) == "MFU 50.0 %"
    moe = build(synthetic("tiny-qwen3.5-moe"), NumpyBackend())
    experts = sum(v.size for layer in moe.layers for k, v in layer.items() if k.startswith("experts"))
    dense = product_flops(moe) - 2 * experts * moe.cfg.top_k / moe.cfg.experts
    assert 0 < dense < product_flops(moe)


def test_decode_while_a_long_prompt_is_read(capsys):
    a = argparse.Namespace(model=None, synthetic="tiny-qwen3", backend="numpy", parallel=3, context=512,
                           kv_dtype="bf16", kv_pages=16, kv_pages_all=True, memory_gib=None, prefill_chunk=64,
                           prompt_lengths=[300], streams=[1], decode_tokens=6, interleave=2)
    assert bench.main(a) == 0
    out = capsys.readouterr().out
    assert "dense GEMM " in out and "(numpy float32 1024^3, for MFU)" in out
    rows = {line.split("\t")[0]: line.split("\t") for line in out.split("cell\t", 1)[1].splitlines()[1:]}
    assert rows["prefill 300 (tok/s)"][-1].startswith("MFU ") and rows["prefill 300 (tok/s)"][-1].endswith(" %")
    during, read = rows["2 streams while a 300-token prompt is read"], rows["the 300-token prompt beside 2 streams"]
    assert float(during[1].replace(",", "")) > 0 and "alone " in during[-1] and "(bound -30 %)" in during[-1]
    assert float(read[1].replace(",", "")) > 0 and "% of it (bound 50 %)" in read[-1]
    a.interleave = 3  # the prompt needs a lane of its own
    assert bench.main(a) == 0
    assert "skipped: more than --parallel 3 - 1 streams" in capsys.readouterr().out


def test_a_hybrid_step_reads_and_writes_each_streams_deltanet_state():
    from engine.synthetic import config_for
    cfg, _ = config_for("qwen3.5-27b")
    per = cfg.state_bytes_per_stream()
    assert per == 48 * (cfg.conv_channels * 3 * 4 + 48 * 128 * 128 * 4)  # 48 DeltaNet layers, fp32
    assert bench.step_state_bytes(cfg, 8) == 2 * 8 * per
    assert bench.step_state_bytes(config_for("llama3-8b")[0], 8) == 0
