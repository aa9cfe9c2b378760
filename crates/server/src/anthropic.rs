//! Anthropic's Messages API: `POST /v1/messages` (also with `?beta=true`, as Claude Code
//! sends it) and `POST /v1/messages/count_tokens`. Any model name is served by the loaded
//! model; unknown top-level fields (`metadata`, `context_management`, ...) are ignored.
//!
//! Streaming follows Anthropic's event sequence: `message_start`, then per content block
//! `content_block_start`, deltas (`text_delta`, `thinking_delta` + `signature_delta`,
//! `input_json_delta`), `content_block_stop`; then `message_delta` (stop_reason, usage) and
//! `message_stop`. A `ping` follows the first block's start, and more pings keep the
//! connection alive while a long prompt is prefilled.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::error::{AntError, ApiError, Flavor};
use crate::gen::{self, Out};
use crate::openai::{clamp_max, constraint, parse_body, sampler_config};
use crate::prompt::{self, ChatRequest, ToolChoice};
use crate::tools::{Piece, ToolParser};
use crate::worker::{Finish, GenParams, Usage};
use crate::Shared;

#[derive(Deserialize)]
struct MsgReq {
    #[serde(default)]
    model: String,
    messages: Vec<Value>,
    #[serde(default)]
    system: Option<Value>,
    max_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stop_sequences: Option<Vec<String>>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    thinking: Option<Value>,
}

/// Claude Code puts a per-request line (`x-anthropic-billing-header: ...`) at the top of its
/// system prompt; it changes every request and would defeat the prefix cache, and says
/// nothing to the model.
fn strip_billing_header(s: &str) -> String {
    if !s.contains("x-anthropic-billing-header") {
        return s.to_string();
    }
    s.lines()
        .filter(|l| !l.trim_start().starts_with("x-anthropic-billing-header"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn system_text(v: Option<&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(strip_billing_header(s))),
        Some(Value::Array(blocks)) => {
            let mut parts = Vec::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let t = b.get("text").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::bad_request("system: a text block needs a string 'text'")
                        })?;
                        let t = strip_billing_header(t);
                        if !t.trim().is_empty() {
                            parts.push(t);
                        }
                    }
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "system: unsupported block type {other:?}"
                        )))
                    }
                }
            }
            Ok(Some(parts.join("\n\n")))
        }
        Some(_) => Err(ApiError::bad_request(
            "system must be a string or an array of text blocks",
        )),
    }
}

fn block_text(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// Anthropic messages → OpenAI-style messages for the template.
fn to_chat_messages(system: Option<String>, msgs: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(s) = system {
        out.push(json!({"role": "system", "content": s}));
    }
    if msgs.is_empty() {
        return Err(ApiError::bad_request(
            "messages: at least one message is required",
        ));
    }
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_request(format!("messages.{i}: a string role is required"))
        })?;
        if role != "user" && role != "assistant" {
            return Err(ApiError::bad_request(format!(
                "messages.{i}: unexpected role \"{role}\"; roles are \"user\" and \"assistant\" (the system prompt goes in the top-level system field)"
            )));
        }
        let content = m.get("content");
        let blocks: Vec<Value> = match content {
            Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
            Some(Value::Array(a)) => a.clone(),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "messages.{i}.content must be a string or an array of content blocks"
                )))
            }
        };
        let mut text = Vec::new();
        let mut thinking = String::new();
        let mut calls = Vec::new();
        let mut results = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let ty = b.get("type").and_then(Value::as_str).unwrap_or("");
            match ty {
                "text" => text.push(b.get("text").and_then(Value::as_str).unwrap_or("").to_string()),
                "image" | "document" => {
                    return Err(ApiError::bad_request(format!(
                        "messages.{i}.content.{j}: {ty} input is not supported: the loaded model takes text only"
                    )))
                }
                "tool_use" if role == "assistant" => {
                    let input = b.get("input").cloned().unwrap_or(json!({}));
                    calls.push(json!({
                        "id": b.get("id").cloned().unwrap_or(Value::Null),
                        "type": "function",
                        "function": {"name": b.get("name").cloned().unwrap_or(Value::Null), "arguments": input.to_string()},
                    }));
                }
                "tool_result" if role == "user" => {
                    let mut t = block_text(b.get("content"));
                    if b.get("is_error").and_then(Value::as_bool) == Some(true) {
                        t = format!("Error: {t}");
                    }
                    results.push(json!({
                        "role": "tool",
                        "tool_call_id": b.get("tool_use_id").cloned().unwrap_or(Value::Null),
                        "content": t,
                    }));
                }
                "thinking" => thinking += b.get("thinking").and_then(Value::as_str).unwrap_or(""),
                "redacted_thinking" => {}
                other => {
                    return Err(ApiError::bad_request(format!(
                        "messages.{i}.content.{j}: unsupported block type \"{other}\" for role {role}"
                    )))
                }
            }
        }
        out.extend(results);
        if role == "assistant" {
            let mut a = json!({"role": "assistant", "content": text.join("\n")});
            if !calls.is_empty() {
                a["tool_calls"] = Value::Array(calls);
            }
            if !thinking.is_empty() {
                a["reasoning_content"] = thinking.into();
            }
            out.push(a);
        } else if !text.is_empty() {
            out.push(json!({"role": "user", "content": text.join("\n")}));
        }
    }
    Ok(out)
}

