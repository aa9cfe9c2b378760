//! From a chat request (already translated to OpenAI-style messages) to prompt tokens: the
//! model's chat template renders messages and tools; for templates that know nothing of
//! tools (the built-in formats, many Gemma files) the tools are described in the system
//! message, earlier calls are written out as `<tool_call>` blocks and results as
//! `<tool_response>` user turns, which the output parser then reads back.

use serde_json::{json, Map, Value};

use crate::error::ApiError;
use crate::grammar::OutputFormat;
use crate::tools::ParserConfig;
use crate::worker::Ready;

#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    Named(String),
}

pub struct ChatRequest {
    /// OpenAI-style messages: role, content (string), tool_calls, tool_call_id, name,
    /// reasoning_content.
    pub messages: Vec<Value>,
    /// OpenAI-style tools: `{"type": "function", "function": {name, description, parameters}}`.
    pub tools: Vec<Value>,
    pub tool_choice: ToolChoice,
    /// Extra template variables (`enable_thinking`, ...).
    pub kwargs: Map<String, Value>,
}

pub struct Prepared {
    pub prompt: Vec<u32>,
    pub parser: ParserConfig,
    /// A grammar that forces a tool call (`tool_choice` required or named).
    pub forced: Option<OutputFormat>,
}

fn tool_name(t: &Value) -> Option<&str> {
    t.get("function")?.get("name")?.as_str()
}

/// Whether the file's template renders tools itself.
fn template_knows_tools(ready: &Ready) -> bool {
    ready
        .template_source
        .as_deref()
        .is_some_and(|s| s.contains("tools") && s.contains("tool_calls"))
}

fn tool_call_text(call: &Value) -> String {
    let f = call.get("function").unwrap_or(call);
    let name = f.get("name").cloned().unwrap_or(Value::Null);
    let args = match f.get("arguments") {
        Some(Value::String(s)) => serde_json::from_str(s).unwrap_or(Value::String(s.clone())),
        Some(v) => v.clone(),
        None => json!({}),
    };
    format!(
        "<tool_call>\n{}\n</tool_call>",
        json!({"name": name, "arguments": args})
    )
}

/// Tool definitions as system-prompt text, for templates without tool support.
fn tools_instruction(tools: &[Value]) -> String {
    let mut s = String::from(
        "# Tools\n\nYou can call these functions. Their signatures, one JSON object per line:\n<tools>\n",
    );
    for t in tools {
        s += &t.get("function").unwrap_or(t).to_string();
        s.push('\n');
    }
    s += "</tools>\n\nTo call a function, reply with one block per call:\n<tool_call>\n{\"name\": \"<function name>\", \"arguments\": {<arguments as a JSON object>}}\n</tool_call>\nResults come back inside <tool_response></tool_response>.";
    s
}

/// Rewrites messages for a template that only knows roles and text.
fn flatten_tools(messages: &[Value], tools: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let instruction = (!tools.is_empty()).then(|| tools_instruction(tools));
    let mut placed = instruction.is_none();
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        let content = m.get("content").and_then(Value::as_str).unwrap_or("");
        match role {
            "system" if !placed => {
                placed = true;
                let text = format!("{content}\n\n{}", instruction.as_deref().unwrap_or(""));
                out.push(json!({"role": "system", "content": text}));
            }
            "assistant" => {
                let mut text = content.to_string();
                if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
                    for c in calls {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text += &tool_call_text(c);
                    }
                }
                out.push(json!({"role": "assistant", "content": text}));
            }
            "tool" => {
                let block = format!("<tool_response>\n{content}\n</tool_response>");
                // Consecutive results share one user turn.
                if let Some(last) = out.last_mut() {
                    if last.get("_tool").is_some() {
                        let prev = last["content"].as_str().unwrap_or("").to_string();
                        last["content"] = Value::String(format!("{prev}\n{block}"));
                        continue;
                    }
                }
                out.push(json!({"role": "user", "content": block, "_tool": true}));
            }
            _ => out.push(json!({"role": role, "content": content})),
        }
    }
    if !placed {
        if let Some(i) = instruction {
            out.insert(0, json!({"role": "system", "content": i}));
        }
    }
    for m in &mut out {
        if let Some(o) = m.as_object_mut() {
            o.remove("_tool");
        }
    }
    out
}

/// For templates with tool support: `arguments` as objects, as chat templates expect.
fn native_messages(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|m| {
            let mut m = m.clone();
            if let Some(calls) = m.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for c in calls {
                    if let Some(f) = c.get_mut("function") {
                        if let Some(Value::String(s)) = f.get("arguments") {
                            if let Ok(v) = serde_json::from_str::<Value>(s) {
                                f["arguments"] = v;
                            }
                        }
                    }
                }
            }
            m
        })
        .collect()
}

