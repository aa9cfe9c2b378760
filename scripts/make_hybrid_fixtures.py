"""Tiny random-weight Qwen3.5 hybrid / Qwen3.5-MoE / Qwen3-MoE models: transformers' logits
and the GGUF that llama.cpp's own converter writes from the same weights.

For each config below the script
  1. builds the model in transformers (f32, seeded random weights with scales that give
     non-trivial logits: zero-centred norms get w ~ N(0, 0.1), A_log and dt_bias spread so
     the decays differ per head),
  2. saves it as HF safetensors + config.json in a temporary folder (the dense hybrid also
     gets random `mtp.*` tensors, which transformers ignores, so the GGUF carries an MTP block),
  3. converts it with llama.cpp's convert_hf_to_gguf.py (vendored in llama-cpp-python
     0.3.36; its gguf-py on sys.path) at --outtype f16 (the matrices are rounded to f16 before the reference runs, so both
     sides hold identical weights); only the vocabulary step is replaced
     by a minimal byte-free list of tokens, because these models have no tokenizer (the
     fixtures are token ids),
  4. runs transformers on a fixed prompt of N_IDS ids in one forward pass and stores the
     f32 logits of every position ([N_IDS, n_vocab], little-endian).

Output: crates/model/tests/fixtures/hybrid/{name}.gguf, {name}.logits.bin and
reference.json (ids, shapes, versions); for the models in HF_DIRS also the HF checkpoint
itself under hf/{name}/ (config.json + model.safetensors: matrices f16, which is exactly what
the reference ran with, vectors kept f32 as the GGUF keeps them), read by neagari's
safetensors source (crates/engine/tests/hybrid_hf.rs). Read by crates/model/tests/hybrid_transformers.rs.

Usage: python3 scripts/make_hybrid_fixtures.py   (needs torch, transformers, safetensors)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import tempfile

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "crates", "model", "tests", "fixtures", "hybrid")
LCP = os.environ.get(
    "LLAMA_CPP_DIR", "/work/deps/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp"
)
N_IDS = 150  # several prefill chunks at n_batch 32, and more than one 64-token GDN chunk
SEED = 1234
# Models whose HF checkpoint is committed too.
HF_DIRS = ("qwen35_dense", "qwen35_moe", "qwen3next_moe")

LT, FA = "linear_attention", "full_attention"

CONFIGS = {
    # Dense Qwen3.5 hybrid: 2 key heads / 4 value heads exercises the V-head reordering.
    "qwen35_dense": dict(
        kind="qwen3_5",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        layer_types=[LT, LT, FA, LT, LT, FA],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=10_000_000.0,
            partial_rotary_factor=0.25,
            mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
        mtp_num_hidden_layers=1,
    ),
    # Qwen3.5 MoE hybrid: router top-k (softmax, renormalised), sigmoid-gated shared expert.
    "qwen35_moe": dict(
        kind="qwen3_5_moe",
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=4,
        layer_types=[LT, FA, LT, FA],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=6,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters=dict(
            rope_type="default",
            rope_theta=10_000_000.0,
            partial_rotary_factor=0.25,
            mrope_section=[2, 1, 1],
            mrope_interleaved=True,
        ),
    ),
    # Qwen3-Next: fused in_proj_qkvz / in_proj_ba (split by the converter into attn_qkv,
    # attn_gate and ssm_ba, V heads left in grouped order), MoE with a gated shared expert,
    # (llama.cpp's qwen3next converter has no dense-layer mapping, so every layer is MoE).
    "qwen3next_moe": dict(
        kind="qwen3_next",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        layer_types=[LT, LT, FA, LT],
        mlp_only_layers=[],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        norm_topk_prob=True,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_parameters=dict(
            rope_type="default", rope_theta=10_000_000.0, partial_rotary_factor=0.25
        ),
    ),
    # Plain Qwen3-MoE (every layer MoE, no shared expert).
    "qwen3_moe": dict(
        kind="qwen3_moe",
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        rope_theta=1_000_000.0,
    ),
}


def build(kind: str, cfg: dict):
    if kind == "qwen3_5":
        from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

        return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**cfg))
    if kind == "qwen3_5_moe":
        from transformers import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

        return Qwen3_5MoeForCausalLM(Qwen3_5MoeTextConfig(**cfg))
    if kind == "qwen3_next":
        from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

        return Qwen3NextForCausalLM(Qwen3NextConfig(**cfg))
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        return Qwen3MoeForCausalLM(Qwen3MoeConfig(**cfg))
    raise ValueError(kind)


def randomize(model, gen: torch.Generator) -> None:
    """Scales that keep activations O(1) through the stack, so the logits differ clearly."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.0, 2.5, generator=gen))
            elif name.endswith("dt_bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("linear_attn.norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
            elif "norm" in name and p.ndim == 1:
                # Zero-centred (1 + w) everywhere in these families except the GDN norm;
                # Qwen3-MoE's plain RMSNorm gets 1 + noise too.
                base = 1.0 if type(model).__name__ == "Qwen3MoeForCausalLM" else 0.0
                p.copy_(base + 0.1 * torch.randn(p.shape, generator=gen))
            elif "conv1d" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=gen))
            else:
                fan_in = p.shape[-1]
                p.copy_(torch.randn(p.shape, generator=gen) / fan_in**0.5)


