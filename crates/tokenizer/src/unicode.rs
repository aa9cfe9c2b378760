//! Code points as llama.cpp sees them: its lenient UTF-8 decoder, its category flags
//! (from the generated `unicode_data` table, same Unicode version as llama.cpp), and the
//! GPT-2 byte ↔ code point alphabet used by byte-level BPE vocabularies.
//!
//! Code points are plain `u32`, not `char`: llama.cpp's decoder accepts surrogates and
//! values past U+10FFFF, and the splitters must see the same sequence it does.

use crate::unicode_data::{CATEGORY_RANGES, WHITESPACE};

/// Category and helper bits of one code point, same bit layout as llama.cpp's
/// `unicode_cpt_flags` (only the bits the splitters read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flags(pub u16);

impl Flags {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002;
    pub const LETTER: u16 = 0x0004;
    pub const SEPARATOR: u16 = 0x0008;
    pub const MARK: u16 = 0x0010;
    pub const PUNCTUATION: u16 = 0x0020;
    pub const SYMBOL: u16 = 0x0040;
    pub const CONTROL: u16 = 0x0080;
    pub const WHITESPACE: u16 = 0x0100;

    /// Flags of a position outside the current piece: all bits clear (llama.cpp's
    /// `unicode_cpt_flags{}`), unlike an unassigned code point which is UNDEFINED.
    pub const OUTSIDE: Flags = Flags(0);

    #[inline]
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    #[inline]
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    #[inline]
    pub fn is_mark(self) -> bool {
        self.0 & Self::MARK != 0
    }
    #[inline]
    pub fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    #[inline]
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// Any bit set: the position is inside the piece.
    #[inline]
    pub fn any(self) -> bool {
        self.0 != 0
    }
    /// The category bits alone (llama.cpp's `category_flag()`).
    #[inline]
    pub fn category(self) -> u16 {
        self.0 & 0x00FF
    }
}

/// Largest code point + 1 covered by the category table.
const MAX_CODEPOINTS: u32 = 0x110000;

fn lookup(cp: u32) -> Flags {
    if cp >= MAX_CODEPOINTS {
        return Flags(Flags::UNDEFINED);
    }
    // CATEGORY_RANGES is sorted by start and starts at 0, so the partition point is ≥ 1.
    let i = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cp) - 1;
    let mut bits = CATEGORY_RANGES[i].1 as u16;
    if WHITESPACE.binary_search(&cp).is_ok() {
        bits |= Flags::WHITESPACE;
    }
    Flags(bits)
}

fn ascii_table() -> &'static [Flags; 128] {
    static TABLE: std::sync::OnceLock<[Flags; 128]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [Flags(0); 128];
        for (cp, slot) in t.iter_mut().enumerate() {
            *slot = lookup(cp as u32);
        }
        t
    })
}

/// Flags of a code point (unassigned and out-of-range code points are UNDEFINED).
#[inline]
pub fn flags(cp: u32) -> Flags {
    if cp < 128 {
        ascii_table()[cp as usize]
    } else {
        lookup(cp)
    }
}

