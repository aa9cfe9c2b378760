//! Python's text forms of template values: `json.dumps` (for transformers' `tojson` filter)
//! and `str()` / `repr()` (what Jinja2 prints for `{{ value }}`).
//!
//! Facts from CPython's `json` encoder (separators, escaping, `ensure_ascii`, `allow_nan`) and
//! `float.__repr__` (shortest round-trip digits; exponent form when the decimal exponent is
//! below -4 or above 16).

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// `json.dumps` options that transformers' `tojson` forwards.
pub(super) struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line; `Some(s)`: newline plus `s` repeated per level.
    pub indent: Option<String>,
    pub item_sep: String,
    pub key_sep: String,
    pub sort_keys: bool,
}

impl DumpOptions {
    pub fn new(
        ensure_ascii: bool,
        indent: Option<String>,
        separators: Option<(String, String)>,
        sort_keys: bool,
    ) -> Self {
        // json.dumps: item separator "," when indenting, ", " otherwise.
        let (item_sep, key_sep) = separators.unwrap_or_else(|| {
            let item = if indent.is_some() { "," } else { ", " };
            (item.to_string(), ": ".to_string())
        });
        DumpOptions {
            ensure_ascii,
            indent,
            item_sep,
            key_sep,
            sort_keys,
        }
    }
}

fn unserializable(v: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!("Object of type {} is not JSON serializable", v.kind()),
    )
}

/// `json.dumps(value, ...)`.
pub(super) fn dumps(v: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let mut out = String::new();
    dump_into(&mut out, v, opts, 0)?;
    Ok(out)
}

fn newline_indent(out: &mut String, opts: &DumpOptions, level: usize) {
    if let Some(ind) = &opts.indent {
        out.push('\n');
        for _ in 0..level {
            out.push_str(ind);
        }
    }
}

fn dump_into(out: &mut String, v: &Value, opts: &DumpOptions, level: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number_text(v, true)?),
        ValueKind::String => json_string(out, v.as_str().unwrap_or(""), opts.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(out, opts, level + 1);
                dump_into(out, item, opts, level + 1)?;
            }
            newline_indent(out, opts, level);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in v.try_iter()? {
                let val = v.get_item(&key)?;
                entries.push((json_key(&key)?, val));
            }
            if opts.sort_keys {
                // Python sorts str keys by code point, which is UTF-8 byte order.
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (key, val)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&opts.item_sep);
                }
                newline_indent(out, opts, level + 1);
                json_string(out, key, opts.ensure_ascii);
                out.push_str(&opts.key_sep);
                dump_into(out, val, opts, level + 1)?;
            }
            newline_indent(out, opts, level);
            out.push('}');
        }
        _ => return Err(unserializable(v)),
    }
    Ok(())
}

/// A dict key as `json.dumps` writes it: str as is; numbers, bools and None converted.
fn json_key(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.as_str().unwrap_or("").to_string()),
        ValueKind::Bool => Ok(if k.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        ValueKind::Number => number_text(k, true),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "keys must be str, int, float, bool or None, not {}",
                k.kind()
            ),
        )),
    }
}

/// An integer as decimal, a float as Python's `repr` (`json` spells non-finite values
/// `NaN`/`Infinity`, `str()` spells them `nan`/`inf`).
fn number_text(v: &Value, json: bool) -> Result<String, Error> {
    if v.is_integer() {
        if let Ok(i) = i128::try_from(v.clone()) {
            return Ok(i.to_string());
        }
    }
    let f = f64::try_from(v.clone())?;
    Ok(float_repr(f, json))
}

/// Python's `repr(float)`.
pub(super) fn float_repr(f: f64, json: bool) -> String {
    if f.is_nan() {
        return if json { "NaN" } else { "nan" }.to_string();
    }
    if f.is_infinite() {
        let s = if json { "Infinity" } else { "inf" };
        return if f < 0.0 {
            format!("-{s}")
        } else {
            s.to_string()
        };
    }
    if f == 0.0 {
        return if f.is_sign_negative() { "-0.0" } else { "0.0" }.to_string();
    }
    // Rust's `{:e}` gives the shortest round-trip digits, as Python's repr does.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| c.is_ascii_digit()).collect();
    let sign = if f < 0.0 { "-" } else { "" };
    // Python's decpt is exp + 1; the exponent form is used when decpt <= -4 or decpt > 16.
    let decpt = exp + 1;
    if decpt <= -4 || decpt > 16 {
        let (first, rest) = digits.split_at(1);
        let mant = if rest.is_empty() {
            first.to_string()
        } else {
            format!("{first}.{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{mant}e{esign}{:02}", exp.abs());
    }
    let n = digits.len() as i32;
    let body = if decpt <= 0 {
        format!("0.{}{}", "0".repeat((-decpt) as usize), digits)
    } else if decpt >= n {
        format!("{}{}.0", digits, "0".repeat((decpt - n) as usize))
    } else {
        let (a, b) = digits.split_at(decpt as usize);
        format!("{a}.{b}")
    };
    format!("{sign}{body}")
}

/// A JSON string literal as CPython's encoder writes it.
fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c if ensure_ascii && !(' '..='~').contains(&c) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{:04x}", unit));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's `str(value)`, which Jinja2 prints for `{{ value }}`.
pub(super) fn py_str(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::String => out.push_str(v.as_str().unwrap_or("")),
        _ => py_repr(out, v),
    }
}

/// Python's `repr(value)` for the JSON-like values templates see.
fn py_repr(out: &mut String, v: &Value) {
    match v.kind() {
        ValueKind::Undefined => {}
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if v.is_true() { "True" } else { "False" }),
        ValueKind::Number => match number_text(v, false) {
            Ok(s) => out.push_str(&s),
            Err(_) => out.push_str(&v.to_string()),
        },
        ValueKind::String => repr_string(out, v.as_str().unwrap_or("")),
        // A MiniJinja iterable (e.g. the result of `list + list`) is a Python list.
        ValueKind::Seq | ValueKind::Iterable => {
            out.push('[');
            if let Ok(iter) = v.try_iter() {
                for (i, item) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &item);
                }
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            if let Ok(iter) = v.try_iter() {
                for (i, key) in iter.enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    py_repr(out, &key);
                    out.push_str(": ");
                    py_repr(out, &v.get_item(&key).unwrap_or_default());
                }
            }
            out.push('}');
        }
        // Objects without a Python counterpart print as MiniJinja shows them.
        _ => out.push_str(&v.to_string()),
    }
}

/// Python's `repr(str)`: single quotes unless the text has a single quote and no double one.
fn repr_string(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..=0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_matches_python_forms() {
        // Each right-hand side is CPython 3.11's repr() of the left-hand literal.
        let cases = [
            (1.0, "1.0"),
            (0.1, "0.1"),
            (2.5, "2.5"),
            (-3.25, "-3.25"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (1e100, "1e+100"),
            (-0.0, "-0.0"),
            (1.0 / 3.0, "0.3333333333333333"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f, false), want, "{f:e}");
        }
        assert_eq!(float_repr(f64::NAN, true), "NaN");
        assert_eq!(float_repr(f64::NEG_INFINITY, true), "-Infinity");
    }

    #[test]
    fn repr_quotes_like_python() {
        let mut s = String::new();
        py_str(
            &mut s,
            &Value::from_serialize(serde_json::json!(["a'b", "c", "d\"e'", 1, null, true])),
        );
        assert_eq!(s, r#"["a'b", 'c', 'd"e\'', 1, None, True]"#);
    }
}
