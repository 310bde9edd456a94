"""The memory plan: seed arithmetic for the Qwen3.5 27B and 35B-A3B configs, lines, bad input."""
import json

import pytest

from engine.config import ModelConfig
from engine.errors import PlanError
from engine.memory import gpu_free_bytes, is_unified
from engine.plan import GIB, UNIFIED_RESERVE, make_plan
from engine.settings import EngineSettings

MIB = 1 << 20


def qwen_config(moe: bool) -> ModelConfig:
    text = dict(model_type="qwen3_5_moe_text" if moe else "qwen3_5_text", hidden_size=2048 if moe else 5120,
                num_hidden_layers=40 if moe else 64, num_attention_heads=16 if moe else 24,
                num_key_value_heads=2 if moe else 4, head_dim=256, vocab_size=248320, rms_norm_eps=1e-6,
                linear_num_key_heads=16, linear_num_value_heads=32 if moe else 48, linear_key_head_dim=128,
                linear_value_head_dim=128, linear_conv_kernel_dim=4, full_attention_interval=4,
                max_position_embeddings=262144,
                rope_parameters={"rope_theta": 1e7, "partial_rotary_factor": 0.25})
    if moe:
        text.update(num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
                    shared_expert_intermediate_size=512)
    else:
        text["intermediate_size"] = 17408
    raw = {"model_type": "qwen3_5_moe" if moe else "qwen3_5", "text_config": text, "vision_config": {}}
    return ModelConfig.from_hf(json.loads(json.dumps(raw)))


@pytest.mark.parametrize("moe,page_mib", [(False, 16), (True, 5)])
def test_page_bytes_match_the_reference(moe, page_mib):
    cfg = qwen_config(moe)
    assert len(cfg.attention_layers) == (10 if moe else 16)
    p = make_plan(cfg, EngineSettings(parallel=8, context=16384, paging="all", memory_gib=64))
    assert p.page_bytes == page_mib * MIB
    fp8 = make_plan(cfg, EngineSettings(parallel=8, context=16384, paging="all", kv_dtype="fp8", memory_gib=64))
    # Half the bytes, plus one fp32 scale per (token, head, K/V, layer).
    assert fp8.page_bytes == page_mib * MIB // 2 + 256 * len(cfg.attention_layers) * 2 * cfg.kv_heads * 4


def test_seed_plan_lines_for_the_27b():
    cfg = qwen_config(False)
    # The seed's budget gave 1039 pages: reproduce the line from a budget of exactly that.
    budget = (1039 * 16 * MIB + 17 * cfg.state_bytes_per_stream()) / GIB
    s = EngineSettings(parallel=8, context=32768 * 4, paging="all", memory_gib=budget)
    p = make_plan(cfg, s)
    assert p.line.startswith("plan: the engine's own and 7 more on 1039 pages (16.23 GiB), no window")
    assert p.pool_pages == 1039
    pages = make_plan(cfg, EngineSettings(parallel=8, context=16384, paging="pages", memory_gib=40))
    assert pages.line.startswith("plan: the engine's own window (1.00 GiB) and 7 more on 448 pages (7.00 GiB)")
    off = make_plan(cfg, EngineSettings(parallel=8, context=16384, paging="off", memory_gib=40))
    assert off.line.startswith("plan: 8 windows of 16384 tokens (8.00 GiB), no pages")
    assert "recurrent state" in off.line  # DeltaNet rows and state counted apart


def test_recurrent_state_is_counted_per_stream():
    cfg = qwen_config(True)
    conv = (2 * 16 * 128 + 32 * 128) * 3 * 4
    state = 32 * 128 * 128 * 4
    assert cfg.state_bytes_per_stream() == 30 * (conv + state)
    p = make_plan(cfg, EngineSettings(parallel=4, context=4096, paging="all", memory_gib=8))
    assert p.state_bytes == (2 * 4 + 1) * cfg.state_bytes_per_stream()  # slots, checkpoints, scratch


def test_pool_is_capped_at_what_the_streams_can_use():
    cfg = qwen_config(True)
    p = make_plan(cfg, EngineSettings(parallel=2, context=4096, paging="all", memory_gib=100))
    assert p.pool_pages == 2 * 16 and p.windows == 0


