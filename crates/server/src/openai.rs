//! OpenAI's API: `POST /v1/chat/completions`, `POST /v1/completions`, `GET /v1/models`.
//! Translates requests into prompts and engine jobs, and engine events into OpenAI's JSON
//! and SSE chunks.
//!
//! Parameters left unset take the engine's sampling defaults (llama.cpp's: temperature 0.8,
//! top_k 40, top_p 0.95, min_p 0.05), not OpenAI's temperature 1. A `max_tokens` larger than
//! the room left in the context is cut to that room (finish_reason "length").

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use crate::error::{ApiError, OaiError};
use crate::gen::{self, Generation, Out};
use crate::grammar::{self, Constraint, OutputFormat};
use crate::prompt::{self, ChatRequest, ToolChoice};
use crate::tools::{ParserConfig, Piece, ToolParser};
use crate::worker::{Finish, GenParams, Ready, TokenLogprob, Usage};
use crate::{unix_now, Shared};

/// Parses a JSON body into `T`: malformed JSON and wrong types are 400s that say where.
pub fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|e| ApiError::new(e.status(), e.body_text()))?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    serde_json::from_value(v).map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Deserialize, Default)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// Sampling fields shared by both endpoints.
#[derive(Deserialize, Default)]
struct Sampling {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    seed: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    stop: Option<OneOrMany>,
    n: Option<u32>,
}

#[derive(Deserialize)]
struct ChatReq {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<Value>,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    sampling: Sampling,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    logprobs: bool,
    top_logprobs: Option<u32>,
    #[serde(default)]
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    /// `false`: at most one tool call.
    parallel_tool_calls: Option<bool>,
    response_format: Option<Value>,
    chat_template_kwargs: Option<Map<String, Value>>,
    reasoning_effort: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

#[derive(Deserialize)]
struct CompletionReq {
    #[serde(default)]
    model: Option<String>,
    prompt: PromptField,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(flatten)]
    sampling: Sampling,
    max_tokens: Option<u64>,
    logprobs: Option<u32>,
    response_format: Option<Value>,
    /// llama.cpp's and vLLM's extension: generate exactly max_tokens.
    #[serde(default)]
    ignore_eos: bool,
}

pub fn sampler_config(
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i32>,
    min_p: Option<f32>,
    seed: Option<i64>,
) -> neagari_engine::sampler::SamplerConfig {
    let d = neagari_engine::sampler::SamplerConfig::default();
    neagari_engine::sampler::SamplerConfig {
        temperature: temperature.unwrap_or(d.temperature),
        top_p: top_p.unwrap_or(d.top_p),
        top_k: top_k.unwrap_or(d.top_k),
        min_p: min_p.unwrap_or(d.min_p),
        seed: seed.map(|s| s as u64),
        ..d
    }
}

fn params_from(s: &Sampling, max_tokens: usize) -> Result<GenParams, ApiError> {
    if s.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad_request("only n = 1 is supported").with_param("n"));
    }
    if let Some(t) = s.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::bad_request("temperature must be between 0 and 2")
                .with_param("temperature"));
        }
    }
    let mut cfg = sampler_config(s.temperature, s.top_p, s.top_k, s.min_p, s.seed);
    cfg.presence_penalty = s.presence_penalty.unwrap_or(0.0);
    cfg.frequency_penalty = s.frequency_penalty.unwrap_or(0.0);
    cfg.repeat_penalty = s.repetition_penalty.unwrap_or(1.0);
    let stop = s
        .stop
        .as_ref()
        .map(|o| match o {
            OneOrMany::One(x) => vec![x.clone()],
            OneOrMany::Many(v) => v.clone(),
        })
        .unwrap_or_default();
    Ok(GenParams {
        sampler: cfg,
        max_tokens,
        stop,
        top_logprobs: None,
        constraint: None,
        ignore_eos: false,
        debug_panic: false,
        halt: None,
    })
}

