//! llama.cpp's built-in (non-Jinja) chat formats, for model files that carry no
//! `tokenizer.chat_template`, and llama.cpp's detection of a format from a template's source.
//!
//! Facts from llama.cpp's `src/llama-chat.cpp` (llama-cpp-python 0.3.36, upstream 0c1e570):
//! `llm_chat_detect_template` (substring tests, in that order) and `llm_chat_apply_template`.
//! Tested against `llama_cpp.llama_chat_apply_template` through the committed fixture.

use super::TemplateError;

/// A built-in format, named as llama.cpp names it (`llama_chat_builtin_templates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BuiltinFormat {
    /// `<|im_start|>role\ncontent<|im_end|>\n` (Qwen 2/3, many others).
    Chatml,
    /// Gemma: `model` for `assistant`, system text merged into the next user turn.
    Gemma,
    /// Llama 3 header/eot format, contents trimmed.
    Llama3,
    /// Llama 2 `[INST]` with the system text bare, and its three variants.
    Llama2,
    Llama2Sys,
    Llama2SysBos,
    Llama2SysStrip,
    MistralV1,
    MistralV3,
    MistralV3Tekken,
    MistralV7,
    MistralV7Tekken,
    Phi3,
    Zephyr,
    Deepseek3,
    /// IBM Granite 3.x.
    Granite,
    /// gpt-oss (Harmony) without channels.
    GptOss,
}

const NAMES: &[(&str, BuiltinFormat)] = &[
    ("chatml", BuiltinFormat::Chatml),
    ("gemma", BuiltinFormat::Gemma),
    ("llama3", BuiltinFormat::Llama3),
    ("llama2", BuiltinFormat::Llama2),
    ("llama2-sys", BuiltinFormat::Llama2Sys),
    ("llama2-sys-bos", BuiltinFormat::Llama2SysBos),
    ("llama2-sys-strip", BuiltinFormat::Llama2SysStrip),
    ("mistral-v1", BuiltinFormat::MistralV1),
    ("mistral-v3", BuiltinFormat::MistralV3),
    ("mistral-v3-tekken", BuiltinFormat::MistralV3Tekken),
    ("mistral-v7", BuiltinFormat::MistralV7),
    ("mistral-v7-tekken", BuiltinFormat::MistralV7Tekken),
    ("phi3", BuiltinFormat::Phi3),
    ("zephyr", BuiltinFormat::Zephyr),
    ("deepseek3", BuiltinFormat::Deepseek3),
    ("granite", BuiltinFormat::Granite),
    ("gpt-oss", BuiltinFormat::GptOss),
];

impl BuiltinFormat {
    /// The format llama.cpp calls `name`, if this crate implements it.
    pub fn from_name(name: &str) -> Option<Self> {
        NAMES.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }

