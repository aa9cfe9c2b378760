//! `neagari serve`: the OpenAI- and Anthropic-compatible HTTP server (crates/server). The
//! model loads on the engine thread while the server already answers /health ("loading").

use anyhow::Result;
use neagari_server::worker::EngineParts;
use neagari_server::ServeConfig;

use neagari_backend::Backend;

use crate::load::{open_gguf, Device, Loaded};

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: crate::ModelArgs,
    /// Address to bind; anything but loopback should come with --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8139)]
    pub port: u16,
    /// Require this key on /v1 (Authorization: Bearer KEY or x-api-key: KEY); default: the
    /// environment variable NEAGARI_API_KEY.
    #[arg(long = "api-key")]
    pub api_key: Option<String>,
    /// Requests waiting or running at most; beyond it clients get 429 with Retry-After.
    #[arg(long = "max-queue", default_value_t = 64)]
    pub max_queue: usize,
    /// KV caches kept, each of the full context: conversations (an agent's main thread and
    /// its side requests) each keep their prefix in one. Memory grows with each.
    #[arg(long = "slots", default_value_t = 2)]
    pub slots: usize,
}

pub fn run(a: &ServeArgs) -> Result<()> {
    match a.model.device {
        Device::Cpu => serve_on(a, |m| Loaded::open_cpu(m, true)),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => serve_on(a, move |m| {
            // Made on the engine thread, which runs every step.
            let be = neagari_backend::cuda::CudaBackend::new(n)
                .map_err(|e| anyhow::anyhow!("cannot use GPU {n}: {e}"))?;
            Loaded::open_on(be, m, true)
        }),
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => {
            anyhow::bail!("this build of neagari has no CUDA support (feature `cuda`)")
        }
    }
}

/// Serves with the model that `open` loads on the engine thread.
fn serve_on<B: Backend + 'static>(
    a: &ServeArgs,
    open: impl FnOnce(&crate::ModelArgs) -> Result<Loaded<B>> + Send + 'static,
) -> Result<()> {
    let margs = a.model.clone();
    let slots = a.slots;
    let cfg = ServeConfig {
        host: a.host.clone(),
        port: a.port,
        api_key: a
            .api_key
            .clone()
            .or_else(|| std::env::var("NEAGARI_API_KEY").ok()),
        max_queue: a.max_queue,
        test_hooks: std::env::var_os("NEAGARI_SERVE_TEST_HOOKS").is_some(),
    };
    let loader = Box::new(move || {
        let mut l = open(&margs)?;
        // Every slot keeps a cache of the full context.
        l.plan_memory(slots)?;
        let g = open_gguf(&margs.model)?;
        let template_source = g
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(str::to_string);
        let model_name = margs
            .model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| l.model.info().name.clone());
        Ok(EngineParts {
            be: l.be,
            model: l.model,
            tokenizer: l.tokenizer,
            template: l.template,
            template_source,
            n_ctx: l.n_ctx,
            n_batch: l.n_batch,
            kv_type: l.kv_type,
            slots,
            model_name,
        })
    });
    neagari_server::serve(cfg, loader)
}
