//! Vocabulary: the per-token table, the special ids and flags, and the load-time fixups
//! llama.cpp applies (TOKENIZERS.md §1.4), plus the list of tokens that are split out of
//! raw text before the model runs (§4).

use std::collections::{HashMap, HashSet};

use crate::pre_types::pre_settings;
use crate::pretokenize::PreTokenizer;
use crate::TokenizerError;

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub mod attr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// Everything needed to build a tokenizer, as stored under `tokenizer.ggml.*` in GGUF.
/// Fields beyond the common ones default to `None`; fill them when the file has them.
#[derive(Clone, Debug, Default)]
pub struct VocabSpec {
    /// `tokenizer.ggml.model`: "llama" (SPM), "gpt2" (BPE), "gemma4" (SPM-style BPE).
    pub model: String,
    /// `tokenizer.ggml.pre` (BPE pre-tokenizer); absent = "default".
    pub pre: Option<String>,
    pub tokens: Vec<String>,
    pub scores: Option<Vec<f32>>,
    /// GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub token_types: Option<Vec<i32>>,
    pub merges: Option<Vec<String>>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub eot_id: Option<u32>,
    pub eom_id: Option<u32>,
    pub unk_id: Option<u32>,
    pub pad_id: Option<u32>,
    pub sep_id: Option<u32>,
    pub mask_id: Option<u32>,
    pub fim_pre_id: Option<u32>,
    pub fim_suf_id: Option<u32>,
    pub fim_mid_id: Option<u32>,
    pub fim_pad_id: Option<u32>,
    pub fim_rep_id: Option<u32>,
    pub fim_sep_id: Option<u32>,
    pub add_bos: Option<bool>,
    pub add_eos: Option<bool>,
    pub add_space_prefix: Option<bool>,
    /// `general.name` (Phi-3 / ModernBERT strip flags key off it).
    pub general_name: Option<String>,
    /// `general.architecture` (a few BERT variants key LSTRIP off it).
    pub general_architecture: Option<String>,
}

/// Tokenization algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabType {
    /// SentencePiece-style score-ordered merges (`llama`).
    Spm,
    /// Ranked merges over pre-split words (`gpt2`, `gemma4`).
    Bpe,
}

#[derive(Clone, Debug)]
pub(crate) struct TokenData {
    pub text: Box<[u8]>,
    pub score: f32,
    pub attr: u32,
}

/// A loaded vocabulary with llama.cpp's fixups applied.
#[derive(Debug)]
pub struct Vocab {
    pub(crate) kind: VocabType,
    pub(crate) tokens: Vec<TokenData>,
    pub(crate) token_to_id: HashMap<Box<[u8]>, u32>,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) unk: Option<u32>,
    pub(crate) pad: Option<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) add_space_prefix: bool,
    pub(crate) ignore_merges: bool,
    pub(crate) clean_spaces: bool,
    /// Spaces become U+2581 before the model (SPM always; SPM-style BPE).
    pub(crate) escape_whitespaces: bool,
    pub(crate) eog: HashSet<u32>,
    /// Control / user-defined / unknown tokens, longest text first (§4).
    pub(crate) specials: Vec<u32>,
    pub(crate) pre: Option<PreTokenizer>,
    /// BPE merges as given (`left right`), rank = index.
    pub(crate) merges: Vec<String>,
}

