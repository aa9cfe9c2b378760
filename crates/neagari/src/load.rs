//! Opening a model file for the commands: the GGUF, the backend, the model, its tokenizer
//! and its chat template, with one clear error line when any of them cannot be had.

use std::path::Path;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use neagari_backend::cpu::{CpuBackend, CpuOptions};
use neagari_backend::{Backend, KvType};
use neagari_engine::loader::{chat_template, tokenizer_from_gguf};
use neagari_engine::session::Session;
use neagari_formats::Gguf;
use neagari_model::gguf::GgufSource;
use neagari_model::hf::HfSource;
use neagari_model::CausalLm;
use neagari_tokenizer::chat_template::ChatTemplate;
use neagari_tokenizer::Tokenizer;

use crate::ModelArgs;

/// Where the model runs (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// GPU ordinal.
    Cuda(usize),
}

impl std::str::FromStr for Device {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let s = s.to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => match s.strip_prefix("cuda:") {
                Some(n) => n
                    .parse()
                    .map(Device::Cuda)
                    .map_err(|_| format!("bad GPU number in '{s}'")),
                None => Err(format!(
                    "unknown device '{s}' (expected cpu, cuda or cuda:N)"
                )),
            },
        }
    }
}

/// What the commands need from a backend beyond the model ops: its thread count, a
/// barrier for timing, and its memory read bandwidth for the bench's share figure.
pub trait DeviceBackend: Backend {
    fn threads(&self) -> usize;
    /// Waits until queued work is done (a no-op on CPU).
    fn sync(&self) -> Result<()>;
    /// Measured read bandwidth in bytes per second.
    fn read_bandwidth(&self) -> Result<f64>;
    /// Starts timing each kernel; false where the backend cannot (the CPU).
    fn profile_begin(&self) -> Result<bool> {
        Ok(false)
    }
    /// The kernel times since `profile_begin`, the largest first.
    fn profile_end(&self) -> Result<Vec<KernelRow>> {
        Ok(Vec::new())
    }
}

/// One kernel's time in `neagari bench --profile`.
pub struct KernelRow {
    pub name: String,
    /// Launch grid, "x×y×z".
    pub grid: String,
    pub launches: usize,
    pub seconds: f64,
}

impl DeviceBackend for CpuBackend {
    fn threads(&self) -> usize {
        CpuBackend::threads(self)
    }
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    fn read_bandwidth(&self) -> Result<f64> {
        Ok(crate::bench::measure_read_bandwidth(self))
    }
}

#[cfg(feature = "cuda")]
impl DeviceBackend for neagari_backend::cuda::CudaBackend {
    fn threads(&self) -> usize {
        0
    }
    fn sync(&self) -> Result<()> {
        Ok(self.synchronize()?)
    }
    /// Device-to-device copy (bytes read + written), the figure the speed bar is set in.
    fn read_bandwidth(&self) -> Result<f64> {
        Ok(self.copy_bandwidth()?)
    }
    fn profile_begin(&self) -> Result<bool> {
        neagari_backend::cuda::CudaBackend::profile_begin(self)?;
        Ok(true)
    }
    fn profile_end(&self) -> Result<Vec<KernelRow>> {
        Ok(neagari_backend::cuda::CudaBackend::profile_end(self)?
            .into_iter()
            .map(|k| KernelRow {
                grid: format!("{}×{}×{}", k.grid.0, k.grid.1, k.grid.2),
                name: k.name,
                launches: k.launches,
                seconds: k.seconds,
            })
            .collect())
    }
}

/// Opens the model on the device `args` names and calls `$f(loaded, $extra...)`, generic
/// over the backend.
#[macro_export]
macro_rules! on_device {
    ($args:expr, $want_template:expr, $f:ident $(, $extra:expr)*) => {
        match $args.device {
            $crate::load::Device::Cpu => {
                $f($crate::load::Loaded::open_cpu(&$args, $want_template)? $(, $extra)*)
            }
            #[cfg(feature = "cuda")]
            $crate::load::Device::Cuda(n) => {
                let be = neagari_backend::cuda::CudaBackend::new(n)
                    .map_err(|e| anyhow::anyhow!("cannot use GPU {n}: {e}"))?;
                $f($crate::load::Loaded::open_on(be, &$args, $want_template)? $(, $extra)*)
            }
            #[cfg(not(feature = "cuda"))]
            $crate::load::Device::Cuda(_) => {
                anyhow::bail!("this build of neagari has no CUDA support (feature `cuda`)")
            }
        }
    };
}

