"""Tiny random llama / qwen3 models as HF and MLX packs, with mlx-lm's logits on them.

Writes tests/fixtures/mlx/<name>/ (config.json, safetensors, tokenizer.json,
tokenizer_config.json) and tests/fixtures/mlx/reference.json + <name>_logits.f32
([n_ids, n_vocab] little-endian f32, every position of one batch). Read by
crates/engine/tests/mlx_packs.rs.

Each model is built with mlx-lm's own model classes (mlx_lm.models.llama / qwen3), seeded
random weights, and quantized with mlx-lm's quantizer (mlx_lm.utils.quantize_model →
mx.quantize, mode "affine"), saved with mlx_lm.utils.save_model / save_config (so the
files are exactly what `mlx_lm.convert` writes). The reference is mlx-lm's forward pass on
the *stored* tensors computed in float32: scales/biases (and bf16 weights) are exactly
representable in f32, so upcasting changes no value, and an f32 forward keeps mlx's own
rounding out of the comparison.

Variants (name: arch, bits/group, what it exercises):
  llama_bf16          unquantized bf16 HF checkpoint (GQA, separate lm_head, NeoX RoPE on
                      unpermuted q/k)
  llama_q{b}_g{g}     affine packs over bits 1,2,3,4,5,6,8 and groups 32/64/128
  qwen3_q{b}_g{g}     qwen3 (q/k norm, tied embedding used as quantized lm_head)
  qwen3_q4_mixed      per-layer overrides in "quantization" (down_proj 8-bit g32, one layer
                      kept float via false), bf16 scales/biases
  qwen3_hadamard      PrismML-style Hadamard rotation (hadamard.json + per-module .signs,
                      block 64) on a 4-bit g64 pack; reference applies
                      mx.hadamard_transform to each rotated module's input

Usage: python3 scripts/make_mlx_fixtures.py   (mlx[cpu]==0.32.*, mlx-lm==0.32.*)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil

import numpy as np
import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import gemma3_text, llama, qwen3
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import quantize_model, save_config, save_model
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "mlx")

HIDDEN = 128
N_LAYERS = 2
N_HEADS = 4
N_KV = 2
HEAD_DIM = 32
FFN = 256
N_GREEDY = 12
MIN_MARGIN = 0.05
QWEN2_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEXT = """The quick brown fox jumps over the lazy dog. A tiny model reads packed weights
where they lie: two bits, three bits, four bits and eight bits per weight, in groups of
thirty-two, sixty-four or one hundred and twenty-eight. Numbers like 12345 and 2026 split
into digits. Hello, world! How are you today? I am fine, thank you.
"""
PROMPT = "The quick brown fox reads packed weights, four bits per weight. Hello"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=384,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([TEXT] * 4, trainer)
    return tok


def base_config(arch: str, vocab: int) -> dict:
    if arch == "gemma3_text":
        # hidden 256: √256 = 16 is exact in bf16, the dtype mlx-lm rounds the embedding
        # scale to. Three layers, pattern 3 (two sliding, one global), a window of 8 so the
        # 20-id prompt crosses it; query_pre_attn_scalar = head_dim as in the 270M–12B.
        return {
            "model_type": "gemma3_text",
            "architectures": ["Gemma3ForCausalLM"],
            "hidden_size": 256,
            "num_hidden_layers": 3,
            "intermediate_size": 512,
            "num_attention_heads": 4,
            "num_key_value_heads": 1,
            "head_dim": 64,
            "query_pre_attn_scalar": 64,
            "rms_norm_eps": 1e-6,
            "vocab_size": vocab,
            "max_position_embeddings": 256,
            "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0,
            "sliding_window": 8,
            "sliding_window_pattern": 3,
            "tie_word_embeddings": True,
        }
    c = {
        "model_type": arch,
        "hidden_size": HIDDEN,
        "num_hidden_layers": N_LAYERS,
        "intermediate_size": FFN,
        "num_attention_heads": N_HEADS,
        "num_key_value_heads": N_KV,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "vocab_size": vocab,
        "max_position_embeddings": 256,
        "rope_theta": 10000.0,
        "tie_word_embeddings": arch == "qwen3",
    }
    if arch == "llama":
        # head_dim 32 = hidden / heads here; llama stores no explicit head_dim normally.
        c["architectures"] = ["LlamaForCausalLM"]
    else:
        c["architectures"] = ["Qwen3ForCausalLM"]
    return c


def build(arch: str, cfg: dict, seed: int) -> nn.Module:
    mx.random.seed(seed)
    mod = {"llama": llama, "qwen3": qwen3, "gemma3_text": gemma3_text}[arch]
    args = mod.ModelArgs.from_dict(cfg)
    m = mod.Model(args)
    # Larger-than-default weights so the tiny model's logits spread (clear greedy margins).
    params = tree_flatten(m.parameters())
    new = []
    for k, v in params:
        if k.endswith("norm.weight"):
            # Gemma's norms multiply by 1 + w: the same spread around 1 either way.
            v = (0.0 if arch == "gemma3_text" else 1.0) + 0.1 * mx.random.normal(v.shape)
        else:
            v = mx.random.normal(v.shape) * (1.5 / np.sqrt(v.shape[-1]))
            if "embed" in k:
                # Tied heads (qwen3, gemma3) reuse this table: keep the logits' spread near 3.
                v = mx.random.normal(v.shape) * {"llama": 1.0, "qwen3": 0.25, "gemma3_text": 0.2}[arch]
        new.append((k, v.astype(mx.float32)))
    m.update(tree_unflatten(new))
    mx.eval(m.parameters())
    return m


def upcast(m: nn.Module) -> None:
    """Floats of the stored pack to f32 (exact), so mlx computes the reference in f32."""
    params = tree_flatten(m.parameters())
    m.update(
        tree_unflatten(
            [(k, v.astype(mx.float32) if v.dtype in (mx.bfloat16, mx.float16) else v) for k, v in params]
        )
    )
    mx.eval(m.parameters())


def run_reference(m: nn.Module, ids: list[int]) -> tuple[np.ndarray, list[int], float]:
    logits = m(mx.array([ids]))[0].astype(mx.float32)
    logits = np.array(logits)
    cache = make_prompt_cache(m)
    out = m(mx.array([ids]), cache=cache)[0, -1]
    greedy, margin = [], 1e9
    for _ in range(N_GREEDY):
        o = np.array(out.astype(mx.float32))
        top = np.sort(o)[-2:]
        margin = min(margin, float(top[1] - top[0]))
        t = int(np.argmax(o))
        greedy.append(t)
        out = m(mx.array([[t]]), cache=cache)[0, -1]
    return logits, greedy, margin


def write_pack(name: str, m: nn.Module, cfg: dict, tok: Tokenizer) -> str:
    d = os.path.join(OUT, name)
    shutil.rmtree(d, ignore_errors=True)
    save_model(d, m)
    save_config(dict(cfg), os.path.join(d, "config.json"))
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "eos_token": "<|im_end|>",
                "bos_token": None,
                "add_bos_token": False,
                "chat_template": CHAT_TEMPLATE,
            },
            f,
            indent=1,
        )
    return d


def cast_scales(m: nn.Module, dtype) -> None:
    params = tree_flatten(m.parameters())
    m.update(
        tree_unflatten(
            [(k, v.astype(dtype) if k.endswith((".scales", ".biases")) else v) for k, v in params]
        )
    )
    mx.eval(m.parameters())


# --- Hadamard ------------------------------------------------------------------------

BLOCK = 64
ROTATED = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def sylvester(n: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def fwht_blocks(x: mx.array) -> mx.array:
    """Blockwise normalized Hadamard along the last axis, by mlx's own transform."""
    shp = x.shape
    y = mx.hadamard_transform(x.reshape(*shp[:-1], shp[-1] // BLOCK, BLOCK), scale=1 / np.sqrt(BLOCK))
    return y.reshape(shp)


class RotatedLinear(nn.Module):
    def __init__(self, inner, signs):
        super().__init__()
        self.inner = inner
        self.signs = signs

    def __call__(self, x):
        return self.inner(fwht_blocks(x * self.signs))


class RotatedEmbedding(nn.Module):
    def __init__(self, inner, signs):
        super().__init__()
        self.inner = inner
        self.signs = signs

    def __call__(self, ids):
        return fwht_blocks(self.inner(ids)) * self.signs

    def as_linear(self, x):
        return self.inner.as_linear(fwht_blocks(x * self.signs))


def in_width(lin) -> int:
    w = lin.weight.shape[-1]
    return w * 32 // lin.bits if hasattr(lin, "bits") else w


def wrap(m, signs) -> None:
    for layer in m.model.layers:
        for r in ROTATED:
            parent, attr = r.split(".")
            pm = getattr(layer, parent)
            inner = getattr(pm, attr)
            setattr(pm, attr, RotatedLinear(inner, signs[in_width(inner)]))
    m.model.embed_tokens = RotatedEmbedding(m.model.embed_tokens, signs[HIDDEN])


def unwrap(m) -> None:
    for layer in m.model.layers:
        for r in ROTATED:
            parent, attr = r.split(".")
            pm = getattr(layer, parent)
            setattr(pm, attr, getattr(pm, attr).inner)
    m.model.embed_tokens = m.model.embed_tokens.inner


def rotate_rows(w: mx.array, s: mx.array) -> mx.array:
    """Stored rows r' = H(s ⊙ r), blockwise."""
    return fwht_blocks(w * s)


def make_variant(name, arch, bits, group, seed, tok, vocab, ids):
    cfg = base_config(arch, vocab)
    m = build(arch, cfg, 1000 + seed)
    extra = {}
    if name in ("llama_bf16", "gemma3_bf16"):
        m.set_dtype(mx.bfloat16)
        cfg["torch_dtype"] = "bfloat16"
    elif name == "qwen3_hadamard":
        signs = {w: mx.array(np.where(np.random.default_rng(w).random(w) < 0.5, -1.0, 1.0).astype(np.float32))
                 for w in (HIDDEN, FFN)}
        before = np.array(m(mx.array([ids]))[0])
        params = dict(tree_flatten(m.parameters()))
        for k in list(params):
            mod = k.rsplit(".", 1)[0]
            if any(mod.endswith(r) for r in ROTATED) or k == "model.embed_tokens.weight":
                params[k] = rotate_rows(params[k], signs[params[k].shape[-1]])
        m.update(tree_unflatten(list(params.items())))
        # The rotation is exact: the rotated f32 model, each rotated input transformed by
        # mlx's hadamard_transform, reproduces the dense model before quantization.
        wrap(m, signs)
        err = float(np.abs(np.array(m(mx.array([ids]))[0]) - before).max())
        assert err < 1e-3, f"rotated f32 model differs from the dense one by {err}"
        unwrap(m)
        m, cfg = quantize_model(m, cfg, group, bits)
        extra["signs"] = signs
    else:
        pred = None
        if name == "qwen3_q4_mixed":
            def pred(path, module):
                if path.endswith("mlp.down_proj"):
                    return {"group_size": 32, "bits": 8, "mode": "affine"}
                if path == "model.layers.1.self_attn.o_proj":
                    return False
                return True
        m, cfg = quantize_model(m, cfg, group, bits, quant_predicate=pred)
        if name == "qwen3_q4_mixed":
            cast_scales(m, mx.bfloat16)
        elif bits is not None and bits % 2 == 1:
            cast_scales(m, mx.float16)
    d = write_pack(name, m, cfg, tok)
    if "signs" in extra:
        signs = extra["signs"]
        # Per-module signs stored beside the codes, and the declaration.
        st_path = os.path.join(d, "model.safetensors")
        w = dict(mx.load(st_path))
        names = []
        for i in range(N_LAYERS):
            for r in ROTATED:
                p = f"model.layers.{i}.{r}"
                w[p + ".signs"] = signs[w[p + ".scales"].shape[-1] * group]
                names.append(p + ".weight")
        w["model.embed_tokens.signs"] = signs[HIDDEN]
        mx.save_safetensors(st_path, w, metadata={"format": "mlx"})
        idx_path = os.path.join(d, "model.safetensors.index.json")
        idx = json.load(open(idx_path))
        idx["weight_map"] = {k: "model.safetensors" for k in sorted(w)}
        json.dump(idx, open(idx_path, "w"), indent=1)
        hj = {
            "prism.hadamard.version": 1,
            "prism.hadamard.block_size": BLOCK,
            "prism.hadamard.transform": "normalized-sylvester-walsh-hadamard",
            "prism.hadamard.axis": "input-last-dimension",
            "prism.hadamard.sign_mode": "explicit",
            "prism.hadamard.sign_widths": [HIDDEN, FFN],
            "prism.hadamard.sign_values": [int(v) for v in np.array(signs[HIDDEN])]
            + [int(v) for v in np.array(signs[FFN])],
            "prism.hadamard.weight_names": names,
            "prism.hadamard.inverse_weight_names": ["model.embed_tokens.weight"],
            "prism.hadamard.gdn_v_grouped": False,
        }
        json.dump(hj, open(os.path.join(d, "hadamard.json"), "w"))
        c = json.load(open(os.path.join(d, "config.json")))
        c["hadamard_config"] = "hadamard.json"
        json.dump(c, open(os.path.join(d, "config.json"), "w"), indent=1)
        # Reference: the quantized rotated pack with each rotated input transformed.
        wrap(m, signs)
    upcast(m)
    logits, greedy, margin = run_reference(m, ids)
    return logits, greedy, margin


def main() -> None:
    # mlx's transform must be the Sylvester-ordered one the formats declare.
    eye = mx.eye(BLOCK)
    assert np.allclose(np.array(mx.hadamard_transform(eye, scale=1 / np.sqrt(BLOCK))), sylvester(BLOCK), atol=1e-6)

    os.makedirs(OUT, exist_ok=True)
    tok = make_tokenizer()
    vocab = tok.get_vocab_size()
    ids = tok.encode(PROMPT).ids
    refs = {
        "generator": "scripts/make_mlx_fixtures.py",
        "mlx": importlib.metadata.version("mlx"),
        "mlx_lm": importlib.metadata.version("mlx-lm"),
        "ids": ids,
        "models": [],
    }

    variants = [("llama_bf16", "llama", None, None)]
    for b, g in [(1, 128), (2, 32), (3, 64), (4, 128), (4, 64), (5, 32), (6, 64), (8, 32)]:
        variants.append((f"llama_q{b}_g{g}", "llama", b, g))
    for b, g in [(2, 128), (3, 32), (4, 32), (8, 128), (8, 64)]:
        variants.append((f"qwen3_q{b}_g{g}", "qwen3", b, g))
    variants.append(("qwen3_q4_mixed", "qwen3", 4, 64))
    variants.append(("gemma3_bf16", "gemma3_text", None, None))
    variants.append(("gemma3_q4_g64", "gemma3_text", 4, 64))
    variants.append(("qwen3_hadamard", "qwen3", 4, 64))

    for idx, (name, arch, bits, group) in enumerate(variants):
        for attempt in range(40):
            logits, greedy, margin = make_variant(
                name, arch, bits, group, 1000 + 100 * idx + attempt, tok, vocab, ids
            )
            if margin >= MIN_MARGIN:
                break
        assert margin >= MIN_MARGIN, f"{name}: no seed gave a greedy margin >= {MIN_MARGIN}"
        logits.astype("<f4").tofile(os.path.join(OUT, f"{name}_logits.f32"))
        refs["models"].append(
            {"name": name, "arch": arch, "bits": bits, "group": group, "greedy": greedy,
             "min_greedy_margin": margin, "n_vocab": vocab}
        )
        print(f"{name}: greedy {greedy} margin {margin:.3f}")
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(refs, f, indent=1)


if __name__ == "__main__":
    main()
