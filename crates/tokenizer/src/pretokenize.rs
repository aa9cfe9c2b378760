//! BPE pre-tokenization: split a raw text fragment into words the way llama.cpp's
//! `unicode_regex_split` does for a given `tokenizer.ggml.pre` (TOKENIZERS.md §3.2–3.3).
//!
//! Each pre-tokenizer is an ordered list of splitters; every splitter re-splits each
//! piece left by the previous one ("isolated": matches and the gaps between them are
//! pieces, and a splitter never looks outside the piece). llama.cpp runs hand-written
//! splitters for the GPT-2, Llama 3, Qwen 2 and Qwen 3.5 patterns — which differ from
//! the regexes they stand for in a few corners (e.g. a lone space before the end of a
//! piece) — and `std::regex` for the rest; the simple `std::regex` patterns used by the
//! `default`, `falcon` and `starcoder` families are written out by hand here, the others
//! go through an emulation of that `std::regex` path ([`crate::regex_split`]).

use crate::regex_split::RegexSplit;
use crate::unicode::{self, Flags};
use crate::TokenizerError;

/// One splitting pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Splitter {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
    Gpt2,
    /// The Llama 3 / Qwen 2 / Qwen 3.5 family:
    /// `(?i:'s|…)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,D}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
    /// with `D = max_digits`; `marks` adds `\p{M}` to the letter runs (Qwen 3.5).
    Llama3 { max_digits: usize, marks: bool },
    /// `[^\n]+|[\n]+`
    Newlines,
    /// `[\p{P}\$\+<=>\^~\|]+`, plus the backtick for falcon.
    PunctRun { backtick: bool },
    /// `\p{N}+`
    NumberRun,
    /// `\p{N}` (each number character alone)
    NumberEach,
    /// `[0-9][0-9][0-9]`
    Digits3,
    /// Any other pattern, run like llama.cpp's `std::regex` fallback.
    Regex(&'static str),
}

/// The splitters and output alphabet for one pre-tokenizer type.
#[derive(Debug)]
pub struct PreTokenizer {
    steps: Vec<(Splitter, Option<RegexSplit>)>,
    /// Re-encode words in the GPT-2 byte alphabet (false for SPM-style BPE such as gemma4).
    pub byte_encode: bool,
}

/// Words produced by [`PreTokenizer::split`], stored back to back.
#[derive(Default, Debug)]
pub struct Words {
    buf: Vec<u8>,
    ends: Vec<usize>,
}

impl Words {
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let w = &self.buf[start..end];
            start = end;
            w
        })
    }
    pub fn len(&self) -> usize {
        self.ends.len()
    }
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }
}

impl PreTokenizer {
    /// Compiles the splitters (regex patterns are translated once here).
    pub fn new(splitters: &[Splitter], byte_encode: bool) -> Result<PreTokenizer, TokenizerError> {
        let steps = splitters
            .iter()
            .map(|&sp| match sp {
                Splitter::Regex(p) => Ok((sp, Some(RegexSplit::new(p)?))),
                _ => Ok((sp, None)),
            })
            .collect::<Result<_, TokenizerError>>()?;
        Ok(PreTokenizer { steps, byte_encode })
    }

    /// Splits `text` into words (each non-empty), re-encoded per `byte_encode`.
    pub fn split(&self, text: &[u8]) -> Words {
        let cpts = unicode::cpts_from_utf8(text);
        let mut pieces = vec![cpts.len()];
        for (sp, re) in &self.steps {
            pieces = apply(*sp, re.as_ref(), &cpts, &pieces);
        }
        let mut words = Words {
            buf: Vec::with_capacity(text.len() * 2),
            ends: Vec::with_capacity(pieces.len()),
        };
        let mut start = 0;
        let mut tmp = Vec::new();
        for len in pieces {
            let piece = &cpts[start..start + len];
            start += len;
            if self.byte_encode {
                tmp.clear();
                for &cp in piece {
                    unicode::push_utf8(&mut tmp, cp);
                }
                unicode::push_byte_encoded(&mut words.buf, &tmp);
            } else {
                for &cp in piece {
                    unicode::push_utf8(&mut words.buf, cp);
                }
            }
            words.ends.push(words.buf.len());
        }
        words
    }
}

