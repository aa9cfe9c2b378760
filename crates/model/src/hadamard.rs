//! PrismML's Hadamard rotation declaration (`prism.hadamard.*`: GGUF metadata, or the MLX
//! pack's `hadamard.json`), read into which weights carry which input rotation.
//!
//! Math (see `neagari_backend::HadamardRotation`): a rotated weight stores rows
//! `r' = H(s ⊙ r)` with `H` the normalized Sylvester Hadamard of `block_size` applied
//! blockwise along the input, `s` the sign vector of the input width. Linear layers rotate
//! their input the same way before the packed matmul; the embedding named in
//! `inverse_weight_names` is un-rotated after lookup. Anything else a file declares
//! (another transform, axis, version or sign mode) is refused by name: applying half of a
//! rotation yields fluent garbage.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use neagari_backend::HadamardRotation;

use crate::{ModelError, Result};

pub const TRANSFORM: &str = "normalized-sylvester-walsh-hadamard";
pub const AXIS: &str = "input-last-dimension";

/// A declared rotation, before it is matched against tensor names.
#[derive(Clone, Debug, PartialEq)]
pub struct HadamardSpec {
    pub block: usize,
    /// Sign vector per input width.
    pub signs: BTreeMap<usize, Arc<[f32]>>,
    /// Weights whose input is rotated (names as the file spells them).
    pub weight_names: Vec<String>,
    /// Weights un-rotated after an embedding lookup.
    pub inverse_weight_names: Vec<String>,
    pub gdn_v_grouped: bool,
}

/// The raw `prism.hadamard.*` values, however the container stores them.
#[derive(Default, Debug)]
pub struct RawSpec {
    pub version: Option<i64>,
    pub block_size: Option<i64>,
    pub transform: Option<String>,
    pub axis: Option<String>,
    pub sign_mode: Option<String>,
    pub sign_widths: Option<Vec<i64>>,
    pub sign_values: Option<Vec<f64>>,
    pub weight_names: Option<Vec<String>>,
    pub inverse_weight_names: Option<Vec<String>>,
    pub gdn_v_grouped: Option<bool>,
}

fn refuse(msg: String) -> ModelError {
    ModelError::Unsupported(format!("Hadamard-rotated weights: {msg}"))
}

impl HadamardSpec {
    /// Validates a declaration; every field we cannot honour is refused by name.
    pub fn from_raw(r: RawSpec) -> Result<Self> {
        match r.version {
            Some(1) => {}
            v => {
                return Err(refuse(format!(
                    "prism.hadamard.version {v:?} (only 1 is known)"
                )))
            }
        }
        match r.transform.as_deref() {
            Some(TRANSFORM) => {}
            t => {
                return Err(refuse(format!(
                    "transform {t:?} cannot be applied (only {TRANSFORM:?})"
                )))
            }
        }
        match r.axis.as_deref() {
            None | Some(AXIS) => {}
            a => return Err(refuse(format!("axis {a:?} (only {AXIS:?})"))),
        }
        let block = r
            .block_size
            .and_then(|b| usize::try_from(b).ok())
            .filter(|b| b.is_power_of_two() && *b <= 65536)
            .ok_or_else(|| refuse(format!("block size {:?}", r.block_size)))?;
        let widths: Vec<usize> = r
            .sign_widths
            .unwrap_or_default()
            .into_iter()
            .map(|w| usize::try_from(w).ok().filter(|w| w % block == 0))
            .collect::<Option<_>>()
            .ok_or_else(|| refuse("sign widths that are not multiples of the block".into()))?;
        let mut signs = BTreeMap::new();
        match r.sign_mode.as_deref() {
            Some("explicit") => {
                let vals = r.sign_values.unwrap_or_default();
                if vals.len() != widths.iter().sum::<usize>()
                    || vals.iter().any(|&v| v != 1.0 && v != -1.0)
                {
                    return Err(refuse(format!(
                        "{} sign values for widths {widths:?} (each must be ±1)",
                        vals.len()
                    )));
                }
                let mut at = 0;
                for &w in &widths {
                    let s: Arc<[f32]> = vals[at..at + w].iter().map(|&v| v as f32).collect();
                    if signs.insert(w, s).is_some() {
                        return Err(refuse(format!("sign width {w} declared twice")));
                    }
                    at += w;
                }
            }
            Some("identity") => {
                for &w in &widths {
                    signs.insert(w, vec![1f32; w].into());
                }
            }
            m => return Err(refuse(format!("sign mode {m:?}"))),
        }
        Ok(HadamardSpec {
            block,
            signs,
            weight_names: r.weight_names.unwrap_or_default(),
            inverse_weight_names: r.inverse_weight_names.unwrap_or_default(),
            gdn_v_grouped: r.gdn_v_grouped.unwrap_or(false),
        })
    }

