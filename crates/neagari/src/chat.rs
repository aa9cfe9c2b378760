//! `neagari chat`: an interactive conversation with the model's own chat template. The
//! session keeps its KV cache between turns, and each turn's prompt is the whole rendered
//! conversation, so only the part that differs from the cache is prefilled.

use std::io::{BufRead, Write};

use anyhow::{Context, Result};
use neagari_backend::Backend;
use neagari_engine::sampler::Sampler;
use serde_json::{json, Value};

use crate::generate::{generate, SampleArgs, Stats};
use crate::load::Loaded;

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: crate::ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// System prompt.
    #[arg(long)]
    pub system: Option<String>,
    /// Tokens per reply at most.
    #[arg(short = 'n', long = "n-predict", default_value_t = 1024)]
    pub n_predict: usize,
}

const HELP: &str = "commands: /new (forget the conversation), /system TEXT (set the system prompt and start over), /stats (last turn's timing), /exit";

pub fn run(a: &ChatArgs) -> Result<()> {
    crate::on_device!(a.model, true, run_on, a)
}

fn run_on<B: Backend>(l: Loaded<B>, a: &ChatArgs) -> Result<()> {
    let template = l
        .template
        .as_ref()
        .context("the model has no chat template and no built-in format is known")?;
    if l.template_builtin {
        eprintln!(
            "neagari: the file has no chat template; using the built-in format of its architecture"
        );
    }
    let mut sess = l.session(l.n_ctx)?;
    let mut sampler = Sampler::new(a.sample.config());
    let mut system = a.system.clone();
    let mut history: Vec<Value> = Vec::new();
    let mut last = Stats::default();
    eprintln!("{} loaded ({}). {HELP}", l.model.info().name, l.be.name());
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let _ = std::io::stderr().flush();
        let Some(line) = lines.next() else { break };
        let line = line?;
        let input = line.trim_end();
        if input.is_empty() {
            continue;
        }
        if let Some(cmd) = input.strip_prefix('/') {
            let (name, rest) = cmd.split_once(' ').unwrap_or((cmd, ""));
            match name {
                "exit" | "quit" => break,
                "new" => {
                    history.clear();
                    eprintln!("(new conversation)");
                }
                "system" => {
                    system = (!rest.trim().is_empty()).then(|| rest.trim().to_string());
                    history.clear();
                    eprintln!("(system prompt set; new conversation)");
                }
                "stats" => eprintln!("{}", last.line()),
                _ => eprintln!("unknown command /{name}. {HELP}"),
            }
            continue;
        }
        history.push(json!({"role": "user", "content": input}));
        let mut msgs = Vec::new();
        if let Some(s) = &system {
            msgs.push(json!({"role": "system", "content": s}));
        }
        msgs.extend(history.iter().cloned());
        let text = template.render(&msgs, None, true, &Default::default())?;
        let bos = l
            .tokenizer
            .bos()
            .map(|b| String::from_utf8_lossy(&l.tokenizer.token_to_piece(b, true)).into_owned());
        let add_special = !bos
            .as_deref()
            .is_some_and(|b| !b.is_empty() && text.starts_with(b));
        let prompt = l.tokenizer.encode(&text, add_special, true);
        if prompt.len() + 1 >= l.n_ctx {
            eprintln!("(the conversation has {} tokens and no longer fits the context of {}; /new to start over)", prompt.len(), l.n_ctx);
            history.pop();
            continue;
        }
        let mut out = std::io::stdout().lock();
        let mut reply = String::new();
        let (_, st) = generate(&l, &mut sess, &prompt, &mut sampler, a.n_predict, |s| {
            reply.push_str(s);
            let _ = out.write_all(s.as_bytes());
            let _ = out.flush();
        })?;
        let _ = writeln!(out);
        eprintln!("[{}]", st.line());
        last = st;
        history.push(json!({"role": "assistant", "content": reply}));
    }
    Ok(())
}
