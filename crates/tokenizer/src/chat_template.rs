//! Chat templates: turns a conversation (OpenAI-style messages, tools, flags) into the prompt
//! text a model was trained on.
//!
//! Two sources, one type ([`ChatTemplate`]):
//! * a Hugging Face `tokenizer.chat_template` (Jinja), rendered with MiniJinja set up to behave
//!   as transformers' `apply_chat_template(..., tokenize=False)`: trim_blocks, lstrip_blocks,
//!   loop controls, no autoescape, `raise_exception`, `strftime_now`, `namespace`, transformers'
//!   `tojson` (`json.dumps` with `ensure_ascii=False`, keys in insertion order), Python string /
//!   dict methods (minijinja-contrib's pycompat), values printed as Python's `str()` prints them,
//!   and transformers' message normalization (keys whose value is null dropped; reasoning
//!   aliased to `thinking` / `reasoning_content`);
//! * llama.cpp's built-in formats ([`BuiltinFormat`]) for files without a template.
//!
//! Tested against transformers' renderer and llama.cpp's `llama_chat_apply_template` through
//! `tests/fixtures/chat_templates.json` (made by `scripts/chat_template_reference.py`).

mod builtin;
mod pyjson;
mod strftime;

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use serde::{Deserialize, Serialize};

pub use builtin::{detect_builtin, detect_llama_cpp_name, BuiltinFormat};

/// Name the template is stored under inside its environment.
const TEMPLATE_NAME: &str = "chat_template";

/// Upper bound on template instructions per render: real templates spend a few hundred per
/// message, so this only stops runaway loops in a hostile template.
const FUEL: u64 = 50_000_000;

/// Marks "no fixed clock" in [`ChatTemplate`]'s clock cell.
const NO_FIXED_NOW: i64 = i64::MIN;

/// Variables the renderer sets itself; a kwarg may not replace them (Python would raise
/// "got multiple values for keyword argument").
const RESERVED_KWARGS: &[&str] = &["messages", "tools", "documents", "add_generation_prompt"];

#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    #[error("chat template does not compile: {0}")]
    Syntax(String),
    /// The template called `raise_exception(message)` (it rejects this conversation).
    #[error("chat template raised an exception: {0}")]
    Raised(String),
    #[error("chat template failed to render: {0}")]
    Render(String),
    #[error("invalid chat message: {0}")]
    InvalidMessage(String),
    #[error("unknown built-in chat format {0:?}")]
    UnknownBuiltin(String),
    #[error("template argument {0:?} is set by the renderer and cannot be passed as a kwarg")]
    ReservedKwarg(String),
}

/// `raise_exception`'s message, carried as the source of MiniJinja's error so that
/// [`TemplateError::Raised`] can be told apart from engine errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Raised(String);

/// One chat message in OpenAI's shape; [`ChatTemplate::render`] also takes raw JSON values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<MessageContent>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            ..Default::default()
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part, e.g. `{"type": "text", "text": "..."}`; other part kinds keep their fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".to_string()
}

/// `arguments` is a JSON object or the JSON text of one (OpenAI sends text); templates test
/// `arguments is string` and print it raw, or pass the object through `tojson`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: serde_json::Value,
}

enum Renderer {
    Jinja(Box<Environment<'static>>),
    Builtin(BuiltinFormat),
}

/// A compiled chat template (Jinja or built-in) with the model's BOS/EOS text.
pub struct ChatTemplate {
    renderer: Renderer,
    bos: String,
    eos: String,
    /// Microseconds since the Unix epoch that `strftime_now` reports, or NO_FIXED_NOW.
    fixed_now: Arc<AtomicI64>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match &self.renderer {
            Renderer::Jinja(_) => "jinja".to_string(),
            Renderer::Builtin(b) => format!("builtin {}", b.name()),
        };
        f.debug_struct("ChatTemplate").field("kind", &kind).finish()
    }
}

