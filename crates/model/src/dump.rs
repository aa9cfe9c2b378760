//! Debug dump of named intermediate buffers, for comparing a forward pass with llama.cpp's
//! op by op (scripts/llama_dump_tensors.py). Off unless NEAGARI_DUMP=DIR is set; then each
//! forward call is one step and `put` writes DIR/<step>_<name>.f32 ([rows, cols] f32 LE).

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use neagari_backend::Backend;

static STEP: AtomicUsize = AtomicUsize::new(0);

/// One forward call's dump target; `None` when dumping is off.
pub(crate) struct Dump {
    dir: PathBuf,
    step: usize,
}

impl Dump {
    /// Starts the next step if NEAGARI_DUMP is set.
    pub(crate) fn start() -> Option<Dump> {
        let dir = PathBuf::from(std::env::var_os("NEAGARI_DUMP")?);
        std::fs::create_dir_all(&dir).ok()?;
        Some(Dump {
            dir,
            step: STEP.fetch_add(1, Ordering::Relaxed),
        })
    }

    /// Writes `buf` as `<name>-<il>` (or `<name>` for `il = None`). Errors are ignored: a
    /// debug dump must never change what the forward pass returns.
    pub(crate) fn put<B: Backend>(&self, be: &B, name: &str, il: Option<usize>, buf: &B::Buf) {
        let (rows, cols) = be.buf_shape(buf);
        let mut host = vec![0f32; rows * cols];
        if be.read(buf, 0, rows, &mut host).is_err() {
            return;
        }
        self.put_host(name, il, &host);
    }

    pub(crate) fn put_host(&self, name: &str, il: Option<usize>, host: &[f32]) {
        let name = match il {
            Some(il) => format!("{:03}_{name}-{il}.f32", self.step),
            None => format!("{:03}_{name}.f32", self.step),
        };
        let bytes: Vec<u8> = host.iter().flat_map(|v| v.to_le_bytes()).collect();
        if let Ok(mut f) = std::fs::File::create(self.dir.join(name)) {
            let _ = f.write_all(&bytes);
        }
    }
}