pub struct Loaded<B: Backend = CpuBackend> {
    pub file_bytes: u64,
    pub be: B,
    pub model: Box<dyn CausalLm<B>>,
    pub tokenizer: Tokenizer,
    /// The file's chat template, or its architecture's built-in format.
    pub template: Option<ChatTemplate>,
    /// True when the template is a built-in stand-in for a missing one.
    pub template_builtin: bool,
    pub n_ctx: usize,
    /// True when `n_ctx` is the user's (`--ctx-size`), not the default.
    pub ctx_explicit: bool,
    pub n_batch: usize,
    pub kv_type: KvType,
}

pub fn open_gguf(path: &Path) -> Result<Arc<Gguf>> {
    if !path.exists() {
        bail!("model file not found: {}", path.display());
    }
    let g = Gguf::open(path).with_context(|| format!("cannot read {} as GGUF", path.display()))?;
    Ok(Arc::new(g))
}

/// True for what the HF loader reads: a directory, a `.safetensors` file or an index.
pub fn is_hf_path(path: &Path) -> bool {
    let s = path.to_string_lossy();
    path.is_dir() || s.ends_with(".safetensors") || s.ends_with(".safetensors.index.json")
}

/// Tokenizer and chat template of an HF directory: `tokenizer.json`, and
/// `tokenizer_config.json`'s `chat_template` (a string, or a list of named templates of
/// which "default" is used) or a `chat_template.jinja` file beside it.
fn hf_tokenizer(dir: &Path, want_template: bool) -> Result<(Tokenizer, Option<ChatTemplate>)> {
    let tj = std::fs::read_to_string(dir.join("tokenizer.json"))
        .with_context(|| format!("cannot read {}", dir.join("tokenizer.json").display()))?;
    let tc = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok();
    let tokenizer = Tokenizer::from_hf_json(&tj, tc.as_deref())
        .context("cannot build the tokenizer from tokenizer.json")?;
    if !want_template {
        return Ok((tokenizer, None));
    }
    let cfg: Option<serde_json::Value> = tc.as_deref().and_then(|t| serde_json::from_str(t).ok());
    let from_cfg = cfg.as_ref().and_then(|c| match c.get("chat_template")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
        _ => None,
    });
    let src = from_cfg.or_else(|| std::fs::read_to_string(dir.join("chat_template.jinja")).ok());
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(&tokenizer.token_to_piece(i, true)).into_owned())
            .unwrap_or_default()
    };
    let template = match src {
        Some(src) => Some(
            ChatTemplate::new(&src, &piece(tokenizer.bos()), &piece(tokenizer.eos()))
                .context("the model's chat template does not compile")?,
        ),
        None => None,
    };
    Ok((tokenizer, template))
}

impl Loaded<CpuBackend> {
    pub fn open_cpu(args: &ModelArgs, want_template: bool) -> Result<Self> {
        let be = CpuBackend::new(&CpuOptions {
            threads: args
                .threads
                .unwrap_or_else(neagari_backend::cpu::default_threads),
            scalar_only: false,
        });
        Self::open_on(be, args, want_template)
    }
}

