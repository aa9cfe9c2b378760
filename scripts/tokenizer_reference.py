#!/usr/bin/env python3
"""Reference token ids from llama.cpp (llama-cpp-python 0.3.36, upstream 0c1e570).

Writes crates/tokenizer/tests/fixtures/<name>_tokens.json for:
  * gemma3      -- the Gemma 3 270M GGUF (path from --model or $NEAGARI_TEST_MODEL)
  * llama-bpe, qwen2, qwen35, gpt-2, llama-spm, phi-3, gemma-4 -- llama.cpp's vocab-only
    conformance files vendor/llama.cpp/models/ggml-vocab-<name>.gguf (directory from
    --vocabs or $NEAGARI_LLAMA_VOCABS)

Each fixture holds, for a corpus of awkward strings, llama_tokenize(text, add_special,
parse_special) for three flag combinations, llama_detokenize of the ids in two modes, the
token_to_piece bytes of a sample of ids, and the special ids / EOG set.  Texts and bytes are
stored as hex so invalid UTF-8 survives JSON.

It also writes split_probe.json: word boundaries of each BPE pre-tokenizer, observed through
llama.cpp with synthetic vocabularies in which every substring of every probe text is a
token and every split of it a merge, so each pre-split word comes out as exactly one token.
The Rust test rebuilds the same vocabulary from the probe texts (see tests/split_probe.rs).

Usage: python3 scripts/tokenizer_reference.py [--model GGUF] [--vocabs DIR] [--probe]
"""
import argparse
import ctypes
import json
import os
import sys
from pathlib import Path

import llama_cpp

OUT_DIR = Path(__file__).resolve().parent.parent / "crates/tokenizer/tests/fixtures"
VOCABS = ["llama-bpe", "qwen2", "qwen35", "gpt-2", "llama-spm", "phi-3", "gemma-4"]


def long_text() -> str:
    """~5 KB of mixed prose, code and scripts (deterministic)."""
    parts = [
        "The quick brown fox jumps over the lazy dog. ",
        "It's 3:45pm on 2024-07-19; the invoice #A-1029 totals $1,234.56 (incl. 8.5% tax).\n",
        "def main(argv):\n    for i, arg in enumerate(argv):\n        print(f\"{i}: {arg!r}\")\n\treturn 0\n\n",
        "日本語の文章と、中文的句子，还有한국어 문장도 있습니다。",
        " Ελληνικά και русский текст; العربية أيضا. ",
        "Emoji: 😀🎉👍🏽 and flags 🇫🇷🇩🇪. ",
        "<p>HTML <b>bold</b> &amp; <i>italic</i></p>\r\n",
        "   indented   with   runs   of   spaces   ",
        "naïve café résumé coöperate — “quotes” ‘single’ … ",
    ]
    text = ""
    i = 0
    while len(text.encode()) < 5000:
        text += parts[i % len(parts)]
        i += 1
    return text


def corpus() -> list[bytes]:
    s = [
        "", " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n\n", "\r\n", "\r", "\r\n\r\n", " \n", "\n ",
        "Hello world", " Hello", "Hello  world", "Hello   world", "hello, world!", "Hello\r\n",
        "line1\nline2", "\tindent", "emoji 😀", "你好，世界", "The year 2025 costs $3.50!",
        "<start_of_turn>user\nHi<end_of_turn>\n", " " * 32, " " * 33, "\n" * 40, "\t" * 35, "𝕏",
        "<b>bold</b>", "<s>x</s>", "<bos>Hello<eos>", "<unused0><mask>[multimodal]",
        "e\u0301 combining", "a\u0300\u0301\u0302", "\u0301start mark", "Ünïcödé façade naïve",
        "日本語のテキストです。", "한국어 텍스트", "Привет, мир!", "مرحبا بالعالم", "हिन्दी पाठ", "ελληνικά",
        "I'm don't we'll they've she'd I'M DON'T We'Re", "'s 're", "x's", "1234567890 3.14159 1,000,000",
        "12 123 1234 12345 ١٢٣٤٥ ①②③ Ⅻ", "    def foo(x):\n        return x * 2\n",
        "<div class=\"a\">text</div>", "a\u00a0b\u3000c\u2003d\u2028e", "\u200b zero width \ufeff bom",
        "\x00\x01\x02 ctrl \x7f", "👨‍👩‍👧‍👦 family 🇯🇵 flag", "ａｂｃ fullwidth １２３",
        "  leading spaces", "trailing spaces   ", "mixed \t \n \r\n whitespace  \n\n  x",
        "!!!???...,,, ;; :: --", "<|im_start|>user\nhi<|im_end|>\n", "<|begin_of_text|>x<|eot_id|>",
        "<|endoftext|>", "</s>", "<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "x" * 300,
        "Hello ? ! . , ' s 're 've 'll 't don 't", "a ' b", " ' ' x", "won 't , can 's",
        "ℌ𝔢𝔩𝔩𝔬 𝓌𝑜𝓇𝓁𝒹", "\u0e01\u0e32\u0e23 ไทย", "ÀÉÎÕÜ àéîõü ß ẞ", "tab\there\tand\tthere",
        "\u00ad soft hyphen", "𠜎𠜱𠝹 rare han", "\U0001F600\U0001F601\U0001F602" * 5,
        long_text(),
    ]
    raw = [t.encode("utf-8") for t in s]
    # byte strings llama.cpp must survive: invalid or cut UTF-8
    raw += [b"\xe3\x61\x62", b"\xff\xfe abc", b"\xc3\x28", b"abc\xe2\x82", b"\x80\x80 cont", b"\xed\xa0\x80 surrogate",
            b"\xf0\x9f\x98 cut emoji", b"ok \xc0\xaf overlong"]
    return raw


