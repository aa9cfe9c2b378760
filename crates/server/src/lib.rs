//! The HTTP server: OpenAI- and Anthropic-compatible endpoints in front of one engine worker.
//!
//! - `worker`: the thread that owns the model and its KV cache, and the request queue.
//! - `openai`, `anthropic`: thin translators between each API and the engine.
//! - `prompt`: messages and tools to prompt tokens; `tools`: model output to tool calls;
//!   `grammar`: structured output through llguidance; `stop`: stop strings.
//! - here: the router, authentication, body limit, panic isolation, health and metrics.

pub mod anthropic;
pub mod error;
pub mod gen;
pub mod grammar;
pub mod metrics;
pub mod openai;
pub mod prompt;
pub mod stop;
pub mod tools;
pub mod worker;

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::FutureExt;
use neagari_backend::Backend;
use serde_json::json;

use crate::error::{ApiError, Flavor};
use crate::metrics::Metrics;
use crate::worker::{Loader, Queue, Ready};

/// Request bodies larger than this are refused (Claude Code's requests are ~100 KB).
pub const BODY_LIMIT: usize = 32 << 20;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    /// Required on /v1 as `Authorization: Bearer KEY` or `x-api-key: KEY` when set.
    pub api_key: Option<String>,
    /// Requests waiting or running at most; more get 429 with Retry-After.
    pub max_queue: usize,
    /// Enables test-only behaviour (a request can ask the engine to panic).
    pub test_hooks: bool,
}

pub struct AppState {
    pub ready: Arc<OnceLock<Ready>>,
    pub load_error: Arc<OnceLock<String>>,
    pub queue: Queue,
    pub metrics: Arc<Metrics>,
    pub api_key: Option<String>,
    pub test_hooks: bool,
    /// For unique response ids.
    pub counter: AtomicU64,
}

pub type Shared = Arc<AppState>;

impl AppState {
    pub fn ready(&self) -> Result<&Ready, ApiError> {
        if let Some(r) = self.ready.get() {
            return Ok(r);
        }
        if let Some(e) = self.load_error.get() {
            return Err(ApiError::internal(format!("the model failed to load: {e}")));
        }
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "the model is still loading",
        );
        e.retry_after = Some(2);
        Err(e)
    }

    /// A fresh id suffix: time and a counter, unique within this process.
    pub fn next_id(&self) -> String {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        format!("{t:x}{n:06x}")
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn flavor_of(path: &str) -> Flavor {
    if path.starts_with("/v1/messages") {
        Flavor::Anthropic
    } else {
        Flavor::OpenAi
    }
}

/// API key check on /v1, a 500 for a handler that panics, and per-status counters.
async fn guard(State(st): State<Shared>, req: Request, next: Next) -> Response {
    let path = req.uri().path().to_string();
    let flavor = flavor_of(&path);
    if let (Some(key), true) = (&st.api_key, path.starts_with("/v1")) {
        let h = req.headers();
        let bearer = h
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let xkey = h.get("x-api-key").and_then(|v| v.to_str().ok());
        if bearer != Some(key.as_str()) && xkey != Some(key.as_str()) {
            st.metrics.record_status(401);
            return ApiError::new(
                StatusCode::UNAUTHORIZED,
                "invalid or missing API key (send Authorization: Bearer KEY or x-api-key: KEY)",
            )
            .into_response_as(flavor);
        }
    }
    let r = match AssertUnwindSafe(next.run(req)).catch_unwind().await {
        Ok(r) => r,
        Err(_) => {
            ApiError::internal("internal error while handling the request").into_response_as(flavor)
        }
    };
    st.metrics.record_status(r.status().as_u16());
    r
}

async fn health(State(st): State<Shared>) -> Response {
    match st.ready() {
        Ok(r) => Json(json!({"status": "ok", "device": r.device})).into_response(),
        Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"status": "loading"})),
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            Json(json!({"status": "error", "error": e.message})),
        )
            .into_response(),
    }
}

async fn metrics(State(st): State<Shared>) -> Response {
    st.metrics
        .queue_depth
        .store(st.queue.depth(), Ordering::Relaxed);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(),
    )
        .into_response()
}

async fn not_found(req: Request) -> Response {
    let path = req.uri().path().to_string();
    eprintln!("neagari serve: 404 {} {path}", req.method());
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no route for {} {path}", req.method()),
    )
    .into_response_as(flavor_of(&path))
}

pub fn router(st: Shared) -> Router {
    Router::new()
        // Clients (Claude Code among them) probe the base URL with HEAD / first.
        .route("/", get(health))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(openai::models))
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/v1/messages", post(anthropic::messages))
        .route("/v1/messages/count_tokens", post(anthropic::count_tokens))
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(st.clone(), guard))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(st)
}

fn is_loopback(host: &str) -> bool {
    let h = host.trim_start_matches('[').trim_end_matches(']');
    h == "localhost"
        || h.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Starts the engine worker (which runs `loader`), binds, prints the base URLs and serves
/// until Ctrl-C.
pub fn serve<B: Backend>(cfg: ServeConfig, loader: Loader<B>) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let ready = Arc::new(OnceLock::new());
        let load_error = Arc::new(OnceLock::new());
        let metrics = Arc::new(Metrics::default());
        let queue = worker::spawn(
            loader,
            ready.clone(),
            load_error.clone(),
            metrics.clone(),
            cfg.max_queue,
        )?;
        let st = Arc::new(AppState {
            ready,
            load_error,
            queue,
            metrics,
            api_key: cfg.api_key.clone().filter(|k| !k.is_empty()),
            test_hooks: cfg.test_hooks,
            counter: AtomicU64::new(0),
        });
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .map_err(|e| anyhow::anyhow!("cannot listen on {addr}: {e}"))?;
        let local: SocketAddr = listener.local_addr()?;
        if !is_loopback(&cfg.host) && st.api_key.is_none() {
            eprintln!(
                "neagari serve: warning: listening on {} without an API key; anyone who can reach it can use it (set --api-key or NEAGARI_API_KEY)",
                cfg.host
            );
        }
        eprintln!("neagari serve: listening on http://{local}");
        eprintln!("  OpenAI:    OPENAI_BASE_URL=http://{local}/v1");
        eprintln!("  Anthropic: ANTHROPIC_BASE_URL=http://{local}");
        let st2 = st.clone();
        tokio::spawn(async move {
            // Report a load failure as soon as it happens; the server keeps answering 500s.
            loop {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                if let Some(r) = st2.ready.get() {
                    eprintln!("neagari serve: model loaded on {}, ready", r.device);
                    break;
                }
                if let Some(e) = st2.load_error.get() {
                    eprintln!("neagari serve: error: the model failed to load: {e}");
                    break;
                }
            }
        });
        axum::serve(listener, router(st))
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        Ok(())
    })
}
