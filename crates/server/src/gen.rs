//! One request's generation as the API translators see it: submit the job, then read its
//! events with the text already split into text, reasoning and tool-call pieces.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
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
    /// `Some(n)`: at most `n` tool calls; once the n-th ends, the rest of the output is
    /// dropped and the job is told to stop (`halt`).
    max_calls: Option<usize>,
    /// The n-th call has ended.
    capped: bool,
    halt: Arc<AtomicBool>,
}

/// `max_calls`: `Some(1)` when the request allows no parallel tool calls.
pub fn submit(
    st: &AppState,
    prompt: Vec<u32>,
    mut params: GenParams,
    parser: ToolParser,
    max_calls: Option<usize>,
) -> Result<Generation, ApiError> {
    let (tx, rx) = mpsc::unbounded_channel();
    let halt = Arc::new(AtomicBool::new(false));
    params.halt = Some(halt.clone());
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
        max_calls,
        capped: false,
        halt,
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
                if !logprobs.is_empty() && !self.capped {
                    out.push(Out::Logprobs(logprobs));
                }
                let pieces = self.parser.push(&text);
                self.keep(pieces, &mut out);
            }
            Some(Event::Done { finish, usage }) => {
                self.ended = true;
                let pieces = self.parser.finish();
                self.keep(pieces, &mut out);
                out.push(Out::Done { finish, usage });
            }
            Some(Event::Failed(m)) => {
                self.ended = true;
                out.push(Out::Failed(m));
            }
        }
        Some(out)
    }

    /// Moves `pieces` to `out` up to the end of the last tool call allowed; after it,
    /// nothing more is given out and the job is asked to stop.
    fn keep(&mut self, pieces: Vec<Piece>, out: &mut Vec<Out>) {
        for p in pieces {
            if self.capped {
                break;
            }
            let last = matches!(p, Piece::CallEnd { index } if Some(index + 1) == self.max_calls);
            out.push(Out::Piece(p));
            if last {
                self.capped = true;
                self.halt.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Tool calls given out.
    pub fn calls(&self) -> usize {
        match self.max_calls {
            Some(m) => self.parser.calls().min(m),
            None => self.parser.calls(),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::ParserConfig;

    /// A generation fed by hand: the worker's events for a reply with two tool calls.
    fn two_calls(max_calls: Option<usize>) -> (Vec<Out>, usize, bool) {
        let (tx, rx) = mpsc::unbounded_channel();
        let halt = Arc::new(AtomicBool::new(false));
        let mut g = Generation {
            rx,
            parser: ToolParser::new(ParserConfig {
                tools: true,
                tool_names: vec!["get_weather".into()],
                ..Default::default()
            }),
            ended: false,
            max_calls,
            capped: false,
            halt: halt.clone(),
        };
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>";
        for piece in text.split_inclusive('}') {
            let _ = tx.send(Event::Text {
                text: piece.to_string(),
                logprobs: Vec::new(),
            });
        }
        let _ = tx.send(Event::Done {
            finish: Finish::Eog,
            usage: Usage::default(),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime");
        let mut outs = Vec::new();
        rt.block_on(async {
            while let Some(o) = g.next().await {
                outs.extend(o);
            }
        });
        let calls = g.calls();
        (outs, calls, halt.load(Ordering::Relaxed))
    }

    fn starts(outs: &[Out]) -> Vec<String> {
        outs.iter()
            .filter_map(|o| match o {
                Out::Piece(Piece::CallStart { name, .. }) => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn parallel_calls_pass_unless_one_is_allowed() {
        let (outs, calls, halt) = two_calls(None);
        assert_eq!((starts(&outs).len(), calls, halt), (2, 2, false));
        let (outs, calls, halt) = two_calls(Some(1));
        assert_eq!((starts(&outs).len(), calls, halt), (1, 1, true));
        // The kept call is whole (its arguments and end), and the result still ends.
        let args: String = outs
            .iter()
            .filter_map(|o| match o {
                Out::Piece(Piece::CallArgs { delta, .. }) => Some(delta.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&args).ok(),
            Some(serde_json::json!({"city": "Paris"}))
        );
        assert!(outs
            .iter()
            .any(|o| matches!(o, Out::Piece(Piece::CallEnd { index: 0 }))));
        assert!(matches!(outs.last(), Some(Out::Done { .. })));
    }
}