/// How the model is to write a forced call: the form its template shows it (or, for a
/// template that knows nothing of tools, the form the flattened tool description asks for).
#[derive(Debug, Clone, Copy, PartialEq)]
enum CallForm {
    /// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` (Hermes, Qwen; the
    /// parser also reads Qwen3.x's XML inside the same wrapper).
    Wrapped,
    /// A bare `{"name": ..., "parameters": {...}}` reply (Llama 3.x and other native tool
    /// templates without a `<tool_call>` wrapper).
    BareJson,
}

/// The grammar for a forced call (`tool_choice` required or named) in `form`; each form is
/// one the output parser reads back as a call.
fn forced_call_grammar(
    tools: &[Value],
    choice: &ToolChoice,
    form: CallForm,
) -> Option<OutputFormat> {
    let pick: Vec<&Value> = match choice {
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(n) => tools
            .iter()
            .filter(|t| tool_name(t) == Some(n.as_str()))
            .collect(),
        _ => return None,
    };
    let args_key = match form {
        CallForm::Wrapped => "arguments",
        CallForm::BareJson => "parameters",
    };
    let alts: Vec<Value> = pick
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let params = f
                .get("parameters")
                .cloned()
                .unwrap_or(json!({"type": "object"}));
            Some(json!({
                "type": "object",
                "properties": {"name": {"const": f.get("name")?}, args_key: params},
                "required": ["name", args_key],
                "additionalProperties": false,
            }))
        })
        .collect();
    if alts.is_empty() {
        return None;
    }
    let schema = crate::grammar::compact(if alts.len() == 1 {
        alts[0].clone()
    } else {
        json!({"anyOf": alts})
    });
    Some(OutputFormat::Lark(match form {
        CallForm::Wrapped => {
            format!("start: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {schema}\n")
        }
        CallForm::BareJson => format!("start: call\ncall: %json {schema}\n"),
    }))
}

/// `check_len`: refuse a prompt that leaves no room in the context (off for counting).
pub fn prepare(ready: &Ready, req: &ChatRequest, check_len: bool) -> Result<Prepared, ApiError> {
    let template = ready.template.as_ref().ok_or_else(|| {
        ApiError::bad_request("the model has no chat template; use /v1/completions")
    })?;
    if let ToolChoice::Named(n) = &req.tool_choice {
        if !req.tools.iter().any(|t| tool_name(t) == Some(n.as_str())) {
            return Err(ApiError::bad_request(format!(
                "tool_choice names the tool '{n}', which is not in tools"
            ))
            .with_param("tool_choice"));
        }
    }
    let use_tools = !req.tools.is_empty() && req.tool_choice != ToolChoice::None;
    let tools: &[Value] = if use_tools { &req.tools } else { &[] };
    let native = template_knows_tools(ready);
    let text = if native {
        let msgs = native_messages(&req.messages);
        template.render(&msgs, use_tools.then_some(tools), true, &req.kwargs)
    } else {
        let msgs = flatten_tools(&req.messages, tools);
        template.render(&msgs, None, true, &req.kwargs)
    }
    .map_err(|e| ApiError::bad_request(format!("the chat template rejected the messages: {e}")))?;

    let tok = &ready.tokenizer;
    let bos = tok
        .bos()
        .map(|b| String::from_utf8_lossy(&tok.token_to_piece(b, true)).into_owned());
    let add_special = !bos
        .as_deref()
        .is_some_and(|b| !b.is_empty() && text.starts_with(b));
    let prompt = tok.encode(&text, add_special, true);
    if check_len {
        check_fits(prompt.len(), ready.n_ctx)?;
    }
    let src = ready.template_source.as_deref().unwrap_or("");
    let reasoning = src.contains("<think>") || text.contains("<think>");
    let start_in_reasoning = reasoning && text.trim_end().ends_with("<think>");
    let form = if native && !src.contains("<tool_call>") {
        CallForm::BareJson
    } else {
        CallForm::Wrapped
    };
    let forced = if use_tools {
        forced_call_grammar(tools, &req.tool_choice, form)
    } else {
        None
    };
    Ok(Prepared {
        prompt,
        parser: ParserConfig {
            tools: use_tools,
            tool_names: tools
                .iter()
                .filter_map(|t| tool_name(t).map(str::to_string))
                .collect(),
            reasoning,
            start_in_reasoning,
        },
        forced,
    })
}