/// `response_format` → what to enforce (None for text).
pub fn output_format(rf: Option<&Value>) -> Result<Option<OutputFormat>, ApiError> {
    let Some(rf) = rf else { return Ok(None) };
    let ty = rf.get("type").and_then(Value::as_str).unwrap_or("");
    match ty {
        "text" => Ok(None),
        "json_object" => Ok(Some(OutputFormat::JsonObject)),
        "json_schema" => {
            let js = rf.get("json_schema").ok_or_else(|| {
                ApiError::bad_request("response_format json_schema needs a json_schema object")
                    .with_param("response_format")
            })?;
            let schema = js.get("schema").cloned().unwrap_or(json!({}));
            Ok(Some(OutputFormat::JsonSchema(schema)))
        }
        other => Err(ApiError::bad_request(format!(
            "response_format type '{other}' is not supported (text, json_object, json_schema)"
        ))
        .with_param("response_format")),
    }
}

/// Compiles `format` with the model's vocabulary (built on first use).
pub fn constraint(ready: &Ready, format: &OutputFormat) -> Result<Box<dyn Constraint>, ApiError> {
    let f = tokio::task::block_in_place(|| {
        ready
            .guidance
            .get_or_init(|| grammar::factory(ready.tokenizer.clone()))
            .clone()
    })
    .map_err(|e| ApiError::internal(format!("structured output is unavailable: {e}")))?;
    let g = tokio::task::block_in_place(|| grammar::compile(&f, format)).map_err(|e| {
        ApiError::bad_request(format!("the schema cannot be enforced: {e}"))
            .with_param("response_format")
    })?;
    Ok(Box::new(g))
}

/// Room left for generation, and `requested` clamped to it.
pub fn clamp_max(requested: Option<u64>, prompt_len: usize, n_ctx: usize) -> usize {
    let room = n_ctx.saturating_sub(prompt_len);
    requested.map_or(room, |r| (r as usize).min(room))
}

const ROLES: [&str; 6] = [
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// Content as the template wants it: text, or parts with only text.
fn content_text(c: Option<&Value>, i: usize) -> Result<String, ApiError> {
    match c {
        None | Some(Value::Null) => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for p in parts {
                match p.get("type").and_then(Value::as_str) {
                    Some("text") | Some("input_text") => out.push(
                        p.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                ApiError::bad_request(format!(
                                    "messages[{i}]: a text part needs a string 'text'"
                                ))
                            })?
                            .to_string(),
                    ),
                    Some("image_url") | Some("input_image") | Some("input_audio") | Some("file") => {
                        return Err(ApiError::bad_request(format!(
                            "messages[{i}]: this server's model takes text only; image, audio and file parts are not supported"
                        ))
                        .with_param("messages"))
                    }
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "messages[{i}]: unknown content part type {other:?}"
                        )))
                    }
                }
            }
            Ok(out.join("\n"))
        }
        Some(_) => Err(ApiError::bad_request(format!(
            "messages[{i}].content must be a string, an array of parts or null"
        ))),
    }
}

fn chat_messages(msgs: &[Value]) -> Result<Vec<Value>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::bad_request("messages must not be empty").with_param("messages"));
    }
    let mut out = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        let o = m.as_object().ok_or_else(|| {
            ApiError::bad_request(format!("messages[{i}] must be an object")).with_param("messages")
        })?;
        let role = o.get("role").and_then(Value::as_str).ok_or_else(|| {
            ApiError::bad_request(format!("messages[{i}] needs a string role"))
                .with_param("messages")
        })?;
        if !ROLES.contains(&role) {
            return Err(ApiError::bad_request(format!(
                "messages[{i}]: unknown role '{role}' (system, developer, user, assistant, tool)"
            ))
            .with_param("messages"));
        }
        let role = match role {
            "developer" => "system",
            "function" => "tool",
            r => r,
        };
        let mut n = Map::new();
        n.insert("role".into(), role.into());
        n.insert("content".into(), content_text(o.get("content"), i)?.into());
        for k in ["tool_calls", "tool_call_id", "name", "reasoning_content"] {
            if let Some(v) = o.get(k).filter(|v| !v.is_null()) {
                n.insert(k.into(), v.clone());
            }
        }
        out.push(Value::Object(n));
    }
    Ok(out)
}