@pytest.mark.parametrize("kw,words", [
    (dict(parallel=0), "parallel"),
    (dict(page_tokens=100), "power of two"),
    (dict(page_tokens=8), "power of two"),
    (dict(context=10**7), "maximum"),
    (dict(memory_gib=0.01), "too small"),
    (dict(kv_dtype="fp16"), "kv dtype"),
])
def test_bad_settings_are_refused_before_allocation(kw, words):
    s = EngineSettings(**{**dict(parallel=8, context=16384, paging="all", memory_gib=20), **kw})
    with pytest.raises(PlanError, match=words):
        make_plan(qwen_config(False), s)


def test_plan_cli_reads_a_nested_config(tmp_path, capsys):
    from engine.__main__ import main
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "qwen3_5_moe", "text_config": {
        "model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 248320, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512, "max_position_embeddings": 262144}}))
    assert main(["plan", "--config", str(cfg), "--parallel", "8", "--context", "16384", "--kv-pages", "256",
                 "--kv-pages-all", "--memory-gib", "6"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("plan: the engine's own and 7 more on 512 pages (2.50 GiB), no window")
    assert main(["plan", "--config", str(cfg), "--parallel", "0"]) == 2
    assert main(["plan", "--config", str(tmp_path / "missing.json")]) == 2


def meminfo(tmp_path, available_gib: float) -> str:
    path = tmp_path / "meminfo"
    path.write_text(f"MemTotal:       124000000 kB\nMemFree:         2000000 kB\n"
                    f"MemAvailable:   {int(available_gib * (1 << 20))} kB\nCached:         60000000 kB\n")
    return str(path)


@pytest.mark.parametrize("available_gib,budget_gib", [(100, 50), (24, 8)])
def test_an_integrated_gpu_plans_from_memavailable_and_leaves_the_desktop_16_gib(tmp_path, available_gib, budget_gib):
    # The device as CuPy's Device.attributes describes a GB10; cudaMemGetInfo there misses the page cache.
    device = {"Integrated": 1, "UnifiedAddressing": 1, "PageableMemoryAccessUsesHostPageTables": 1}
    unified = is_unified(device)
    free = gpu_free_bytes(unified, device_free=3 * GIB, pool_free=0, meminfo=meminfo(tmp_path, available_gib))
    assert unified and free == available_gib * GIB
    cfg = qwen_config(False)
    s = EngineSettings(parallel=8, context=16384, paging="all")
    p = make_plan(cfg, s, free, 0, unified=True)
    assert p.budget_bytes == budget_gib * GIB and free - p.budget_bytes >= UNIFIED_RESERVE
    assert p.total_bytes <= p.budget_bytes and p.unified
    plain = make_plan(cfg, EngineSettings(parallel=8, context=16384, paging="all", memory_gib=budget_gib), free)
    assert p.line == plain.line + " · unified memory"  # the seed's line, then the note


def test_a_discrete_gpu_keeps_cudamemgetinfo_and_half_of_it(tmp_path):
    device = {"Integrated": 0, "UnifiedAddressing": 1}
    assert not is_unified(device) and not is_unified({})
    free = gpu_free_bytes(is_unified(device), device_free=20 * GIB, pool_free=GIB, meminfo=meminfo(tmp_path, 500))
    assert free == 21 * GIB
    p = make_plan(qwen_config(False), EngineSettings(parallel=8, context=16384, paging="all"), free)
    assert p.budget_bytes == int(10.5 * GIB) and "unified" not in p.line


def test_unified_memory_too_small_for_the_reserve_says_so():
    s = EngineSettings(parallel=8, context=16384, paging="all")
    with pytest.raises(PlanError, match="16.00 GiB left to the desktop"):
        make_plan(qwen_config(False), s, 17 * GIB, 0, unified=True)
    # An explicit budget is the user's word, reserve or not.
    assert make_plan(qwen_config(False), EngineSettings(parallel=8, context=16384, paging="all", memory_gib=12),
                     17 * GIB, 0, unified=True).budget_bytes == 12 * GIB
