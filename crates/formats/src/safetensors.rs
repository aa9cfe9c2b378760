//! safetensors reader: one file or a sharded checkpoint (`model.safetensors.index.json`),
//! memory-mapped, validated up front, tensors handed out as zero-copy byte views.
//!
//! Layout (huggingface/safetensors README): u64 LE header length `n`, then `n` bytes of
//! JSON `{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}}`,
//! then the data blob; offsets are relative to the blob. Every malformation is a typed
//! error; nothing here panics on input.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as Json;

/// Largest header accepted (the reference implementation's limit is 100 MB).
const MAX_HEADER: u64 = 100_000_000;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SafetensorsError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: file of {size} bytes is too short for a safetensors header")]
    TooShort { path: PathBuf, size: u64 },
    #[error("{path}: header length {len} exceeds the file ({size} bytes) or the 100 MB limit")]
    HeaderTooLarge { path: PathBuf, len: u64, size: u64 },
    #[error("{path}: header is not valid JSON: {msg}")]
    BadJson { path: PathBuf, msg: String },
    #[error("{path}: {msg}")]
    BadHeader { path: PathBuf, msg: String },
    #[error("{path}: tensor {tensor:?}: {msg}")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        msg: String,
    },
    #[error("tensor {0:?} appears in more than one shard")]
    DuplicateTensor(String),
    #[error("{path}: index names tensor {tensor:?} in {file}, which does not hold it")]
    IndexMismatch {
        path: PathBuf,
        tensor: String,
        file: String,
    },
    #[error("{0}: no model.safetensors or model.safetensors.index.json in the directory")]
    NoCheckpoint(PathBuf),
}

type Result<T> = std::result::Result<T, SafetensorsError>;

/// Element types of safetensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dtype {
    Bool,
    U8,
    I8,
    F8E4M3,
    F8E5M2,
    U16,
    I16,
    F16,
    BF16,
    U32,
    I32,
    F32,
    U64,
    I64,
    F64,
}

impl Dtype {
    fn parse(s: &str) -> Option<Self> {
        use Dtype::*;
        Some(match s {
            "BOOL" => Bool,
            "U8" => U8,
            "I8" => I8,
            "F8_E4M3" => F8E4M3,
            "F8_E5M2" => F8E5M2,
            "U16" => U16,
            "I16" => I16,
            "F16" => F16,
            "BF16" => BF16,
            "U32" => U32,
            "I32" => I32,
            "F32" => F32,
            "U64" => U64,
            "I64" => I64,
            "F64" => F64,
            _ => return None,
        })
    }

    pub fn size(self) -> usize {
        use Dtype::*;
        match self {
            Bool | U8 | I8 | F8E4M3 | F8E5M2 => 1,
            U16 | I16 | F16 | BF16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
        }
    }
}

/// One tensor of a checkpoint: where its bytes are and what they hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StTensor {
    pub dtype: Dtype,
    /// Shape as stored (row-major, outermost first: `[out, in]` for a Linear weight).
    pub shape: Vec<usize>,
    /// Index of the shard in `SafeTensors::files`.
    pub file: usize,
    /// Absolute byte range in that shard's file.
    pub start: usize,
    pub len: usize,
}

/// A memory-mapped shard.
pub struct StFile {
    pub path: PathBuf,
    map: memmap2::Mmap,
}