/// Names that make a token the end-of-turn token when the file names none.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_NAMES: &[&str] = &["<|eom_id|>"];
const FIM_PRE_NAMES: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_NAMES: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_NAMES: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_NAMES: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_NAMES: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_NAMES: &[&str] = &["<|file_sep|>"];
/// Tokens that end generation by name.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Vocab {
    pub fn from_spec(spec: VocabSpec) -> Result<Vocab, TokenizerError> {
        let n = spec.tokens.len();
        if n == 0 {
            return Err(TokenizerError::EmptyVocab);
        }
        if n > u32::MAX as usize {
            return Err(TokenizerError::Invalid(
                "vocabulary larger than u32 ids".into(),
            ));
        }

        // Type defaults (llama.cpp: special ids and flags per tokenizer model).
        let (kind, mut bos, mut eos, mut unk) = match spec.model.as_str() {
            "llama" => (VocabType::Spm, Some(1), Some(2), Some(0)),
            "gpt2" => (VocabType::Bpe, Some(11), Some(11), None),
            "gemma4" => (VocabType::Bpe, None, None, None),
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let mut pad = None;
        let mut add_eos = false;
        let (mut ignore_merges, mut clean_spaces, mut escape_whitespaces) = (false, false, true);
        let mut pre = None;
        let mut force_bos = false;
        let (mut add_bos, mut add_space_prefix);
        match kind {
            VocabType::Spm => {
                add_space_prefix = true;
                add_bos = true;
            }
            VocabType::Bpe => {
                let name = if spec.model == "gemma4" {
                    "gemma4".to_string()
                } else {
                    spec.pre
                        .clone()
                        .filter(|p| !p.is_empty())
                        .unwrap_or_else(|| "default".to_string())
                };
                let p = pre_settings(&name).ok_or(TokenizerError::UnsupportedPre(name))?;
                clean_spaces = p.clean_spaces;
                ignore_merges = p.ignore_merges;
                escape_whitespaces = p.escape_whitespaces;
                add_bos = p.add_bos;
                add_space_prefix = false;
                if p.clear_bos {
                    bos = None;
                }
                force_bos = p.force_bos;
                pre = Some(PreTokenizer::new(&p.splitters, p.byte_encode)?);
            }
        }
        if let Some(v) = spec.add_space_prefix {
            add_space_prefix = v;
        }

        // Token table. Empty texts are renamed; on duplicate texts the later id wins the
        // text → id map (llama.cpp then asserts sizes and refuses the file).
        let mut tokens = Vec::with_capacity(n);
        let mut token_to_id: HashMap<Box<[u8]>, u32> = HashMap::with_capacity(n);
        for (i, text) in spec.tokens.into_iter().enumerate() {
            let text: Box<[u8]> = if text.is_empty() {
                format!("[EMPTY_{i}]").into_bytes().into()
            } else {
                text.into_bytes().into()
            };
            let score = match &spec.scores {
                Some(s) => *s
                    .get(i)
                    .ok_or_else(|| TokenizerError::Invalid("fewer scores than tokens".into()))?,
                None => 0.0,
            };
            let attr = match &spec.token_types {
                Some(t) => match *t.get(i).ok_or_else(|| {
                    TokenizerError::Invalid("fewer token types than tokens".into())
                })? {
                    1 => attr::NORMAL,
                    2 => attr::UNKNOWN,
                    3 => attr::CONTROL,
                    4 => attr::USER_DEFINED,
                    5 => attr::UNUSED,
                    6 => attr::BYTE,
                    _ => attr::UNDEFINED,
                },
                None => attr::NORMAL,
            };
            if token_to_id.insert(text.clone(), i as u32).is_some() {
                return Err(TokenizerError::Invalid(format!(
                    "duplicate token text {:?}",
                    String::from_utf8_lossy(&text)
                )));
            }
            tokens.push(TokenData { text, score, attr });
        }

        // Special ids: a default out of range is dropped; a given id out of range is ignored.
        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let pick = |default: Option<u32>, given: Option<u32>| in_range(given).or(in_range(default));
        bos = pick(bos, spec.bos_id);
        eos = pick(eos, spec.eos_id);
        unk = pick(unk, spec.unk_id);
        pad = pick(pad, spec.pad_id);
        let mut eot = in_range(spec.eot_id);
        let mut eom = in_range(spec.eom_id);
        let mut fim = [
            spec.fim_pre_id,
            spec.fim_suf_id,
            spec.fim_mid_id,
            spec.fim_pad_id,
            spec.fim_rep_id,
            spec.fim_sep_id,
        ]
        .map(in_range);
        if let Some(v) = spec.add_bos {
            add_bos = v;
        }
        if let Some(v) = spec.add_eos {
            add_eos = v;
        }
        if force_bos {
            // llama.cpp forces BOS on for gemma4-style vocabularies.
            add_bos = true;
        }

        let mut vocab = Vocab {
            kind,
            tokens,
            token_to_id,
            bos,
            eos,
            eot: None,
            eom: None,
            unk,
            pad,
            add_bos,
            add_eos,
            add_space_prefix,
            ignore_merges,
            clean_spaces,
            escape_whitespaces: kind == VocabType::Spm || escape_whitespaces,
            eog: HashSet::new(),
            specials: Vec::new(),
            pre,
            merges: spec.merges.unwrap_or_default(),
        };
        if kind == VocabType::Bpe && vocab.merges.is_empty() {
            return Err(TokenizerError::Invalid(
                "BPE vocabulary without merges".into(),
            ));
        }

        // Auto-detected special tokens. llama.cpp walks an unordered map and keeps the
        // first match; on the vocabularies checked (Llama 3, Qwen 2, Phi-3) that is the
        // highest id, which is what we pick.
        let find_named =
            |v: &Vocab, names: &[&str]| names.iter().filter_map(|s| v.find(s.as_bytes())).max();
        let mark_control = |v: &mut Vocab, id: Option<u32>| {
            if let Some(id) = id {
                v.tokens[id as usize].attr |= attr::CONTROL;
            }
        };
        if eot.is_none() {
            eot = find_named(&vocab, EOT_NAMES);
            mark_control(&mut vocab, eot);
        }
        if eom.is_none() {
            eom = find_named(&vocab, EOM_NAMES);
            mark_control(&mut vocab, eom);
        }
        let fim_names = [
            FIM_PRE_NAMES,
            FIM_SUF_NAMES,
            FIM_MID_NAMES,
            FIM_PAD_NAMES,
            FIM_REP_NAMES,
            FIM_SEP_NAMES,
        ];
        for (slot, names) in fim.iter_mut().zip(fim_names) {
            if slot.is_none() {
                *slot = find_named(&vocab, names);
                mark_control(&mut vocab, *slot);
            }
        }
        vocab.eot = eot;
        vocab.eom = eom;

        // Control tokens named "unused…" are unused.
        for t in vocab.tokens.iter_mut() {
            if t.attr & attr::CONTROL != 0 && memchr::memmem::find(&t.text, b"unused").is_some() {
                t.attr |= attr::UNUSED;
            }
        }

        // End-of-generation set.
        let mut eog: HashSet<u32> = [fim[3], fim[4], fim[5]].into_iter().flatten().collect();
        for name in EOG_NAMES {
            if let Some(id) = vocab.find(name.as_bytes()) {
                eog.insert(id);
                vocab.tokens[id as usize].attr |= attr::CONTROL;
            }
        }
        for name in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = vocab.find(name.as_bytes()) {
                vocab.tokens[id as usize].attr = attr::USER_DEFINED;
            }
        }
        eog.extend([vocab.eos, vocab.eot, vocab.eom].into_iter().flatten());
        let eog_named = |v: &Vocab, eog: &HashSet<u32>, name: &str| {
            v.find(name.as_bytes()).filter(|id| eog.contains(id))
        };
        let has = |v: &Vocab, eog: &HashSet<u32>, name: &str| eog_named(v, eog, name).is_some();
        if let Some(end) = eog_named(&vocab, &eog, "<|end|>") {
            let call = has(&vocab, &eog, "<|call|>") || has(&vocab, &eog, "<|calls|>");
            if call && (has(&vocab, &eog, "<|return|>") || has(&vocab, &eog, "<|flush|>")) {
                eog.remove(&end);
                vocab.tokens[end as usize].attr = attr::USER_DEFINED;
            }
        }
        if let Some(s) = eog_named(&vocab, &eog, "</s>") {
            if has(&vocab, &eog, "<|tool_response>") || has(&vocab, &eog, "<|plamo:eos|>") {
                eog.remove(&s);
                vocab.tokens[s as usize].attr = attr::NORMAL;
            }
        }
        vocab.eog = eog;

        // Tokens split out before the model, longest first. llama.cpp's std::sort leaves
        // the order among equal lengths unspecified; we break ties by id.
        let mut specials: Vec<u32> = (0..n as u32)
            .filter(|&id| {
                vocab.tokens[id as usize].attr
                    & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN)
                    != 0
            })
            .collect();
        specials.sort_by(|&a, &b| {
            vocab.tokens[b as usize]
                .text
                .len()
                .cmp(&vocab.tokens[a as usize].text.len())
        });

        // Strip flags that are not stored in GGUF.
        let name = spec.general_name.unwrap_or_default().to_lowercase();
        let arch = spec.general_architecture.unwrap_or_default();
        let pre_name = spec.pre.unwrap_or_default();
        let set = |v: &mut Vocab, text: &str, bit: u32, on: bool| {
            if let Some(id) = v.find(text.as_bytes()) {
                let a = &mut v.tokens[id as usize].attr;
                *a = if on { *a | bit } else { *a & !bit };
            }
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code"]
            .iter()
            .any(|p| pre_name.contains(p))
            || ["nomic-bert-moe", "jina-bert-v3"]
                .iter()
                .any(|a| arch.contains(a))
        {
            set(&mut vocab, "<mask>", attr::LSTRIP, true);
        } else if name.contains("phi-3") || name.contains("phi3") {
            for &id in &specials {
                vocab.tokens[id as usize].attr |= attr::RSTRIP;
            }
            set(&mut vocab, "</s>", attr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(&mut vocab, t, attr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            set(&mut vocab, "[MASK]", attr::LSTRIP, true);
        }
        vocab.specials = specials;
        Ok(vocab)
    }

    /// Id of the token whose text is exactly `text`.
    #[inline]
    pub fn find(&self, text: &[u8]) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    #[inline]
    pub(crate) fn attr(&self, id: u32) -> u32 {
        self.tokens
            .get(id as usize)
            .map_or(attr::UNDEFINED, |t| t.attr)
    }

    pub fn n_tokens(&self) -> usize {
        self.tokens.len()
    }

    pub fn kind(&self) -> VocabType {
        self.kind
    }
}
