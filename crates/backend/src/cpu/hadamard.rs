//! Blockwise normalized Walsh–Hadamard rotation of activation rows (PrismML's
//! `normalized-sylvester-walsh-hadamard`, axis = input last dimension): the fast transform
//! in `n log n` adds, never an `n × n` matrix.
//!
//! `H[r][c] = (−1)^popcount(r & c) / √n` (Sylvester order). The in-place butterfly over
//! strides 1, 2, 4, … computes exactly that product.

use crate::HadamardRotation;

/// In-place `v ← (H/√n) v` for `v.len() = n`, a power of two.
pub fn fwht(v: &mut [f32]) {
    let n = v.len();
    let mut h = 1;
    while h < n {
        for base in (0..n).step_by(2 * h) {
            for i in base..base + h {
                let (a, b) = (v[i], v[i + h]);
                v[i] = a + b;
                v[i + h] = a - b;
            }
        }
        h *= 2;
    }
    let norm = 1.0 / (n as f32).sqrt();
    v.iter_mut().for_each(|x| *x *= norm);
}

/// `x ← H(s ⊙ x)` blockwise: the input of a rotated matrix. `x.len()` = `signs.len()`.
pub fn rotate_input(x: &mut [f32], r: &HadamardRotation) {
    for (a, s) in x.iter_mut().zip(r.signs.iter()) {
        *a *= s;
    }
    for b in x.chunks_exact_mut(r.block) {
        fwht(b);
    }
}

/// `x ← s ⊙ (H x)` blockwise: a stored row back to the original basis (embedding lookup).
pub fn unrotate_row(x: &mut [f32], r: &HadamardRotation) {
    for b in x.chunks_exact_mut(r.block) {
        fwht(b);
    }
    for (a, s) in x.iter_mut().zip(r.signs.iter()) {
        *a *= s;
    }
}

/// Checks a rotation against an input width.
pub fn check(r: &HadamardRotation, width: usize) -> Result<(), String> {
    if !r.block.is_power_of_two() || r.block > 65536 || !width.is_multiple_of(r.block) {
        return Err(format!(
            "Hadamard block {} does not tile an input of {width}",
            r.block
        ));
    }
    if r.signs.len() != width || r.signs.iter().any(|&s| s != 1.0 && s != -1.0) {
        return Err(format!(
            "Hadamard signs: {} values for an input of {width}, each must be ±1",
            r.signs.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The FWHT against the definition `H[r][c] = (−1)^popcount(r&c)/√n`.
    #[test]
    fn fwht_equals_dense_sylvester_product() {
        for n in [1usize, 2, 8, 64, 256] {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 7919) % 113) as f32 / 50.0 - 1.0)
                .collect();
            let mut y = x.clone();
            fwht(&mut y);
            for (r, yr) in y.iter().enumerate() {
                let want: f64 = (0..n)
                    .map(|c| {
                        let sign = if (r & c).count_ones() % 2 == 1 {
                            -1.0
                        } else {
                            1.0
                        };
                        sign * x[c] as f64
                    })
                    .sum::<f64>()
                    / (n as f64).sqrt();
                assert!((*yr as f64 - want).abs() < 1e-5, "n={n} r={r}");
            }
        }
    }

    #[test]
    fn rotate_then_unrotate_is_identity_and_preserves_dots() {
        let n = 96;
        let signs: Arc<[f32]> = (0..n)
            .map(|i| if i % 3 == 0 { -1.0 } else { 1.0 })
            .collect();
        let r = HadamardRotation { block: 32, signs };
        check(&r, n).unwrap();
        let w: Vec<f32> = (0..n).map(|i| (i as f32 * 0.3).sin()).collect();
        let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.7).cos()).collect();
        let (mut w2, mut x2) = (w.clone(), x.clone());
        rotate_input(&mut w2, &r);
        rotate_input(&mut x2, &r);
        let d = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
        assert!((d(&w, &x) - d(&w2, &x2)).abs() < 1e-4);
        unrotate_row(&mut w2, &r);
        for (a, b) in w.iter().zip(&w2) {
            assert!((a - b).abs() < 1e-5);
        }
        assert!(check(
            &HadamardRotation {
                block: 24,
                signs: r.signs.clone()
            },
            n
        )
        .is_err());
    }
}
