//! neagari-tokenizer
pub mod chat_template;