impl AsRef<[u8]> for StFile {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

/// An open checkpoint: every shard mapped, every tensor validated.
pub struct SafeTensors {
    files: Vec<Arc<StFile>>,
    tensors: BTreeMap<String, StTensor>,
    /// `__metadata__` of the first shard (mlx-lm writes `{"format": "mlx"}`).
    metadata: BTreeMap<String, String>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SafetensorsError + '_ {
    move |source| SafetensorsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn map_file(path: &Path) -> Result<memmap2::Mmap> {
    let file = File::open(path).map_err(io(path))?;
    // SAFETY: the map is read-only and private to this process; if another process
    // truncates or rewrites the file while it is mapped, reads may fault or see new bytes —
    // the same contract every mmap-based model loader accepts.
    unsafe { memmap2::Mmap::map(&file) }.map_err(io(path))
}

/// Parses and validates one shard's header against `bytes` (the whole file).
pub fn parse_header(
    path: &Path,
    bytes: &[u8],
) -> Result<(BTreeMap<String, StTensor>, BTreeMap<String, String>)> {
    let size = bytes.len() as u64;
    let Some(len_bytes) = bytes.get(..8) else {
        return Err(SafetensorsError::TooShort {
            path: path.to_path_buf(),
            size,
        });
    };
    let mut b8 = [0u8; 8];
    b8.copy_from_slice(len_bytes);
    let n = u64::from_le_bytes(b8);
    if n > MAX_HEADER || n > size - 8 {
        return Err(SafetensorsError::HeaderTooLarge {
            path: path.to_path_buf(),
            len: n,
            size,
        });
    }
    let data_start = 8 + n as usize;
    let header: Json =
        serde_json::from_slice(&bytes[8..data_start]).map_err(|e| SafetensorsError::BadJson {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
    let bad = |msg: String| SafetensorsError::BadHeader {
        path: path.to_path_buf(),
        msg,
    };
    let Json::Object(obj) = header else {
        return Err(bad("header is not a JSON object".into()));
    };
    let data_len = bytes.len() - data_start;
    let mut tensors = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    for (name, v) in obj {
        if name == "__metadata__" {
            let Json::Object(m) = v else {
                return Err(bad("__metadata__ is not an object".into()));
            };
            for (k, v) in m {
                match v {
                    Json::String(s) => metadata.insert(k, s),
                    _ => return Err(bad(format!("__metadata__[{k:?}] is not a string"))),
                };
            }
            continue;
        }
        let t = parse_tensor(&v, data_len).map_err(|msg| SafetensorsError::BadTensor {
            path: path.to_path_buf(),
            tensor: name.clone(),
            msg,
        })?;
        tensors.insert(
            name,
            StTensor {
                start: data_start + t.start,
                ..t
            },
        );
    }
    Ok((tensors, metadata))
}

/// One tensor entry; `start` relative to the data blob, `file` left 0.
fn parse_tensor(v: &Json, data_len: usize) -> std::result::Result<StTensor, String> {
    let dtype = v
        .get("dtype")
        .and_then(Json::as_str)
        .ok_or("missing dtype")?;
    let dtype = Dtype::parse(dtype).ok_or_else(|| format!("unknown dtype {dtype:?}"))?;
    let shape: Vec<usize> = v
        .get("shape")
        .and_then(Json::as_array)
        .ok_or("missing shape")?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<_>>()
        .ok_or("shape holds a value that is not a non-negative integer")?;
    let offs = v
        .get("data_offsets")
        .and_then(Json::as_array)
        .ok_or("missing data_offsets")?;
    let (begin, end) = match offs.as_slice() {
        [a, b] => (
            a.as_u64().ok_or("bad data_offsets")?,
            b.as_u64().ok_or("bad data_offsets")?,
        ),
        _ => return Err("data_offsets must hold two integers".into()),
    };
    if begin > end || end > data_len as u64 {
        return Err(format!(
            "data_offsets [{begin}, {end}) outside the data of {data_len} bytes"
        ));
    }
    let n_bytes = shape
        .iter()
        .try_fold(dtype.size(), |acc, &d| acc.checked_mul(d))
        .ok_or("shape overflows")?;
    if n_bytes as u64 != end - begin {
        return Err(format!(
            "{} bytes for shape {shape:?} of {dtype:?} ({n_bytes} expected)",
            end - begin
        ));
    }
    Ok(StTensor {
        dtype,
        shape,
        file: 0,
        start: begin as usize,
        len: n_bytes,
    })
}

impl SafeTensors {
    /// Opens a `.safetensors` file, a `*.index.json`, or a directory holding either
    /// (`model.safetensors` or `model.safetensors.index.json`).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        if path.is_dir() {
            let index = path.join("model.safetensors.index.json");
            if index.is_file() {
                return Self::open_index(&index);
            }
            let single = path.join("model.safetensors");
            if single.is_file() {
                return Self::open_file(&single);
            }
            return Err(SafetensorsError::NoCheckpoint(path.to_path_buf()));
        }
        if path.to_string_lossy().ends_with(".json") {
            Self::open_index(path)
        } else {
            Self::open_file(path)
        }
    }

    pub fn open_file(path: &Path) -> Result<Self> {
        let map = map_file(path)?;
        let (tensors, metadata) = parse_header(path, &map)?;
        Ok(SafeTensors {
            files: vec![Arc::new(StFile {
                path: path.to_path_buf(),
                map,
            })],
            tensors,
            metadata,
        })
    }

    /// A sharded checkpoint: `{"weight_map": {tensor: shard file name}}`; shards are
    /// resolved next to the index.
    pub fn open_index(path: &Path) -> Result<Self> {
        let text = std::fs::read(path).map_err(io(path))?;
        let bad = |msg: String| SafetensorsError::BadHeader {
            path: path.to_path_buf(),
            msg,
        };
        let json: Json = serde_json::from_slice(&text).map_err(|e| SafetensorsError::BadJson {
            path: path.to_path_buf(),
            msg: e.to_string(),
        })?;
        let map = json
            .get("weight_map")
            .and_then(Json::as_object)
            .ok_or_else(|| bad("index has no weight_map object".into()))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut shard_names: Vec<&str> = Vec::new();
        for (t, f) in map {
            let f = f
                .as_str()
                .ok_or_else(|| bad(format!("weight_map[{t:?}] is not a string")))?;
            // A shard name is a file next to the index, never a path elsewhere.
            if f.contains('/') || f.contains('\\') || f == ".." {
                return Err(bad(format!("shard name {f:?} is not a plain file name")));
            }
            if !shard_names.contains(&f) {
                shard_names.push(f);
            }
        }
        shard_names.sort_unstable();
        let mut out = SafeTensors {
            files: Vec::new(),
            tensors: BTreeMap::new(),
            metadata: BTreeMap::new(),
        };
        for (i, name) in shard_names.iter().enumerate() {
            let p = dir.join(name);
            let mmap = map_file(&p)?;
            let (tensors, metadata) = parse_header(&p, &mmap)?;
            if i == 0 {
                out.metadata = metadata;
            }
            for (tn, t) in tensors {
                if out.tensors.contains_key(&tn) {
                    return Err(SafetensorsError::DuplicateTensor(tn));
                }
                out.tensors.insert(tn, StTensor { file: i, ..t });
            }
            out.files.push(Arc::new(StFile { path: p, map: mmap }));
        }
        for (t, f) in map {
            let want = shard_names.iter().position(|n| Some(*n) == f.as_str());
            if out.tensors.get(t).map(|x| Some(x.file)) != Some(want) {
                return Err(SafetensorsError::IndexMismatch {
                    path: path.to_path_buf(),
                    tensor: t.clone(),
                    file: f.as_str().unwrap_or_default().to_string(),
                });
            }
        }
        Ok(out)
    }

    pub fn tensor(&self, name: &str) -> Option<&StTensor> {
        self.tensors.get(name)
    }

    pub fn tensors(&self) -> impl Iterator<Item = (&str, &StTensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// The mapped shards (owners for zero-copy views).
    pub fn files(&self) -> &[Arc<StFile>] {
        &self.files
    }

    /// The bytes of a tensor (validated at open, so always in range).
    pub fn bytes(&self, t: &StTensor) -> &[u8] {
        self.files
            .get(t.file)
            .and_then(|f| f.map.get(t.start..t.start + t.len))
            .unwrap_or(&[])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file built by hand from the published layout.
    fn build(header: &str, data: &[u8]) -> Vec<u8> {
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.extend_from_slice(data);
        v
    }

    fn parse(bytes: &[u8]) -> Result<BTreeMap<String, StTensor>> {
        parse_header(Path::new("t"), bytes).map(|x| x.0)
    }

    const GOOD: &str = r#"{"__metadata__":{"format":"mlx"},"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]}}"#;

    #[test]
    fn parses_good_file() {
        let f = build(GOOD, &[7u8; 22]);
        let (t, m) = parse_header(Path::new("t"), &f).unwrap();
        assert_eq!(m.get("format").map(String::as_str), Some("mlx"));
        let a = &t["a"];
        assert_eq!(
            (a.dtype, a.shape.clone(), a.len),
            (Dtype::F32, vec![2, 2], 16)
        );
        assert_eq!(a.start, 8 + GOOD.len());
        assert_eq!(t["b"].start, 8 + GOOD.len() + 16);
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let f = build(GOOD, &[7u8; 22]);
        for cut in 0..f.len() {
            assert!(parse(&f[..cut]).is_err(), "cut at {cut} accepted");
        }
    }

    #[test]
    fn corrupted_bytes_never_panic() {
        let f = build(GOOD, &[7u8; 22]);
        let mut state = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut g = f.clone();
            for _ in 0..3 {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let i = state as usize % g.len();
                g[i] = (state >> 8) as u8;
            }
            let _ = parse(&g);
        }
    }

    #[test]
    fn rejects_inconsistent_entries() {
        let cases = [
            r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}}"#,
            r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[8,0]}}"#,
            r#"{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,999]}}"#,
            r#"{"a":{"dtype":"Q4","shape":[2,2],"data_offsets":[0,16]}}"#,
            r#"{"a":{"dtype":"F32","shape":[-2,2],"data_offsets":[0,16]}}"#,
            r#"{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,16]}}"#,
            r#"{"a":{"dtype":"F32","shape":[4],"data_offsets":[0]}}"#,
            r#"{"__metadata__":{"x":1}}"#,
            r#"[1,2]"#,
        ];
        for h in cases {
            assert!(parse(&build(h, &[0u8; 16])).is_err(), "{h} accepted");
        }
        let huge = {
            let mut v = u64::MAX.to_le_bytes().to_vec();
            v.extend_from_slice(b"{}");
            v
        };
        assert!(matches!(
            parse(&huge),
            Err(SafetensorsError::HeaderTooLarge { .. })
        ));
    }

    #[test]
    fn sharded_index_round_trip_and_mismatch() {
        let dir = std::env::temp_dir().join(format!("neagari_st_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let h1 = r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let h2 = r#"{"y":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}"#;
        std::fs::write(dir.join("s1.safetensors"), build(h1, &1f32.to_le_bytes())).unwrap();
        std::fs::write(dir.join("s2.safetensors"), build(h2, &[1, 2, 3])).unwrap();
        let idx = dir.join("model.safetensors.index.json");
        std::fs::write(
            &idx,
            r#"{"metadata":{},"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}}"#,
        )
        .unwrap();
        let st = SafeTensors::open(&dir).unwrap();
        assert_eq!(st.bytes(st.tensor("x").unwrap()), 1f32.to_le_bytes());
        assert_eq!(st.bytes(st.tensor("y").unwrap()), [1, 2, 3]);
        std::fs::write(
            &idx,
            r#"{"weight_map":{"x":"s2.safetensors","y":"s2.safetensors"}}"#,
        )
        .unwrap();
        assert!(matches!(
            SafeTensors::open(&dir),
            Err(SafetensorsError::IndexMismatch { .. })
        ));
        std::fs::write(&idx, r#"{"weight_map":{"x":"../s1.safetensors"}}"#).unwrap();
        assert!(SafeTensors::open(&dir).is_err());
        std::fs::remove_dir_all(&dir).ok();
    }
}
