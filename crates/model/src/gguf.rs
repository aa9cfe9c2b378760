//! `ModelSource` over a GGUF file: metadata through the typed getters, tensors as views of
//! the mmap (no copy), shapes turned from ggml's `ne` order into HF's `[out, in]`.

use std::sync::{Arc, OnceLock};

use neagari_backend::{HostTensor, SharedBytes, WeightDesc};
use neagari_formats::{Array, Gguf, Value};

use crate::hadamard::{spec_from_gguf, RotatedSet};
use crate::source::ModelSource;
use crate::{ModelError, Result};

/// A GGUF file shared by the tensors that view it.
#[derive(Clone)]
pub struct GgufSource {
    file: Arc<Gguf>,
    /// The `prism.hadamard.*` rotation, resolved on first use (an error kept as text so
    /// every later weight reports it too).
    rotated: Arc<OnceLock<std::result::Result<RotatedSet, String>>>,
}

struct FileBytes(Arc<Gguf>);

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.bytes()
    }
}

impl GgufSource {
    pub fn new(file: Arc<Gguf>) -> Self {
        GgufSource {
            file,
            rotated: Arc::new(OnceLock::new()),
        }
    }

    pub fn file(&self) -> &Gguf {
        &self.file
    }

    /// The declared Hadamard rotation: each declared name must be a tensor of the file.
    fn rotation_set(&self) -> Result<&RotatedSet> {
        self.rotated
            .get_or_init(|| {
                let Some(spec) = spec_from_gguf(&self.file).map_err(|e| e.to_string())? else {
                    return Ok(RotatedSet::default());
                };
                let has_gdn = self
                    .file
                    .tensors()
                    .iter()
                    .any(|t| t.name.contains("ssm_out"));
                if spec.gdn_v_grouped && has_gdn {
                    return Err(
                        "Hadamard-rotated weights: prism.hadamard.gdn_v_grouped (grouped \
                                V-head order before ssm_out) is not implemented"
                            .to_string(),
                    );
                }
                RotatedSet::resolve(spec, |n| self.file.tensor(n).map(|_| n.to_string()))
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| ModelError::Unsupported(e.clone()))
    }
}

fn bad(key: &str, v: &Value, want: &str) -> ModelError {
    ModelError::BadKey {
        key: key.to_string(),
        msg: format!("expected {want}, found {}", v.type_desc()),
    }
}

impl ModelSource for GgufSource {
    fn architecture(&self) -> Result<String> {
        self.str_opt("general.architecture")?
            .ok_or_else(|| ModelError::MissingKey("general.architecture".into()))
    }

    fn u64_opt(&self, key: &str) -> Result<Option<u64>> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => match v.as_int() {
                Some(i) if (0..=u64::MAX as i128).contains(&i) => Ok(Some(i as u64)),
                _ => Err(bad(key, v, "a non-negative integer")),
            },
        }
    }

    fn f32_opt(&self, key: &str) -> Result<Option<f32>> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::F32(f)) => Ok(Some(*f)),
            Some(Value::F64(f)) => Ok(Some(*f as f32)),
            Some(v) => v
                .as_int()
                .map(|i| Some(i as f32))
                .ok_or_else(|| bad(key, v, "a number")),
        }
    }

    fn str_opt(&self, key: &str) -> Result<Option<String>> {
        match self.file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_str()
                .map(|s| Some(s.to_string()))
                .ok_or_else(|| bad(key, v, "a string")),
        }
    }

    fn bool_opt(&self, key: &str) -> Result<Option<bool>> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(bad(key, v, "a bool")),
        }
    }

    fn u64_array_opt(&self, key: &str) -> Result<Option<Vec<u64>>> {
        let Some(v) = self.file.get(key) else {
            return Ok(None);
        };
        let Some(a) = v.as_array() else {
            // A scalar where an array may stand (a pattern length): not an array.
            return Ok(None);
        };
        let out: Option<Vec<u64>> = match a {
            Array::Bool(b) => Some(b.iter().map(|&x| x as u64).collect()),
            Array::U8(x) => Some(x.iter().map(|&x| x as u64).collect()),
            Array::I8(x) => x.iter().map(|&x| u64::try_from(x).ok()).collect(),
            Array::U16(x) => Some(x.iter().map(|&x| x as u64).collect()),
            Array::I16(x) => x.iter().map(|&x| u64::try_from(x).ok()).collect(),
            Array::U32(x) => Some(x.iter().map(|&x| x as u64).collect()),
            Array::I32(x) => x.iter().map(|&x| u64::try_from(x).ok()).collect(),
            Array::U64(x) => Some(x.clone()),
            Array::I64(x) => x.iter().map(|&x| u64::try_from(x).ok()).collect(),
            _ => None,
        };
        out.map(Some)
            .ok_or_else(|| bad(key, v, "an array of non-negative integers"))
    }

    fn weight(&self, name: &str) -> Result<Option<WeightDesc>> {
        let Some(t) = self.tensor(name) else {
            return Ok(None);
        };
        let width = t.shape.last().copied().unwrap_or(0);
        let rotation = self.rotation_set()?.rotation_of(name, width)?;
        Ok(Some(WeightDesc {
            rotation,
            ..WeightDesc::from(t)
        }))
    }

    fn tensor(&self, name: &str) -> Option<HostTensor> {
        let t = self.file.tensor(name)?;
        let start = self.file.data_offset().checked_add(t.offset)?;
        let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(FileBytes(self.file.clone()));
        let bytes = SharedBytes::new(
            owner,
            usize::try_from(start).ok()?,
            usize::try_from(t.n_bytes).ok()?,
        )?;
        // ggml ne = [in, out, ...]; HF order is the reverse.
        let shape: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
        Some(HostTensor {
            name: name.to_string(),
            ty: t.ty,
            shape,
            bytes,
        })
    }
}