impl<B: Backend> Loaded<B> {
    pub fn open_on(be: B, args: &ModelArgs, want_template: bool) -> Result<Self> {
        if is_hf_path(&args.model) {
            return Self::open_hf_on(be, args, want_template);
        }
        let file = open_gguf(&args.model)?;
        let file_bytes = std::fs::metadata(&args.model).map(|m| m.len()).unwrap_or(0);
        weights_fit(&be, &args.model, file_bytes)?;
        // The matrices' formats (vectors load as f32), so a GPU backend compiles their
        // kernels together rather than one as each format first appears.
        let mut types: Vec<_> = file
            .tensors()
            .iter()
            .filter(|t| t.dims.len() >= 2)
            .map(|t| t.ty)
            .collect();
        types.sort_by_key(|t| *t as u32);
        types.dedup();
        be.prepare_formats(&types)
            .context("cannot build the GPU kernels for the file's weight formats")?;
        let src = GgufSource::new(file.clone());
        let model = neagari_model::load(&be, &src)
            .with_context(|| format!("cannot load {}", args.model.display()))?;
        let tokenizer = tokenizer_from_gguf(&file)
            .context("cannot build the tokenizer from the file's metadata")?;
        let (template, template_builtin) = if want_template {
            chat_template(&file, &tokenizer)?
        } else {
            (None, false)
        };
        let n_ctx_train = model.info().n_ctx_train;
        let n_ctx = match args.ctx_size {
            Some(0) | None => n_ctx_train.min(4096),
            Some(n) => n,
        };
        let mut l = Loaded {
            file_bytes,
            be,
            model,
            tokenizer,
            template,
            template_builtin,
            n_ctx,
            ctx_explicit: args.ctx_size.is_some_and(|n| n > 0),
            n_batch: args.batch_size.max(1),
            kv_type: args.kv_type,
        };
        l.plan_memory(1)?;
        Ok(l)
    }

    /// An HF checkpoint or MLX pack directory (see `neagari_model::hf`).
    fn open_hf_on(be: B, args: &ModelArgs, want_template: bool) -> Result<Self> {
        if !args.model.exists() {
            bail!("model not found: {}", args.model.display());
        }
        let src = HfSource::open(&args.model)
            .with_context(|| format!("cannot open {} as an HF/MLX model", args.model.display()))?;
        let dir = src.dir().to_path_buf();
        let file_bytes = std::fs::read_dir(&dir)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        weights_fit(&be, &args.model, file_bytes)?;
        let model = neagari_model::load(&be, &src)
            .with_context(|| format!("cannot load {}", args.model.display()))?;
        let (tokenizer, template) = hf_tokenizer(&dir, want_template)?;
        let n_ctx_train = model.info().n_ctx_train;
        let n_ctx = match args.ctx_size {
            Some(0) | None => n_ctx_train.min(4096),
            Some(n) => n,
        };
        let mut l = Loaded {
            file_bytes,
            be,
            model,
            tokenizer,
            template,
            template_builtin: false,
            n_ctx,
            ctx_explicit: args.ctx_size.is_some_and(|n| n > 0),
            n_batch: args.batch_size.max(1),
            kv_type: args.kv_type,
        };
        l.plan_memory(1)?;
        Ok(l)
    }

    /// Fits `sessions` KV caches of `n_ctx` positions into the device's free memory (after
    /// the weights, less a reserve for the step's buffers): a default context shrinks to
    /// what fits (with a note), an explicit one that does not fit is an error naming what
    /// would. Nothing to plan on host memory.
    pub fn plan_memory(&mut self, sessions: usize) -> Result<()> {
        let Some((free, _)) = self.be.device_memory() else {
            return Ok(());
        };
        let info = self.model.info();
        let reserve = PLAN_RESERVE
            + (self.n_batch as u64) * (info.n_vocab as u64 + 16 * info.n_embd as u64) * 4;
        let avail = free.saturating_sub(reserve);
        // (bytes a position, bytes besides) of one cache of type ty.
        let cost = |ty: KvType| {
            let fixed = info.kv_bytes(0, ty);
            (info.kv_bytes(1, ty) - fixed, fixed)
        };
        let (per_pos, fixed) = cost(self.kv_type);
        let n = match fit_context(
            self.n_ctx,
            self.ctx_explicit,
            sessions,
            per_pos,
            fixed,
            avail,
        ) {
            Ok(n) => n,
            Err(max) => {
                let need = info.kv_bytes(self.n_ctx, self.kv_type) * sessions.max(1) as u64;
                let q8 = if self.kv_type == KvType::F16 && info.head_dim.is_multiple_of(32) {
                    let (per_pos, fixed) = cost(KvType::Q8_0);
                    let q = max_positions(sessions, per_pos, fixed, avail);
                    format!(", or --kv-type q8_0 for up to {q}")
                } else {
                    String::new()
                };
                let each = if sessions > 1 {
                    format!(" ({sessions} sessions)")
                } else {
                    String::new()
                };
                bail!(
                    "a KV cache of {} tokens ({}){each} needs {}, but {} has {} free after \
                     the weights and {} kept for the step's buffers: at most {max} tokens fit \
                     (--ctx-size {max}{q8})",
                    self.n_ctx,
                    self.kv_type,
                    gib(need),
                    self.be.name(),
                    gib(free),
                    gib(reserve),
                );
            }
        };
        if n != self.n_ctx {
            eprintln!(
                "note: context {} → {n} tokens, what {} has free memory for ({} KV cache)",
                self.n_ctx,
                self.be.name(),
                self.kv_type
            );
            self.n_ctx = n;
        }
        Ok(())
    }

