//! The parsers on outputs in the shape each model family produces (taken from the families'
//! chat-template documentation and their published tool-use examples), fed whole, in chunks
//! and character by character: the structured result must not depend on how text arrives.

use super::*;

#[derive(Debug, Default, PartialEq)]
struct Parsed {
    text: String,
    reasoning: String,
    calls: Vec<(String, Value)>,
    arg_pieces: usize,
}

fn cfg(names: &[&str]) -> ParserConfig {
    ParserConfig {
        tools: true,
        tool_names: names.iter().map(|s| s.to_string()).collect(),
        reasoning: true,
        start_in_reasoning: false,
    }
}

fn run_chunks(cfg: ParserConfig, chunks: &[&str]) -> Parsed {
    let mut p = ToolParser::new(cfg);
    let mut pieces = Vec::new();
    for c in chunks {
        pieces.extend(p.push(c));
    }
    pieces.extend(p.finish());
    let mut out = Parsed::default();
    let mut args: Vec<String> = Vec::new();
    let mut open: Option<usize> = None;
    for pc in pieces {
        match pc {
            Piece::Text(t) => out.text += &t,
            Piece::Reasoning(t) => out.reasoning += &t,
            Piece::CallStart { index, name } => {
                assert_eq!(index, out.calls.len(), "indices count up");
                assert!(open.is_none(), "a call started inside another");
                open = Some(index);
                out.calls.push((name, Value::Null));
                args.push(String::new());
            }
            Piece::CallArgs { index, delta } => {
                assert_eq!(Some(index), open);
                args[index] += &delta;
                out.arg_pieces += 1;
            }
            Piece::CallEnd { index } => {
                assert_eq!(Some(index), open);
                open = None;
            }
        }
    }
    assert!(open.is_none(), "a call was left open");
    for (i, a) in args.iter().enumerate() {
        out.calls[i].1 = serde_json::from_str(a).unwrap_or_else(|e| panic!("args {a:?}: {e}"));
    }
    out
}

/// Whole, in 7-byte chunks and one character at a time give the same result.
fn run_all_ways(cfg: ParserConfig, s: &str) -> Parsed {
    let whole = run_chunks(cfg.clone(), &[s]);
    let chars: Vec<String> = s.chars().map(|c| c.to_string()).collect();
    let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
    let mut by_char = run_chunks(cfg.clone(), &chars);
    let mut chunks = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let mut n = 7.min(rest.len());
        while !rest.is_char_boundary(n) {
            n += 1;
        }
        chunks.push(&rest[..n]);
        rest = &rest[n..];
    }
    let mut chunked = run_chunks(cfg, &chunks);
    let n = whole.arg_pieces;
    by_char.arg_pieces = n;
    chunked.arg_pieces = n;
    assert_eq!(whole, by_char, "char by char differs");
    assert_eq!(whole, chunked, "7-byte chunks differ");
    whole
}

#[test]
fn hermes_qwen25_call_after_text() {
    let s = "I'll look that up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris, France\", \"unit\": \"celsius\"}}\n</tool_call>";
    let p = run_all_ways(cfg(&["get_weather"]), s);
    assert_eq!(p.text, "I'll look that up.\n");
    assert_eq!(p.calls.len(), 1);
    assert_eq!(p.calls[0].0, "get_weather");
    assert_eq!(
        p.calls[0].1,
        serde_json::json!({"location": "Paris, France", "unit": "celsius"})
    );
}

#[test]
fn hermes_arguments_stream_before_the_call_closes() {
    let s = "<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.txt\", \"content\": \"line one\\nline two {with braces}\"}}\n</tool_call>";
    let chars: Vec<String> = s.chars().map(|c| c.to_string()).collect();
    let mut p = ToolParser::new(cfg(&["write_file"]));
    let close_at = s.find("</tool_call>").unwrap();
    let mut seen = 0;
    let mut args_before_close = String::new();
    for c in &chars {
        for pc in p.push(c) {
            if let Piece::CallArgs { delta, .. } = pc {
                if seen < close_at {
                    args_before_close += &delta;
                }
            }
        }
        seen += c.len();
    }
    // Everything but the held-back closing braces went out before `</tool_call>` arrived.
    assert!(
        args_before_close
            .starts_with("{\"path\": \"a.txt\", \"content\": \"line one\\nline two {with braces"),
        "{args_before_close}"
    );
}

#[test]
fn hermes_parallel_calls() {
    let s = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>";
    let p = run_all_ways(cfg(&["get_weather", "get_time"]), s);
    assert_eq!(p.calls.len(), 2);
    assert_eq!(p.calls[1].0, "get_time");
    assert_eq!(p.calls[1].1, serde_json::json!({"tz": "Europe/Paris"}));
    assert_eq!(p.text.trim(), "");
}