impl ChatTemplate {
    /// Compiles a Jinja chat template. `bos` / `eos` become `bos_token` / `eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self, TemplateError> {
        let fixed_now = Arc::new(AtomicI64::new(NO_FIXED_NOW));
        let env = build_environment(source, fixed_now.clone())?;
        Ok(ChatTemplate {
            renderer: Renderer::Jinja(Box::new(env)),
            bos: bos.to_string(),
            eos: eos.to_string(),
            fixed_now,
        })
    }

    /// llama.cpp's built-in format of that name (see [`BuiltinFormat`]).
    pub fn builtin(name: &str) -> Result<Self, TemplateError> {
        BuiltinFormat::from_name(name)
            .map(Self::from_builtin)
            .ok_or_else(|| TemplateError::UnknownBuiltin(name.to_string()))
    }

    pub fn from_builtin(format: BuiltinFormat) -> Self {
        ChatTemplate {
            renderer: Renderer::Builtin(format),
            bos: String::new(),
            eos: String::new(),
            fixed_now: Arc::new(AtomicI64::new(NO_FIXED_NOW)),
        }
    }

    /// The template a model file calls for: its Jinja template when it has one, else the
    /// built-in format for its architecture ([`BuiltinFormat::for_architecture`]).
    pub fn for_model(
        arch: &str,
        template: Option<&str>,
        bos: &str,
        eos: &str,
    ) -> Result<Self, TemplateError> {
        match template {
            Some(t) if !t.trim().is_empty() => Self::new(t, bos, eos),
            _ => Ok(Self::from_builtin(BuiltinFormat::for_architecture(arch))),
        }
    }

    /// The built-in format, when this is not a Jinja template.
    pub fn builtin_format(&self) -> Option<BuiltinFormat> {
        match self.renderer {
            Renderer::Builtin(b) => Some(b),
            Renderer::Jinja(_) => None,
        }
    }

    /// Pins the clock `strftime_now` reads (`None`: the system clock). For reproducible
    /// prompts and tests.
    pub fn set_fixed_now(&self, now: Option<SystemTime>) {
        let micros = match now {
            None => NO_FIXED_NOW,
            Some(t) => unix_micros(t),
        };
        self.fixed_now.store(micros, Ordering::Relaxed);
    }

    /// Renders a conversation. `messages` are OpenAI-style objects (`role`, `content` as a
    /// string or a list of parts, `tool_calls`, `tool_call_id`, `name`, `reasoning_content`...);
    /// `tools` the request's tool list; `kwargs` extra template variables (`enable_thinking`,
    /// ...), which may override `bos_token` / `eos_token`.
    ///
    /// Built-in formats use only roles and text contents.
    pub fn render(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let env = match &self.renderer {
            Renderer::Builtin(format) => {
                let flat = builtin::flatten_messages(messages)?;
                let pairs: Vec<(&str, &str)> =
                    flat.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
                return Ok(format.apply(&pairs, add_generation_prompt));
            }
            Renderer::Jinja(env) => env,
        };
        if let Some(k) = RESERVED_KWARGS.iter().find(|k| kwargs.contains_key(**k)) {
            return Err(TemplateError::ReservedKwarg(k.to_string()));
        }
        let messages = normalize_messages(messages)?;
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from_serialize(&messages)),
            (
                "tools".into(),
                tools.map_or(Value::from(()), Value::from_serialize),
            ),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(add_generation_prompt),
            ),
            ("bos_token".into(), Value::from(self.bos.as_str())),
            ("eos_token".into(), Value::from(self.eos.as_str())),
        ];
        for (k, v) in kwargs {
            ctx.retain(|(name, _)| name != k);
            ctx.push((k.clone(), Value::from_serialize(v)));
        }
        let ctx: Value = ctx.into_iter().collect();
        let tmpl = env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(e.to_string()))?;
        tmpl.render(ctx).map_err(render_error)
    }

    /// [`ChatTemplate::render`] over typed messages.
    pub fn render_messages(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        kwargs: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, TemplateError> {
        let values = messages
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TemplateError::InvalidMessage(e.to_string()))?;
        self.render(&values, tools, add_generation_prompt, kwargs)
    }
}

fn unix_micros(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_micros()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_micros()).map_or(i64::MIN + 1, |m| -m),
    }
}