fn tool_choice(v: Option<&Value>) -> Result<ToolChoice, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(ToolChoice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            o => Err(ApiError::bad_request(format!("unknown tool_choice '{o}'"))
                .with_param("tool_choice")),
        },
        Some(o) => o
            .get("function")
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Named(n.to_string()))
            .ok_or_else(|| {
                ApiError::bad_request("tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ...}}")
                    .with_param("tool_choice")
            }),
    }
}

fn validate_tools(tools: &[Value]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        let ok = t
            .get("function")
            .and_then(|f| f.get("name"))
            .is_some_and(Value::is_string);
        if !ok {
            return Err(ApiError::bad_request(format!(
                "tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ..., \"parameters\": ...}}}}"
            ))
            .with_param("tools"));
        }
    }
    Ok(())
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

fn logprob_json(l: &TokenLogprob) -> Value {
    json!({
        "token": l.token,
        "logprob": l.logprob,
        "bytes": l.bytes,
        "top_logprobs": l.top.iter().map(|(t, b, p)| json!({"token": t, "logprob": p, "bytes": b})).collect::<Vec<_>>(),
    })
}

fn finish_reason(f: Finish, calls: usize) -> &'static str {
    match f {
        Finish::Length => "length",
        _ if calls > 0 => "tool_calls",
        _ => "stop",
    }
}

fn debug_panic(st: &Shared, text: &str) -> bool {
    st.test_hooks && text.contains("__neagari_test_panic__")
}

pub async fn chat(State(st): State<Shared>, body: Result<Bytes, BytesRejection>) -> Response {
    match chat_inner(st, body).await {
        Ok(r) => r,
        Err(e) => OaiError(e).into_response(),
    }
}

async fn chat_inner(st: Shared, body: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let req: ChatReq = parse_body(body)?;
    let ready = st.ready()?;
    let messages = chat_messages(&req.messages)?;
    let tools = req.tools.clone().unwrap_or_default();
    validate_tools(&tools)?;
    let mut kwargs = req.chat_template_kwargs.clone().unwrap_or_default();
    if req.reasoning_effort.as_deref() == Some("none") {
        kwargs.insert("enable_thinking".into(), false.into());
    }
    let chat = ChatRequest {
        messages,
        tools,
        tool_choice: tool_choice(req.tool_choice.as_ref())?,
        kwargs,
    };
    let prep = prompt::prepare(ready, &chat, true)?;
    let max = clamp_max(
        req.max_completion_tokens.or(req.max_tokens),
        prep.prompt.len(),
        ready.n_ctx,
    );
    let mut params = params_from(&req.sampling, max)?;
    if req.logprobs {
        params.top_logprobs = Some(req.top_logprobs.unwrap_or(0).min(20) as usize);
    }
    let format = match prep.forced.clone() {
        Some(f) => Some(f),
        None => output_format(req.response_format.as_ref())?,
    };
    let mut parser_cfg = prep.parser.clone();
    if let Some(f) = &format {
        params.constraint = Some(constraint(ready, f)?);
        if !matches!(f, OutputFormat::Lark(_)) {
            parser_cfg = ParserConfig::default();
        }
    }
    params.debug_panic = debug_panic(
        &st,
        &chat
            .messages
            .last()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    );
    let model = ready.model_name.clone();
    let _ = req.model;
    let max_calls = (req.parallel_tool_calls == Some(false)).then_some(1);
    let g = gen::submit(
        &st,
        prep.prompt,
        params,
        ToolParser::new(parser_cfg),
        max_calls,
    )?;
    let id = format!("chatcmpl-{}", st.next_id());
    if req.stream {
        let usage = req.stream_options.is_some_and(|o| o.include_usage);
        Ok(stream_chat(g, id, model, usage, st.clone()))
    } else {
        collect_chat(g, id, model, st.clone()).await
    }
}