    /// llama.cpp's name for this format.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(_, f)| *f == self)
            .map(|(n, _)| *n)
            .unwrap_or("chatml")
    }

    /// Every implemented format.
    pub fn all() -> impl Iterator<Item = BuiltinFormat> {
        NAMES.iter().map(|(_, f)| *f)
    }

    /// The format for a model file without a chat template, keyed by `general.architecture`.
    /// llama.cpp itself falls back to chatml for every such file; this picks each family's own
    /// turn markers where the architecture names the family unambiguously.
    pub fn for_architecture(arch: &str) -> Self {
        match arch {
            a if a.starts_with("gemma") => BuiltinFormat::Gemma,
            // `llama` files without a template are Llama 2 era; Llama 3 files ship a template.
            "llama" => BuiltinFormat::Llama2,
            "phi3" => BuiltinFormat::Phi3,
            "deepseek2" => BuiltinFormat::Deepseek3,
            "gpt-oss" => BuiltinFormat::GptOss,
            "granite" | "granitemoe" => BuiltinFormat::Granite,
            // qwen2, qwen2moe, qwen3, qwen3moe and everything else: llama.cpp's default.
            _ => BuiltinFormat::Chatml,
        }
    }

    /// Renders `(role, content)` pairs exactly as `llm_chat_apply_template` does.
    pub fn apply(self, chat: &[(&str, &str)], add_assistant: bool) -> String {
        use BuiltinFormat as F;
        let mut s = String::new();
        match self {
            F::Chatml => {
                for (role, content) in chat {
                    s += &format!("<|im_start|>{role}\n{content}<|im_end|>\n");
                }
                if add_assistant {
                    s += "<|im_start|>assistant\n";
                }
            }
            F::MistralV7 | F::MistralV7Tekken => {
                let sp = if self == F::MistralV7 { " " } else { "" };
                for (role, content) in chat {
                    match *role {
                        "system" => s += &format!("[SYSTEM_PROMPT]{sp}{content}[/SYSTEM_PROMPT]"),
                        "user" => s += &format!("[INST]{sp}{content}[/INST]"),
                        _ => s += &format!("{sp}{content}</s>"),
                    }
                }
            }
            F::MistralV1 | F::MistralV3 | F::MistralV3Tekken => {
                let leading = if self == F::MistralV1 { " " } else { "" };
                let trailing = if self == F::MistralV3Tekken { "" } else { " " };
                let trim_assistant = self == F::MistralV3;
                let mut inside_turn = false;
                for (role, content) in chat {
                    if !inside_turn {
                        s += &format!("{leading}[INST]{trailing}");
                        inside_turn = true;
                    }
                    match *role {
                        "system" => s += &format!("{content}\n\n"),
                        "user" => s += &format!("{content}{leading}[/INST]"),
                        _ => {
                            let c = if trim_assistant {
                                trim(content)
                            } else {
                                content
                            };
                            s += &format!("{trailing}{c}</s>");
                            inside_turn = false;
                        }
                    }
                }
            }
            F::Llama2 | F::Llama2Sys | F::Llama2SysBos | F::Llama2SysStrip => {
                let system_supported = self != F::Llama2;
                let bos_inside = self == F::Llama2SysBos;
                let strip = self == F::Llama2SysStrip;
                // The first BOS is the tokenizer's, so the prompt opens inside a turn.
                let mut inside_turn = true;
                s += "[INST] ";
                for (role, content) in chat {
                    let content = if strip { trim(content) } else { content };
                    if !inside_turn {
                        inside_turn = true;
                        s += if bos_inside { "<s>[INST] " } else { "[INST] " };
                    }
                    match *role {
                        "system" if system_supported => {
                            s += &format!("<<SYS>>\n{content}\n<</SYS>>\n\n")
                        }
                        "system" => s += &format!("{content}\n"),
                        "user" => s += &format!("{content} [/INST]"),
                        _ => {
                            s += &format!("{content}</s>");
                            inside_turn = false;
                        }
                    }
                }
            }
            F::Phi3 => {
                for (role, content) in chat {
                    s += &format!("<|{role}|>\n{content}<|end|>\n");
                }
                if add_assistant {
                    s += "<|assistant|>\n";
                }
            }
            F::Zephyr => {
                for (role, content) in chat {
                    s += &format!("<|{role}|>\n{content}<|endoftext|>\n");
                }
                if add_assistant {
                    s += "<|assistant|>\n";
                }
            }
            F::Gemma => {
                // Gemma has no system turn: the (trimmed) system text opens the next user turn.
                let mut system = String::new();
                for (role, content) in chat {
                    if *role == "system" {
                        system += trim(content);
                        continue;
                    }
                    let role = if *role == "assistant" { "model" } else { role };
                    s += &format!("<start_of_turn>{role}\n");
                    if !system.is_empty() && role != "model" {
                        s += &system;
                        s += "\n\n";
                        system.clear();
                    }
                    s += trim(content);
                    s += "<end_of_turn>\n";
                }
                if add_assistant {
                    s += "<start_of_turn>model\n";
                }
            }
            F::Llama3 => {
                for (role, content) in chat {
                    s += &format!(
                        "<|start_header_id|>{role}<|end_header_id|>\n\n{}<|eot_id|>",
                        trim(content)
                    );
                }
                if add_assistant {
                    s += "<|start_header_id|>assistant<|end_header_id|>\n\n";
                }
            }
            F::Deepseek3 => {
                for (role, content) in chat {
                    match *role {
                        "system" => s += &format!("{content}\n\n"),
                        "user" => s += &format!("<\u{ff5c}User\u{ff5c}>{content}"),
                        "assistant" => s += &format!(
                            "<\u{ff5c}Assistant\u{ff5c}>{content}<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>"
                        ),
                        _ => {}
                    }
                }
                if add_assistant {
                    s += "<\u{ff5c}Assistant\u{ff5c}>";
                }
            }
            F::Granite => {
                for (role, content) in chat {
                    s += &format!("<|start_of_role|>{role}<|end_of_role|>");
                    if *role == "assistant_tool_call" {
                        s += "<|tool_call|>";
                    }
                    s += &format!("{content}<|end_of_text|>\n");
                }
                if add_assistant {
                    s += "<|start_of_role|>assistant<|end_of_role|>";
                }
            }
            F::GptOss => {
                for (role, content) in chat {
                    let end = if *role == "assistant" {
                        "<|return|>"
                    } else {
                        "<|end|>"
                    };
                    s += &format!("<|start|>{role}<|message|>{content}{end}");
                }
                if add_assistant {
                    s += "<|start|>assistant";
                }
            }
        }
        s
    }
}