def tokenize(vocab, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
    n_max = len(text) + 16
    buf = (llama_cpp.llama_token * n_max)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n_max, add_special, parse_special)
    if n < 0:
        n_max = -n
        buf = (llama_cpp.llama_token * n_max)()
        n = llama_cpp.llama_tokenize(vocab, text, len(text), buf, n_max, add_special, parse_special)
    assert n >= 0
    return list(buf[:n])


def detokenize(vocab, ids: list[int], remove_special: bool, unparse_special: bool) -> bytes:
    arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
    cap = 64 + 64 * len(ids)
    out = ctypes.create_string_buffer(cap)
    n = llama_cpp.llama_detokenize(vocab, arr, len(ids), out, cap, remove_special, unparse_special)
    assert n >= 0, n
    return out.raw[:n]


def piece(vocab, tok: int, special: bool) -> bytes:
    out = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_token_to_piece(vocab, tok, out, 256, 0, special)
    assert n >= 0
    return out.raw[:n]


def opt(x):
    return None if x < 0 else x


def dump(name: str, path: str) -> None:
    model = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    cases = []
    seen: set[int] = set()
    for text in corpus():
        for add_special, parse_special in [(True, True), (True, False), (False, False)]:
            ids = tokenize(vocab, text, add_special, parse_special)
            seen.update(ids)
            cases.append({
                "text_hex": text.hex(),
                "add_special": add_special,
                "parse_special": parse_special,
                "ids": ids,
                "detok_hex": detokenize(vocab, ids, False, False).hex(),
                "detok_special_hex": detokenize(vocab, ids, True, True).hex(),
            })
    # pieces: every id the corpus produced, the first 600 ids and every 97th id
    sample = sorted(seen | set(range(min(600, n_vocab))) | set(range(0, n_vocab, 97)))
    pieces = [[t, piece(vocab, t, False).hex(), piece(vocab, t, True).hex()] for t in sample]
    fixture = {
        "source": "llama-cpp-python %s (llama.cpp 0c1e570), %s" % (llama_cpp.__version__, os.path.basename(path)),
        "n_vocab": n_vocab,
        "bos": opt(llama_cpp.llama_vocab_bos(vocab)),
        "eos": opt(llama_cpp.llama_vocab_eos(vocab)),
        "eot": opt(llama_cpp.llama_vocab_eot(vocab)),
        "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "cases": cases,
        "pieces": pieces,
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    out = OUT_DIR / f"{name}_tokens.json"
    out.write_text(json.dumps(fixture, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(cases)} cases)")


PROBE_PRES = [
    "gpt-2", "llama-bpe", "qwen2", "qwen35", "default", "falcon", "starcoder", "command-r", "laguna",
    "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5", "youtu", "gpt-4o", "granite-embed-multi-97m",
    "tekken", "chameleon", "bloom", "viking", "jais-2", "bailingmoe", "seed-coder", "ufakzeka", "exaone-moe",
    "minicpm5",
]


def byte_alphabet() -> list[str]:
    """GPT-2 byte -> code point map (printable Latin-1 kept, the rest from U+0100 on)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(0x100 + n)
            n += 1
    return [out[b] for b in range(256)]


def probe_texts() -> list[str]:
    def valid(t: bytes) -> bool:
        try:
            t.decode()
            return True
        except UnicodeDecodeError:
            return False

    short = [t.decode() for t in corpus() if 0 < len(t) <= 40 and valid(t)]
    extra = [
        "a  b   c    d", "x \t\t y", " \n\n x", "a\r\n\r\nb", "1234567 89", "x1y22z333w4444",
        "e\u0301\u0302 x\u0301", "\u0301\u0301 a", " \u0301b", "ab\u0300cd", "$a+b<=c>d^e~f|g`h",
        "(foo) [bar] {baz}", "'s'S'T'Re'LL'd", "it's IT'S it'Ll", "\u00a0\u00a0x", "x\u3000\u3000",
        "\u2028\u2029 y", "\u0085z", "\x0b\x0c w", "٣٤٥ ①②", "½¼ ²³", "©®™ ±×÷", "“quoted” ‘x’",
        "a.b,c;d:e!f?g", "--==__**", "#tag @user", "\U0001F600 \U0001F600\U0001F601", "x\U000E0001y",
        "\U00010FFF unassigned \u0378", "\ue000 private", "\u200d\u200c joiners",
        "HelloWorld ABCdef aBC", "XMLHttpRequest's", "ÄÖÜäöü ÀBc", "かなカナ漢字 한글ㄱ", "！？：；，、",
        "ｈｅｌｌｏ　ｗｏｒｌｄ", "<sentinel:12>IMGIMGABZ", "a    b  c", "x\r\ny \n", "$1,234.56",
        "a/b\\c\"d\"", "ab  \t  cd", "x1234567y",
    ]
    texts = []
    for t in short + extra:
        if t not in texts:
            texts.append(t)
    return texts


def probe_vocab(texts: list[str]) -> tuple[list[str], list[str]]:
    """Tokens: the 256 byte characters, then every substring (length >= 2) of every
    byte-encoded text, sorted by (length, string); merges: every split of every such token,
    in token order then split position."""
    alpha = byte_alphabet()
    subs = set()
    for t in texts:
        enc = "".join(alpha[b] for b in t.encode())
        for i in range(len(enc)):
            for j in range(i + 2, len(enc) + 1):
                subs.add(enc[i:j])
    multi = sorted(subs, key=lambda s: (len(s), s))
    tokens = alpha + [s for s in multi if s not in set(alpha)]
    merges = [f"{s[:k]} {s[k:]}" for s in multi for k in range(1, len(s))]
    return tokens, merges


def probe(tmp: Path) -> None:
    import gguf

    texts = probe_texts()
    tokens, merges = probe_vocab(texts)
    result = {"texts_hex": [t.encode().hex() for t in texts], "n_tokens": len(tokens), "n_merges": len(merges), "ids": {}}
    for pre in PROBE_PRES:
        path = tmp / f"probe-{pre}.gguf"
        w = gguf.GGUFWriter(str(path), "gpt2")
        w.add_name("probe")
        w.add_block_count(1)
        w.add_context_length(64)
        w.add_embedding_length(8)
        w.add_feed_forward_length(8)
        w.add_head_count(1)
        w.add_layer_norm_eps(1e-5)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types([1] * len(tokens))
        w.add_token_merges(merges)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        model = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        vocab = llama_cpp.llama_model_get_vocab(model.model)
        result["ids"][pre] = [tokenize(vocab, t.encode(), False, False) for t in texts]
        del model
        path.unlink()
    out = OUT_DIR / "split_probe.json"
    out.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(f"wrote {out} ({out.stat().st_size} bytes, {len(texts)} texts, {len(tokens)} tokens, {len(merges)} merges)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.environ.get("NEAGARI_TEST_MODEL"))
    ap.add_argument("--vocabs", default=os.environ.get("NEAGARI_LLAMA_VOCABS"))
    ap.add_argument("--probe", action="store_true", help="write split_probe.json")
    args = ap.parse_args()
    if not args.model and not args.vocabs and not args.probe:
        sys.exit("give --model, --vocabs and/or --probe (or set NEAGARI_TEST_MODEL / NEAGARI_LLAMA_VOCABS)")
    if args.probe:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            probe(Path(tmp))
    if args.model:
        dump("gemma3", args.model)
    if args.vocabs:
        for name in VOCABS:
            path = Path(args.vocabs) / f"ggml-vocab-{name}.gguf"
            if path.exists():
                dump(name, str(path))
            else:
                print(f"skip {name}: {path} missing")


if __name__ == "__main__":
    main()
