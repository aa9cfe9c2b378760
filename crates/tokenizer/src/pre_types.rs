//! `tokenizer.ggml.pre` → splitters and flags for BPE vocabularies (llama.cpp's pre-type
//! table, TOKENIZERS.md §3.3/§3.5). Regex patterns are llama.cpp's own strings; those it
//! runs through `std::regex` are emulated by [`crate::regex_split`].

use crate::pretokenize::Splitter::{self, *};

pub(crate) struct PreSettings {
    pub splitters: Vec<Splitter>,
    pub byte_encode: bool,
    /// `clean_up_tokenization_spaces` in the detokenizer.
    pub clean_spaces: bool,
    /// A word that is a token is emitted whole, without merging.
    pub ignore_merges: bool,
    pub add_bos: bool,
    /// BOS is added whatever the file says (gemma4).
    pub force_bos: bool,
    pub escape_whitespaces: bool,
    /// The BOS id is cleared (chatglm / glm).
    pub clear_bos: bool,
}

const LLAMA3: Splitter = Llama3 {
    max_digits: 3,
    marks: false,
};
const QWEN2: Splitter = Llama3 {
    max_digits: 1,
    marks: false,
};
const QWEN35: Splitter = Llama3 {
    max_digits: 1,
    marks: true,
};

const N: Splitter = Regex("\\p{N}");
const N_1_3: Splitter = Regex("\\p{N}{1,3}");
const CJK_KANA: Splitter = Regex("[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+");
const DEEPSEEK3_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
const SPARK_MAIN: &str = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+|[\r\n]|\\s+(?!\\S)|\\s+";
const YOUTU_CJK: &str = "[\u{AC00}-\u{D7A3}\u{3131}-\u{318E}]+|[\u{FF01}\u{2026}\u{201C}\u{201D}\u{2018}\u{2019}\u{2014}\u{FF1A}\u{FF1B}\u{FF0C}\u{3001}-\u{303F}\u{FE30}-\u{FE4F}]+|[\u{3105}-\u{312F}]+|[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+";
const YOUTU_MAIN: &str = "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}\u{1E900}-\u{1E943}]+";
const CJK_HANGUL: Splitter = Regex("[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+");
const TEKKEN_MAIN: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GPT4O_MAIN: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const GRANITE_MULTI_MAIN: &str = "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))*((?=[\\p{L}\\p{M}])([^A-Z]))+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}\\p{M}])([^a-z]))+((?=[\\p{L}\\p{M}])([^A-Z]))*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const BLOOM: Splitter =
    Regex(" ?[^(\\s|.,!?\u{2026}\u{3002}\u{FF0C}\u{3001}\u{964}\u{6D4}\u{60C})]+");