fn to_tools(tools: Option<&Vec<Value>>) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    for (i, t) in tools.into_iter().flatten().enumerate() {
        // Server tools (web search, ...) have a versioned type and no input_schema: the
        // model cannot run them here, so they are left out.
        if t.get("input_schema").is_none() && t.get("type").is_some_and(|x| x != "custom") {
            continue;
        }
        let name = t.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_request(format!("tools.{i}: a string name is required"))
        })?;
        out.push(json!({"type": "function", "function": {
            "name": name,
            "description": t.get("description").cloned().unwrap_or(Value::String(String::new())),
            "parameters": t.get("input_schema").cloned().unwrap_or(json!({"type": "object"})),
        }}));
    }
    Ok(out)
}

fn to_tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    let Some(v) = v else {
        return Ok(ToolChoice::Auto);
    };
    match v.get("type").and_then(Value::as_str) {
        Some("auto") | None => Ok(ToolChoice::Auto),
        Some("any") => Ok(ToolChoice::Required),
        Some("none") => Ok(ToolChoice::None),
        Some("tool") => v
            .get("name")
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Named(n.to_string()))
            .ok_or_else(|| ApiError::bad_request("tool_choice of type tool needs a name")),
        Some(o) => Err(ApiError::bad_request(format!(
            "unknown tool_choice type \"{o}\""
        ))),
    }
}

fn chat_request(req: &MsgReq) -> Result<ChatRequest, ApiError> {
    let messages = to_chat_messages(system_text(req.system.as_ref())?, &req.messages)?;
    let thinking_on = req
        .thinking
        .as_ref()
        .and_then(|t| t.get("type"))
        .and_then(Value::as_str)
        .is_some_and(|t| t == "enabled" || t == "adaptive");
    let mut kwargs = Map::new();
    kwargs.insert("enable_thinking".into(), thinking_on.into());
    Ok(ChatRequest {
        messages,
        tools: to_tools(req.tools.as_ref())?,
        tool_choice: to_tool_choice(req.tool_choice.as_ref())?,
        kwargs,
    })
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens - u.cached_tokens,
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
        "cache_creation_input_tokens": 0,
    })
}

fn stop_reason(f: Finish, calls: usize, stops: &[String]) -> (&'static str, Value) {
    match f {
        Finish::Length => ("max_tokens", Value::Null),
        Finish::Stop(i) => ("stop_sequence", stops.get(i).cloned().into()),
        Finish::Eog if calls > 0 => ("tool_use", Value::Null),
        Finish::Eog => ("end_turn", Value::Null),
    }
}

pub async fn count_tokens(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let r = (|| {
        let req: MsgReq = parse_body(body)?;
        let ready = st.ready()?;
        let chat = chat_request(&req)?;
        // Counting is not generating: a prompt longer than the context is still counted.
        let n = prompt::prepare(ready, &chat, false)?.prompt.len();
        Ok::<_, ApiError>(Json(json!({"input_tokens": n})).into_response())
    })();
    r.unwrap_or_else(|e| AntError(e).into_response())
}

pub async fn messages(State(st): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    match messages_inner(st, body).await {
        Ok(r) => r,
        Err(e) => AntError(e).into_response(),
    }
}