def mtp_tensors(cfg: dict, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A random MTP block in Qwen3.5's checkpoint naming (one full-attention layer)."""
    h, hd = cfg["hidden_size"], cfg["head_dim"]
    nh, nkv, ff = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["intermediate_size"]

    def r(*shape, s=None):
        s = s if s is not None else 1.0 / shape[-1] ** 0.5
        return torch.randn(shape, generator=gen) * s

    t = {
        "mtp.fc.weight": r(h, 2 * h),
        "mtp.pre_fc_norm_embedding.weight": r(h, s=0.1),
        "mtp.pre_fc_norm_hidden.weight": r(h, s=0.1),
        "mtp.norm.weight": r(h, s=0.1),
    }
    p = "mtp.layers.0."
    t.update(
        {
            p + "input_layernorm.weight": r(h, s=0.1),
            p + "post_attention_layernorm.weight": r(h, s=0.1),
            p + "self_attn.q_proj.weight": r(nh * hd * 2, h),
            p + "self_attn.k_proj.weight": r(nkv * hd, h),
            p + "self_attn.v_proj.weight": r(nkv * hd, h),
            p + "self_attn.o_proj.weight": r(h, nh * hd),
            p + "self_attn.q_norm.weight": r(hd, s=0.1),
            p + "self_attn.k_norm.weight": r(hd, s=0.1),
            p + "mlp.gate_proj.weight": r(ff, h),
            p + "mlp.up_proj.weight": r(ff, h),
            p + "mlp.down_proj.weight": r(h, ff),
        }
    )
    return t


def patch_converter_vocab(n_vocab: int) -> None:
    """The converter reads a tokenizer from the model folder; these models have none, so
    its vocabulary step writes a plain list of placeholder tokens instead."""
    sys.path.insert(0, LCP)
    sys.path.insert(0, os.path.join(LCP, "gguf-py"))
    from conversion import base

    def no_spm(self, *a, **k):
        raise FileNotFoundError("no tokenizer.model in a fixture")

    def minimal_gpt2(self) -> None:
        n = self.hparams["vocab_size"]
        self.gguf_writer.add_tokenizer_model("gpt2")
        self.gguf_writer.add_tokenizer_pre("qwen35")
        self.gguf_writer.add_token_list([f"<t{i}>" for i in range(n)])
        self.gguf_writer.add_token_types([1] * n)
        self.gguf_writer.add_token_merges([])
        self.gguf_writer.add_eos_token_id(n - 1)

    base.TextModel._set_vocab_sentencepiece = no_spm
    base.TextModel._set_vocab_gpt2 = minimal_gpt2
    base.TextModel._set_vocab_qwen = minimal_gpt2


def convert(model_dir: str, out_path: str, no_mtp: bool, name: str) -> None:
    import convert_hf_to_gguf as conv

    argv = [
        "convert_hf_to_gguf.py",
        model_dir,
        "--outfile",
        out_path,
        "--outtype",
        "f32",
        "--model-name",
        f"fixture-{name}",
    ]
    if no_mtp:
        argv.append("--no-mtp")
    argv[argv.index("f32")] = "f16"
    old = sys.argv
    sys.argv = argv
    try:
        conv.main()
    finally:
        sys.argv = old


def save_hf(src_dir: str, dst: str, t: dict | None = None) -> None:
    """The checkpoint as transformers saved it (or the tensors `t`, with its config),
    matrices as f16 (they hold f16 values already), 1-D tensors f32."""
    import shutil

    from safetensors.torch import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    shutil.copy(os.path.join(src_dir, "config.json"), os.path.join(dst, "config.json"))
    if t is None:
        t = load_file(os.path.join(src_dir, "model.safetensors"))
    out = {k: (v.half() if v.ndim >= 2 else v.float()).contiguous() for k, v in sorted(t.items())}
    for k, v in t.items():
        assert torch.equal(out[k].float(), v.float()), k
    save_file(out, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})