/// transformers' `_normalize_chat_messages` + `_alias_reasoning_fields`: drop top-level keys
/// whose value is null; when a message carries reasoning under `reasoning_content`, `thinking`
/// or `reasoning` (first non-null, in that order), expose it as both `thinking` (placed first)
/// and `reasoning_content`.
fn normalize_messages(
    messages: &[serde_json::Value],
) -> Result<Vec<serde_json::Map<String, serde_json::Value>>, TemplateError> {
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let obj = m.as_object().ok_or_else(|| {
            TemplateError::InvalidMessage(format!("message {i} is not a JSON object"))
        })?;
        let mut msg: serde_json::Map<String, serde_json::Value> = obj
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let reasoning = ["reasoning_content", "thinking", "reasoning"]
            .iter()
            .find_map(|k| msg.get(*k).cloned());
        if let Some(r) = reasoning {
            // Python: {"thinking": r, **message, "reasoning_content": r}; re-inserting an
            // existing key keeps its position, as a dict literal does.
            let mut aliased = serde_json::Map::new();
            aliased.insert("thinking".into(), r.clone());
            for (k, v) in msg {
                aliased.insert(k, v);
            }
            aliased.insert("reasoning_content".into(), r);
            msg = aliased;
        }
        out.push(msg);
    }
    Ok(out)
}

fn render_error(e: Error) -> TemplateError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
    while let Some(err) = source {
        if let Some(raised) = err.downcast_ref::<Raised>() {
            return TemplateError::Raised(raised.0.clone());
        }
        source = err.source();
    }
    TemplateError::Render(e.to_string())
}

/// MiniJinja configured as transformers' ImmutableSandboxedEnvironment.
fn build_environment(
    source: &str,
    fixed_now: Arc<AtomicI64>,
) -> Result<Environment<'static>, TemplateError> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    // Jinja2 drops one trailing newline of the source by default, as MiniJinja does.
    env.set_keep_trailing_newline(false);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    env.set_undefined_behavior(UndefinedBehavior::Lenient);
    env.set_fuel(Some(FUEL));
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(|out, _state, value| {
        let mut s = String::new();
        pyjson::py_str(&mut s, value);
        out.write_str(&s)
            .map_err(|_| Error::new(ErrorKind::WriteFailure, "output failed"))
    });
    env.add_filter("tojson", tojson);
    env.add_filter("string", |v: Value| {
        let mut s = String::new();
        pyjson::py_str(&mut s, &v);
        s
    });
    // Jinja2's trim is `str(value).strip(chars)`: a list prints as Python's repr first.
    env.add_filter("trim", |v: Value, chars: Option<String>| {
        let mut s = String::new();
        pyjson::py_str(&mut s, &v);
        match chars {
            Some(chars) => s.trim_matches(|c| chars.contains(c)).to_string(),
            None => s.trim_matches(py_isspace).to_string(),
        }
    });
    // Jinja2's length is `len(value)`: 0 for Undefined, an error for None and scalars.
    env.add_filter("length", |v: Value| -> Result<usize, Error> {
        if v.is_undefined() {
            return Ok(0);
        }
        v.len().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("object of type {} has no len()", v.kind()),
            )
        })
    });
    env.add_filter("count", |v: Value| -> Result<usize, Error> {
        if v.is_undefined() {
            return Ok(0);
        }
        v.len().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                format!("object of type {} has no len()", v.kind()),
            )
        })
    });
    // Jinja2's `iterable` test is `iter(value)` succeeding: false for None and scalars, true
    // for Undefined (which iterates as empty). MiniJinja's default also accepts none.
    env.add_test("iterable", |v: Value| {
        !matches!(
            v.kind(),
            ValueKind::None
                | ValueKind::Bool
                | ValueKind::Number
                | ValueKind::Plain
                | ValueKind::Invalid
        )
    });
    env.add_function(
        "raise_exception",
        |message: Value| -> Result<Value, Error> {
            let mut text = String::new();
            pyjson::py_str(&mut text, &message);
            Err(Error::new(ErrorKind::InvalidOperation, text.clone()).with_source(Raised(text)))
        },
    );
    env.add_function("strftime_now", move |format: String| -> String {
        let fixed = fixed_now.load(Ordering::Relaxed);
        let micros = if fixed == NO_FIXED_NOW {
            unix_micros(SystemTime::now())
        } else {
            fixed
        };
        strftime::DateTime::from_unix_micros(micros).strftime(&format)
    });
    env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
        .map_err(|e| TemplateError::Syntax(e.to_string()))?;
    Ok(env)
}