const JAIS2_MAIN: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}";
const BAILING_MAIN: &str = "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
const SEED_CODER_MAIN: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const UFAKZEKA_MAIN: &str = "[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const EXAONE_MOE_MAIN: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?(?:\\p{L}\\p{M}*(?: \\p{L}\\p{M}*)*)+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]?|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+";
const MINICPM5_MAIN: &str = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/// Settings for a `pre` value, or `None` for one this crate does not implement (kimi-k2,
/// afmoe, tiny_aya, superbpe and whitespace need llama.cpp's other custom splitters).
pub(crate) fn pre_settings(pre: &str) -> Option<PreSettings> {
    // `clean` = clean_spaces; everything else off unless overridden below
    let s = |splitters: Vec<Splitter>, clean_spaces: bool| PreSettings {
        splitters,
        byte_encode: true,
        clean_spaces,
        ignore_merges: false,
        add_bos: false,
        force_bos: false,
        escape_whitespaces: false,
        clear_bos: false,
    };
    let settings = match pre {
        "default" => s(vec![PunctRun { backtick: false }, Gpt2, NumberRun, Digits3], true),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" => PreSettings { ignore_merges: true, add_bos: true, ..s(vec![LLAMA3], true) },
        "dbrx" | "smaug-bpe" => s(vec![LLAMA3], true),
        "chatglm-bpe" => PreSettings { clear_bos: true, ..s(vec![LLAMA3], true) },
        "glm4" | "glm5" => PreSettings { clear_bos: true, ignore_merges: true, ..s(vec![LLAMA3], true) },
        "jais-2" => s(vec![Regex(JAIS2_MAIN)], true),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open" | "grok-2" => {
            s(vec![QWEN2], false)
        }
        "stablelm2" | "megrez" => s(vec![QWEN2], true),
        "qwen35" => s(vec![QWEN35], false),
        "laguna" => s(vec![Newlines, QWEN2], false),
        "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0" | "mellum"
        | "modern-bert" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" | "exaone4" | "mpt" | "olmo" | "jais" => {
            s(vec![Gpt2], true)
        }
        "trillion" | "granite-docling" => s(vec![Gpt2], false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => s(vec![NumberEach, Gpt2], true),
        "command-r" | "smollm" => s(vec![NumberEach, Gpt2], false),
        "falcon" => s(vec![PunctRun { backtick: true }, Gpt2, Digits3], true),
        "deepseek-llm" => s(
            vec![
                Regex("[\r\n]"),
                Regex(DEEPSEEK_LLM_LETTERS),
                Regex("\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+"),
                Regex("\\s+$"),
                CJK_HANGUL,
                Regex("\\p{N}+"),
            ],
            false,
        ),
        "deepseek-coder" => {
            s(vec![Regex("[\r\n]"), Regex("\\s?\\p{L}+"), Regex("\\s?\\p{P}+"), CJK_HANGUL, N], false)
        }
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => {
            s(vec![N_1_3, CJK_KANA, Regex(DEEPSEEK3_MAIN)], false)
        }
        "spark2_5" => s(vec![N_1_3, CJK_KANA, Regex(SPARK_MAIN), N], false),
        "youtu" => PreSettings { ignore_merges: true, ..s(vec![Regex(YOUTU_CJK), Regex(YOUTU_MAIN)], false) },
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => s(vec![Regex(GPT4O_MAIN)], false),
        "granite-embed-multi-97m" => {
            PreSettings { ignore_merges: true, ..s(vec![Regex(GRANITE_MULTI_MAIN)], false) }
        }
        "tekken" => PreSettings { ignore_merges: true, add_bos: true, ..s(vec![Regex(TEKKEN_MAIN)], false) },
        "chameleon" => PreSettings {
            add_bos: true,
            ..s(
                vec![
                    Regex("<sentinel:[0-9]+>"),
                    Regex("(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z"),
                    Regex("([\\t\\n]|    |  )"),
                    N,
                    Regex("[\\p{P}!-/:-@\\[-`{-~]"),
                    Gpt2,
                ],
                false,
            )
        },
        "bloom" | "gpt3-finnish" => s(vec![BLOOM], true),
        "poro-chat" => s(vec![BLOOM], false),
        "viking" => s(vec![BLOOM, N], false),
        "bailingmoe" | "bailingmoe2" | "llada-moe" => s(vec![Regex(BAILING_MAIN)], false),
        "seed-coder" => s(vec![Regex(SEED_CODER_MAIN)], false),
        "ufakzeka" => s(vec![Regex(UFAKZEKA_MAIN)], false),
        "exaone-moe" => s(vec![Regex(EXAONE_MOE_MAIN)], true),
        "minicpm5" => PreSettings { ignore_merges: true, ..s(vec![N_1_3, Regex(MINICPM5_MAIN)], true) },
        "gemma4" | "granite-embed-multi-311m" => PreSettings {
            byte_encode: false,
            escape_whitespaces: true,
            force_bos: true,
            ..s(vec![Newlines], true)
        },
        "sarvam-moe" => PreSettings { byte_encode: false, escape_whitespaces: true, ..s(vec![Newlines], false) },
        _ => return None,
    };
    Some(settings)
}
