//! neagari-tokenizer: tokenizers that reproduce llama.cpp's token ids (upstream 0c1e570)
//! for GGUF-embedded vocabularies, and a loader for Hugging Face `tokenizer.json` BPE files.
//!
//! Build a [`Tokenizer`] from a [`VocabSpec`] (the `tokenizer.ggml.*` metadata), then
//! [`Tokenizer::encode`] / [`Tokenizer::decode`]; [`StreamDecoder`] turns generated ids into
//! text without splitting UTF-8 characters. The facts followed are summarised in
//! `shared/reference/TOKENIZERS.md`.

mod bpe;
pub mod chat_template;
pub mod hf;
mod pre_types;
pub mod pretokenize;
mod regex_split;
mod spm;
pub mod unicode;
mod unicode_data;
pub mod vocab;

use aho_corasick::AhoCorasick;

use vocab::Vocab;
pub use vocab::{attr, VocabSpec, VocabType};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("unsupported tokenizer model '{0}'")]
    UnsupportedModel(String),
    #[error("unsupported BPE pre-tokenizer '{0}'")]
    UnsupportedPre(String),
    #[error("empty vocabulary")]
    EmptyVocab,
    #[error("invalid vocabulary: {0}")]
    Invalid(String),
    #[error("tokenizer.json: {0}")]
    Json(String),
}

/// A tokenizer with llama.cpp's behaviour for one vocabulary.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: Vocab,
    merges: bpe::Merges,
    /// Finds which special tokens occur in a text at all (a prefilter: the exact split
    /// order is llama.cpp's, see [`Tokenizer::partition`]). Index = position in `vocab.specials`.
    special_finder: Option<AhoCorasick>,
}

/// A piece of input: raw bytes still to tokenize, or an already-identified token.
enum Fragment {
    Raw { start: usize, end: usize },
    Token(u32),
}

impl Tokenizer {
    /// Builds a tokenizer from GGUF-style metadata, applying llama.cpp's load-time fixups.
    pub fn from_spec(spec: VocabSpec) -> Result<Tokenizer, TokenizerError> {
        let vocab = Vocab::from_spec(spec)?;
        let merges = bpe::Merges::new(&vocab.merges);
        let patterns: Vec<&[u8]> = vocab
            .specials
            .iter()
            .map(|&id| &*vocab.tokens[id as usize].text)
            .collect();
        let special_finder = if patterns.is_empty() {
            None
        } else {
            Some(
                AhoCorasick::new(&patterns)
                    .map_err(|e| TokenizerError::Invalid(format!("special tokens: {e}")))?,
            )
        };
        Ok(Tokenizer {
            vocab,
            merges,
            special_finder,
        })
    }

