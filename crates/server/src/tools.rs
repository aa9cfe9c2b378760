//! Turns a model's streamed output text into text, reasoning and structured tool calls.
//!
//! Formats understood (whichever appears; none is assumed from the model family alone):
//! - Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; the arguments
//!   stream out as they form once the name is known.
//! - Qwen3.x XML: `<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>`
//!   (the wrapper may be missing); each parameter is sent when it closes.
//! - Llama 3 JSON: the reply is a bare `{"name": ..., "parameters": {...}}` object (optionally
//!   after `<|python_tag|>`), accepted only when the name is one of the request's tools.
//! - Gemma: a fenced Python call, ```` ```tool_code\nname(a=1, b="x")\n``` ````.
//! - `<think>...</think>` reasoning, kept apart from the text.
//!
//! Markup never reaches the text: a partial marker at the end of a piece is held back until
//! it is known not to be one. A call that cannot be parsed is given back as plain text.

use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    Text(String),
    Reasoning(String),
    CallStart { index: usize, name: String },
    CallArgs { index: usize, delta: String },
    CallEnd { index: usize },
}

#[derive(Debug, Clone, Default)]
pub struct ParserConfig {
    /// Recognize tool calls (the request declared tools and did not say `none`).
    pub tools: bool,
    /// Names of the declared tools (bare JSON calls must name one of them).
    pub tool_names: Vec<String>,
    /// Recognize `<think>` blocks.
    pub reasoning: bool,
    /// The prompt already opened a `<think>` block.
    pub start_in_reasoning: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// After `<tool_call>`: JSON or XML, decided by the first non-space character.
    Wrapped,
    /// `<function=` without a wrapper.
    XmlBare,
    ToolCode,
    /// The whole rest of the reply is one JSON call.
    BareJson,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum State {
    Text,
    Think,
    Call(Kind),
}

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TC_OPEN: &str = "<tool_call>";
const TC_CLOSE: &str = "</tool_call>";
const FN_OPEN: &str = "<function=";
const FN_CLOSE: &str = "</function>";
const CODE_OPEN: &str = "```tool_code";
const CODE_CLOSE: &str = "```";
const PY_TAG: &str = "<|python_tag|>";

pub struct ToolParser {
    cfg: ParserConfig,
    state: State,
    /// Text not yet classified.
    buf: String,
    /// The body of the call being read (after its opening marker; for `XmlBare` including it).
    cbuf: String,
    /// Calls started so far; the current one's index is `n_calls - 1` once started.
    n_calls: usize,
    started: bool,
    /// JSON calls: end of the `{"name": ..., "arguments":` header in `cbuf`, and bytes of
    /// the arguments after it already sent.
    header_end: usize,
    args_sent: usize,
    /// XML calls: bytes of `cbuf` consumed and parameters sent.
    xml_pos: usize,
    xml_params: usize,
    /// Nothing but whitespace has been released as text yet.
    at_start: bool,
    /// A `</think>` just closed: newlines that follow it are dropped.
    after_think: bool,
    out: Vec<Piece>,
}

enum Header {
    Found { name: String, end: usize },
    NeedMore,
    Mismatch,
}

impl ToolParser {
    pub fn new(cfg: ParserConfig) -> Self {
        let state = if cfg.reasoning && cfg.start_in_reasoning {
            State::Think
        } else {
            State::Text
        };
        ToolParser {
            cfg,
            state,
            buf: String::new(),
            cbuf: String::new(),
            n_calls: 0,
            started: false,
            header_end: 0,
            args_sent: 0,
            xml_pos: 0,
            xml_params: 0,
            at_start: true,
            after_think: false,
            out: Vec::new(),
        }
    }

    /// Number of tool calls seen so far.
    pub fn calls(&self) -> usize {
        self.n_calls
    }

    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        self.step(false);
        std::mem::take(&mut self.out)
    }

    /// The stream ended: whatever is held is released or parsed as it stands.
    pub fn finish(&mut self) -> Vec<Piece> {
        self.step(true);
        std::mem::take(&mut self.out)
    }

