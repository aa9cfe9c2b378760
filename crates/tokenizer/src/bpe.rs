//! Ranked-merge BPE over pre-split words (`gpt2`, `gemma4`; TOKENIZERS.md §3.4).
//!
//! Merges are compared by text in llama.cpp; here every string that occurs in a merge
//! (left part, right part, result) is interned once at load, so a merge lookup is a
//! hash of two integers. A symbol whose text occurs in no merge can never merge.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use crate::unicode::utf8_len;
use crate::vocab::Vocab;

const NO_PIECE: u32 = u32::MAX;

/// Merge table with interned piece strings.
#[derive(Debug, Default)]
pub(crate) struct Merges {
    piece_ids: HashMap<Box<[u8]>, u32>,
    /// (left piece, right piece) → (rank, merged piece)
    ranks: HashMap<(u32, u32), (u32, u32)>,
}

impl Merges {
    pub(crate) fn new(merges: &[String]) -> Merges {
        let mut m = Merges::default();
        for (rank, line) in merges.iter().enumerate() {
            let b = line.as_bytes();
            // split at the first space at offset ≥ 1 (a part may itself be a space)
            let Some(pos) = b.iter().skip(1).position(|&c| c == b' ').map(|p| p + 1) else {
                continue;
            };
            let (left, right) = (&b[..pos], &b[pos + 1..]);
            let l = m.intern(left);
            let r = m.intern(right);
            let mut joined = Vec::with_capacity(left.len() + right.len());
            joined.extend_from_slice(left);
            joined.extend_from_slice(right);
            let j = m.intern(&joined);
            // a repeated pair keeps its first rank
            m.ranks.entry((l, r)).or_insert((rank as u32, j));
        }
        m
    }

    fn intern(&mut self, s: &[u8]) -> u32 {
        if let Some(&id) = self.piece_ids.get(s) {
            return id;
        }
        let id = self.piece_ids.len() as u32;
        self.piece_ids.insert(s.into(), id);
        id
    }

    fn piece(&self, s: &[u8]) -> u32 {
        self.piece_ids.get(s).copied().unwrap_or(NO_PIECE)
    }

    pub(crate) fn len(&self) -> usize {
        self.ranks.len()
    }
}

#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    piece: u32,
    prev: Option<usize>,
    next: Option<usize>,
}

struct Bigram {
    rank: u32,
    left: usize,
    right: usize,
    left_piece: u32,
    right_piece: u32,
    merged: u32,
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
    /// Max-heap order: lowest rank first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Reusable buffers for tokenizing many words.
#[derive(Default)]
pub(crate) struct Session {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

impl Session {
    /// Tokenizes one pre-split word and appends its ids to `out`.
    pub(crate) fn word(
        &mut self,
        vocab: &Vocab,
        merges: &Merges,
        byte_encoded: bool,
        word: &[u8],
        out: &mut Vec<u32>,
    ) {
        if word.is_empty() {
            return;
        }
        if vocab.ignore_merges {
            if let Some(id) = vocab.find(word) {
                out.push(id);
                return;
            }
        }
        if !byte_encoded && word.iter().all(|&b| b == b'\n') {
            // gemma4: a newline run that is a token stays whole
            if let Some(id) = vocab.find(word) {
                out.push(id);
                return;
            }
        }

        let symbols = &mut self.symbols;
        symbols.clear();
        let mut offs = 0;
        while offs < word.len() {
            let len = utf8_len(word[offs]).min(word.len() - offs);
            let idx = symbols.len();
            let piece = merges.piece(&word[offs..offs + len]);
            symbols.push(Symbol {
                start: offs,
                len,
                piece,
                prev: idx.checked_sub(1),
                next: None,
            });
            offs += len;
            if offs < word.len() {
                symbols[idx].next = Some(idx + 1);
            }
        }

        let queue = &mut self.queue;
        queue.clear();
        let add = |queue: &mut BinaryHeap<Bigram>,
                   symbols: &[Symbol],
                   left: Option<usize>,
                   right: Option<usize>| {
            let (Some(l), Some(r)) = (left, right) else {
                return;
            };
            let (lp, rp) = (symbols[l].piece, symbols[r].piece);
            if lp == NO_PIECE || rp == NO_PIECE {
                return;
            }
            if let Some(&(rank, merged)) = merges.ranks.get(&(lp, rp)) {
                queue.push(Bigram {
                    rank,
                    left: l,
                    right: r,
                    left_piece: lp,
                    right_piece: rp,
                    merged,
                });
            }
        };
        for i in 1..symbols.len() {
            add(queue, symbols, Some(i - 1), Some(i));
        }
        while let Some(bg) = queue.pop() {
            let (l, r) = (symbols[bg.left], symbols[bg.right]);
            // stale: a side was merged away or changed since this pair was queued
            if l.len == 0 || r.len == 0 || l.piece != bg.left_piece || r.piece != bg.right_piece {
                continue;
            }
            symbols[bg.left].len += r.len;
            symbols[bg.left].piece = bg.merged;
            symbols[bg.right].len = 0;
            symbols[bg.left].next = r.next;
            if let Some(nx) = r.next {
                symbols[nx].prev = Some(bg.left);
            }
            let left = symbols[bg.left];
            add(queue, symbols, left.prev, Some(bg.left));
            add(queue, symbols, Some(bg.left), left.next);
        }

        let mut i = Some(0);
        while let Some(idx) = i {
            let s = symbols[idx];
            let text = &word[s.start..s.start + s.len];
            match vocab.find(text) {
                Some(id) => out.push(id),
                None => {
                    // Unknown symbol: each byte as a one-byte token (byte-level) or
                    // `<0xXX>` (SPM-style); bytes without a token are dropped.
                    for &b in text {
                        let id = if byte_encoded {
                            vocab.find(&[b])
                        } else {
                            const HEX: &[u8; 16] = b"0123456789ABCDEF";
                            vocab.find(&[
                                b'<',
                                b'0',
                                b'x',
                                HEX[(b >> 4) as usize],
                                HEX[(b & 15) as usize],
                                b'>',
                            ])
                        };
                        out.extend(id);
                    }
                }
            }
            i = s.next;
        }
    }
}