    /// Token ids of `text`, as llama.cpp's `llama_tokenize(text, add_special, parse_special)`.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_bytes(text.as_bytes(), add_special, parse_special)
    }

    /// As [`Tokenizer::encode`] for arbitrary bytes (invalid UTF-8 is handled as llama.cpp does).
    pub fn encode_bytes(&self, text: &[u8], add_special: bool, parse_special: bool) -> Vec<u32> {
        let v = &self.vocab;
        let fragments = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && v.add_bos {
            out.extend(v.bos);
        }
        match v.kind {
            VocabType::Spm => {
                let mut prev_special = true;
                let mut buf = Vec::new();
                for f in &fragments {
                    match *f {
                        Fragment::Raw { start, end } => {
                            buf.clear();
                            if v.add_space_prefix && prev_special {
                                buf.push(b' ');
                            }
                            buf.extend_from_slice(&text[start..end]);
                            let escaped = escape_whitespace(&buf);
                            spm::tokenize(v, &escaped, &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            VocabType::Bpe => {
                let Some(pre) = &v.pre else { return out };
                let mut session = bpe::Session::default();
                for f in &fragments {
                    match *f {
                        Fragment::Raw { start, end } => {
                            let raw = &text[start..end];
                            let escaped;
                            let raw = if v.escape_whitespaces {
                                escaped = escape_whitespace(raw);
                                &escaped[..]
                            } else {
                                raw
                            };
                            for word in pre.split(raw).iter() {
                                session.word(v, &self.merges, pre.byte_encode, word, &mut out);
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && v.add_eos {
            out.extend(v.eos);
        }
        out
    }

    /// Splits `text` on special tokens (TOKENIZERS.md §4): for each special token, longest
    /// first, every raw fragment is scanned left to right and each occurrence cut out.
    /// Control/unknown tokens take part only with `parse_special`; user-defined ones always.
    fn partition(&self, text: &[u8], parse_special: bool) -> Vec<Fragment> {
        let v = &self.vocab;
        let mut frags = vec![Fragment::Raw {
            start: 0,
            end: text.len(),
        }];
        let Some(finder) = &self.special_finder else {
            return frags;
        };
        // Only tokens that occur somewhere in the text can occur in a fragment of it.
        let mut present = vec![false; v.specials.len()];
        for m in finder.find_overlapping_iter(text) {
            present[m.pattern().as_usize()] = true;
        }
        for (k, &id) in v.specials.iter().enumerate() {
            if !present[k] {
                continue;
            }
            let tok = &v.tokens[id as usize];
            if !parse_special && tok.attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let needle = &tok.text;
            let finder = memchr::memmem::Finder::new(needle);
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Fragment::Raw { mut start, end } = f else {
                    next.push(f);
                    continue;
                };
                while let Some(rel) = finder.find(&text[start..end]) {
                    let m = start + rel;
                    let mut left_end = m;
                    if tok.attr & attr::LSTRIP != 0 {
                        while left_end > start && is_c_space(text[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > start {
                        next.push(Fragment::Raw {
                            start,
                            end: left_end,
                        });
                    }
                    next.push(Fragment::Token(id));
                    start = m + needle.len();
                    if tok.attr & attr::RSTRIP != 0 {
                        while start < end && is_c_space(text[start]) {
                            start += 1;
                        }
                    }
                }
                if start < end {
                    next.push(Fragment::Raw { start, end });
                }
            }
            frags = next;
        }
        frags
    }

    /// Bytes of one token, as llama.cpp's `token_to_piece(id, lstrip = 0, special)`:
    /// control/unknown tokens are empty unless `special`; user-defined text verbatim;
    /// normal tokens unescaped (`▁` → space) or byte-decoded (byte-level BPE); byte tokens
    /// their byte. Out-of-range ids give an empty piece.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let Some(tok) = v.tokens.get(id as usize) else {
            return Vec::new();
        };
        let a = tok.attr;
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Vec::new();
        }
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return tok.text.to_vec();
        }
        if a & attr::NORMAL != 0 {
            let byte_level =
                v.pre.as_ref().is_some_and(|p| p.byte_encode) && v.kind == VocabType::Bpe;
            return if byte_level {
                decode_byte_level(&tok.text)
            } else {
                unescape_whitespace(&tok.text)
            };
        }
        if a & attr::BYTE != 0 {
            return parse_byte_token(&tok.text)
                .map(|b| vec![b])
                .unwrap_or_default();
        }
        Vec::new()
    }

    /// Text of ids, as llama.cpp's `llama_detokenize(ids, remove_special, unparse_special)`:
    /// pieces concatenated, the SPM leading space dropped, and for vocabularies with
    /// `clean_spaces` the tokenization spaces removed (` .` → `.`, ` 's` → `'s`, …).
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let v = &self.vocab;
        let mut ids = ids;
        let mut remove_space = v.add_space_prefix;
        if remove_special && v.add_bos && ids.first().is_some_and(|&f| Some(f) == v.bos) {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && v.add_eos && ids.last().is_some_and(|&l| Some(l) == v.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let piece = self.token_to_piece(id, unparse_special);
            // lstrip: only the first piece, at most one leading space
            let skip = usize::from(remove_space && piece.first() == Some(&b' '));
            text.extend_from_slice(&piece[skip..]);
            remove_space = false;
        }
        if v.clean_spaces {
            text = clean_up_spaces(text);
        }
        text
    }

    /// Text of ids with control tokens hidden (`detokenize(ids, false, false)`), invalid
    /// UTF-8 replaced by U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, false)).into_owned()
    }

    /// True for tokens that end generation (EOS, EOT, EOM, FIM pad/rep/sep, named ones).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.contains(&id)
    }

    /// Sorted end-of-generation ids.
    pub fn eog_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.vocab.eog.iter().copied().collect();
        ids.sort_unstable();
        ids
    }

    pub fn bos(&self) -> Option<u32> {
        self.vocab.bos
    }
    pub fn eos(&self) -> Option<u32> {
        self.vocab.eos
    }
    pub fn eot(&self) -> Option<u32> {
        self.vocab.eot
    }
    pub fn eom(&self) -> Option<u32> {
        self.vocab.eom
    }
    pub fn unk(&self) -> Option<u32> {
        self.vocab.unk
    }
    pub fn pad(&self) -> Option<u32> {
        self.vocab.pad
    }
    /// Whether `encode(…, add_special = true, …)` prepends BOS / appends EOS.
    pub fn add_bos(&self) -> bool {
        self.vocab.add_bos
    }
    pub fn add_eos(&self) -> bool {
        self.vocab.add_eos
    }
    pub fn n_vocab(&self) -> usize {
        self.vocab.n_tokens()
    }
    pub fn vocab_type(&self) -> VocabType {
        self.vocab.kind
    }
    /// Number of distinct BPE merges (0 for SPM).
    pub fn n_merges(&self) -> usize {
        self.merges.len()
    }
    /// Raw vocabulary text of a token (e.g. `▁Hello`, `Ġworld`, `<0x0A>`).
    pub fn token_text(&self, id: u32) -> Option<&[u8]> {
        self.vocab.tokens.get(id as usize).map(|t| &*t.text)
    }
    /// Attribute bits of a token after the load-time fixups (see [`attr`]).
    pub fn token_attr(&self, id: u32) -> u32 {
        self.vocab.attr(id)
    }
    pub fn token_score(&self, id: u32) -> Option<f32> {
        self.vocab.tokens.get(id as usize).map(|t| t.score)
    }
    /// True for control tokens (rendered only with `special`).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & attr::CONTROL != 0
    }
    /// Id of the token whose vocabulary text is exactly `text`.
    pub fn find_token(&self, text: &str) -> Option<u32> {
        self.vocab.find(text.as_bytes())
    }
}

/// Turns generated ids into text incrementally, holding back an incomplete trailing
/// UTF-8 sequence (byte tokens and byte-level BPE pieces can end mid-character).
#[derive(Debug, Default, Clone)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    /// Render control tokens' text (`special = true` in `token_to_piece`).
    pub special: bool,
}

impl StreamDecoder {
    pub fn new(special: bool) -> StreamDecoder {
        StreamDecoder {
            pending: Vec::new(),
            special,
        }
    }

    /// Adds one token; returns the text that is complete so far (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> String {
        let piece = tok.token_to_piece(id, self.special);
        self.push_bytes(&piece)
    }

    /// Adds raw bytes; returns the complete text so far.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let cut = complete_prefix_len(&self.pending);
        let out = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
        self.pending.drain(..cut);
        out
    }

    /// Flushes whatever is held back (an incomplete sequence becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }

    /// Bytes currently held back.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }
}

/// Length of the longest prefix that does not end inside a UTF-8 sequence that more
/// bytes could still complete. Invalid bytes are not held back.
fn complete_prefix_len(buf: &[u8]) -> usize {
    let mut i = 0;
    loop {
        match std::str::from_utf8(&buf[i..]) {
            Ok(_) => return buf.len(),
            Err(e) => match e.error_len() {
                None => return i + e.valid_up_to(),
                Some(n) => i += e.valid_up_to() + n,
            },
        }
    }
}

/// C `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Every space → U+2581 (`▁`).
fn escape_whitespace(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() + text.len() / 2);
    for &b in text {
        if b == b' ' {
            out.extend_from_slice("\u{2581}".as_bytes());
        } else {
            out.push(b);
        }
    }
    out
}