async fn messages_inner(
    st: Shared,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: MsgReq = parse_body(body)?;
    let ready = st.ready()?;
    let Some(max_tokens) = req.max_tokens else {
        return Err(ApiError::bad_request("max_tokens: field required"));
    };
    let chat = chat_request(&req)?;
    let prep = prompt::prepare(ready, &chat, true)?;
    let stops = req.stop_sequences.clone().unwrap_or_default();
    let mut params = GenParams {
        sampler: sampler_config(req.temperature, req.top_p, req.top_k, None, None),
        max_tokens: clamp_max(Some(max_tokens), prep.prompt.len(), ready.n_ctx),
        stop: stops.clone(),
        top_logprobs: None,
        constraint: None,
        ignore_eos: false,
        debug_panic: st.test_hooks
            && chat
                .messages
                .last()
                .is_some_and(|m| m.to_string().contains("__neagari_test_panic__")),
        halt: None,
    };
    if let Some(f) = &prep.forced {
        params.constraint = Some(constraint(ready, f)?);
    }
    let model = if req.model.is_empty() {
        ready.model_name.clone()
    } else {
        req.model.clone()
    };
    // tool_choice.disable_parallel_tool_use: at most one tool call.
    let one_call = req
        .tool_choice
        .as_ref()
        .and_then(|c| c.get("disable_parallel_tool_use"))
        .and_then(Value::as_bool)
        == Some(true);
    let g = gen::submit(
        &st,
        prep.prompt,
        params,
        ToolParser::new(prep.parser),
        one_call.then_some(1),
    )?;
    let id = format!("msg_{}", st.next_id());
    if !req.stream {
        return collect(g, id, model, stops, st).await;
    }
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let mut s = StreamState {
        id,
        model,
        stops,
        st,
        open: None,
        index: 0,
        pinged: false,
        thinking: String::new(),
    };
    let make = move |outs: Vec<Out>, calls: usize| s.events(outs, calls);
    tokio::spawn(gen::pump(
        g,
        tx,
        event("ping", &json!({"type": "ping"})),
        make,
    ));
    Ok(gen::sse_response(rx))
}

/// A thinking block's signature: clients must send it back with the block, and check only
/// that it is there. Made from the block's text (FNV-1a, 64 bits), so the same thinking
/// always carries the same signature, whichever response or stream it came in.
fn signature(thinking: &str) -> String {
    let h = thinking.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    format!("neagari-{h:016x}")
}

fn event(name: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {name}\ndata: {data}\n\n"))
}

#[derive(Clone, Copy, PartialEq)]
enum Block {
    Text,
    Thinking,
    Tool,
}

struct StreamState {
    id: String,
    model: String,
    stops: Vec<String>,
    st: Shared,
    open: Option<Block>,
    index: usize,
    pinged: bool,
    /// The open thinking block's text so far (its signature is made from it).
    thinking: String,
}

impl StreamState {
    fn close(&mut self, ev: &mut Vec<Bytes>) {
        if let Some(b) = self.open.take() {
            if b == Block::Thinking {
                let sig = signature(&std::mem::take(&mut self.thinking));
                ev.push(event("content_block_delta", &json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "signature_delta", "signature": sig}})));
            }
            ev.push(event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.index}),
            ));
            self.index += 1;
        }
    }

    fn open(&mut self, ev: &mut Vec<Bytes>, b: Block, block: Value) {
        self.close(ev);
        ev.push(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        ));
        if !self.pinged {
            self.pinged = true;
            ev.push(event("ping", &json!({"type": "ping"})));
        }
        self.open = Some(b);
    }

    fn events(&mut self, outs: Vec<Out>, calls: usize) -> (Vec<Bytes>, bool) {
        let mut ev = Vec::new();
        for o in outs {
            match o {
                Out::Started {
                    prompt_tokens,
                    cached_tokens,
                } => {
                    let usage = usage_json(&Usage {
                        prompt_tokens,
                        cached_tokens,
                        ..Default::default()
                    });
                    ev.push(event("message_start", &json!({"type": "message_start", "message": {
                        "id": self.id, "type": "message", "role": "assistant", "model": self.model,
                        "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage,
                    }})));
                }
                Out::Piece(Piece::Text(t)) => {
                    if self.open != Some(Block::Text) {
                        if t.trim().is_empty() {
                            continue; // no block for whitespace between calls
                        }
                        self.open(&mut ev, Block::Text, json!({"type": "text", "text": ""}));
                    }
                    ev.push(event("content_block_delta", &json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": t}})));
                }
                Out::Piece(Piece::Reasoning(t)) => {
                    if self.open != Some(Block::Thinking) {
                        self.open(
                            &mut ev,
                            Block::Thinking,
                            json!({"type": "thinking", "thinking": "", "signature": ""}),
                        );
                    }
                    self.thinking += &t;
                    ev.push(event("content_block_delta", &json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "thinking_delta", "thinking": t}})));
                }
                Out::Piece(Piece::CallStart { name, .. }) => {
                    let id = format!("toolu_{}", self.st.next_id());
                    self.open(
                        &mut ev,
                        Block::Tool,
                        json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    );
                }
                Out::Piece(Piece::CallArgs { delta, .. }) => {
                    ev.push(event("content_block_delta", &json!({"type": "content_block_delta", "index": self.index, "delta": {"type": "input_json_delta", "partial_json": delta}})));
                }
                Out::Piece(Piece::CallEnd { .. }) => self.close(&mut ev),
                Out::Logprobs(_) => {}
                Out::Done { finish, usage } => {
                    self.close(&mut ev);
                    let (reason, seq) = stop_reason(finish, calls, &self.stops);
                    ev.push(event("message_delta", &json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq}, "usage": usage_json(&usage)})));
                    ev.push(event("message_stop", &json!({"type": "message_stop"})));
                    return (ev, true);
                }
                Out::Failed(m) => {
                    ev.push(event(
                        "error",
                        &ApiError::internal(m).body(Flavor::Anthropic),
                    ));
                    return (ev, true);
                }
            }
        }
        (ev, false)
    }
}

