//! The view of a weights file the models read: typed metadata getters under the GGUF key
//! names, and tensors by GGUF name with their shape in HF order (`[out, in]`).

use neagari_backend::{Backend, HostTensor, WeightDesc};

use crate::{ModelError, Result};

pub trait ModelSource {
    fn architecture(&self) -> Result<String>;
    /// An unsigned integer key (any width), `None` when absent.
    fn u64_opt(&self, key: &str) -> Result<Option<u64>>;
    /// A float key (f32/f64, or an integer), `None` when absent.
    fn f32_opt(&self, key: &str) -> Result<Option<f32>>;
    fn str_opt(&self, key: &str) -> Result<Option<String>>;
    fn bool_opt(&self, key: &str) -> Result<Option<bool>>;
    /// An array of integers or bools (per-layer patterns), `None` when absent.
    fn u64_array_opt(&self, key: &str) -> Result<Option<Vec<u64>>>;
    /// A tensor by name, `None` when absent.
    fn tensor(&self, name: &str) -> Option<HostTensor>;
    /// A matrix by name with everything the backend needs to multiply it (an MLX affine
    /// triple, an input rotation); by default the plain tensor.
    fn weight(&self, name: &str) -> Result<Option<WeightDesc>> {
        Ok(self.tensor(name).map(WeightDesc::from))
    }
}

/// Helpers on top of `ModelSource` for the model files.
pub(crate) trait SourceExt {
    fn usize(&self, key: &str) -> Result<usize>;
    fn usize_or(&self, key: &str, default: usize) -> Result<usize>;
    fn f32_or(&self, key: &str, default: f32) -> Result<f32>;
    fn require(&self, name: &str) -> Result<HostTensor>;
    fn require_shape(&self, name: &str, want: &[usize]) -> Result<HostTensor>;
    fn mat<B: Backend>(&self, be: &B, name: &str, want: &[usize]) -> Result<B::Mat>;
    fn vector<B: Backend>(&self, be: &B, name: &str, len: usize) -> Result<B::Vector>;
    fn vector_opt<B: Backend>(&self, be: &B, name: &str, len: usize) -> Result<Option<B::Vector>>;
}

impl<S: ModelSource + ?Sized> SourceExt for S {
    fn usize(&self, key: &str) -> Result<usize> {
        self.u64_opt(key)?
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::MissingKey(key.to_string()))
    }

    fn usize_or(&self, key: &str, default: usize) -> Result<usize> {
        Ok(self.u64_opt(key)?.map(|v| v as usize).unwrap_or(default))
    }

    fn f32_or(&self, key: &str, default: f32) -> Result<f32> {
        Ok(self.f32_opt(key)?.unwrap_or(default))
    }

    fn require(&self, name: &str) -> Result<HostTensor> {
        self.tensor(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    fn require_shape(&self, name: &str, want: &[usize]) -> Result<HostTensor> {
        let t = self.require(name)?;
        if t.shape != want {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                got: t.shape.clone(),
                want: want.to_vec(),
            });
        }
        Ok(t)
    }

    fn mat<B: Backend>(&self, be: &B, name: &str, want: &[usize]) -> Result<B::Mat> {
        let w = self
            .weight(name)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
        if w.shape != want {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                got: w.shape.clone(),
                want: want.to_vec(),
            });
        }
        Ok(be.load_weight(&w)?)
    }

    fn vector<B: Backend>(&self, be: &B, name: &str, len: usize) -> Result<B::Vector> {
        Ok(be.load_vector(&self.require_shape(name, &[len])?)?)
    }

    fn vector_opt<B: Backend>(&self, be: &B, name: &str, len: usize) -> Result<Option<B::Vector>> {
        match self.tensor(name) {
            None => Ok(None),
            Some(_) => Ok(Some(self.vector(be, name, len)?)),
        }
    }
}