    /// From `hadamard.json` text: the `prism.hadamard.*` keys (the prefix may be omitted).
    pub fn from_json(text: &str) -> Result<Self> {
        let j: serde_json::Value = serde_json::from_str(text)
            .map_err(|e| refuse(format!("hadamard.json is not JSON: {e}")))?;
        let get = |k: &str| {
            j.get(format!("prism.hadamard.{k}"))
                .or_else(|| j.get(k))
                .cloned()
        };
        let strs = |v: Option<serde_json::Value>| {
            v.and_then(|v| {
                v.as_array()?
                    .iter()
                    .map(|s| s.as_str().map(str::to_string))
                    .collect::<Option<Vec<_>>>()
            })
        };
        let raw = RawSpec {
            version: get("version").and_then(|v| v.as_i64()),
            block_size: get("block_size").and_then(|v| v.as_i64()),
            transform: get("transform").and_then(|v| v.as_str().map(str::to_string)),
            axis: get("axis").and_then(|v| v.as_str().map(str::to_string)),
            sign_mode: get("sign_mode").and_then(|v| v.as_str().map(str::to_string)),
            sign_widths: get("sign_widths")
                .and_then(|v| v.as_array()?.iter().map(|x| x.as_i64()).collect()),
            sign_values: get("sign_values")
                .and_then(|v| v.as_array()?.iter().map(|x| x.as_f64()).collect()),
            weight_names: strs(get("weight_names")),
            inverse_weight_names: strs(get("inverse_weight_names")),
            gdn_v_grouped: get("gdn_v_grouped").and_then(|v| v.as_bool()),
        };
        Self::from_raw(raw)
    }

    /// The rotation of an input of `width`.
    pub fn rotation(&self, width: usize) -> Result<HadamardRotation> {
        let signs = self
            .signs
            .get(&width)
            .ok_or_else(|| refuse(format!("no sign vector for input width {width}")))?;
        Ok(HadamardRotation {
            block: self.block,
            signs: signs.clone(),
        })
    }
}

fn gguf_nums(v: &neagari_formats::Value) -> Option<Vec<f64>> {
    use neagari_formats::Array as A;
    Some(match v.as_array()? {
        A::U8(x) => x.iter().map(|&v| v as f64).collect(),
        A::I8(x) => x.iter().map(|&v| v as f64).collect(),
        A::U16(x) => x.iter().map(|&v| v as f64).collect(),
        A::I16(x) => x.iter().map(|&v| v as f64).collect(),
        A::U32(x) => x.iter().map(|&v| v as f64).collect(),
        A::I32(x) => x.iter().map(|&v| v as f64).collect(),
        A::U64(x) => x.iter().map(|&v| v as f64).collect(),
        A::I64(x) => x.iter().map(|&v| v as f64).collect(),
        A::F32(x) => x.iter().map(|&v| v as f64).collect(),
        A::F64(x) => x.clone(),
        _ => return None,
    })
}

