"""Thin wrapper over llama-cpp-python's low-level (ctypes) API.

Owns: loading a GGUF into a llama.cpp context with explicit settings, tokenizing,
detokenizing, and decoding token batches while reading back exactly the logits asked for.
Used by scripts/make_llama_fixtures.py (reference data) and bench/compare_llamacpp.py
(speed reference). The high-level `llama_cpp.Llama` class is avoided on purpose: it adds
its own sampling and caching, and we want plain decode + argmax.

Tested with llama-cpp-python 0.3.36 (vendored llama.cpp upstream 0c1e570).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import numpy as np

import llama_cpp as L

# enum llama_flash_attn_type
FLASH_ATTN = {"auto": -1, "disabled": 0, "enabled": 1}
# enum ggml_type values for the KV cache.
GGML_TYPE_NAMES = {0: "f32", 1: "f16", 8: "q8_0", 30: "bf16"}


@dataclass
class Settings:
    n_ctx: int = 1024
    n_batch: int = 512
    n_ubatch: int = 512
    n_threads: int = 2
    flash_attn: str = "disabled"  # one of FLASH_ATTN
    type_kv: int = 1  # GGML_TYPE_F16
    log_lines: list = field(default_factory=list)

    def as_json(self) -> dict:
        return {
            "n_ctx": self.n_ctx,
            "n_batch": self.n_batch,
            "n_ubatch": self.n_ubatch,
            "n_threads": self.n_threads,
            "n_threads_batch": self.n_threads,
            "flash_attn": self.flash_attn,
            "type_k": GGML_TYPE_NAMES.get(self.type_kv, str(self.type_kv)),
            "type_v": GGML_TYPE_NAMES.get(self.type_kv, str(self.type_kv)),
            "n_gpu_layers": 0,
        }


_LOG_SINK: list[str] = []


@L.llama_log_callback
def _log_cb(level, text, user_data):  # noqa: ARG001 - ctypes callback signature
    # Keep llama.cpp's log (it says e.g. what flash_attn=auto resolved to) without
    # flooding the terminal.
    _LOG_SINK.append(text.decode("utf-8", "replace"))


def quiet_logs() -> list[str]:
    L.llama_log_set(_log_cb, ctypes.c_void_p(0))
    return _LOG_SINK


class LlamaRef:
    """One model + one context (single sequence 0)."""

    def __init__(self, model_path: str, settings: Settings, model=None, cb_eval=None):
        """`cb_eval`: an optional `ggml_backend_sched_eval_callback` (see llama_dump_tensors.py);
        the caller keeps it alive as long as the context."""
        L.llama_backend_init()
        self.settings = settings
        self._own_model = model is None
        if model is None:
            mp = L.llama_model_default_params()
            mp.n_gpu_layers = 0
            model = L.llama_model_load_from_file(model_path.encode(), mp)
            if not model:
                raise RuntimeError(f"llama.cpp could not load {model_path}")
        self.model = model
        cp = L.llama_context_default_params()
        cp.n_ctx = settings.n_ctx
        cp.n_batch = settings.n_batch
        cp.n_ubatch = settings.n_ubatch
        cp.n_seq_max = 1
        cp.n_threads = settings.n_threads
        cp.n_threads_batch = settings.n_threads
        cp.flash_attn_type = FLASH_ATTN[settings.flash_attn]
        cp.type_k = settings.type_kv
        cp.type_v = settings.type_kv
        if cb_eval is not None:
            cp.cb_eval = cb_eval
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context")
        self.vocab = L.llama_model_get_vocab(self.model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        self.batch = L.llama_batch_init(settings.n_batch, 0, 1)

    def close(self):
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        if self._own_model:
            L.llama_model_free(self.model)

    # -- tokenizer -----------------------------------------------------------------
    def tokenize(self, text: str | bytes, add_special: bool, parse_special: bool) -> list[int]:
        data = text.encode("utf-8") if isinstance(text, str) else text
        cap = len(data) + 8
        buf = (L.llama_token * cap)()
        n = L.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:
            raise RuntimeError("tokenize buffer too small")
        return list(buf[:n])

    def detokenize(self, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
        arr = (L.llama_token * max(1, len(ids)))(*ids)
        cap = 64 * len(ids) + 64
        out = ctypes.create_string_buffer(cap)
        n = L.llama_detokenize(self.vocab, arr, len(ids), out, cap, remove_special, unparse_special)
        if n < 0:
            raise RuntimeError("detokenize buffer too small")
        return out.raw[:n]

    def bos(self) -> int:
        return L.llama_vocab_bos(self.vocab)

    def is_eog(self, tok: int) -> bool:
        return bool(L.llama_vocab_is_eog(self.vocab, tok))

    def meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(4096)
        n = L.llama_model_meta_val_str(self.model, key.encode(), buf, 4096)
        return None if n < 0 else buf.value.decode("utf-8", "replace")

    # -- evaluation ----------------------------------------------------------------
    def clear(self):
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)

    def decode(self, tokens: list[int], pos0: int, want) -> np.ndarray:
        """Decode `tokens` at positions pos0.. in chunks of n_batch.

        want(i) -> bool says whether token i (index into `tokens`) needs logits.
        Returns logits [n_wanted, n_vocab] f32, in token order.
        """
        out = []
        nb = self.settings.n_batch
        for c0 in range(0, len(tokens), nb):
            chunk = tokens[c0 : c0 + nb]
            b = self.batch
            b.n_tokens = len(chunk)
            idx = []
            for k, t in enumerate(chunk):
                b.token[k] = t
                b.pos[k] = pos0 + c0 + k
                b.n_seq_id[k] = 1
                b.seq_id[k][0] = 0
                w = bool(want(c0 + k))
                b.logits[k] = w
                if w:
                    idx.append(k)
            rc = L.llama_decode(self.ctx, b)
            if rc != 0:
                raise RuntimeError(f"llama_decode returned {rc}")
            for k in idx:
                ptr = L.llama_get_logits_ith(self.ctx, k)
                out.append(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy())
        if not out:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        return np.stack(out).astype(np.float32, copy=False)

    def synchronize(self):
        L.llama_synchronize(self.ctx)
