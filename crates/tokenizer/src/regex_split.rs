//! The `std::regex` fallback of llama.cpp's splitter (TOKENIZERS.md §3.2), emulated with
//! `fancy-regex` for the pre-tokenizers that have no hand-written splitter.
//!
//! llama.cpp runs such a pattern in ECMAScript mode over a *collapsed* text when it uses
//! `\p{…}`: code points below 128 stay, every other one becomes one stand-in per category
//! (whitespace → `\v`), and each `\p{X}` in the pattern becomes a class of that stand-in and
//! the ASCII members of X — so `\p{Lu}` and `\p{Ll}` both mean "letter" and case exists
//! only for ASCII. Patterns without `\p{…}` run over the code points themselves (non-ASCII
//! whitespace → `\v`). We build the same collapsed text with private-use characters as the
//! stand-ins and rewrite the pattern the same way; for these patterns Rust's leftmost-first
//! backtracking matches ECMAScript's.

use crate::unicode::{self, Flags};
use crate::TokenizerError;

/// Stand-ins for the collapsed categories (llama.cpp uses the bytes 0xD0..0xD5).
const OTHER: char = '\u{E0D0}';
const NUMBER: char = '\u{E0D1}';
const LETTER: char = '\u{E0D2}';
const PUNCT: char = '\u{E0D3}';
const MARK: char = '\u{E0D4}';
const SYMBOL: char = '\u{E0D5}';

/// `\p{…}` names llama.cpp rewrites, with their stand-in and ASCII members (regex syntax).
const CATEGORIES: &[(&str, char, &str)] = &[
    (r"\p{N}", NUMBER, "0-9"),
    (r"\p{L}", LETTER, "A-Za-z"),
    (r"\p{P}", PUNCT, r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
    (r"\p{M}", MARK, ""),
    (r"\p{S}", SYMBOL, r"\$\+<->\^`\|\~"),
    (r"\p{Lu}", LETTER, "A-Za-z"),
    (r"\p{Ll}", LETTER, "A-Za-z"),
    (r"\p{Lt}", LETTER, "A-Za-z"),
    (r"\p{Lm}", LETTER, "A-Za-z"),
    (r"\p{Lo}", LETTER, "A-Za-z"),
];

/// One compiled fallback pattern.
#[derive(Debug)]
pub(crate) struct RegexSplit {
    re: fancy_regex::Regex,
    collapsed: bool,
}

impl RegexSplit {
    pub(crate) fn new(pattern: &str) -> Result<RegexSplit, TokenizerError> {
        let collapsed = CATEGORIES.iter().any(|(name, _, _)| pattern.contains(name));
        let translated = if collapsed {
            collapse_pattern(pattern)?
        } else {
            pattern.to_string()
        };
        let re = fancy_regex::Regex::new(&translated).map_err(|e| {
            TokenizerError::Invalid(format!("pre-tokenizer regex {pattern:?}: {e}"))
        })?;
        Ok(RegexSplit { re, collapsed })
    }

    /// Splits one piece: matches and the gaps between them become pieces (lengths in code
    /// points, appended to `out` through `cut`).
    pub(crate) fn split(&self, piece: &[u32], mut cut: impl FnMut(usize)) {
        let text: String = piece.iter().map(|&cp| self.stand_in(cp)).collect();
        // byte offset → code point index (every character here stands for one code point)
        let mut char_at = vec![0usize; text.len() + 1];
        let mut n = 0;
        for (b, _) in text.char_indices() {
            char_at[b] = n;
            n += 1;
        }
        char_at[text.len()] = n;
        for m in self.re.find_iter(&text) {
            // A regex error here is a backtracking limit; llama.cpp would have thrown. Leave
            // the rest of the piece whole rather than fail the whole encode.
            let Ok(m) = m else { break };
            cut(char_at[m.start()]);
            cut(char_at[m.end()]);
        }
    }

    fn stand_in(&self, cp: u32) -> char {
        if cp < 128 {
            return cp as u8 as char;
        }
        let f = unicode::flags(cp);
        if f.is_whitespace() {
            return '\u{0B}';
        }
        if !self.collapsed {
            return char::from_u32(cp).unwrap_or('\u{FFFD}');
        }
        match f.category() {
            Flags::NUMBER => NUMBER,
            Flags::LETTER => LETTER,
            Flags::PUNCTUATION => PUNCT,
            Flags::MARK => MARK,
            Flags::SYMBOL => SYMBOL,
            _ => OTHER,
        }
    }
}

/// Rewrites each known `\p{X}` into its collapsed class, bracketed unless already inside a
/// class (llama.cpp's rule: a `[` or `]` counts unless preceded by a backslash).
fn collapse_pattern(pattern: &str) -> Result<String, TokenizerError> {
    if !pattern.is_ascii() {
        return Err(TokenizerError::Invalid(format!(
            "regex mixes unicode categories and non-ASCII characters: {pattern:?}"
        )));
    }
    let b = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut inside = false;
    let mut i = 0;
    while i < b.len() {
        let prev_backslash = i > 0 && b[i - 1] == b'\\';
        if b[i] == b'[' && !prev_backslash {
            inside = true;
        } else if b[i] == b']' && inside && !prev_backslash {
            inside = false;
        } else if let Some((name, stand_in, members)) = CATEGORIES
            .iter()
            .find(|(name, _, _)| pattern[i..].starts_with(name))
        {
            if !inside {
                out.push('[');
            }
            out.push(*stand_in);
            out.push_str(members);
            if !inside {
                out.push(']');
            }
            i += name.len();
            continue;
        }
        out.push(b[i] as char);
        i += 1;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_categories() {
        assert_eq!(collapse_pattern(r"\p{N}+").unwrap(), "[\u{E0D1}0-9]+");
        assert_eq!(
            collapse_pattern(r"[^\s\p{L}]").unwrap(),
            "[^\\s\u{E0D2}A-Za-z]"
        );
        assert!(collapse_pattern(r"\p{L}é").is_err());
    }

    #[test]
    fn splits_isolated() {
        let re = RegexSplit::new(r"\p{N}{1,3}").unwrap();
        let cpts: Vec<u32> = "ab1234٣c".chars().map(|c| c as u32).collect();
        let mut cuts = Vec::new();
        re.split(&cpts, |c| cuts.push(c));
        assert_eq!(cuts, [2, 5, 5, 7]);
    }
}
