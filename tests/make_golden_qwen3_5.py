"""Write the Qwen3.5 parity fixtures: tiny random checkpoints in Hugging Face form and their golden outputs.

Runs where torch and transformers (>= 5, with qwen3_5 / qwen3_5_moe) are installed, on the CPU:

    /tmp/venvtf/bin/python tests/make_golden_qwen3_5.py   # (torch, transformers, safetensors, ml_dtypes, tokenizers)

It writes tests/fixtures/tiny_qwen3_5/ and tiny_qwen3_5_moe/ (Hugging Face form), and
tiny_qwen3_5_mlx4/ and tiny_qwen3_5_moe_mlx4/: the same models as mlx-lm converts them (renamed,
norms shifted, conv1d [C, K, 1], experts split into switch_mlp, no MTP) and affine 4-bit with groups
of 32 (routers 8-bit, weights whose input dim is not a multiple of 32 left bf16); their golden
outputs come from transformers running the dequantized weights. One seed serves both forms: the
first whose greedy steps are all at least MIN_MARGIN from a tie in both.

Each fixture folder holds
- config.json: a real Qwen3.5 layout (top-level `qwen3_5[_moe]`, text fields under `text_config`,
  `mtp_num_hidden_layers` 1, a tiny `vision_config`);
- tokenizer.json, tokenizer_config.json, generation_config.json: tests/ckpt.py's tiny byte-level BPE;
- model.safetensors (HF form): bf16 weights (A_log fp32) named as the released checkpoints name them
  (`model.language_model.*`, `lm_head.weight`, `mtp.*`; MoE experts fused as
  `mlp.experts.gate_up_proj` / `mlp.experts.down_proj`), norms zero-centred (HF stores w, uses 1+w);
- golden.npz, in tests/make_golden.py's keys plus two:
    input_ids   int64 [P, L]     the prompts, right-padded with -1 (150 tokens: two engine prompt
                                 chunks of 128 and three DeltaNet chunks of 64; 3 tokens; 1 token)
    lengths     int64 [P]
    logits      float32 [P, V]   last-position logits of each prompt (no cache: the chunked form)
    greedy      int64 [P, 8]     greedy tokens generated with the HF cache (chunked prompt form,
                                 then the recurrent decode step)
    step_logits float32 [P, 8, V] the logits each greedy token was chosen from
    margins     float32 [P, 8]   top-1 minus top-2 of each step (the seed is chosen so that none is
                                 a near tie, so greedy tokens are a fair test)
    versions    str

Weights are random with unit-scale fan-in init (not the 0.02 init, whose logits are nearly flat),
zero-centred norm weights far from zero so that a missing or doubled (1+w) shows, and the DeltaNet
gated norm weight away from 1. The model computes in float32 from the bf16-rounded weights.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch
import transformers

TESTS = Path(__file__).resolve().parent
HERE = TESTS / "fixtures"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS.parent))
import ml_dtypes  # noqa: E402

from engine.weights import dequantize, quantize  # noqa: E402

import ckpt  # noqa: E402  (the tokenizer files and safetensors writer, shared with tests/make_golden.py)

PROMPT_LEN = 150
STEPS = 8
MIN_MARGIN = 0.05

TEXT = dict(
    vocab_size=320, hidden_size=32, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
    head_dim=16, hidden_act="silu", max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
    linear_num_value_heads=4, full_attention_interval=4, attention_bias=False, bos_token_id=1, eos_token_id=2,
)
DENSE = dict(intermediate_size=64)
MOE = dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, shared_expert_intermediate_size=16)
VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, patch_size=4,
              spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16)


def classes(moe: bool):
    if moe:
        from transformers import Qwen3_5MoeForCausalLM as LM
        from transformers import Qwen3_5MoeTextConfig as Cfg
        from transformers.models.qwen3_5_moe.modeling_qwen3_5_moe import Qwen3_5MoeDecoderLayer as Layer
    else:
        from transformers import Qwen3_5ForCausalLM as LM
        from transformers import Qwen3_5TextConfig as Cfg
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer as Layer
    return LM, Cfg, Layer


def randomise(named: dict[str, torch.Tensor], g: torch.Generator) -> None:
    """Overwrite parameters in place with bf16-representable random values (A_log stays fp32)."""
    def normal(t, std):
        return torch.randn(t.shape, generator=g) * std

    for name, t in named.items():
        leaf = name.rsplit(".", 1)[-1] if not name.endswith(".weight") else name.rsplit(".", 2)[-2]
        if name.endswith("A_log"):
            val = torch.log(torch.rand(t.shape, generator=g) * 15 + 1)
        elif name.endswith("dt_bias"):
            val = normal(t, 0.5)
        elif name.endswith("linear_attn.norm.weight"):
            val = 1.0 + normal(t, 0.3)  # used as is
        elif leaf in ("input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm",
                      "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
            val = normal(t, 0.4)  # zero-centred: the model multiplies by 1 + w
        elif name.endswith("conv1d.weight"):
            val = normal(t, 0.5)
        elif name.endswith("embed_tokens.weight"):
            val = normal(t, 1.0)
        elif name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            val = normal(t, t.shape[-1] ** -0.5)
        elif name == "lm_head.weight":
            val = normal(t, 4 * t.shape[-1] ** -0.5)  # logits spread wide enough that greedy has no near ties
        elif name.endswith("mlp.gate.weight"):
            val = normal(t, 2 * t.shape[-1] ** -0.5)  # decisive routing
        elif t.ndim == 2:
            val = normal(t, t.shape[-1] ** -0.5)
        else:
            raise ValueError(f"no init rule for {name} {tuple(t.shape)}")
        if not name.endswith("A_log"):
            val = val.to(torch.bfloat16).to(torch.float32)
        with torch.no_grad():
            t.copy_(val)


@torch.no_grad()
def greedy(model, ids: torch.Tensor):
    """8 greedy tokens with the HF cache; the logits each was chosen from."""
    out = model(input_ids=ids, use_cache=True)
    cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
    logits = out.logits[0, -1]
    toks, steps = [], []
    for _ in range(STEPS):
        steps.append(logits.float().numpy().copy())
        t = int(torch.argmax(logits))
        toks.append(t)
        out = model(input_ids=torch.tensor([[t]]), past_key_values=cache, use_cache=True)
        cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
        logits = out.logits[0, -1]
    return np.array(toks, np.int32), np.stack(steps).astype(np.float32)


def margin(row: np.ndarray) -> float:
    top = np.sort(row)[-2:]
    return float(top[1] - top[0])


def build(moe: bool, seed: int):
    LM, Cfg, Layer = classes(moe)
    text = dict(TEXT, **(MOE if moe else DENSE))
    cfg = Cfg(**text)
    torch.manual_seed(seed)
    model = LM(cfg).float().eval()
    g = torch.Generator().manual_seed(seed)
    randomise(dict(model.named_parameters()), g)
    # The MTP head: one full-attention decoder layer of the model's kind, plus fc and norms.
    mcfg = Cfg(**dict(text, num_hidden_layers=1, layer_types=["full_attention"]))
    mlayer = Layer(mcfg, 0).float()
    H = cfg.hidden_size
    mtp = {f"mtp.layers.0.{k}": v for k, v in mlayer.state_dict().items()}
    mtp.update({"mtp.fc.weight": torch.zeros(H, 2 * H), "mtp.pre_fc_norm_embedding.weight": torch.zeros(H),
                "mtp.pre_fc_norm_hidden.weight": torch.zeros(H), "mtp.norm.weight": torch.zeros(H)})
    mtp = {k: v.clone() for k, v in mtp.items()}
    randomise(mtp, g)
    return model, cfg, mtp


def checkpoint(model, mtp: dict) -> dict[str, torch.Tensor]:
    out = {}
    for name, t in model.state_dict().items():
        if name.startswith("model."):
            name = "model.language_model." + name[len("model."):]
        out[name] = t
    out.update(mtp)
    return {k: (v.contiguous() if k.endswith("A_log") else v.to(torch.bfloat16).contiguous()) for k, v in out.items()}


def config_json(cfg, moe: bool) -> dict:
    text = cfg.to_dict()
    for k in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path", "id2label",
              "label2id", "output_attentions", "output_hidden_states", "return_dict", "problem_type",
              "chunk_size_feed_forward", "tie_encoder_decoder", "is_encoder_decoder"):
        text.pop(k, None)
    text.update(model_type="qwen3_5_moe_text" if moe else "qwen3_5_text", mtp_num_hidden_layers=1,
                attn_output_gate=True, full_attention_interval=4, dtype="bfloat16")
    arch = "Qwen3_5MoeForConditionalGeneration" if moe else "Qwen3_5ForConditionalGeneration"
    return {"architectures": [arch], "model_type": "qwen3_5_moe" if moe else "qwen3_5",
            "text_config": text, "vision_config": dict(VISION), "tie_word_embeddings": False,
            "image_token_id": 120, "video_token_id": 121, "vision_start_token_id": 122, "vision_end_token_id": 123,
            "transformers_version": transformers.__version__}


def run_golden(model, prompts):
    """Last-position logits (no cache), greedy tokens with the cache, their step logits and margins."""
    logits, tokens, steps = [], [], []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            logits.append(model(input_ids=ids, use_cache=False).logits[0, -1].float().numpy())
        t, s = greedy(model, ids)
        # HF's own consistency: the cached path's first step is the no-cache logits.
        assert np.allclose(s[0], logits[-1], atol=1e-3), np.abs(s[0] - logits[-1]).max()
        tokens.append(t)
        steps.append(s)
    margins = np.array([[margin(r) for r in s] for s in steps], np.float32)
    drift = 0.0  # the full recompute of prompt + generated against the cached decode (HF's own check)
    for p, t, s in zip(prompts, tokens, steps):
        with torch.no_grad():
            recompute = model(input_ids=torch.tensor([p + t[:-1].tolist()]), use_cache=False).logits[0, len(p) - 1:]
        drift = max(drift, float(np.abs(recompute.float().numpy() - s).max()))
    return logits, tokens, steps, margins, drift


def write_fixture(out: Path, tensors: dict[str, np.ndarray], config: dict, prompts, logits, tokens, steps, margins):
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        old.unlink()
    ckpt.write_safetensors(out / "model.safetensors", tensors, {"format": "mlx" if "quantization" in config else "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": [2]}))
    ckpt.write_tokenizer(out)
    lengths = np.array([len(p) for p in prompts], np.int64)
    input_ids = np.full((len(prompts), lengths.max()), -1, np.int64)
    for i, p in enumerate(prompts):
        input_ids[i, : len(p)] = p
    np.savez(out / "golden.npz", input_ids=input_ids, lengths=lengths, logits=np.stack(logits).astype(np.float32),
             greedy=np.stack(tokens).astype(np.int64), step_logits=np.stack(steps).astype(np.float32),
             margins=margins, versions=np.array(f"transformers {transformers.__version__} / torch {torch.__version__}"))


ZERO_CENTRED = ("input_layernorm", "post_attention_layernorm", "norm", "q_norm", "k_norm")


def mlx_form(hf: dict[str, torch.Tensor], bits: int = 4, group: int = 32):
    """The HF checkpoint as mlx-lm converts it: renamed, zero-centred norms shifted (1+w), conv1d
    [C, K, 1], experts split into switch_mlp, MTP dropped; Linear/Embedding weights whose input dim
    divides by `group` affine-quantized (bf16 scales/biases), routers 8-bit as mlx-lm does.

    Returns (stored tensors, quantization block, float32 values back in HF names and conventions)."""
    stored, back, overrides = {}, {}, {}

    def put(mname: str, a: np.ndarray) -> np.ndarray:
        module = mname.removesuffix(".weight")
        b = 8 if module.endswith(("mlp.gate", "shared_expert_gate")) else bits
        if mname.endswith(".weight") and a.ndim >= 2 and "conv1d" not in mname and a.shape[-1] % group == 0:
            q = quantize(a, b, group, scale_dtype=ml_dtypes.bfloat16)
            stored[mname], stored[module + ".scales"], stored[module + ".biases"] = q.packed, q.scales, q.biases
            if b != bits:
                overrides[module] = {"group_size": group, "bits": b}
            return dequantize(q)
        stored[mname] = a.astype(np.float32 if mname.endswith("A_log") else ml_dtypes.bfloat16)
        return stored[mname].astype(np.float32)

    for name, t in hf.items():
        if name.startswith("mtp."):
            continue
        a = t.float().numpy()
        mname = "language_model.lm_head.weight" if name == "lm_head.weight" else \
            name.replace("model.language_model.", "language_model.model.")
        leaf = name.removesuffix(".weight").rsplit(".", 1)[-1]
        shift = leaf in ZERO_CENTRED and ".linear_attn." not in name
        if name.endswith("experts.gate_up_proj"):
            base = mname.replace("experts.gate_up_proj", "switch_mlp.")
            half = a.shape[1] // 2
            back[name] = np.concatenate([put(base + "gate_proj.weight", a[:, :half]),
                                         put(base + "up_proj.weight", a[:, half:])], axis=1)
        elif name.endswith("experts.down_proj"):
            back[name] = put(mname.replace("experts.down_proj", "switch_mlp.down_proj.weight"), a)
        elif name.endswith("conv1d.weight"):
            back[name] = put(mname, np.ascontiguousarray(a.transpose(0, 2, 1))).transpose(0, 2, 1)
        elif shift:
            back[name] = put(mname, a + np.float32(1.0)) - np.float32(1.0)
        else:
            back[name] = put(mname, a)
    quant = {"group_size": group, "bits": bits, "mode": "affine", **overrides}
    return stored, quant, back


def make(moe: bool) -> None:
    name = "tiny_qwen3_5_moe" if moe else "tiny_qwen3_5"
    LM = classes(moe)[0]
    for seed in range(200):
        model, cfg, mtp = build(moe, seed)
        rng = np.random.default_rng(1000 + seed)
        prompts = [rng.integers(3, cfg.vocab_size, PROMPT_LEN).tolist(), [1, 42, 7], [5]]
        dense = run_golden(model, prompts)
        hf = checkpoint(model, mtp)
        # MLX 4-bit form of the same model; its golden comes from the dequantized weights.
        stored, quant, back = mlx_form(hf)
        qmodel = LM(cfg).float().eval()
        qmodel.load_state_dict({("model." + k[len("model.language_model."):] if k.startswith("model.language_model.")
                                 else k): torch.from_numpy(np.ascontiguousarray(v)) for k, v in back.items()},
                               strict=True)
        mlx = run_golden(qmodel, prompts)
        worst = min(dense[3].min(), mlx[3].min())
        if worst >= MIN_MARGIN:
            break
        print(f"{name}: seed {seed} has a near tie ({worst:.4f}), trying the next", file=sys.stderr)
    else:
        raise SystemExit(f"{name}: no seed without near ties")
    out = HERE / name
    write_fixture(out, {k: v.float().numpy().astype(np.float32 if k.endswith("A_log") else ml_dtypes.bfloat16)
                        for k, v in hf.items()}, config_json(cfg, moe), prompts, *dense[:4])
    # The files on disk load back into transformers and give the same logits.
    reloaded = LM.from_pretrained(str(out), dtype=torch.float32).eval()
    with torch.no_grad():
        again = reloaded(input_ids=torch.tensor([prompts[0]]), use_cache=False).logits[0, -1].float().numpy()
    reload_err = float(np.abs(again - dense[0][0]).max())
    assert reload_err < 1e-5, reload_err
    qout = HERE / (name + "_mlx4")
    write_fixture(qout, stored, {**config_json(cfg, moe), "quantization": quant, "quantization_config": quant},
                  prompts, *mlx[:4])
    for folder, (logits, tokens, steps, margins, drift) in ((out, dense), (qout, mlx)):
        size = (folder / "model.safetensors").stat().st_size
        print(f"{folder.name}: seed {seed}, {size} bytes, greedy {[t.tolist() for t in tokens]}, "
              f"min margin {margins.min():.3f}, cache-vs-recompute drift {drift:.2e}, "
              f"logit range [{logits[0].min():.2f}, {logits[0].max():.2f}]")
    print(f"reload diff {reload_err:.1e}; transformers {transformers.__version__}, torch {torch.__version__}")


if __name__ == "__main__":
    torch.set_num_threads(1)
    for moe in (False, True):
        make(moe)