def main() -> None:
    from safetensors.torch import load_file, save_file

    os.makedirs(OUT, exist_ok=True)
    patch_converter_vocab(0)
    torch.manual_seed(SEED)
    ref: dict = {
        "torch": torch.__version__,
        "transformers": importlib.metadata.version("transformers"),
        "converter": "llama.cpp convert_hf_to_gguf.py (llama-cpp-python 0.3.36 vendor)",
        "models": {},
    }
    for i, (name, full) in enumerate(CONFIGS.items()):
        cfg = {k: v for k, v in full.items() if k != "kind"}
        gen = torch.Generator().manual_seed(SEED + i)
        model = build(full["kind"], cfg).float().eval()
        randomize(model, gen)
        # Matrices are stored as f16 in the GGUF; round them here so both sides hold the
        # same values and the comparison measures the forward pass, not the storage.
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim >= 2:
                    p.copy_(p.half().float())
        ids = torch.randint(0, cfg["vocab_size"], (1, N_IDS), generator=gen)
        with torch.no_grad():
            logits = model(input_ids=ids, use_cache=False).logits[0].float().numpy()
        with tempfile.TemporaryDirectory() as d:
            model.save_pretrained(d, safe_serialization=True)
            has_mtp = cfg.get("mtp_num_hidden_layers", 0) > 0
            if has_mtp:
                st = os.path.join(d, "model.safetensors")
                tensors = load_file(st)
                extra = mtp_tensors(cfg, gen)
                tensors.update({k: v.half().float() for k, v in extra.items()})
                save_file(tensors, st, metadata={"format": "pt"})
            if name in HF_DIRS:
                save_hf(d, os.path.join(OUT, "hf", name))
            fused = any(k.endswith("experts.gate_up_proj") for k in model.state_dict())
            if fused and full["kind"] == "qwen3_5_moe":
                # transformers saves experts one by one (experts.E.gate_proj, …); the fused
                # layout the model holds in memory (experts.gate_up_proj [E, 2F, H],
                # experts.down_proj [E, H, F]) is saved too, as hf/{name}_fused.
                if name in HF_DIRS:
                    save_hf(d, os.path.join(OUT, "hf", name + "_fused"), dict(model.state_dict()))
            gguf_path = os.path.join(OUT, f"{name}.gguf")
            convert(d, gguf_path, no_mtp=full["kind"] != "qwen3_moe" and not has_mtp, name=name)
        logits.astype("<f4").tofile(os.path.join(OUT, f"{name}.logits.bin"))
        ref["models"][name] = {
            "hf_model_type": model.config.model_type,
            "ids": [int(x) for x in ids[0]],
            "logits_shape": list(logits.shape),
            "has_mtp": has_mtp,
        }
        print(
            f"{name}: {model.config.model_type}, |logit| max {np.abs(logits).max():.3f}, "
            f"std {logits.std():.3f}, gguf {os.path.getsize(gguf_path)} bytes"
        )
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
