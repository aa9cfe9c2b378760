//! Type id 42 carries two layouts: upstream Q2_0 (64 weights in 18 bytes, the official
//! ternary Bonsai `*-Q2_0_g64.gguf` files) and the deprecated group-128 data of older
//! ternary Bonsai `*-Q2_0.gguf` files (128 weights in 34 bytes: the layout PrismML later
//! named PQ2_0, id 142). The tensor infos cannot say which; the space between a tensor's
//! offset and the next tensor's (or the end of the file) can. Files whose id-42 tensors
//! only fit the group-128 size are read as PQ2_0, so they run correctly and `inspect`
//! names them.

use super::TensorInfo;
use neagari_quant::GgmlType;

/// Bytes of `t` in the group-128 layout, if its rows are whole 128-weight blocks.
fn g128_bytes(t: &TensorInfo) -> Option<u64> {
    let ne0 = t.row_len();
    ne0.is_multiple_of(128)
        .then(|| (ne0 / 128).saturating_mul(34).saturating_mul(t.rows()))
}

/// Re-types the id-42 tensors of a legacy group-128 file as PQ2_0. `data_len` is the
/// length of the data section. A file is legacy when some id-42 tensor's slot is smaller
/// than its upstream size but holds the group-128 size, and every id-42 tensor has
/// group-128 rows (then the slots that also hold the upstream size are padding).
pub(crate) fn resolve(tensors: &mut [TensorInfo], data_len: u64) {
    let mut starts: Vec<u64> = tensors.iter().map(|t| t.offset).collect();
    starts.sort_unstable();
    let slot = |t: &TensorInfo| {
        let next = starts
            .iter()
            .copied()
            .find(|&o| o > t.offset)
            .unwrap_or(data_len);
        next.saturating_sub(t.offset)
    };
    let mut legacy = false;
    for t in tensors.iter().filter(|t| t.ty == GgmlType::Q2_0) {
        let s = slot(t);
        match g128_bytes(t) {
            Some(g) if s < t.n_bytes && s >= g => legacy = true,
            None => return,
            _ => {}
        }
    }
    if !legacy {
        return;
    }
    for t in tensors.iter_mut().filter(|t| t.ty == GgmlType::Q2_0) {
        if let Some(g) = g128_bytes(t) {
            t.ty = GgmlType::PQ2_0;
            t.n_bytes = g;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, ne0: u64, rows: u64, ty: GgmlType, offset: u64) -> TensorInfo {
        let n_bytes = ty.row_bytes(ne0 as usize).unwrap() as u64 * rows;
        TensorInfo {
            name: name.into(),
            ty,
            dims: vec![ne0, rows],
            offset,
            n_bytes,
        }
    }

    #[test]
    fn upstream_files_keep_q2_0() {
        // 4096 × 4 Q2_0: 4608 bytes per tensor at upstream size.
        let mut t = vec![
            info("a", 4096, 4, GgmlType::Q2_0, 0),
            info("b", 4096, 4, GgmlType::Q2_0, 4608),
        ];
        resolve(&mut t, 2 * 4608);
        assert!(t.iter().all(|t| t.ty == GgmlType::Q2_0));
    }

    #[test]
    fn group_128_files_become_pq2_0() {
        // The same shapes packed at 34 bytes per 128 weights: 4352 bytes per tensor.
        let mut t = vec![
            info("a", 4096, 4, GgmlType::Q2_0, 0),
            info("b", 4096, 4, GgmlType::Q2_0, 4352),
        ];
        resolve(&mut t, 2 * 4352);
        for x in &t {
            assert_eq!(x.ty, GgmlType::PQ2_0);
            assert_eq!(x.n_bytes, 4352);
        }
    }

    #[test]
    fn rows_not_of_128_stay_upstream() {
        let mut t = vec![info("a", 192, 4, GgmlType::Q2_0, 0)];
        resolve(&mut t, 10);
        assert_eq!(t[0].ty, GgmlType::Q2_0);
    }
}