struct Collected {
    text: String,
    reasoning: String,
    calls: Vec<(String, String, String)>,
    logprobs: Vec<Value>,
    finish: Finish,
    usage: Usage,
}

async fn collect(mut g: Generation, st: &Shared) -> Result<Collected, ApiError> {
    let mut c = Collected {
        text: String::new(),
        reasoning: String::new(),
        calls: Vec::new(),
        logprobs: Vec::new(),
        finish: Finish::Eog,
        usage: Usage::default(),
    };
    while let Some(outs) = g.next().await {
        for o in outs {
            match o {
                Out::Started { .. } => {}
                Out::Piece(Piece::Text(t)) => c.text += &t,
                Out::Piece(Piece::Reasoning(t)) => c.reasoning += &t,
                Out::Piece(Piece::CallStart { name, .. }) => {
                    c.calls
                        .push((format!("call_{}", st.next_id()), name, String::new()))
                }
                Out::Piece(Piece::CallArgs { delta, .. }) => {
                    if let Some(l) = c.calls.last_mut() {
                        l.2 += &delta;
                    }
                }
                Out::Piece(Piece::CallEnd { .. }) => {}
                Out::Logprobs(l) => c.logprobs.extend(l.iter().map(logprob_json)),
                Out::Done { finish, usage } => {
                    c.finish = finish;
                    c.usage = usage;
                }
                Out::Failed(m) => return Err(ApiError::internal(m)),
            }
        }
    }
    Ok(c)
}

async fn collect_chat(
    g: Generation,
    id: String,
    model: String,
    st: Shared,
) -> Result<Response, ApiError> {
    let c = collect(g, &st).await?;
    let mut msg = json!({
        "role": "assistant",
        "content": if c.text.is_empty() && !c.calls.is_empty() { Value::Null } else { Value::String(c.text) },
    });
    if !c.reasoning.is_empty() {
        msg["reasoning_content"] = c.reasoning.into();
    }
    if !c.calls.is_empty() {
        msg["tool_calls"] = c
            .calls
            .iter()
            .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
            .collect();
    }
    let logprobs = if c.logprobs.is_empty() {
        Value::Null
    } else {
        json!({"content": c.logprobs})
    };
    Ok(Json(json!({
        "id": id,
        "object": "chat.completion",
        "created": unix_now(),
        "model": model,
        "choices": [{"index": 0, "message": msg, "logprobs": logprobs, "finish_reason": finish_reason(c.finish, c.calls.len())}],
        "usage": usage_json(&c.usage),
    }))
    .into_response())
}

