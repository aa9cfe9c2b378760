//! `neagari run`: complete one prompt (optionally wrapped in the chat template).

use std::io::Write;

use anyhow::{Context, Result};
use neagari_backend::Backend;
use neagari_engine::sampler::Sampler;
use serde_json::json;

use crate::generate::{generate, SampleArgs};
use crate::load::Loaded;

#[derive(clap::Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: crate::ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    /// The prompt.
    #[arg(short = 'p', long = "prompt")]
    pub prompt: String,
    /// Tokens to generate at most (-1: until the end of the context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    pub n_predict: i64,
    /// Apply the model's chat template to the prompt (a user turn).
    #[arg(long)]
    pub chat: bool,
    /// A system prompt for --chat.
    #[arg(long)]
    pub system: Option<String>,
    /// Print timing after the completion.
    #[arg(long, default_value_t = true)]
    pub stats: bool,
}

pub fn run(a: &RunArgs) -> Result<()> {
    crate::on_device!(a.model, a.chat, run_on, a)
}

fn run_on<B: Backend>(l: Loaded<B>, a: &RunArgs) -> Result<()> {
    let text = if a.chat {
        let t = l
            .template
            .as_ref()
            .context("the model has no chat template and no built-in format is known")?;
        if l.template_builtin {
            eprintln!("neagari: the file has no chat template; using the built-in format of its architecture");
        }
        let mut msgs = Vec::new();
        if let Some(s) = &a.system {
            msgs.push(json!({"role": "system", "content": s}));
        }
        msgs.push(json!({"role": "user", "content": a.prompt}));
        t.render(&msgs, None, true, &Default::default())?
    } else {
        a.prompt.clone()
    };
    // A chat template already writes BOS when the model wants it.
    let add_special = !a.chat || !text.starts_with(&bos_text(&l));
    let prompt = l.tokenizer.encode(&text, add_special, true);
    if prompt.len() >= l.n_ctx {
        anyhow::bail!(
            "the prompt has {} tokens but the context holds {} (raise --ctx-size)",
            prompt.len(),
            l.n_ctx
        );
    }
    let max = if a.n_predict < 0 {
        usize::MAX
    } else {
        a.n_predict as usize
    };
    let mut sess = l.session(l.n_ctx)?;
    let mut sampler = Sampler::new(a.sample.config());
    let mut stdout = std::io::stdout().lock();
    if !a.chat {
        let _ = write!(stdout, "{}", a.prompt);
    }
    let (_, st) = generate(&l, &mut sess, &prompt, &mut sampler, max, |s| {
        let _ = stdout.write_all(s.as_bytes());
        let _ = stdout.flush();
    })?;
    let _ = writeln!(stdout);
    if a.stats {
        eprintln!("\n[{}]", st.line());
    }
    Ok(())
}

fn bos_text<B: Backend>(l: &Loaded<B>) -> String {
    l.tokenizer
        .bos()
        .map(|b| String::from_utf8_lossy(&l.tokenizer.token_to_piece(b, true)).into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "\u{0}never".into())
}
