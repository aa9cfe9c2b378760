//! One request's generation as the API translators see it: submit the job, then read its
//! events with the text already split into text, reasoning and tool-call pieces.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{header, StatusCode};
use axum::response::Response;
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::tools::{Piece, ToolParser};
use crate::worker::{Event, Finish, GenParams, Job, SubmitError, TokenLogprob, Usage};
use crate::AppState;

pub enum Out {
    Started {
        prompt_tokens: usize,
        cached_tokens: usize,
    },
    Piece(Piece),
    Logprobs(Vec<TokenLogprob>),
    Done {
        finish: Finish,
        usage: Usage,
    },
    Failed(String),
}

pub struct Generation {
    rx: mpsc::UnboundedReceiver<Event>,
    parser: ToolParser,
    ended: bool,
}

pub fn submit(
    st: &AppState,
    prompt: Vec<u32>,
    params: GenParams,
    parser: ToolParser,
) -> Result<Generation, ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    st.queue
        .submit(Job {
            prompt,
            params,
            events: tx,
        })
        .map_err(|e| match e {
            SubmitError::Busy(..) => {
                let mut a = ApiError::new(StatusCode::TOO_MANY_REQUESTS, e.to_string());
                a.retry_after = Some(1);
                a
            }
            SubmitError::Gone => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()),
        })?;
    Ok(Generation {
        rx,
        parser,
        ended: false,
    })
}

impl Generation {
    /// The next batch of outputs; `None` once the job has ended. Cancel-safe: the only await
    /// is the channel receive.
    pub async fn next(&mut self) -> Option<Vec<Out>> {
        if self.ended {
            return None;
        }
        let ev = self.rx.recv().await;
        let mut out = Vec::new();
        match ev {
            None => {
                self.ended = true;
                out.push(Out::Failed("the engine dropped the request".into()));
            }
            Some(Event::Started {
                prompt_tokens,
                cached_tokens,
            }) => out.push(Out::Started {
                prompt_tokens,
                cached_tokens,
            }),
            Some(Event::Text { text, logprobs }) => {
                if !logprobs.is_empty() {
                    out.push(Out::Logprobs(logprobs));
                }
                out.extend(self.parser.push(&text).into_iter().map(Out::Piece));
            }
            Some(Event::Done { finish, usage }) => {
                self.ended = true;
                out.extend(self.parser.finish().into_iter().map(Out::Piece));
                out.push(Out::Done { finish, usage });
            }
            Some(Event::Failed(m)) => {
                self.ended = true;
                out.push(Out::Failed(m));
            }
        }
        Some(out)
    }

    /// Tool calls the parser has seen.
    pub fn calls(&self) -> usize {
        self.parser.calls()
    }
}

/// How often a waiting stream sends a keep-alive; it also finds clients that went away.
pub const KEEPALIVE: Duration = Duration::from_millis(500);

/// An SSE response whose body is fed by `rx`; when the client disconnects the body (and
/// with it the receiver) is dropped, so the feeding task's next send fails.
pub fn sse_response(rx: mpsc::Receiver<Bytes>) -> Response {
    let mut rx = rx;
    let stream = futures_util::stream::poll_fn(move |cx| {
        rx.poll_recv(cx)
            .map(|o| o.map(Ok::<Bytes, std::convert::Infallible>))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .header("x-accel-buffering", "no")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// Feeds an SSE body from a generation: `make(outs)` turns outputs into events. Keep-alive
/// comments go out while the engine is busy (and find clients that left).
pub async fn pump(
    mut g: Generation,
    tx: mpsc::Sender<Bytes>,
    keepalive: Bytes,
    mut make: impl FnMut(Vec<Out>, usize) -> (Vec<Bytes>, bool),
) {
    loop {
        let next = tokio::time::timeout(KEEPALIVE, g.next()).await;
        let outs = match next {
            Err(_) => {
                if tx.send(keepalive.clone()).await.is_err() {
                    return;
                }
                continue;
            }
            Ok(None) => return,
            Ok(Some(o)) => o,
        };
        let (events, end) = make(outs, g.calls());
        for e in events {
            if tx.send(e).await.is_err() {
                return; // client gone: dropping `g` cancels the job
            }
        }
        if end {
            return;
        }
    }
}