fn sse_data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn stream_chat(
    g: Generation,
    id: String,
    model: String,
    include_usage: bool,
    st: Shared,
) -> Response {
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let created = unix_now();
    let chunk = move |delta: Value, finish: Value, logprobs: Value| {
        let mut c = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}],
        });
        if include_usage {
            c["usage"] = Value::Null;
        }
        c
    };
    let mut call_ids: Vec<String> = Vec::new();
    let make = move |outs: Vec<Out>, calls: usize| {
        let mut ev = Vec::new();
        let mut end = false;
        for o in outs {
            let c = match o {
                Out::Started { .. } => Some(chunk(
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    Value::Null,
                )),
                Out::Piece(Piece::Text(t)) => {
                    Some(chunk(json!({"content": t}), Value::Null, Value::Null))
                }
                Out::Piece(Piece::Reasoning(t)) => Some(chunk(
                    json!({"reasoning_content": t}),
                    Value::Null,
                    Value::Null,
                )),
                Out::Piece(Piece::CallStart { index, name }) => {
                    let cid = format!("call_{}", st.next_id());
                    call_ids.push(cid.clone());
                    Some(chunk(
                        json!({"tool_calls": [{"index": index, "id": cid, "type": "function", "function": {"name": name, "arguments": ""}}]}),
                        Value::Null,
                        Value::Null,
                    ))
                }
                Out::Piece(Piece::CallArgs { index, delta }) => Some(chunk(
                    json!({"tool_calls": [{"index": index, "function": {"arguments": delta}}]}),
                    Value::Null,
                    Value::Null,
                )),
                Out::Piece(Piece::CallEnd { .. }) => None,
                Out::Logprobs(l) => Some(chunk(
                    json!({}),
                    Value::Null,
                    json!({"content": l.iter().map(logprob_json).collect::<Vec<_>>()}),
                )),
                Out::Done { finish, usage } => {
                    ev.push(sse_data(&chunk(
                        json!({}),
                        finish_reason(finish, calls).into(),
                        Value::Null,
                    )));
                    if include_usage {
                        let mut u = chunk(json!({}), Value::Null, Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = usage_json(&usage);
                        ev.push(sse_data(&u));
                    }
                    ev.push(Bytes::from_static(b"data: [DONE]\n\n"));
                    end = true;
                    None
                }
                Out::Failed(m) => {
                    let e = ApiError::internal(m).body(crate::error::Flavor::OpenAi);
                    ev.push(sse_data(&e));
                    end = true;
                    None
                }
            };
            if let Some(c) = c {
                ev.push(sse_data(&c));
            }
        }
        (ev, end)
    };
    tokio::spawn(gen::pump(
        g,
        tx,
        Bytes::from_static(b": keep-alive\n\n"),
        make,
    ));
    gen::sse_response(rx)
}

pub async fn completions(
    State(st): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    match completions_inner(st, body).await {
        Ok(r) => r,
        Err(e) => OaiError(e).into_response(),
    }
}