async fn collect(
    mut g: gen::Generation,
    id: String,
    model: String,
    stops: Vec<String>,
    st: Shared,
) -> Result<Response, ApiError> {
    let mut content: Vec<Value> = Vec::new();
    let mut args = String::new();
    let mut done = None;
    while let Some(outs) = g.next().await {
        for o in outs {
            match o {
                Out::Piece(Piece::Text(t)) => match content.last_mut() {
                    Some(b) if b["type"] == "text" => {
                        let s = b["text"].as_str().unwrap_or("").to_string() + &t;
                        b["text"] = s.into();
                    }
                    _ if t.trim().is_empty() => {}
                    _ => content.push(json!({"type": "text", "text": t})),
                },
                Out::Piece(Piece::Reasoning(t)) => match content.last_mut() {
                    Some(b) if b["type"] == "thinking" => {
                        let s = b["thinking"].as_str().unwrap_or("").to_string() + &t;
                        b["thinking"] = s.into();
                    }
                    _ => content.push(json!({"type": "thinking", "thinking": t})),
                },
                Out::Piece(Piece::CallStart { name, .. }) => {
                    args.clear();
                    content.push(json!({"type": "tool_use", "id": format!("toolu_{}", st.next_id()), "name": name, "input": {}}));
                }
                Out::Piece(Piece::CallArgs { delta, .. }) => args += &delta,
                Out::Piece(Piece::CallEnd { .. }) => {
                    if let Some(b) = content.last_mut() {
                        b["input"] = serde_json::from_str::<Value>(&args).unwrap_or(json!({}));
                    }
                }
                Out::Done { finish, usage } => done = Some((finish, usage)),
                Out::Failed(m) => return Err(ApiError::internal(m)),
                _ => {}
            }
        }
    }
    let (finish, usage) =
        done.ok_or_else(|| ApiError::internal("the generation ended without a result"))?;
    for b in content.iter_mut().filter(|b| b["type"] == "thinking") {
        b["signature"] = signature(b["thinking"].as_str().unwrap_or("")).into();
    }
    let calls = content.iter().filter(|b| b["type"] == "tool_use").count();
    let (reason, seq) = stop_reason(finish, calls, &stops);
    Ok(Json(json!({
        "id": id, "type": "message", "role": "assistant", "model": model,
        "content": content, "stop_reason": reason, "stop_sequence": seq,
        "usage": usage_json(&usage),
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn billing_header_line_is_dropped() {
        let s = "x-anthropic-billing-header: cc_version=2.0.1; cc_entrypoint=cli;\nYou are Claude Code.";
        assert_eq!(strip_billing_header(s), "You are Claude Code.");
        let v = json!([{"type": "text", "text": "x-anthropic-billing-header: cc_version=1"}, {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}]);
        assert_eq!(system_text(Some(&v)).unwrap().as_deref(), Some("Hi"));
    }

    #[test]
    fn tool_use_and_results_map_to_chat_messages() {
        let msgs = vec![
            json!({"role": "user", "content": "weather?"}),
            json!({"role": "assistant", "content": [{"type": "text", "text": "checking"}, {"type": "tool_use", "id": "t1", "name": "w", "input": {"c": "P"}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "sunny"}]}, {"type": "text", "text": "thanks"}]}),
        ];
        let out = to_chat_messages(Some("sys".into()), &msgs).unwrap();
        assert_eq!(out[0]["role"], "system");
        assert_eq!(
            out[2]["tool_calls"][0]["function"]["arguments"],
            "{\"c\":\"P\"}"
        );
        assert_eq!(
            out[3],
            json!({"role": "tool", "tool_call_id": "t1", "content": "sunny"})
        );
        assert_eq!(out[4], json!({"role": "user", "content": "thanks"}));
        let img = vec![json!({"role": "user", "content": [{"type": "image", "source": {}}]})];
        assert!(to_chat_messages(None, &img)
            .unwrap_err()
            .message
            .contains("image"));
        let bad = vec![json!({"role": "system", "content": "x"})];
        assert!(to_chat_messages(None, &bad).is_err());
    }

    #[test]
    fn thinking_signature_is_set_and_follows_the_text() {
        let a = signature("Let me think about the sea.");
        assert!(a.starts_with("neagari-") && a.len() > "neagari-".len());
        assert_eq!(a, signature("Let me think about the sea."));
        assert_ne!(a, signature("Let me think about the sky."));
        assert_ne!(signature(""), "");
    }
}