/// Byte length of a UTF-8 sequence from its lead byte's high nibble, as llama.cpp's
/// `unicode_len_utf8` (continuation bytes count as 1, 0xF8..0xFF as 4).
#[inline]
pub fn utf8_len(lead: u8) -> usize {
    match lead >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

/// Decodes one code point at `bytes[*pos]` the way llama.cpp does: the lead byte picks
/// the length, continuation bits are checked, overlong forms and surrogates are accepted.
/// `None` = invalid (caller advances one byte and substitutes U+FFFD).
fn decode_one(bytes: &[u8], pos: &mut usize) -> Option<u32> {
    let b0 = bytes[*pos];
    let cont = |i: usize| bytes.get(*pos + i).is_some_and(|&b| b & 0xC0 == 0x80);
    let (len, init) = if b0 & 0x80 == 0 {
        *pos += 1;
        return Some(b0 as u32);
    } else if b0 & 0x40 == 0 {
        return None;
    } else if b0 & 0x20 == 0 {
        (2, (b0 & 0x1F) as u32)
    } else if b0 & 0x10 == 0 {
        (3, (b0 & 0x0F) as u32)
    } else if b0 & 0x08 == 0 {
        (4, (b0 & 0x07) as u32)
    } else {
        return None;
    };
    if !(1..len).all(cont) {
        return None;
    }
    let mut cp = init;
    for i in 1..len {
        cp = (cp << 6) | (bytes[*pos + i] & 0x3F) as u32;
    }
    *pos += len;
    Some(cp)
}

/// Code points of a byte string; each invalid byte becomes U+FFFD (llama.cpp's
/// `unicode_cpts_from_utf8`).
pub fn cpts_from_utf8(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::with_capacity(bytes.len());
    let mut pos = 0;
    while pos < bytes.len() {
        match decode_one(bytes, &mut pos) {
            Some(cp) => out.push(cp),
            None => {
                pos += 1;
                out.push(0xFFFD);
            }
        }
    }
    out
}

/// Appends the UTF-8 encoding of `cp`; surrogates are encoded as three bytes like
/// llama.cpp does. Values past U+10FFFF (llama.cpp throws there) become U+FFFD.
pub fn push_utf8(out: &mut Vec<u8>, cp: u32) {
    match cp {
        0..=0x7F => out.push(cp as u8),
        0x80..=0x7FF => out.extend_from_slice(&[0xC0 | (cp >> 6) as u8, 0x80 | (cp & 0x3F) as u8]),
        0x800..=0xFFFF => out.extend_from_slice(&[
            0xE0 | (cp >> 12) as u8,
            0x80 | ((cp >> 6) & 0x3F) as u8,
            0x80 | (cp & 0x3F) as u8,
        ]),
        0x10000..=0x10FFFF => out.extend_from_slice(&[
            0xF0 | (cp >> 18) as u8,
            0x80 | ((cp >> 12) & 0x3F) as u8,
            0x80 | ((cp >> 6) & 0x3F) as u8,
            0x80 | (cp & 0x3F) as u8,
        ]),
        _ => out.extend_from_slice("\u{FFFD}".as_bytes()),
    }
}

/// GPT-2 byte → code point: printable Latin-1 bytes map to themselves, the other 68
/// bytes (in ascending order) to U+0100, U+0101, ….
pub fn byte_to_cpt(b: u8) -> u32 {
    byte_maps().0[b as usize]
}

/// Inverse of [`byte_to_cpt`]; `None` for code points outside the alphabet.
pub fn cpt_to_byte(cp: u32) -> Option<u8> {
    byte_maps().1.get(cp as usize).copied().flatten()
}

#[allow(clippy::type_complexity)]
fn byte_maps() -> &'static ([u32; 256], [Option<u8>; 0x144]) {
    static MAPS: std::sync::OnceLock<([u32; 256], [Option<u8>; 0x144])> =
        std::sync::OnceLock::new();
    MAPS.get_or_init(|| {
        let printable = |b: u32| {
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b)
        };
        let mut fwd = [0u32; 256];
        let mut inv = [None; 0x144];
        let mut next = 0x100;
        for b in 0..256u32 {
            let cp = if printable(b) {
                b
            } else {
                next += 1;
                next - 1
            };
            fwd[b as usize] = cp;
            inv[cp as usize] = Some(b as u8);
        }
        (fwd, inv)
    })
}

/// Appends the byte-level encoding of `bytes` (each byte → its code point, as UTF-8).
pub fn push_byte_encoded(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        push_utf8(out, byte_to_cpt(b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_alphabet() {
        assert_eq!(byte_to_cpt(b' '), 0x120);
        assert_eq!(byte_to_cpt(b'\n'), 0x10A);
        assert_eq!(byte_to_cpt(b'A'), 'A' as u32);
        assert_eq!(byte_to_cpt(0xAD), 0x143);
        for b in 0..=255u8 {
            assert_eq!(cpt_to_byte(byte_to_cpt(b)), Some(b));
        }
        assert_eq!(cpt_to_byte(0x144), None);
    }

    #[test]
    fn lenient_decoder() {
        // E3 61 62: lead byte with bad continuation → FFFD then the ASCII letters
        assert_eq!(
            cpts_from_utf8(&[0xE3, 0x61, 0x62]),
            vec![0xFFFD, 0x61, 0x62]
        );
        // encoded surrogate is accepted as a code point
        assert_eq!(cpts_from_utf8(&[0xED, 0xA0, 0x80]), vec![0xD800]);
        assert_eq!(cpts_from_utf8("é😀".as_bytes()), vec![0xE9, 0x1F600]);
        assert_eq!(cpts_from_utf8(&[0x80, 0xFF]), vec![0xFFFD, 0xFFFD]);
    }

    #[test]
    fn categories() {
        assert!(flags('a' as u32).is_letter());
        assert!(flags('7' as u32).is_number());
        assert!(flags(' ' as u32).is_whitespace());
        assert!(flags(0x3000).is_whitespace());
        assert!(flags(0x0301).is_mark());
        assert!(flags('!' as u32).is_punctuation());
        assert!(flags('你' as u32).is_letter());
        assert_eq!(flags(0x110000).0, Flags::UNDEFINED);
        assert_eq!(flags(1).category(), Flags::CONTROL);
    }
}
