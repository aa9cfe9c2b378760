//! Structured output: a JSON Schema (or "any JSON object") compiled by llguidance into a
//! parser that, at every step, gives the set of tokens that keep the output valid. The worker
//! sets every other logit to -inf before sampling and feeds each sampled token back.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use neagari_tokenizer::Tokenizer;

/// A token mask that follows the sampled tokens.
pub trait Constraint: Send {
    /// Sets the logits of tokens the constraint forbids now to -inf.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String>;
    /// Records the sampled token; `true` when the constraint is complete.
    fn commit(&mut self, token: u32) -> Result<bool, String>;
}

/// The vocabulary as llguidance sees it: each token's bytes, special tokens marked.
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tok.encode_bytes(s, false, false)
    }
}

/// Builds the llguidance parser factory for `tok` (walks the vocabulary once).
pub fn factory(tok: Arc<Tokenizer>) -> Result<Arc<ParserFactory>, String> {
    let n = tok.n_vocab();
    let eos = tok
        .eot()
        .or(tok.eos())
        .ok_or("the tokenizer has no end-of-sequence token")?;
    let mut info = TokRxInfo::new(n as u32, eos);
    info.tok_bos = tok.bos();
    info.tok_pad = tok.pad();
    info.tok_unk = tok.unk();
    info.tok_end_of_turn = tok.eot();
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| {
            if tok.is_control(id) || tok.is_eog(id) {
                // Special tokens: 0xff + their text, so no grammar matches them as text.
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(&tok.token_to_piece(id, true));
                w
            } else {
                tok.token_to_piece(id, false)
            }
        })
        .collect();
    let trie = TokTrie::from(&info, &words);
    let env: TokEnv = Arc::new(Env { trie, tok });
    let mut f = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
    f.quiet();
    Ok(Arc::new(f))
}

/// What a request asks the output to be.
#[derive(Debug, Clone)]
pub enum OutputFormat {
    JsonObject,
    JsonSchema(serde_json::Value),
    /// A Lark grammar (tool calls forced by `tool_choice`).
    Lark(String),
}

/// Single-line JSON with `, ` and `: ` separators unless the schema says otherwise: with
/// free whitespace a small model can emit blank lines until it runs out of tokens.
pub fn compact(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(o) = schema.as_object_mut() {
        o.entry("x-guidance").or_insert_with(|| {
            serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
        });
    }
    schema
}

pub struct Guided {
    m: Matcher,
}

/// Compiles `format`; the error says why a schema cannot be enforced.
pub fn compile(f: &ParserFactory, format: &OutputFormat) -> Result<Guided, String> {
    let g = match format {
        OutputFormat::JsonObject => {
            TopLevelGrammar::from_json_schema(compact(serde_json::json!({"type": "object"})))
        }
        OutputFormat::JsonSchema(s) => TopLevelGrammar::from_json_schema(compact(s.clone())),
        OutputFormat::Lark(s) => TopLevelGrammar::from_lark(s.clone()),
    };
    let parser = f.create_parser(g).map_err(|e| e.to_string())?;
    let m = Matcher::new(Ok(parser));
    if let Some(e) = m.get_error() {
        return Err(e);
    }
    Ok(Guided { m })
}

impl Constraint for Guided {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let mask = self
            .m
            .compute_mask_or_eos()
            .map_err(|e| format!("structured output: {e}"))?;
        for (i, l) in logits.iter_mut().enumerate() {
            if !mask.is_allowed(i as TokenId) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<bool, String> {
        if self.m.is_stopped() {
            return Ok(true);
        }
        self.m
            .consume_token(token)
            .map_err(|e| format!("structured output: {e}"))?;
        Ok(self.m.is_stopped())
    }
}