/// Applies one splitter to every piece (`pieces` = lengths in code points, summing to
/// `cpts.len()`); returns the new piece lengths.
fn apply(sp: Splitter, re: Option<&RegexSplit>, cpts: &[u32], pieces: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(pieces.len() * 2);
    let mut start = 0;
    for &len in pieces {
        let piece = &cpts[start..start + len];
        start += len;
        let mut cuts = Cuts {
            out: &mut out,
            prev: 0,
        };
        match sp {
            Splitter::Regex(_) => {
                if let Some(re) = re {
                    re.split(piece, |c| {
                        cuts.cut(c);
                    });
                }
            }
            Splitter::Gpt2 => split_gpt2(piece, &mut cuts),
            Splitter::Llama3 { max_digits, marks } => {
                split_llama3(piece, max_digits, marks, &mut cuts)
            }
            Splitter::Newlines => split_runs(piece, &mut cuts, |cp| cp == '\n' as u32),
            Splitter::PunctRun { backtick } => split_class_runs(piece, &mut cuts, |cp| {
                unicode::flags(cp).is_punctuation()
                    || matches!(
                        char::from_u32(cp),
                        Some('$' | '+' | '<' | '=' | '>' | '^' | '~' | '|')
                    )
                    || (backtick && cp == '`' as u32)
            }),
            Splitter::NumberRun => {
                split_class_runs(piece, &mut cuts, |cp| unicode::flags(cp).is_number())
            }
            Splitter::NumberEach => {
                for (i, &cp) in piece.iter().enumerate() {
                    if unicode::flags(cp).is_number() {
                        cuts.cut(i);
                        cuts.cut(i + 1);
                    }
                }
            }
            Splitter::Digits3 => {
                let digit = |i: usize| {
                    piece
                        .get(i)
                        .is_some_and(|&c| (b'0' as u32..=b'9' as u32).contains(&c))
                };
                let mut i = 0;
                while i < piece.len() {
                    if digit(i) && digit(i + 1) && digit(i + 2) {
                        cuts.cut(i);
                        cuts.cut(i + 3);
                        i += 3;
                    } else {
                        i += 1;
                    }
                }
            }
        }
        cuts.cut(len);
    }
    out
}

/// Records cut points inside one piece as piece lengths (empty pieces are dropped).
struct Cuts<'a> {
    out: &'a mut Vec<usize>,
    prev: usize,
}

impl Cuts<'_> {
    #[inline]
    fn cut(&mut self, end: usize) -> usize {
        let len = end - self.prev;
        if len > 0 {
            self.out.push(len);
        }
        self.prev = end;
        len
    }
}

/// Alternating runs of `pred` / not `pred` (used for `[^\n]+|[\n]+`).
fn split_runs(piece: &[u32], cuts: &mut Cuts, pred: impl Fn(u32) -> bool) {
    for i in 1..piece.len() {
        if pred(piece[i]) != pred(piece[i - 1]) {
            cuts.cut(i);
        }
    }
}

/// Maximal runs of a class isolated from the gaps between them (`[class]+`).
fn split_class_runs(piece: &[u32], cuts: &mut Cuts, pred: impl Fn(u32) -> bool) {
    let mut i = 0;
    while i < piece.len() {
        if pred(piece[i]) {
            cuts.cut(i);
            while i < piece.len() && pred(piece[i]) {
                i += 1;
            }
            cuts.cut(i);
        } else {
            i += 1;
        }
    }
}

const OUTSIDE: u32 = u32::MAX;

/// Piece accessors with llama.cpp's out-of-piece conventions.
struct View<'a>(&'a [u32]);

