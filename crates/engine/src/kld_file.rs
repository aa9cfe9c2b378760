//! Base log-probabilities saved to a file, in llama-perplexity's `--kl-divergence-base`
//! layout, so the base model need not be loaded next to the model under test.
//!
//! Layout (tools/perplexity/perplexity.cpp, little-endian): `"_logits_"`, n_ctx u32,
//! n_vocab i32, n_chunk i32, the text's tokens (n_chunk·n_ctx i32, as tokenized: BOS is put
//! in at evaluation, not here); then for every chunk, for each of its n_ctx − 1 − n_ctx/2
//! scored positions, `nv = 2·⌈n_vocab/2⌉ + 4` u16: the first four hold two f32 (scale,
//! min_log_prob), then one u16 per token, log p = scale·q + min_log_prob, with logits more
//! than 16 below the maximum clamped to the minimum.

use std::io::{Read, Write};

#[derive(Debug, thiserror::Error)]
pub enum KldFileError {
    #[error("I/O on the base log-probability file: {0}")]
    Io(#[from] std::io::Error),
    #[error("not a base log-probability file (no \"_logits_\" magic)")]
    BadMagic,
    #[error("base log-probability file: {0}")]
    Bad(String),
}

const MAGIC: &[u8; 8] = b"_logits_";

/// u16 per scored position: two f32 in front, the vocabulary padded to even.
pub fn position_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// ggml's `nearest_int`: round to nearest, ties to even, for |x| < 2^22.
fn nearest_int(x: f32) -> i32 {
    let v = x + 12582912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Encodes one position's logits as llama-perplexity does. Returns `nv` u16.
pub fn encode_position(logits: &[f32]) -> Vec<u16> {
    let n = logits.len();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let min = logits
        .iter()
        .copied()
        .fold(f32::INFINITY, f32::min)
        .max(max - 16.0);
    let sum: f64 = logits.iter().map(|&l| (l - max).exp() as f64).sum();
    let lse = sum.ln() as f32;
    let min_log_prob = min - max - lse;
    let scale = (max - min) / 65535.0;
    let mut out = vec![0u16; position_len(n)];
    let s = scale.to_le_bytes();
    let m = min_log_prob.to_le_bytes();
    out[0] = u16::from_le_bytes([s[0], s[1]]);
    out[1] = u16::from_le_bytes([s[2], s[3]]);
    out[2] = u16::from_le_bytes([m[0], m[1]]);
    out[3] = u16::from_le_bytes([m[2], m[3]]);
    if scale != 0.0 {
        let inv = 1.0 / scale;
        for (o, &l) in out[4..4 + n].iter_mut().zip(logits) {
            *o = if l > min {
                nearest_int(inv * (l - min)).clamp(0, 65535) as u16
            } else {
                0
            };
        }
    }
    out
}

/// Decodes one position into log-probabilities (`out`: [n_vocab]).
pub fn decode_position(enc: &[u16], out: &mut [f32]) {
    let f = |a: u16, b: u16| {
        let (x, y) = (a.to_le_bytes(), b.to_le_bytes());
        f32::from_le_bytes([x[0], x[1], y[0], y[1]])
    };
    let scale = f(enc[0], enc[1]);
    let min_log_prob = f(enc[2], enc[3]);
    for (o, &q) in out.iter_mut().zip(&enc[4..]) {
        *o = scale * q as f32 + min_log_prob;
    }
}

/// Header of a base file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseHeader {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
    /// [n_chunk · n_ctx] the evaluated tokens.
    pub tokens: Vec<u32>,
}

impl BaseHeader {
    pub fn positions_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.n_ctx / 2
    }

    pub fn write(&self, w: &mut impl Write) -> Result<(), KldFileError> {
        w.write_all(MAGIC)?;
        w.write_all(&(self.n_ctx as u32).to_le_bytes())?;
        w.write_all(&(self.n_vocab as i32).to_le_bytes())?;
        w.write_all(&(self.n_chunk as i32).to_le_bytes())?;
        for &t in &self.tokens {
            w.write_all(&(t as i32).to_le_bytes())?;
        }
        Ok(())
    }