#[test]
fn hermes_string_encoded_arguments() {
    let s = "<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>";
    let p = run_all_ways(cfg(&["f"]), s);
    assert_eq!(
        p.calls,
        vec![("f".to_string(), serde_json::json!({"x": 1}))]
    );
}

#[test]
fn hermes_arguments_before_name() {
    let s = "<tool_call>\n{\"arguments\": {\"q\": \"rust\"}, \"name\": \"search\"}\n</tool_call>";
    let p = run_all_ways(cfg(&["search"]), s);
    assert_eq!(
        p.calls,
        vec![("search".to_string(), serde_json::json!({"q": "rust"}))]
    );
}

#[test]
fn qwen3_xml_call() {
    let s = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=location>\nSan Francisco, CA\n</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=options>\n{\"hourly\": true}\n</parameter>\n</function>\n</tool_call>";
    let p = run_all_ways(cfg(&["get_weather"]), s);
    assert_eq!(p.text, "Let me check.\n");
    assert_eq!(
        p.calls,
        vec![(
            "get_weather".to_string(),
            serde_json::json!({"location": "San Francisco, CA", "days": 3, "options": {"hourly": true}})
        )]
    );
    assert!(p.arg_pieces >= 3, "one piece per parameter at least");
}

#[test]
fn qwen3_xml_without_wrapper_and_without_parameters() {
    let s = "<function=list_files>\n</function>";
    let p = run_all_ways(cfg(&["list_files"]), s);
    assert_eq!(
        p.calls,
        vec![("list_files".to_string(), serde_json::json!({}))]
    );
    assert_eq!(p.text, "");
}

#[test]
fn llama3_bare_json_call() {
    let s = "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Tokyo\"}}";
    let p = run_all_ways(cfg(&["get_weather"]), s);
    assert_eq!(
        p.calls,
        vec![(
            "get_weather".to_string(),
            serde_json::json!({"location": "Tokyo"})
        )]
    );
    let s = "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Tokyo\"}}";
    assert_eq!(run_all_ways(cfg(&["get_weather"]), s).calls.len(), 1);
}

#[test]
fn bare_json_that_is_not_a_call_stays_text() {
    let s = "{\"name\": \"Alice\", \"age\": 30}";
    let p = run_all_ways(cfg(&["get_weather"]), s);
    assert_eq!(p.text, s);
    assert!(p.calls.is_empty());
    // A known name but an unknown tool is also text.
    let s = "{\"name\": \"Bob\", \"parameters\": {}}";
    let p = run_all_ways(cfg(&["get_weather"]), s);
    assert_eq!(p.text, s);
}

#[test]
fn gemma_tool_code_call() {
    let s =
        "```tool_code\nget_weather(location=\"London\", days=2, metric=True, tags=['a', 'b'])\n```";
    let p = run_all_ways(cfg(&["get_weather"]), s);
    assert_eq!(
        p.calls,
        vec![(
            "get_weather".to_string(),
            serde_json::json!({"location": "London", "days": 2, "metric": true, "tags": ["a", "b"]})
        )]
    );
    assert_eq!(p.text.trim(), "");
}

#[test]
fn thinking_then_call() {
    let s = "<think>\nThe user wants the weather; I should call the tool.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"Paris\"}}\n</tool_call>";
    let p = run_all_ways(cfg(&["get_weather"]), s);
    assert_eq!(
        p.reasoning,
        "\nThe user wants the weather; I should call the tool.\n"
    );
    assert_eq!(p.calls.len(), 1);
    assert_eq!(p.text.trim(), "");
}

#[test]
fn prompt_opened_thinking() {
    let mut c = cfg(&[]);
    c.start_in_reasoning = true;
    let p = run_all_ways(c, "hmm, 2+2 is 4.\n</think>\n\nThe answer is 4.");
    assert_eq!(p.reasoning, "hmm, 2+2 is 4.\n");
    assert_eq!(p.text, "The answer is 4.");
}

#[test]
fn malformed_call_becomes_text_not_a_dead_stream() {
    let s = "<tool_call>\n{\"name\": get_weather}\n</tool_call> ok";
    let p = run_all_ways(cfg(&["get_weather"]), s);
    assert!(p.calls.is_empty());
    assert_eq!(p.text, s);
}

#[test]
fn unclosed_call_at_end_of_stream_is_closed() {
    let s = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2]}}";
    let p = run_all_ways(cfg(&["f"]), s);
    assert_eq!(
        p.calls,
        vec![("f".to_string(), serde_json::json!({"a": [1, 2]}))]
    );
}

#[test]
fn angle_brackets_in_plain_text_are_not_swallowed() {
    let s = "if a < b and x <tool then <functional> code";
    let p = run_all_ways(cfg(&["f"]), s);
    assert_eq!(p.text, s);
    let mut c = cfg(&[]);
    c.tools = false;
    let s = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>";
    assert_eq!(run_all_ways(c, s).text, s);
}