impl View<'_> {
    #[inline]
    fn cpt(&self, i: usize) -> u32 {
        self.0.get(i).copied().unwrap_or(OUTSIDE)
    }
    #[inline]
    fn flags(&self, i: usize) -> Flags {
        self.0.get(i).map_or(Flags::OUTSIDE, |&c| unicode::flags(c))
    }
}

const SP: u32 = b' ' as u32;
const CR: u32 = b'\r' as u32;
const LF: u32 = b'\n' as u32;
const APOS: u32 = b'\'' as u32;

#[inline]
fn ascii_lower(cp: u32) -> u32 {
    if (b'A' as u32..=b'Z' as u32).contains(&cp) {
        cp + 32
    } else {
        cp
    }
}

/// Length of a contraction (`'s 't 'm 'd` = 2, `'re 've 'll` = 3) at `pos`, or 0.
/// Only ASCII letters lower-case to these letters, so ASCII folding matches llama.cpp's
/// table-driven `unicode_tolower`.
fn contraction(v: &View, pos: usize, case_insensitive: bool) -> usize {
    let n = v.0.len();
    if v.cpt(pos) != APOS || pos + 1 >= n {
        return 0;
    }
    let fold = |c: u32| if case_insensitive { ascii_lower(c) } else { c };
    let c1 = fold(v.cpt(pos + 1));
    if [b's', b't', b'm', b'd'].iter().any(|&b| c1 == b as u32) {
        return 2;
    }
    if pos + 2 < n {
        let c2 = fold(v.cpt(pos + 2));
        let pair = (c1, c2);
        let is = |a: u8, b: u8| pair == (a as u32, b as u32);
        if is(b'r', b'e') || is(b'v', b'e') || is(b'l', b'l') {
            return 3;
        }
    }
    0
}

/// Counts the whitespace run at `pos`; returns (count, end of the last `\r`/`\n` in it + 1, or 0).
fn whitespace_run(v: &View, pos: usize) -> (usize, usize) {
    let mut n = 0;
    let mut last_nl_end = 0;
    while v.flags(pos + n).is_whitespace() {
        let c = v.cpt(pos + n);
        if c == CR || c == LF {
            last_nl_end = pos + n + 1;
        }
        n += 1;
    }
    (n, last_nl_end)
}

fn split_gpt2(piece: &[u32], cuts: &mut Cuts) {
    let v = View(piece);
    let n = piece.len();
    let mut pos = 0;
    while pos < n {
        let cpt = v.cpt(pos);
        let flags = v.flags(pos);

        let c = contraction(&v, pos, false);
        if c > 0 {
            pos += cuts.cut(pos + c);
            continue;
        }

        // ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: the class is decided by the
        // character after an optional leading space.
        let lead = if cpt == SP { v.flags(pos + 1) } else { flags };
        let class: Option<fn(Flags) -> bool> = if lead.is_letter() {
            Some(|f: Flags| f.is_letter())
        } else if lead.is_number() {
            Some(|f: Flags| f.is_number())
        } else if !(lead.is_whitespace() || lead.is_letter() || lead.is_number()) && lead.any() {
            Some(|f: Flags| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any())
        } else {
            None
        };
        if let Some(class) = class {
            if cpt == SP {
                pos += 1;
            }
            while class(v.flags(pos)) {
                pos += 1;
            }
            cuts.cut(pos);
            continue;
        }

        let (ws, _) = whitespace_run(&v, pos);
        if ws > 1 && v.cpt(pos + ws) != OUTSIDE {
            // `\s+(?!\S)`: leave the last space to prefix the next word
            pos += ws - 1;
            cuts.cut(pos);
            continue;
        }
        if ws > 0 {
            pos += ws;
            cuts.cut(pos);
            continue;
        }
        pos += 1;
        cuts.cut(pos);
    }
}