    pub fn read(r: &mut impl Read) -> Result<Self, KldFileError> {
        let mut magic = [0u8; 8];
        r.read_exact(&mut magic)?;
        if &magic != MAGIC {
            return Err(KldFileError::BadMagic);
        }
        let mut b = [0u8; 4];
        let mut int = |r: &mut dyn Read| -> Result<i64, KldFileError> {
            r.read_exact(&mut b)?;
            Ok(i32::from_le_bytes(b) as i64)
        };
        let n_ctx = int(r)? as u32 as usize;
        let n_vocab = int(r)?;
        let n_chunk = int(r)?;
        if !(8..=1 << 24).contains(&n_ctx) || !(1..=1 << 24).contains(&n_vocab) || n_chunk < 1 {
            return Err(KldFileError::Bad(format!(
                "n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}"
            )));
        }
        let n = (n_chunk as usize)
            .checked_mul(n_ctx)
            .filter(|&n| n <= 1 << 32)
            .ok_or_else(|| KldFileError::Bad("token count overflows".into()))?;
        let mut raw = vec![0u8; n * 4];
        r.read_exact(&mut raw)?;
        let tokens = raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32)
            .collect();
        Ok(BaseHeader {
            n_ctx,
            n_vocab: n_vocab as usize,
            n_chunk: n_chunk as usize,
            tokens,
        })
    }
}

/// Writes one position's encoding.
pub fn write_position(w: &mut impl Write, enc: &[u16]) -> Result<(), KldFileError> {
    let mut bytes = Vec::with_capacity(enc.len() * 2);
    for v in enc {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    w.write_all(&bytes)?;
    Ok(())
}

/// Reads one position's encoding (`nv` u16).
pub fn read_position(r: &mut impl Read, n_vocab: usize) -> Result<Vec<u16>, KldFileError> {
    let mut raw = vec![0u8; position_len(n_vocab) * 2];
    r.read_exact(&mut raw)?;
    Ok(raw
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(3.5), 4);
        assert_eq!(nearest_int(65534.6), 65535);
        assert_eq!(nearest_int(0.49), 0);
    }

    #[test]
    fn encoding_keeps_log_probs_within_half_a_step() {
        let logits: Vec<f32> = (0..301)
            .map(|i| ((i * 37 % 101) as f32) * 0.1 - 3.0)
            .collect();
        let enc = encode_position(&logits);
        assert_eq!(enc.len(), 306);
        let mut lp = vec![0f32; logits.len()];
        decode_position(&enc, &mut lp);
        let max = logits.iter().copied().fold(f32::MIN, f32::max);
        let lse = max + logits.iter().map(|&l| (l - max).exp()).sum::<f32>().ln();
        let step = (max - logits.iter().copied().fold(f32::MAX, f32::min)) / 65535.0;
        for (l, d) in logits.iter().zip(&lp) {
            assert!(
                (l - lse - d).abs() <= 0.5 * step + 1e-5,
                "{} vs {d}",
                l - lse
            );
        }
    }

    #[test]
    fn header_round_trips_and_rejects_garbage() {
        let h = BaseHeader {
            n_ctx: 16,
            n_vocab: 5,
            n_chunk: 2,
            tokens: (0..32).collect(),
        };
        let mut buf = Vec::new();
        h.write(&mut buf).unwrap();
        assert_eq!(BaseHeader::read(&mut buf.as_slice()).unwrap(), h);
        assert!(matches!(
            BaseHeader::read(&mut &b"GGUF\x03\0\0\0\0\0\0\0\0\0\0\0"[..]),
            Err(KldFileError::BadMagic)
        ));
        assert!(BaseHeader::read(&mut &buf[..20]).is_err());
    }
}