async fn completions_inner(
    st: Shared,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: CompletionReq = parse_body(body)?;
    let ready = st.ready()?;
    let tok = &ready.tokenizer;
    let one = |n: usize| {
        if n == 1 {
            Ok(())
        } else {
            Err(ApiError::bad_request("exactly one prompt is supported").with_param("prompt"))
        }
    };
    let (prompt, text_for_hook) = match req.prompt {
        PromptField::Text(s) => (tok.encode(&s, true, false), s),
        PromptField::Texts(v) => {
            one(v.len())?;
            (tok.encode(&v[0], true, false), v[0].clone())
        }
        PromptField::Ids(ids) => (ids, String::new()),
        PromptField::IdLists(v) => {
            one(v.len())?;
            (v.into_iter().next().unwrap_or_default(), String::new())
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::bad_request("the prompt is empty").with_param("prompt"));
    }
    if let Some(bad) = prompt.iter().find(|&&t| t as usize >= tok.n_vocab()) {
        return Err(
            ApiError::bad_request(format!("token id {bad} is outside the vocabulary"))
                .with_param("prompt"),
        );
    }
    prompt::check_fits(prompt.len(), ready.n_ctx).map_err(|e| e.with_param("prompt"))?;
    let max = clamp_max(req.max_tokens.or(Some(16)), prompt.len(), ready.n_ctx);
    let mut params = params_from(&req.sampling, max)?;
    params.top_logprobs = req.logprobs.map(|n| n.min(20) as usize);
    params.ignore_eos = req.ignore_eos;
    if let Some(f) = output_format(req.response_format.as_ref())? {
        params.constraint = Some(constraint(ready, &f)?);
    }
    params.debug_panic = debug_panic(&st, &text_for_hook);
    let model = ready.model_name.clone();
    let _ = req.model;
    let g = gen::submit(
        &st,
        prompt,
        params,
        ToolParser::new(ParserConfig::default()),
        None,
    )?;
    let id = format!("cmpl-{}", st.next_id());
    let created = unix_now();
    let legacy_lp = |l: &[TokenLogprob]| {
        json!({
            "tokens": l.iter().map(|x| &x.token).collect::<Vec<_>>(),
            "token_logprobs": l.iter().map(|x| x.logprob).collect::<Vec<_>>(),
            "top_logprobs": l.iter().map(|x| x.top.iter().map(|(t, _, p)| (t.clone(), json!(p))).collect::<Map<String, Value>>()).collect::<Vec<_>>(),
        })
    };
    if !req.stream {
        let c = collect(g, &st).await?;
        let lp: Vec<TokenLogprob> = Vec::new();
        let logprobs = if req.logprobs.is_some() {
            // Collected logprobs are in chat form; rebuild the legacy shape from them.
            let toks: Vec<Value> = c.logprobs.clone();
            json!({
                "tokens": toks.iter().map(|t| t["token"].clone()).collect::<Vec<_>>(),
                "token_logprobs": toks.iter().map(|t| t["logprob"].clone()).collect::<Vec<_>>(),
                "top_logprobs": toks.iter().map(|t| t["top_logprobs"].as_array().map(|a| a.iter().map(|x| (x["token"].as_str().unwrap_or("").to_string(), x["logprob"].clone())).collect::<Map<String, Value>>()).unwrap_or_default()).collect::<Vec<_>>(),
            })
        } else {
            let _ = legacy_lp(&lp);
            Value::Null
        };
        return Ok(Json(json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": c.text, "logprobs": logprobs, "finish_reason": finish_reason(c.finish, 0)}],
            "usage": usage_json(&c.usage),
        }))
        .into_response());
    }
    let include_usage = req.stream_options.is_some_and(|o| o.include_usage);
    let (tx, rx) = mpsc::channel::<Bytes>(64);
    let chunk = move |text: String, finish: Value, lp: Value| {
        let mut c = json!({
            "id": id, "object": "text_completion", "created": created, "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": lp, "finish_reason": finish}],
        });
        if include_usage {
            c["usage"] = Value::Null;
        }
        c
    };
    let make = move |outs: Vec<Out>, _calls: usize| {
        let mut ev = Vec::new();
        let mut end = false;
        for o in outs {
            match o {
                Out::Piece(Piece::Text(t)) => {
                    ev.push(sse_data(&chunk(t, Value::Null, Value::Null)))
                }
                Out::Logprobs(l) => {
                    ev.push(sse_data(&chunk(String::new(), Value::Null, legacy_lp(&l))))
                }
                Out::Done { finish, usage } => {
                    ev.push(sse_data(&chunk(
                        String::new(),
                        finish_reason(finish, 0).into(),
                        Value::Null,
                    )));
                    if include_usage {
                        let mut u = chunk(String::new(), Value::Null, Value::Null);
                        u["choices"] = json!([]);
                        u["usage"] = usage_json(&usage);
                        ev.push(sse_data(&u));
                    }
                    ev.push(Bytes::from_static(b"data: [DONE]\n\n"));
                    end = true;
                }
                Out::Failed(m) => {
                    ev.push(sse_data(
                        &ApiError::internal(m).body(crate::error::Flavor::OpenAi),
                    ));
                    end = true;
                }
                _ => {}
            }
        }
        (ev, end)
    };
    tokio::spawn(gen::pump(
        g,
        tx,
        Bytes::from_static(b": keep-alive\n\n"),
        make,
    ));
    Ok(gen::sse_response(rx))
}

pub async fn models(State(st): State<Shared>) -> Response {
    match st.ready() {
        Ok(r) => Json(json!({
            "object": "list",
            "data": [{"id": r.model_name, "object": "model", "created": unix_now(), "owned_by": "neagari", "context_length": r.n_ctx}],
        }))
        .into_response(),
        Err(e) => OaiError(e).into_response(),
    }
}