/// A prompt must leave room for at least one generated token.
pub fn check_fits(n: usize, n_ctx: usize) -> Result<(), ApiError> {
    if n + 1 > n_ctx {
        return Err(ApiError::bad_request(format!(
            "the prompt has {n} tokens but the context holds {n_ctx} (start the server with a larger -c)"
        ))
        .with_param("messages")
        .with_code("context_length_exceeded"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flattened_tools_round_trip_through_text() {
        let tools = vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}),
        ];
        let msgs = vec![
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Weather?"}),
            json!({"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "sunny"}),
            json!({"role": "tool", "tool_call_id": "c2", "content": "warm"}),
        ];
        let out = flatten_tools(&msgs, &tools);
        assert_eq!(out.len(), 4);
        assert!(out[0]["content"]
            .as_str()
            .unwrap()
            .starts_with("Be brief.\n\n# Tools"));
        assert!(out[0]["content"]
            .as_str()
            .unwrap()
            .contains("\"get_weather\""));
        let call = out[2]["content"].as_str().unwrap();
        // The call text is what the output parser reads back as the same call.
        let mut p = crate::tools::ToolParser::new(ParserConfig {
            tools: true,
            tool_names: vec!["get_weather".into()],
            ..Default::default()
        });
        let mut pieces = p.push(call);
        pieces.extend(p.finish());
        assert!(pieces.contains(&crate::tools::Piece::CallStart {
            index: 0,
            name: "get_weather".into()
        }));
        assert_eq!(out[3]["role"], "user");
        assert_eq!(
            out[3]["content"],
            "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nwarm\n</tool_response>"
        );
    }

    /// Each form's forced grammar accepts a call in that form (and refuses the other
    /// form's key), and the output parser reads the accepted text back as that call.
    /// Needs NEAGARI_TEST_MODEL (its tokenizer; llguidance masks whole tokens).
    #[test]
    fn forced_calls_in_each_form_are_read_back_as_the_call() {
        use crate::grammar::{compile, factory, Constraint};
        use crate::tools::{Piece, ToolParser};
        let Some(path) = std::env::var_os("NEAGARI_TEST_MODEL") else {
            eprintln!("skipping: NEAGARI_TEST_MODEL is not set");
            return;
        };
        let g = neagari_formats::gguf::Gguf::open(&path).unwrap();
        let tok = std::sync::Arc::new(neagari_engine::loader::tokenizer_from_gguf(&g).unwrap());
        let f = factory(tok.clone()).unwrap();
        let city = json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]});
        let tools = vec![
            json!({"type": "function", "function": {"name": "get_weather", "parameters": city}}),
            json!({"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}),
        ];
        let named = ToolChoice::Named("get_weather".into());
        let wrapped = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let bare = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
        for (form, good, other) in [
            (CallForm::Wrapped, wrapped, bare),
            (CallForm::BareJson, bare, wrapped),
        ] {
            for choice in [&ToolChoice::Required, &named] {
                let fmt = forced_call_grammar(&tools, choice, form).unwrap();
                // Feeds `text`: Some(completed) if every token is allowed, None if one is not.
                let run = |text: &str| {
                    let mut c = compile(&f, &fmt).unwrap();
                    let mut done = false;
                    for t in tok.encode(text, false, false) {
                        let mut logits = vec![0f32; tok.n_vocab()];
                        c.mask(&mut logits).unwrap();
                        if logits[t as usize] == f32::NEG_INFINITY {
                            return None;
                        }
                        done = c.commit(t).unwrap();
                    }
                    Some(done)
                };
                assert_eq!(run(good), Some(true), "{form:?} {choice:?}");
                assert_eq!(run(other), None, "{form:?} {choice:?}");
                let mut p = ToolParser::new(ParserConfig {
                    tools: true,
                    tool_names: vec!["get_weather".into(), "get_time".into()],
                    ..Default::default()
                });
                let mut pieces = p.push(good);
                pieces.extend(p.finish());
                let args: String = pieces
                    .iter()
                    .filter_map(|x| match x {
                        Piece::CallArgs { delta, .. } => Some(delta.as_str()),
                        _ => None,
                    })
                    .collect();
                assert!(pieces.contains(&Piece::CallStart {
                    index: 0,
                    name: "get_weather".into()
                }));
                assert_eq!(
                    serde_json::from_str::<Value>(&args).unwrap(),
                    json!({"city": "Paris"})
                );
                assert!(!pieces
                    .iter()
                    .any(|x| matches!(x, Piece::Text(t) if !t.trim().is_empty())));
            }
        }
        // A named choice excludes the other tools.
        let fmt = forced_call_grammar(&tools, &named, CallForm::BareJson).unwrap();
        let mut c = compile(&f, &fmt).unwrap();
        let mut ok = true;
        for t in tok.encode("{\"name\": \"get_time\", \"parameters\": {}}", false, false) {
            let mut logits = vec![0f32; tok.n_vocab()];
            c.mask(&mut logits).unwrap();
            ok &= logits[t as usize] != f32::NEG_INFINITY;
            if !ok {
                break;
            }
            c.commit(t).unwrap();
        }
        assert!(!ok, "get_time passed a grammar that names get_weather");
    }
}
