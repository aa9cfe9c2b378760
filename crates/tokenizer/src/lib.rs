//! neagari-tokenizer