/// Every U+2581 → space.
fn unescape_whitespace(text: &[u8]) -> Vec<u8> {
    const LOWER_BLOCK: &[u8] = "\u{2581}".as_bytes();
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with(LOWER_BLOCK) {
            out.push(b' ');
            i += LOWER_BLOCK.len();
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

/// Byte-level BPE text → bytes; a code point outside the byte alphabet becomes
/// llama.cpp's `[UNK_BYTE_0x…]` marker (its hex bytes followed by the whole token text).
fn decode_byte_level(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for cp in unicode::cpts_from_utf8(text) {
        match unicode::cpt_to_byte(cp) {
            Some(b) => out.push(b),
            None => {
                let mut utf8 = Vec::new();
                unicode::push_utf8(&mut utf8, cp);
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in utf8 {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text);
                out.push(b']');
            }
        }
    }
    out
}

/// `<0xXX>` → the byte (llama.cpp parses the two characters after `<0x` as hex).
fn parse_byte_token(text: &[u8]) -> Option<u8> {
    let hex = text.get(3..5)?;
    u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
}

/// llama.cpp's `clean_up_tokenization_spaces` passes, applied in order on bytes.
fn clean_up_spaces(text: Vec<u8>) -> Vec<u8> {
    if text.len() < 2 {
        return text;
    }
    // 1: drop the space before ? ! . ,
    let mut a = Vec::with_capacity(text.len());
    a.push(text[0]);
    for i in 1..text.len() {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            a.pop();
        }
        a.push(x);
    }
    // 2: " ' " → "'" (both spaces go; the dropped right space also stops the next
    // character from seeing a space before it)
    let mut b = Vec::with_capacity(a.len());
    if !a.is_empty() {
        b.push(a[0]);
    }
    let mut prev_dropped = false;
    let mut i = 1;
    while i < a.len() {
        let x = a[i];
        let prev = if prev_dropped { 0 } else { a[i - 1] };
        prev_dropped = false;
        if x == b'\'' && i + 1 < a.len() && prev == b' ' && a[i + 1] == b' ' {
            b.pop();
            b.push(x);
            i += 2;
            prev_dropped = true;
            continue;
        }
        b.push(x);
        i += 1;
    }
    // 3: drop the space before 's 'm 're 've
    let mut c = Vec::with_capacity(b.len());
    if !b.is_empty() {
        c.push(b[0]);
    }
    for i in 1..b.len() {
        let x = b[i];
        if b[i - 1] == b' ' && x == b'\'' && i + 1 < b.len() {
            let x1 = b[i + 1];
            let x2 = b.get(i + 2).copied();
            let drop = match x1 {
                b's' | b'm' => true,
                b'r' | b'v' => x2 == Some(b'e') && i + 2 < b.len(),
                _ => false,
            };
            if drop {
                c.pop();
            }
        }
        c.push(x);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Tokenizer>();
    }

    #[test]
    fn stream_holds_back_partial_utf8() {
        let mut d = StreamDecoder::new(false);
        let bytes = "𝕏!".as_bytes();
        assert_eq!(d.push_bytes(&bytes[..1]), "");
        assert_eq!(d.push_bytes(&bytes[1..3]), "");
        assert_eq!(d.push_bytes(&bytes[3..]), "𝕏!");
        assert_eq!(d.push_bytes(&[0xFF, b'a']), "\u{FFFD}a");
        assert_eq!(d.push_bytes(&[0xE3]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
