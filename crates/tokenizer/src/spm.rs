//! SentencePiece-style tokenization of one raw fragment (`tokenizer.ggml.model = llama`,
//! TOKENIZERS.md §2): start from UTF-8 units, repeatedly merge the adjacent pair whose
//! concatenation is the highest-scoring token, then fall back to `<0xXX>` byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::unicode::utf8_len;
use crate::vocab::Vocab;

/// A symbol: a byte span of the text, linked to its live neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

/// A candidate merge of `left` with its right neighbour `right`.
struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    /// Byte length of the merged text when queued (stale entries no longer match).
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Tokenizes `text` (spaces already escaped to U+2581) and appends ids to `out`.
pub(crate) fn tokenize(vocab: &Vocab, text: &[u8], out: &mut Vec<u32>) {
    if text.is_empty() {
        return;
    }
    // Symbols: UTF-8 units by lead byte, the last one cut at the end of the text.
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let mut offs = 0;
    while offs < text.len() {
        let len = utf8_len(text[offs]).min(text.len() - offs);
        let idx = symbols.len();
        symbols.push(Symbol {
            start: offs,
            len,
            prev: idx.checked_sub(1),
            next: None,
        });
        offs += len;
        if offs < text.len() {
            symbols[idx].next = Some(idx + 1);
        }
    }

    let mut queue = BinaryHeap::with_capacity(symbols.len());
    let try_add = |queue: &mut BinaryHeap<Bigram>,
                   symbols: &[Symbol],
                   left: Option<usize>,
                   right: Option<usize>| {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let (a, b) = (symbols[l], symbols[r]);
        let span = &text[a.start..a.start + a.len + b.len];
        if let Some(id) = vocab.find(span) {
            queue.push(Bigram {
                score: vocab.tokens[id as usize].score,
                left: l,
                right: r,
                size: span.len(),
            });
        }
    };
    for i in 1..symbols.len() {
        try_add(&mut queue, &symbols, Some(i - 1), Some(i));
    }

    while let Some(bg) = queue.pop() {
        let (l, r) = (symbols[bg.left], symbols[bg.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != bg.size {
            continue;
        }
        // Merge right into left and unlink right.
        symbols[bg.left].len += r.len;
        symbols[bg.right].len = 0;
        symbols[bg.left].next = r.next;
        if let Some(nx) = r.next {
            symbols[nx].prev = Some(bg.left);
        }
        let left = symbols[bg.left];
        try_add(&mut queue, &symbols, left.prev, Some(bg.left));
        try_add(&mut queue, &symbols, Some(bg.left), left.next);
    }

    let mut i = Some(0);
    while let Some(idx) = i {
        let s = symbols[idx];
        let piece = &text[s.start..s.start + s.len];
        match vocab.find(piece) {
            Some(id) => out.push(id),
            None => {
                // A symbol that is not a token was never merged: emit its bytes.
                for &b in piece {
                    if let Some(id) = vocab.spm_byte_token(b) {
                        out.push(id);
                    }
                }
            }
        }
        i = s.next;
    }
}

impl Vocab {
    /// `<0xXX>` for a byte, else the token whose text is the byte itself. llama.cpp throws
    /// when neither exists; we fall back to UNK (or drop the byte without one).
    pub(crate) fn spm_byte_token(&self, b: u8) -> Option<u32> {
        const HEX: &[u8; 16] = b"0123456789ABCDEF";
        let name = [
            b'<',
            b'0',
            b'x',
            HEX[(b >> 4) as usize],
            HEX[(b & 15) as usize],
            b'>',
        ];
        self.find(&name)
            .or_else(|| if b == 0 { None } else { self.find(&[b]) })
            .or(self.unk)
    }
}