/// The `prism.hadamard.*` keys of a GGUF file, `None` when it declares no rotation.
pub fn spec_from_gguf(g: &neagari_formats::Gguf) -> Result<Option<HadamardSpec>> {
    let key = |k: &str| g.get(&format!("prism.hadamard.{k}"));
    if !g
        .metadata()
        .keys()
        .any(|k| k.starts_with("prism.hadamard."))
    {
        return Ok(None);
    }
    let int = |k: &str| key(k).and_then(|v| v.as_int()).map(|i| i as i64);
    let string = |k: &str| key(k).and_then(|v| v.as_str()).map(str::to_string);
    let strs = |k: &str| match key(k).and_then(|v| v.as_array()) {
        Some(neagari_formats::Array::String(s)) => Some(s.clone()),
        _ => None,
    };
    let raw = RawSpec {
        version: int("version"),
        block_size: int("block_size"),
        transform: string("transform"),
        axis: string("axis"),
        sign_mode: string("sign_mode"),
        sign_widths: key("sign_widths")
            .and_then(gguf_nums)
            .map(|v| v.into_iter().map(|x| x as i64).collect()),
        sign_values: key("sign_values").and_then(gguf_nums),
        weight_names: strs("weight_names"),
        inverse_weight_names: strs("inverse_weight_names"),
        gdn_v_grouped: match key("gdn_v_grouped") {
            Some(neagari_formats::Value::Bool(b)) => Some(*b),
            _ => None,
        },
    };
    HadamardSpec::from_raw(raw).map(Some)
}

/// Which GGUF-named weights are rotated, resolved from a spec by a name mapping. Every
/// declared name must resolve, and the inverse set may hold only the token embedding.
#[derive(Clone, Debug, Default)]
pub struct RotatedSet {
    pub spec: Option<Arc<HadamardSpec>>,
    pub names: BTreeSet<String>,
}

impl RotatedSet {
    pub fn resolve(spec: HadamardSpec, to_gguf: impl Fn(&str) -> Option<String>) -> Result<Self> {
        // `gdn_v_grouped` concerns gated-delta layers only; the families loaded here have
        // none, so it changes nothing for them.
        let mut names = BTreeSet::new();
        for n in spec.weight_names.iter().chain(&spec.inverse_weight_names) {
            let g = to_gguf(n).ok_or_else(|| {
                refuse(format!(
                    "declared weight {n:?} is not a weight this loader rotates"
                ))
            })?;
            names.insert(g);
        }
        for n in &spec.inverse_weight_names {
            if to_gguf(n).as_deref() != Some("token_embd.weight") {
                return Err(refuse(format!(
                    "inverse rotation declared on {n:?}; only the token embedding is supported"
                )));
            }
        }
        Ok(RotatedSet {
            spec: Some(Arc::new(spec)),
            names,
        })
    }

    /// The rotation of a weight with input `width`, if it is rotated.
    pub fn rotation_of(&self, gguf_name: &str, width: usize) -> Result<Option<HadamardRotation>> {
        match &self.spec {
            Some(s) if self.names.contains(gguf_name) => Ok(Some(s.rotation(width)?)),
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw() -> RawSpec {
        RawSpec {
            version: Some(1),
            block_size: Some(4),
            transform: Some(TRANSFORM.into()),
            axis: Some(AXIS.into()),
            sign_mode: Some("explicit".into()),
            sign_widths: Some(vec![4, 8]),
            sign_values: Some(vec![1., -1., 1., 1., -1., -1., 1., 1., 1., 1., -1., 1.]),
            weight_names: Some(vec!["a".into()]),
            inverse_weight_names: Some(vec![]),
            gdn_v_grouped: None,
        }
    }

    #[test]
    fn splits_signs_per_width() {
        let s = HadamardSpec::from_raw(raw()).unwrap();
        assert_eq!(&*s.rotation(4).unwrap().signs, &[1., -1., 1., 1.]);
        assert_eq!(s.rotation(8).unwrap().signs.len(), 8);
        assert!(s.rotation(16).is_err());
    }

    #[test]
    fn refuses_what_it_cannot_apply_by_name() {
        let e = HadamardSpec::from_raw(RawSpec {
            transform: Some("randomized-dct".into()),
            ..raw()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("randomized-dct"), "{e}");
        assert!(HadamardSpec::from_raw(RawSpec {
            block_size: Some(6),
            ..raw()
        })
        .is_err());
        assert!(HadamardSpec::from_raw(RawSpec {
            sign_values: Some(vec![1.0; 11]),
            ..raw()
        })
        .is_err());
        let e = HadamardSpec::from_raw(RawSpec {
            sign_mode: Some("learned".into()),
            ..raw()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("learned"), "{e}");
    }
}