/// C's `isspace` trim over ASCII whitespace (space, \t, \n, \v, \f, \r), as llama.cpp's `trim`.
fn trim(s: &str) -> &str {
    let ws = |c: char| matches!(c, ' ' | '\t' | '\n' | '\x0b' | '\x0c' | '\r');
    s.trim_matches(ws)
}

/// Every name in llama.cpp's `LLM_CHAT_TEMPLATES` table (a template string equal to one of them
/// selects that format directly).
const LLAMA_CPP_NAMES: &[&str] = &[
    "chatml",
    "llama2",
    "llama2-sys",
    "llama2-sys-bos",
    "llama2-sys-strip",
    "mistral-v1",
    "mistral-v3",
    "mistral-v3-tekken",
    "mistral-v7",
    "mistral-v7-tekken",
    "phi3",
    "phi4",
    "falcon3",
    "zephyr",
    "monarch",
    "gemma",
    "orion",
    "openchat",
    "vicuna",
    "vicuna-orca",
    "deepseek",
    "deepseek2",
    "deepseek3",
    "deepseek-ocr",
    "command-r",
    "llama3",
    "chatglm3",
    "chatglm4",
    "glmedge",
    "minicpm",
    "exaone3",
    "exaone4",
    "exaone-moe",
    "rwkv-world",
    "granite",
    "granite-4.0",
    "granite-4.1",
    "gigachat",
    "megrez",
    "yandex",
    "bailing",
    "bailing-think",
    "bailing2",
    "llama4",
    "smolvlm",
    "hunyuan-moe",
    "gpt-oss",
    "hunyuan-dense",
    "hunyuan-vl",
    "kimi-k2",
    "seed_oss",
    "grok-2",
    "pangu-embedded",
    "solar-open",
];