    fn markers(&self) -> Vec<&'static str> {
        let mut m = Vec::new();
        if self.cfg.tools {
            m.extend([TC_OPEN, FN_OPEN, CODE_OPEN, PY_TAG]);
        }
        if self.cfg.reasoning {
            m.push(THINK_OPEN);
        }
        m
    }

    fn emit_text(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        if !s.trim().is_empty() {
            self.at_start = false;
        }
        if let Some(Piece::Text(t)) = self.out.last_mut() {
            t.push_str(s);
        } else {
            self.out.push(Piece::Text(s.to_string()));
        }
    }

    fn emit_reasoning(&mut self, s: &str) {
        if s.is_empty() {
            return;
        }
        if let Some(Piece::Reasoning(t)) = self.out.last_mut() {
            t.push_str(s);
        } else {
            self.out.push(Piece::Reasoning(s.to_string()));
        }
    }

    fn step(&mut self, eof: bool) {
        loop {
            match self.state {
                State::Text => {
                    if self.after_think {
                        let lead = self.buf.len() - self.buf.trim_start_matches('\n').len();
                        self.buf.drain(..lead);
                        if self.buf.is_empty() && !eof {
                            return;
                        }
                        self.after_think = false;
                    }
                    // A reply that opens with a JSON object may be a Llama-style call.
                    if self.cfg.tools && self.at_start {
                        let t = self.buf.trim_start();
                        if t.starts_with('{') {
                            let lead = self.buf.len() - t.len();
                            self.buf.drain(..lead);
                            self.enter_call(Kind::BareJson);
                            continue;
                        }
                        if t.is_empty() && !eof {
                            return;
                        }
                    }
                    let markers = self.markers();
                    let hit = markers
                        .iter()
                        .filter_map(|m| self.buf.find(m).map(|p| (p, *m)))
                        .min_by_key(|&(p, m)| (p, std::cmp::Reverse(m.len())));
                    if let Some((pos, m)) = hit {
                        let before = self.buf[..pos].to_string();
                        self.emit_text(&before);
                        let after = self.buf[pos + m.len()..].to_string();
                        self.buf = after;
                        match m {
                            THINK_OPEN => self.state = State::Think,
                            TC_OPEN => self.enter_call(Kind::Wrapped),
                            FN_OPEN => {
                                self.buf.insert_str(0, FN_OPEN);
                                self.enter_call(Kind::XmlBare);
                            }
                            CODE_OPEN => self.enter_call(Kind::ToolCode),
                            _ => self.enter_call(Kind::BareJson), // PY_TAG
                        }
                        continue;
                    }
                    let keep = if eof {
                        0
                    } else {
                        partial_suffix(&self.buf, &markers)
                    };
                    let cut = self.buf.len() - keep;
                    let s = self.buf[..cut].to_string();
                    self.emit_text(&s);
                    self.buf.drain(..cut);
                    return;
                }
                State::Think => {
                    if let Some(pos) = self.buf.find(THINK_CLOSE) {
                        let r = self.buf[..pos].to_string();
                        self.emit_reasoning(&r);
                        self.buf.drain(..pos + THINK_CLOSE.len());
                        // The reply proper usually starts after a blank line.
                        self.after_think = true;
                        self.state = State::Text;
                        continue;
                    }
                    let keep = if eof {
                        0
                    } else {
                        partial_suffix(&self.buf, &[THINK_CLOSE])
                    };
                    let cut = self.buf.len() - keep;
                    let s = self.buf[..cut].to_string();
                    self.emit_reasoning(&s);
                    self.buf.drain(..cut);
                    return;
                }
                State::Call(kind) => {
                    let moved = std::mem::take(&mut self.buf);
                    self.cbuf.push_str(&moved);
                    let close = match kind {
                        Kind::Wrapped => Some(TC_CLOSE),
                        Kind::XmlBare => Some(FN_CLOSE),
                        Kind::ToolCode => Some(CODE_CLOSE),
                        Kind::BareJson => None,
                    };
                    let found = close.and_then(|c| self.cbuf.find(c).map(|p| (p, c)));
                    if let Some((pos, c)) = found {
                        let mut body_end = pos;
                        let mut rest_start = pos + c.len();
                        if kind == Kind::XmlBare {
                            // Keep `</function>` in the body: the XML reader wants it.
                            body_end = rest_start;
                            // A wrapper's close may follow.
                            let r = self.cbuf[rest_start..].trim_start();
                            if let Some(r2) = r.strip_prefix(TC_CLOSE) {
                                rest_start = self.cbuf.len() - r2.len();
                            }
                        }
                        let rest = self.cbuf[rest_start..].to_string();
                        self.cbuf.truncate(body_end);
                        self.finish_call(kind);
                        self.buf = rest;
                        self.state = State::Text;
                        continue;
                    }
                    if eof {
                        self.finish_call(kind);
                        self.state = State::Text;
                        continue;
                    }
                    self.progress_call(kind, close);
                    return;
                }
            }
        }
    }

    fn enter_call(&mut self, kind: Kind) {
        self.state = State::Call(kind);
        self.cbuf.clear();
        self.started = false;
        self.header_end = 0;
        self.args_sent = 0;
        self.xml_pos = 0;
        self.xml_params = 0;
    }

    fn start_call(&mut self, name: String) {
        self.started = true;
        self.out.push(Piece::CallStart {
            index: self.n_calls,
            name,
        });
        self.n_calls += 1;
        self.at_start = false;
    }

    fn cur(&self) -> usize {
        self.n_calls - 1
    }

    fn args(&mut self, delta: String) {
        if !delta.is_empty() {
            let index = self.cur();
            self.out.push(Piece::CallArgs { index, delta });
        }
    }

    fn end_call(&mut self) {
        let index = self.cur();
        self.out.push(Piece::CallEnd { index });
    }

    fn is_xml(&self, kind: Kind) -> bool {
        kind == Kind::XmlBare
            || (kind == Kind::Wrapped && self.cbuf.trim_start().starts_with(FN_OPEN))
    }

    /// Streams what can be streamed of an unfinished call.
    fn progress_call(&mut self, kind: Kind, close: Option<&str>) {
        if kind == Kind::ToolCode {
            return;
        }
        if self.is_xml(kind) {
            self.progress_xml();
            return;
        }
        if kind == Kind::Wrapped && self.cbuf.trim_start().is_empty() {
            return;
        }
        if !self.started {
            match json_header(&self.cbuf) {
                Header::NeedMore => return,
                Header::Mismatch => {
                    if kind == Kind::BareJson {
                        // Not a call: give it back as text.
                        let s = std::mem::take(&mut self.cbuf);
                        self.state = State::Text;
                        self.at_start = false;
                        self.emit_text(&s);
                    }
                    // Wrapped: wait for the close and parse the whole object.
                    return;
                }
                Header::Found { name, end } => {
                    if kind == Kind::BareJson && !self.cfg.tool_names.contains(&name) {
                        let s = std::mem::take(&mut self.cbuf);
                        self.state = State::Text;
                        self.at_start = false;
                        self.emit_text(&s);
                        return;
                    }
                    // A string-encoded argument object is parsed whole at the end.
                    match self.cbuf[end..].trim_start().chars().next() {
                        None => return,
                        Some('{') => {}
                        Some(_) => return,
                    }
                    self.header_end = end;
                    self.start_call(name);
                }
            }
        }
        let mut s = &self.cbuf[self.header_end..];
        if let Some(c) = close {
            s = &s[..s.len() - partial_suffix(s, &[c])];
        }
        let safe = s.trim_end_matches(|ch: char| ch.is_whitespace() || ch == '}');
        let lead = s.len() - s.trim_start().len();
        let from = self.args_sent.max(lead);
        if safe.len() > from {
            let d = safe[from..].to_string();
            self.args_sent = safe.len();
            self.args(d);
        }
    }

    fn progress_xml(&mut self) {
        if !self.started {
            let Some(p) = self.cbuf.find(FN_OPEN) else {
                return;
            };
            let Some(gt) = self.cbuf[p..].find('>') else {
                return;
            };
            let name = self.cbuf[p + FN_OPEN.len()..p + gt].trim().to_string();
            self.xml_pos = p + gt + 1;
            self.start_call(name);
        }
        while let Some((name, value, end)) = xml_param(&self.cbuf[self.xml_pos..]) {
            let key = Value::String(name).to_string();
            let sep = if self.xml_params == 0 { "{" } else { ", " };
            self.xml_params += 1;
            self.xml_pos += end;
            self.args(format!("{sep}{key}: {value}"));
        }
    }

    /// The call's body is complete (or the stream ended inside it).
    fn finish_call(&mut self, kind: Kind) {
        let raw_open = match kind {
            Kind::Wrapped => TC_OPEN,
            Kind::ToolCode => CODE_OPEN,
            Kind::XmlBare | Kind::BareJson => "",
        };
        if kind == Kind::ToolCode {
            let body = std::mem::take(&mut self.cbuf);
            match parse_python_call(body.trim()) {
                Some((name, args)) => {
                    self.start_call(name);
                    self.args(Value::Object(args).to_string());
                    self.end_call();
                }
                None => {
                    let t = format!("{raw_open}{body}");
                    self.emit_text(&t);
                }
            }
            return;
        }
        if self.is_xml(kind) {
            self.progress_xml();
            if self.started {
                self.args(if self.xml_params == 0 { "{}" } else { "}" }.to_string());
                self.end_call();
            } else {
                let t = format!("{raw_open}{}", self.cbuf);
                self.emit_text(&t);
            }
            self.cbuf.clear();
            return;
        }
        if !self.started {
            // Parse the whole object: `{"name": ..., "arguments" | "parameters": ...}`.
            let body = self.cbuf.trim();
            let parsed = serde_json::from_str::<Value>(body).ok().and_then(|v| {
                let name = v.get("name")?.as_str()?.to_string();
                let args = v.get("arguments").or_else(|| v.get("parameters"));
                let args = match args {
                    None | Some(Value::Null) => "{}".to_string(),
                    Some(Value::String(s)) => s.clone(),
                    Some(a) => a.to_string(),
                };
                Some((name, args))
            });
            let ok_name =
                |n: &str| kind != Kind::BareJson || self.cfg.tool_names.iter().any(|t| t == n);
            match parsed {
                Some((name, args)) if ok_name(&name) => {
                    self.start_call(name);
                    self.args(args);
                    self.end_call();
                }
                _ => {
                    let t = format!("{raw_open}{}", self.cbuf);
                    if kind == Kind::Wrapped {
                        let t = format!("{t}{TC_CLOSE}");
                        self.emit_text(&t);
                    } else {
                        self.emit_text(&t);
                    }
                }
            }
            self.cbuf.clear();
            return;
        }
        // Streaming JSON: send the rest minus the object's own closing brace.
        let s = self.cbuf[self.header_end..].trim_end();
        let s = s.strip_suffix('}').unwrap_or(s).trim_end();
        let lead = s.len() - s.trim_start().len();
        let from = self.args_sent.max(lead);
        if s.len() > from {
            let d = s[from..].to_string();
            self.args(d);
        }
        self.end_call();
        self.cbuf.clear();
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of one of `markers`.
fn partial_suffix(s: &str, markers: &[&str]) -> usize {
    let mut best = 0;
    for m in markers {
        let max = (m.len() - 1).min(s.len());
        for k in (best + 1..=max).rev() {
            let start = s.len() - k;
            if s.is_char_boundary(start) && m.as_bytes().starts_with(&s.as_bytes()[start..]) {
                best = k;
                break;
            }
        }
    }
    best
}

/// Matches `{ "name": "<str>", "arguments"|"parameters": ` at the start of `s` (leading
/// whitespace allowed).
fn json_header(s: &str) -> Header {
    let b = s.as_bytes();
    let mut i = 0;
    let ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Each expected literal: NeedMore when `s` ends inside it, Mismatch when it differs.
    let lit = |i: &mut usize, l: &str| -> Option<Header> {
        let lb = l.as_bytes();
        let n = lb.len().min(b.len() - *i);
        if b[*i..*i + n] != lb[..n] {
            return Some(Header::Mismatch);
        }
        if n < lb.len() {
            return Some(Header::NeedMore);
        }
        *i += lb.len();
        None
    };
    ws(&mut i);
    if let Some(h) = lit(&mut i, "{") {
        return h;
    }
    ws(&mut i);
    if let Some(h) = lit(&mut i, "\"name\"") {
        return h;
    }
    ws(&mut i);
    if let Some(h) = lit(&mut i, ":") {
        return h;
    }
    ws(&mut i);
    if i >= b.len() {
        return Header::NeedMore;
    }
    if b[i] != b'"' {
        return Header::Mismatch;
    }
    // The name string, escapes included.
    let start = i;
    i += 1;
    loop {
        if i >= b.len() {
            return Header::NeedMore;
        }
        match b[i] {
            b'\\' => i += 2,
            b'"' => break,
            _ => i += 1,
        }
    }
    let Ok(name) = serde_json::from_str::<String>(&s[start..=i]) else {
        return Header::Mismatch;
    };
    i += 1;
    ws(&mut i);
    if let Some(h) = lit(&mut i, ",") {
        return h;
    }
    ws(&mut i);
    let rest = &s[i..];
    let key = ["\"arguments\"", "\"parameters\""]
        .into_iter()
        .find(|k| rest.starts_with(k) || k.starts_with(rest));
    let Some(key) = key else {
        return Header::Mismatch;
    };
    if rest.len() < key.len() {
        return Header::NeedMore;
    }
    i += key.len();
    ws(&mut i);
    if let Some(h) = lit(&mut i, ":") {
        return h;
    }
    Header::Found { name, end: i }
}

/// One complete `<parameter=NAME>value</parameter>` at the start of `s` (after whitespace):
/// (name, value as JSON text, bytes consumed).
fn xml_param(s: &str) -> Option<(String, String, usize)> {
    let p = s.find("<parameter=")?;
    if !s[..p].trim().is_empty() {
        return None;
    }
    let gt = s[p..].find('>')? + p;
    let name = s[p + "<parameter=".len()..gt].trim().to_string();
    let close = s[gt..].find("</parameter>")? + gt;
    let mut v = &s[gt + 1..close];
    v = v.strip_prefix('\n').unwrap_or(v);
    v = v.strip_suffix('\n').unwrap_or(v);
    let value = match serde_json::from_str::<Value>(v) {
        Ok(j) if !j.is_string() => j.to_string(),
        _ => Value::String(v.to_string()).to_string(),
    };
    Some((name, value, close + "</parameter>".len()))
}

/// `name(a=1, b="x", c=[1, 2])` → (name, {"a": 1, "b": "x", "c": [1, 2]}).
fn parse_python_call(s: &str) -> Option<(String, Map<String, Value>)> {
    let open = s.find('(')?;
    let name = s[..open].trim();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '.')
    {
        return None;
    }
    let inner = s[open + 1..].trim_end().strip_suffix(')')?;
    let mut args = Map::new();
    for part in split_top_level(inner) {
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let (k, v) = part.split_once('=')?;
        let k = k.trim();
        if k.is_empty() || !k.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        args.insert(k.to_string(), python_literal(v.trim())?);
    }
    Some((name.to_string(), args))
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut quote, mut esc, mut start) = (0i32, None::<char>, false, 0);
    for (i, c) in s.char_indices() {
        if let Some(q) = quote {
            if esc {
                esc = false;
            } else if c == '\\' {
                esc = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn python_literal(v: &str) -> Option<Value> {
    match v {
        "True" => return Some(Value::Bool(true)),
        "False" => return Some(Value::Bool(false)),
        "None" => return Some(Value::Null),
        _ => {}
    }
    if let Ok(j) = serde_json::from_str::<Value>(v) {
        return Some(j);
    }
    if v.len() >= 2 && v.starts_with('\'') && v.ends_with('\'') {
        let inner = &v[1..v.len() - 1];
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            if c == '\\' {
                match chars.next()? {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    o => out.push(o),
                }
            } else {
                out.push(c);
            }
        }
        return Some(Value::String(out));
    }
    // Python containers with single-quoted strings.
    if v.starts_with('[') || v.starts_with('{') {
        let swapped = v
            .replace('\'', "\"")
            .replace("True", "true")
            .replace("False", "false")
            .replace("None", "null");
        return serde_json::from_str(&swapped).ok();
    }
    None
}

#[cfg(test)]
mod tests;