    pub fn session(&self, n_ctx: usize) -> Result<Session<B>> {
        Ok(Session::new(
            self.model.as_ref(),
            &self.be,
            n_ctx,
            self.kv_type,
        )?)
    }
}

/// Device memory kept free of KV caches for a step's buffers, besides a batch's logits and
/// activations (`Loaded::plan_memory`).
const PLAN_RESERVE: u64 = 1 << 30;

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// A clear error before a device upload that cannot fit: the file's bytes against the
/// device's free memory.
fn weights_fit<B: Backend>(be: &B, path: &Path, file_bytes: u64) -> Result<()> {
    match be.device_memory() {
        Some((free, total)) if file_bytes > free => bail!(
            "{} ({}) does not fit on {}: {} free of {}",
            path.display(),
            gib(file_bytes),
            be.name(),
            gib(free),
            gib(total)
        ),
        _ => Ok(()),
    }
}

/// Positions each of `sessions` caches of `per_pos` bytes a position and `fixed` bytes
/// besides can hold in `avail` bytes.
fn max_positions(sessions: usize, per_pos: u64, fixed: u64, avail: u64) -> usize {
    let each = avail / sessions.max(1) as u64;
    match each.checked_sub(fixed) {
        None => 0,
        Some(_) if per_pos == 0 => usize::MAX,
        Some(room) => usize::try_from(room / per_pos).unwrap_or(usize::MAX),
    }
}

/// The context to allocate: `want` where it fits; a default (`!explicit`) shrunk to the
/// most that fits, rounded down to a multiple of 256; else `Err(most that fits)`.
fn fit_context(
    want: usize,
    explicit: bool,
    sessions: usize,
    per_pos: u64,
    fixed: u64,
    avail: u64,
) -> std::result::Result<usize, usize> {
    let max = max_positions(sessions, per_pos, fixed, avail);
    if want <= max {
        Ok(want)
    } else if explicit || max < 256 {
        Err(max)
    } else {
        Ok(max / 256 * 256)
    }
}

/// Peak resident memory of this process (VmHWM), 0 where unknown.
pub fn peak_rss_bytes() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_fits_shrinks_or_names_what_fits() {
        // 1 KiB a position, 10 KiB fixed, 1 MiB free: (1024 − 10) positions a session.
        let (pp, fx, av) = (1024, 10 * 1024, 1 << 20);
        assert_eq!(max_positions(1, pp, fx, av), 1014);
        assert_eq!(max_positions(2, pp, fx, av), 502);
        assert_eq!(fit_context(1000, true, 1, pp, fx, av), Ok(1000));
        assert_eq!(fit_context(1014, true, 1, pp, fx, av), Ok(1014));
        assert_eq!(fit_context(1015, true, 1, pp, fx, av), Err(1014));
        // A default context shrinks to a multiple of 256; an explicit one does not.
        assert_eq!(fit_context(4096, false, 1, pp, fx, av), Ok(768));
        assert_eq!(fit_context(4096, false, 2, pp, fx, av), Ok(256));
        assert_eq!(fit_context(4096, true, 2, pp, fx, av), Err(502));
        // Below 256 positions, or not even the fixed part: an error either way.
        assert_eq!(fit_context(4096, false, 5, pp, fx, av), Err(194));
        assert_eq!(fit_context(8, false, 1, pp, 2 << 20, av), Err(0));
        // Nothing per position (a recurrent-only model): any context.
        assert_eq!(fit_context(1 << 30, true, 1, 0, fx, av), Ok(1 << 30));
    }
}