/// llama.cpp's `llm_chat_detect_template`: the built-in format name a template source (or a
/// built-in name) selects, including formats this crate does not implement; `None` when
/// llama.cpp recognizes nothing.
pub fn detect_llama_cpp_name(tmpl: &str) -> Option<&'static str> {
    if let Some(name) = LLAMA_CPP_NAMES.iter().find(|n| **n == tmpl) {
        return Some(name);
    }
    let has = |needle: &str| tmpl.contains(needle);
    let name = if has("<|im_start|>") {
        if has("<|im_sep|>") {
            "phi4"
        } else if has("<end_of_utterance>") {
            "smolvlm"
        } else {
            "chatml"
        }
    } else if tmpl.starts_with("mistral") || has("[INST]") {
        if has("[SYSTEM_PROMPT]") {
            "mistral-v7"
        } else if has("' [INST] ' + system_message") || has("[AVAILABLE_TOOLS]") {
            if has(" [INST]") {
                "mistral-v1"
            } else if has("\"[INST]\"") {
                "mistral-v3-tekken"
            } else {
                "mistral-v3"
            }
        } else if has("content.strip()") {
            "llama2-sys-strip"
        } else if has("bos_token + '[INST]") {
            "llama2-sys-bos"
        } else if has("<<SYS>>") {
            "llama2-sys"
        } else {
            "llama2"
        }
    } else if has("<|assistant|>") && has("<|end|>") {
        "phi3"
    } else if has("[gMASK]<sop>") {
        "chatglm4"
    } else if has("<|assistant|>") && has("<|user|>") {
        if has("<|tool_declare|>") {
            "exaone-moe"
        } else if has("</s>") {
            "falcon3"
        } else {
            "glmedge"
        }
    } else if has("<|{{ item['role'] }}|>") && has("<|begin_of_image|>") {
        "glmedge"
    } else if has("<|user|>") && has("<|endoftext|>") {
        "zephyr"
    } else if has("bos_token + message['role']") {
        "monarch"
    } else if has("<start_of_turn>") {
        "gemma"
    } else if has("'\\n\\nAssistant: ' + eos_token") {
        "orion"
    } else if has("GPT4 Correct ") {
        "openchat"
    } else if has("USER: ") && has("ASSISTANT: ") {
        if has("SYSTEM: ") {
            "vicuna-orca"
        } else {
            "vicuna"
        }
    } else if has("### Instruction:") && has("<|EOT|>") {
        "deepseek"
    } else if has("<|START_OF_TURN_TOKEN|>") && has("<|USER_TOKEN|>") {
        "command-r"
    } else if has("<|start_header_id|>") && has("<|end_header_id|>") {
        "llama3"
    } else if has("[gMASK]sop") {
        "chatglm3"
    } else if has("<用户>") {
        "minicpm"
    } else if has("'Assistant: ' + message['content'] + eos_token") {
        "deepseek2"
    } else if has("<\u{ff5c}Assistant\u{ff5c}>")
        && has("<\u{ff5c}User\u{ff5c}>")
        && has("<\u{ff5c}end\u{2581}of\u{2581}sentence\u{ff5c}>")
    {
        "deepseek3"
    } else if has("[|system|]") && has("[|assistant|]") && has("[|endofturn|]") {
        if has("[|tool|]") {
            "exaone4"
        } else {
            "exaone3"
        }
    } else if has("rwkv-world") || has("{{- 'User: ' + message['content']|trim + '\\n\\n' -}}") {
        "rwkv-world"
    } else if has("<|start_of_role|>") {
        if has("<tool_call>") || has("<tools>") {
            if has("g4_default_system_message") {
                "granite-4.0"
            } else {
                "granite-4.1"
            }
        } else {
            "granite"
        }
    } else if has("message['role'] + additional_special_tokens[0] + message['content'] + additional_special_tokens[1]") {
        "gigachat"
    } else if has("<|role_start|>") {
        "megrez"
    } else if has(" Ассистент:") {
        "yandex"
    } else if has("<role>ASSISTANT</role>") && has("'HUMAN'") {
        "bailing"
    } else if has("<role>ASSISTANT</role>") && has("\"HUMAN\"") && has("<think>") {
        "bailing-think"
    } else if has("<role>ASSISTANT</role>") && has("<role>HUMAN</role>") && has("<|role_end|>") {
        "bailing2"
    } else if has("<|header_start|>") && has("<|header_end|>") {
        "llama4"
    } else if has("<|endofuserprompt|>") {
        "dots1"
    } else if has("<|extra_0|>") && has("<|extra_4|>") {
        "hunyuan-moe"
    } else if has("<|start|>") && has("<|channel|>") {
        "gpt-oss"
    } else if has("<\u{ff5c}hy_Assistant\u{ff5c}>") && has("<\u{ff5c}hy_begin\u{2581}of\u{2581}sentence\u{ff5c}>") {
        "hunyuan-vl"
    } else if has("<\u{ff5c}hy_Assistant\u{ff5c}>") && has("<\u{ff5c}hy_place\u{2581}holder\u{2581}no\u{2581}3\u{ff5c}>") {
        "hunyuan-dense"
    } else if has("<|im_assistant|>assistant<|im_middle|>") {
        "kimi-k2"
    } else if has("<seed:bos>") {
        "seed_oss"
    } else if has("'Assistant: '  + message['content'] + '<|separator|>") {
        "grok-2"
    } else if has("[unused9]系统：[unused10]") {
        "pangu-embedded"
    } else if has("<|begin|>") && has("<|end|>") && has("<|content|>") {
        "solar-open"
    } else {
        return None;
    };
    Some(name)
}

/// The implemented built-in format for a model: detected from its template source when it has
/// one (llama.cpp's detection), else chosen by architecture. `None` when a template is present
/// but llama.cpp would pick a format this crate does not implement, or none at all.
pub fn detect_builtin(arch: &str, template: Option<&str>) -> Option<BuiltinFormat> {
    match template {
        Some(t) if !t.is_empty() => detect_llama_cpp_name(t).and_then(BuiltinFormat::from_name),
        _ => Some(BuiltinFormat::for_architecture(arch)),
    }
}

/// Flattens OpenAI-style messages to llama.cpp's `(role, content)` pairs: text parts of a list
/// content are joined with "\n" after any string content, as `common_chat_templates_apply_legacy`.
pub(super) fn flatten_messages(
    messages: &[serde_json::Value],
) -> Result<Vec<(String, String)>, TemplateError> {
    use serde_json::Value;
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let obj = m.as_object().ok_or_else(|| {
            TemplateError::InvalidMessage(format!("message {i} is not an object"))
        })?;
        let role = obj.get("role").and_then(Value::as_str).ok_or_else(|| {
            TemplateError::InvalidMessage(format!("message {i} has no string role"))
        })?;
        let mut content = String::new();
        match obj.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => content.push_str(s),
            Some(Value::Array(parts)) => {
                for part in parts {
                    let ty = part.get("type").and_then(Value::as_str).unwrap_or("");
                    if ty != "text" {
                        continue;
                    }
                    if !content.is_empty() {
                        content.push('\n');
                    }
                    content.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
                }
            }
            Some(_) => {
                return Err(TemplateError::InvalidMessage(format!(
                    "message {i} content is neither a string nor a list of parts"
                )))
            }
        }
        out.push((role.to_string(), content));
    }
    Ok(out)
}