/// Python's `str.isspace` for one character: Unicode White_Space plus the C0 separators
/// U+001C..U+001F, which Python also counts.
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// transformers' `{% generation %}…{% endgeneration %}` extension (it marks assistant text
/// for training masks and renders its body unchanged) becomes `{% if true %}…{% endif %}`,
/// keeping any `-` whitespace control, so MiniJinja parses such templates.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (lead, body) = match inner.strip_prefix('-') {
            Some(b) => ("-", b),
            None => ("", inner),
        };
        let (body, trail) = match body.strip_suffix('-') {
            Some(b) => (b, "-"),
            None => (body, ""),
        };
        let replacement = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => out.push_str(&format!("{{%{lead} {r} {trail}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)` = `json.dumps` with those arguments, positional or by name.
fn tojson(value: &Value, args: Rest<Value>) -> Result<Value, Error> {
    let mut positional = args.0;
    let kwargs = match positional.last() {
        Some(v) if v.is_kwargs() => Kwargs::try_from(positional.pop().unwrap_or_default())?,
        _ => Kwargs::from_iter(std::iter::empty::<(String, Value)>()),
    };
    if positional.len() > 4 {
        return Err(Error::new(
            ErrorKind::TooManyArguments,
            "tojson takes at most 4 arguments",
        ));
    }
    let mut positional = positional.into_iter();
    let (ensure_ascii, indent, separators, sort_keys) = (
        positional.next(),
        positional.next(),
        positional.next(),
        positional.next(),
    );
    let pick = |positional: Option<Value>, name: &str| -> Result<Option<Value>, Error> {
        let named: Option<Value> = kwargs.get(name)?;
        Ok(named.or(positional))
    };
    let ensure_ascii = pick(ensure_ascii, "ensure_ascii")?.is_some_and(|v| v.is_true());
    let sort_keys = pick(sort_keys, "sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match pick(indent, "indent")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent must be an int or str",
                    )
                })?;
                Some(" ".repeat(n.max(0) as usize))
            }
        },
    };
    let separators = match pick(separators, "separators")? {
        None => None,
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => Some((
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                )),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be a pair of strings",
                    ))
                }
            }
        }
    };
    kwargs.assert_all_used()?;
    let opts = pyjson::DumpOptions::new(ensure_ascii, indent, separators, sort_keys);
    pyjson::dumps(value, &opts).map(Value::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render_src(src: &str, messages: serde_json::Value) -> Result<String, TemplateError> {
        let t = ChatTemplate::new(src, "<s>", "</s>")?;
        let msgs = messages.as_array().cloned().unwrap_or_default();
        t.render(&msgs, None, true, &serde_json::Map::new())
    }

    #[test]
    fn raise_exception_is_reported_as_raised() {
        let err = render_src(
            "{{ raise_exception('no system role') }}",
            serde_json::json!([]),
        );
        match err {
            Err(TemplateError::Raised(m)) => assert_eq!(m, "no system role"),
            other => panic!("expected Raised, got {other:?}"),
        }
    }

    #[test]
    fn syntax_error_is_reported_at_construction() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", "", ""),
            Err(TemplateError::Syntax(_))
        ));
    }

    #[test]
    fn reserved_kwargs_are_rejected() {
        let t = ChatTemplate::new("{{ messages }}", "", "").unwrap();
        let mut kw = serde_json::Map::new();
        kw.insert("messages".into(), serde_json::json!(1));
        assert!(matches!(
            t.render(&[], None, false, &kw),
            Err(TemplateError::ReservedKwarg(_))
        ));
    }

    #[test]
    fn runaway_template_runs_out_of_fuel() {
        let src =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        assert!(matches!(
            render_src(src, serde_json::json!([])),
            Err(TemplateError::Render(_))
        ));
    }
}