fn split_llama3(piece: &[u32], max_digits: usize, marks: bool, cuts: &mut Cuts) {
    let v = View(piece);
    let n = piece.len();
    let letterish = |f: Flags| f.is_letter() || (marks && f.is_mark());
    let mut pos = 0;
    while pos < n {
        let cpt = v.cpt(pos);
        let flags = v.flags(pos);

        let c = contraction(&v, pos, true);
        if c > 0 {
            pos += cuts.cut(pos + c);
            continue;
        }

        // `[^\r\n\p{L}\p{N}]?\p{L}+` (letters and marks for Qwen 3.5)
        if !(cpt == CR || cpt == LF || flags.is_number())
            && (letterish(flags) || letterish(v.flags(pos + 1)))
        {
            pos += 1;
            while letterish(v.flags(pos)) {
                pos += 1;
            }
            cuts.cut(pos);
            continue;
        }

        // `\p{N}{1,D}`
        if flags.is_number() {
            let mut run_start = pos;
            while v.flags(pos).is_number() {
                pos += 1;
                if pos - run_start >= max_digits {
                    cuts.cut(pos);
                    run_start = pos;
                }
            }
            cuts.cut(pos);
            continue;
        }

        // ` ?[^\s\p{L}\p{N}]+[\r\n]*`; the class test reads the character after a leading
        // space, the "inside the piece" test the current one (as llama.cpp does).
        let other = |f: Flags| {
            !(f.is_whitespace() || letterish(f) || f.is_number() || (marks && f.is_mark()))
        };
        let lead = if cpt == SP { v.flags(pos + 1) } else { flags };
        if other(lead) && flags.any() {
            if cpt == SP {
                pos += 1;
            }
            let mut f = lead;
            while other(f) && f.any() {
                pos += 1;
                f = v.flags(pos);
            }
            while matches!(v.cpt(pos), CR | LF) {
                pos += 1;
            }
            cuts.cut(pos);
            continue;
        }

        let (ws, last_nl_end) = whitespace_run(&v, pos);
        if last_nl_end > 0 {
            // `\s*[\r\n]+`
            pos = last_nl_end;
            cuts.cut(pos);
            continue;
        }
        if ws > 1 && v.cpt(pos + ws) != OUTSIDE {
            pos += ws - 1;
            cuts.cut(pos);
            continue;
        }
        if ws > 0 {
            pos += ws;
            cuts.cut(pos);
            continue;
        }
        pos += 1;
        cuts.cut(pos);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(sp: &[Splitter], text: &str) -> Vec<String> {
        let pt = PreTokenizer::new(sp, false).unwrap();
        pt.split(text.as_bytes())
            .iter()
            .map(|w| String::from_utf8(w.to_vec()).unwrap())
            .collect()
    }

    const LLAMA3: Splitter = Splitter::Llama3 {
        max_digits: 3,
        marks: false,
    };

    #[test]
    fn llama3_words() {
        assert_eq!(words(&[LLAMA3], "Hello world"), ["Hello", " world"]);
        assert_eq!(
            words(&[LLAMA3], "I'M 12345!!\n\n  x"),
            ["I", "'M", " ", "123", "45", "!!\n\n", " ", " x"]
        );
        assert_eq!(words(&[LLAMA3], "a  \n b"), ["a", "  \n", " b"]);
        // a space at the very end of a piece stays alone
        assert_eq!(words(&[LLAMA3], "a "), ["a", " "]);
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            words(&[Splitter::Gpt2], "I'M don't  go 42"),
            ["I", "'", "M", " don", "'t", " ", " go", " 42"]
        );
    }

    #[test]
    fn default_chain() {
        let d = [
            Splitter::PunctRun { backtick: false },
            Splitter::Gpt2,
            Splitter::NumberRun,
            Splitter::Digits3,
        ];
        assert_eq!(words(&d, "x 12345,y"), ["x", " ", "123", "45", ",", "y"]);
    }

    #[test]
    fn byte_encoding() {
        let pt = PreTokenizer::new(&[LLAMA3], true).unwrap();
        let w: Vec<_> = pt
            .split(b" hi")
            .iter()
            .map(|w| String::from_utf8(w.to_vec()).unwrap())
            .collect();
        assert_eq!(w, ["\u{120}hi"]);
    }
}
