//! `neagari inspect`: what a GGUF file holds, without loading the model.

use std::collections::BTreeMap;
use std::path::PathBuf;

use std::fmt::Write as _;

use anyhow::Result;
use neagari_formats::{Array, Value};

use crate::load::open_gguf;
use neagari_engine::loader::tokenizer_from_gguf;

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The GGUF file.
    pub file: PathBuf,
    /// List every tensor (default: the first 40 and a per-type summary).
    #[arg(long)]
    pub all: bool,
}

fn short(v: &Value) -> String {
    match v {
        Value::String(s) => {
            let one_line = s.replace('\n', "\\n");
            if one_line.chars().count() > 80 {
                format!(
                    "\"{}…\" ({} bytes)",
                    one_line.chars().take(77).collect::<String>(),
                    s.len()
                )
            } else {
                format!("\"{one_line}\"")
            }
        }
        Value::Array(a) => {
            let n = array_len(a);
            let head = match a {
                Array::String(s) => s
                    .iter()
                    .take(3)
                    .map(|x| format!("{x:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                Array::F32(x) => x
                    .iter()
                    .take(3)
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                Array::I32(x) => x
                    .iter()
                    .take(3)
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                Array::U32(x) => x
                    .iter()
                    .take(3)
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                Array::Bool(x) => x
                    .iter()
                    .take(3)
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                _ => String::new(),
            };
            format!(
                "{} [{n}] [{head}{}]",
                a.elem_type().name(),
                if n > 3 { ", …" } else { "" }
            )
        }
        Value::F32(f) => f.to_string(),
        Value::F64(f) => f.to_string(),
        Value::Bool(b) => b.to_string(),
        v => v.as_int().map(|i| i.to_string()).unwrap_or_default(),
    }
}

fn array_len(a: &Array) -> usize {
    match a {
        Array::U8(v) => v.len(),
        Array::I8(v) => v.len(),
        Array::U16(v) => v.len(),
        Array::I16(v) => v.len(),
        Array::U32(v) => v.len(),
        Array::I32(v) => v.len(),
        Array::F32(v) => v.len(),
        Array::Bool(v) => v.len(),
        Array::String(v) => v.len(),
        Array::Array(v) => v.len(),
        Array::U64(v) => v.len(),
        Array::I64(v) => v.len(),
        Array::F64(v) => v.len(),
    }
}

pub fn run(a: &InspectArgs) -> Result<()> {
    let g = open_gguf(&a.file)?;
    // Built whole, then written once: a closed pipe (`| head`) is not an error worth a panic.
    let mut o = String::new();
    writeln!(o, "file: {}", a.file.display()).ok();
    writeln!(
        o,
        "GGUF v{}, {} metadata keys, {} tensors, alignment {}, data at byte {}, {} bytes",
        g.version(),
        g.metadata().len(),
        g.tensors().len(),
        g.alignment(),
        g.data_offset(),
        g.file_size()
    )
    .ok();
    writeln!(o, "\nmetadata:").ok();
    for (k, v) in g.metadata().iter() {
        writeln!(o, "  {k:<48} {:<10} {}", v.type_desc(), short(v)).ok();
    }
    writeln!(o, "\ntensors:").ok();
    writeln!(
        o,
        "  {:<40} {:<8} {:<22} {:>12}",
        "name", "type", "shape (ne)", "bytes"
    )
    .ok();
    let mut by_type: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
    for (i, t) in g.tensors().iter().enumerate() {
        let e = by_type.entry(t.ty.name()).or_default();
        e.0 += 1;
        e.1 += t.n_bytes;
        if a.all || i < 40 {
            let shape = t
                .dims
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(" x ");
            writeln!(
                o,
                "  {:<40} {:<8} {:<22} {:>12}",
                t.name,
                t.ty.name(),
                shape,
                t.n_bytes
            )
            .ok();
        } else if i == 40 {
            writeln!(o, "  … {} more (--all lists them)", g.tensors().len() - 40).ok();
        }
    }
    writeln!(o, "\nby type:").ok();
    for (ty, (n, b)) in &by_type {
        writeln!(
            o,
            "  {ty:<8} {n:>5} tensors {:>10.2} MiB",
            *b as f64 / (1u64 << 20) as f64
        )
        .ok();
    }
    writeln!(o, "\ntokenizer:").ok();
    match tokenizer_from_gguf(&g) {
        Ok(t) => {
            let model = g
                .get("tokenizer.ggml.model")
                .and_then(|v| v.as_str())
                .unwrap_or("?");
            let pre = g
                .get("tokenizer.ggml.pre")
                .and_then(|v| v.as_str())
                .unwrap_or("-");
            writeln!(
                o,
                "  model {model}, pre {pre}, {} tokens, bos {:?}, eos {:?}, eot {:?}",
                t.n_vocab(),
                t.bos(),
                t.eos(),
                t.eot()
            )
            .ok();
        }
        Err(e) => {
            writeln!(o, "  unusable: {e:#}").ok();
        }
    }
    writeln!(o, "\nchat template:").ok();
    match g.get("tokenizer.chat_template").and_then(|v| v.as_str()) {
        Some(s) => writeln!(
            o,
            "  {} bytes, first line: {}",
            s.len(),
            s.lines().next().unwrap_or("")
        )
        .ok(),
        None => {
            let arch = g
                .get("general.architecture")
                .and_then(|v| v.as_str())
                .unwrap_or("");
            match neagari_tokenizer::chat_template::detect_builtin(arch, None) {
                Some(f) => writeln!(
                    o,
                    "  none in the file; the built-in '{}' format of its architecture applies",
                    f.name()
                )
                .ok(),
                None => writeln!(
                    o,
                    "  none in the file, and no built-in format for this architecture"
                )
                .ok(),
            }
        }
    };
    let _ = std::io::Write::write_all(&mut std::io::stdout().lock(), o.as_bytes());
    Ok(())
}
