//! Which ggml type each tensor gets: llama.cpp's file types (`llama_ftype`) and its
//! per-tensor rules (`src/llama-quant.cpp`: `tensor_allows_quantization`,
//! `llama_tensor_get_type_impl`, `tensor_type_fallback`), so that `neagari quantize -t Q4_K_M`
//! picks the same mixture as `llama-quantize … Q4_K_M`. Facts read from llama.cpp
//! 0c1e570 (the one vendored by llama-cpp-python 0.3.36); the code is ours.
//!
//! Only the rules that need no importance matrix are reachable: neagari has no imatrix
//! input, so `has_imatrix` is always false here.

use neagari_quant::GgmlType;

/// A named mixture, `llama_ftype` in llama.h; `id()` is what `general.file_type` stores.
#[allow(non_camel_case_types)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q1_0,
    Q2_0,
    Q2_K,
    Q2_K_S,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ2_M,
    IQ3_XS,
    IQ3_XXS,
    IQ3_S,
    IQ3_M,
    IQ1_S,
    IQ1_M,
    IQ4_NL,
    IQ4_XS,
    TQ1_0,
    TQ2_0,
}

/// (name, file type, llama_ftype id, default tensor type) — llama.h's enum and
/// `llama_ftype_get_default_type`.
const TABLE: &[(&str, FileType, u32, GgmlType)] = &[
    ("F32", FileType::F32, 0, GgmlType::F32),
    ("F16", FileType::F16, 1, GgmlType::F16),
    ("Q4_0", FileType::Q4_0, 2, GgmlType::Q4_0),
    ("Q4_1", FileType::Q4_1, 3, GgmlType::Q4_1),
    ("Q8_0", FileType::Q8_0, 7, GgmlType::Q8_0),
    ("Q5_0", FileType::Q5_0, 8, GgmlType::Q5_0),
    ("Q5_1", FileType::Q5_1, 9, GgmlType::Q5_1),
    ("Q2_K", FileType::Q2_K, 10, GgmlType::Q2_K),
    ("Q3_K_S", FileType::Q3_K_S, 11, GgmlType::Q3_K),
    ("Q3_K_M", FileType::Q3_K_M, 12, GgmlType::Q3_K),
    ("Q3_K_L", FileType::Q3_K_L, 13, GgmlType::Q3_K),
    ("Q4_K_S", FileType::Q4_K_S, 14, GgmlType::Q4_K),
    ("Q4_K_M", FileType::Q4_K_M, 15, GgmlType::Q4_K),
    ("Q5_K_S", FileType::Q5_K_S, 16, GgmlType::Q5_K),
    ("Q5_K_M", FileType::Q5_K_M, 17, GgmlType::Q5_K),
    ("Q6_K", FileType::Q6_K, 18, GgmlType::Q6_K),
    ("IQ2_XXS", FileType::IQ2_XXS, 19, GgmlType::IQ2_XXS),
    ("IQ2_XS", FileType::IQ2_XS, 20, GgmlType::IQ2_XS),
    ("Q2_K_S", FileType::Q2_K_S, 21, GgmlType::Q2_K),
    ("IQ3_XS", FileType::IQ3_XS, 22, GgmlType::IQ3_S),
    ("IQ3_XXS", FileType::IQ3_XXS, 23, GgmlType::IQ3_XXS),
    ("IQ1_S", FileType::IQ1_S, 24, GgmlType::IQ1_S),
    ("IQ4_NL", FileType::IQ4_NL, 25, GgmlType::IQ4_NL),
    ("IQ3_S", FileType::IQ3_S, 26, GgmlType::IQ3_S),
    ("IQ3_M", FileType::IQ3_M, 27, GgmlType::IQ3_S),
    ("IQ2_S", FileType::IQ2_S, 28, GgmlType::IQ2_XS),
    ("IQ2_M", FileType::IQ2_M, 29, GgmlType::IQ2_S),
    ("IQ4_XS", FileType::IQ4_XS, 30, GgmlType::IQ4_XS),
    ("IQ1_M", FileType::IQ1_M, 31, GgmlType::IQ1_M),
    ("BF16", FileType::BF16, 32, GgmlType::BF16),
    ("TQ1_0", FileType::TQ1_0, 36, GgmlType::TQ1_0),
    ("TQ2_0", FileType::TQ2_0, 37, GgmlType::TQ2_0),
    ("Q1_0", FileType::Q1_0, 40, GgmlType::Q1_0),
    ("Q2_0", FileType::Q2_0, 41, GgmlType::Q2_0),
];

/// llama-quantize's aliases: a bare K type names its `_M` mixture.
const ALIASES: &[(&str, FileType)] = &[
    ("Q3_K", FileType::Q3_K_M),
    ("Q4_K", FileType::Q4_K_M),
    ("Q5_K", FileType::Q5_K_M),
];

impl FileType {
    fn row(self) -> &'static (&'static str, FileType, u32, GgmlType) {
        // Every variant has exactly one row (checked by a test).
        TABLE.iter().find(|r| r.1 == self).unwrap_or(&TABLE[0])
    }

    /// Parses a name as llama-quantize spells it (case-insensitive), aliases included.
    pub fn parse(s: &str) -> Option<Self> {
        let up = s.to_ascii_uppercase();
        TABLE
            .iter()
            .find(|r| r.0 == up)
            .map(|r| r.1)
            .or_else(|| ALIASES.iter().find(|a| a.0 == up).map(|a| a.1))
    }

    pub fn name(self) -> &'static str {
        self.row().0
    }

    /// The `llama_ftype` value written to `general.file_type`.
    pub fn id(self) -> u32 {
        self.row().2
    }

    /// The type of a tensor the mixture's rules leave alone.
    pub fn default_type(self) -> GgmlType {
        self.row().3
    }

    /// Every accepted name, for help and error messages.
    pub fn names() -> Vec<&'static str> {
        TABLE
            .iter()
            .map(|r| r.0)
            .chain(ALIASES.iter().map(|a| a.0))
            .collect()
    }
}

impl std::fmt::Display for FileType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the rules need to know about the model (llama.cpp reads them from its hparams).
#[derive(Clone, Debug, Default)]
pub struct ModelFacts {
    pub arch: String,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub n_expert: usize,
}

impl ModelFacts {
    fn n_gqa(&self) -> usize {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// llama.cpp's LLM_TYPE_70B: an 80-layer llama with grouped KV heads.
    fn is_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer == 80 && self.n_head != self.n_head_kv
    }

    fn is_falcon(&self) -> bool {
        self.arch == "falcon"
    }
}

/// User choices that steer the rules (`llama_model_quantize_params`).
#[derive(Clone, Debug)]
pub struct TypeParams {
    pub ftype: FileType,
    /// `--output-tensor-type`: the type of `output.weight` (and a tied `token_embd`).
    pub output_type: Option<GgmlType>,
    /// `--token-embedding-type`.
    pub embd_type: Option<GgmlType>,
    /// `--pure`: every quantizable tensor gets the default type (fallbacks still apply).
    pub pure: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        return Output;
    }
    if is_token_embd(name) {
        return TokenEmbd;
    }
    let has = |s: &str| name.contains(s);
    if has("attn_qkv.weight") {
        AttnQkv
    } else if has("attn_kv_b.weight") {
        AttnKvB
    } else if has("attn_v.weight") {
        AttnV
    } else if has("attn_k.weight") {
        AttnK
    } else if has("attn_q.weight") {
        AttnQ
    } else if has("attn_output.weight") {
        AttnOutput
    } else if has("ffn_up") {
        FfnUp
    } else if has("ffn_gate") {
        FfnGate
    } else if has("ffn_down") {
        FfnDown
    } else {
        Other
    }
}

fn is_token_embd(name: &str) -> bool {
    name == "token_embd.weight" || name == "per_layer_token_embd.weight"
}

fn is_attn_v(c: Category) -> bool {
    matches!(c, Category::AttnV | Category::AttnQkv | Category::AttnKvB)
}

/// ggml_n_dims: dimensions up to the last one larger than 1 (at least 1).
fn n_dims(dims: &[u64]) -> usize {
    dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1)
}

/// Whether llama.cpp would quantize this tensor at all: 2-D and 3-D `*weight` tensors,
/// minus norms, routers and the small tensors its list names.
pub fn allows_quantization(name: &str, dims: &[u64]) -> bool {
    if n_dims(dims) < 2 || !name.ends_with("weight") {
        return false;
    }
    const NEVER: &[&str] = &[
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    if NEVER.iter().any(|s| name.contains(s)) {
        return false;
    }
    // Positional embeddings and BERT token types keep their type.
    name != "position_embd.weight" && name != "token_types.weight"
}

/// `tensor_type_fallback`: a row width that is not a whole number of the target's blocks
/// moves to a 32-wide type, and to F16 when even that does not fit. Returns the type and
/// whether a fallback happened.
pub fn fallback(ncols: u64, target: GgmlType) -> (GgmlType, bool) {
    use GgmlType::*;
    let block = target.info().block as u64;
    if ncols.is_multiple_of(block) {
        return (target, false);
    }
    let mut t = match target {
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_0 | Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        // 32-wide types go straight to the F16 check below. For a wider type without an
        // entry (Q1_0, 128) llama.cpp stops with "no tensor type fallback"; we store such
        // rows as F16 instead, which llama.cpp reads as well.
        other => other,
    };
    if !ncols.is_multiple_of(t.info().block as u64) {
        t = F16;
    }
    (t, true)
}

/// Walks the tensors in llama.cpp's order and decides each one's type; keeps the layer
/// counters llama.cpp keeps (`i_attention_wv`, `i_ffn_*`).
pub struct TypeChooser<'a> {
    facts: &'a ModelFacts,
    params: &'a TypeParams,
    n_attention_wv: usize,
    i_attention_wv: usize,
    i_ffn_down: usize,
    i_ffn_gate: usize,
    i_ffn_up: usize,
    tied_embeddings: bool,
    /// Tensors that needed a fallback type so far.
    pub n_fallback: usize,
}

impl<'a> TypeChooser<'a> {
    /// `names`: every tensor of the model (to count attn_v tensors and see whether the
    /// output head is tied to the embeddings).
    pub fn new<'n>(
        facts: &'a ModelFacts,
        params: &'a TypeParams,
        names: impl IntoIterator<Item = &'n str>,
    ) -> Self {
        let mut n_attention_wv = 0;
        let mut tied = true;
        for n in names {
            let c = category(n);
            if is_attn_v(c) {
                n_attention_wv += 1;
            }
            if c == Category::Output {
                tied = false;
            }
        }
        TypeChooser {
            facts,
            params,
            n_attention_wv,
            i_attention_wv: 0,
            i_ffn_down: 0,
            i_ffn_gate: 0,
            i_ffn_up: 0,
            tied_embeddings: tied,
            n_fallback: 0,
        }
    }

    /// `llama_tensor_get_type`; call once per tensor, in llama.cpp's order.
    pub fn choose(&mut self, name: &str, dims: &[u64], cur: GgmlType) -> GgmlType {
        if !allows_quantization(name, dims) {
            return cur;
        }
        let cat = category(name);
        let ncols = dims.first().copied().unwrap_or(1);
        // llama.cpp returns explicit embedding/output types without a fallback check (and
        // would then fail); we still apply the fallback so the row fits its blocks.
        if let (Some(t), Category::TokenEmbd) = (self.params.embd_type, cat) {
            return self.fall_back(ncols, t);
        }
        if let (Some(t), Category::Output) = (self.params.output_type, cat) {
            return self.fall_back(ncols, t);
        }
        let default = self.params.ftype.default_type();
        if default.info().block == 1 {
            // F32/F16/BF16 targets: no mixture, no fallback.
            return default;
        }
        let t = if self.params.pure {
            default
        } else {
            self.mixture(name, ncols, default, cat)
        };
        self.fall_back(ncols, t)
    }

    fn fall_back(&mut self, ncols: u64, t: GgmlType) -> GgmlType {
        let (t, fell) = fallback(ncols, t);
        self.n_fallback += usize::from(fell);
        t
    }

    /// Layer index of a FFN tensor: the counter, or the name's `blk.N.` with experts.
    fn layer(&self, counter: usize, name: &str) -> usize {
        if self.facts.n_expert > 1 {
            if let Some(n) = name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|s| s.parse().ok())
            {
                return n;
            }
        }
        counter
    }

    /// `llama_tensor_get_type_impl`, branch for branch.
    fn mixture(&mut self, name: &str, ncols: u64, default: GgmlType, cat: Category) -> GgmlType {
        use FileType as F;
        use GgmlType as G;
        let ft = self.params.ftype;
        let f = self.facts;
        let mut t = default;
        let use_more_bits = |i: usize, n: usize| {
            i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2
        };
        let n_layer = f.n_layer;
        let iq_low = matches!(
            ft,
            F::IQ2_XXS | F::IQ2_XS | F::IQ3_XXS | F::IQ1_S | F::IQ2_S | F::IQ2_M | F::IQ1_M
        );

        if cat == Category::Output || (self.tied_embeddings && cat == Category::TokenEmbd) {
            if let Some(o) = self.params.output_type {
                t = o;
            } else if f.is_falcon() || !ncols.is_multiple_of(default.info().block as u64) {
                t = G::Q8_0;
            } else if iq_low {
                t = G::Q5_K;
            } else if t != G::Q8_0 {
                t = G::Q6_K;
            }
        } else if cat == Category::TokenEmbd {
            if matches!(ft, F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ1_M) {
                t = G::Q2_K;
            } else if matches!(ft, F::IQ2_S | F::IQ2_M | F::IQ3_XXS) {
                t = G::IQ3_S;
            } else if matches!(ft, F::TQ1_0 | F::TQ2_0 | F::Q2_0) {
                t = G::Q4_K;
            }
        } else if matches!(
            ft,
            F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ2_S | F::IQ2_M | F::IQ1_M
        ) {
            let s_or_m = matches!(ft, F::IQ2_S | F::IQ2_M);
            if is_attn_v(cat) {
                t = if f.n_gqa() >= 4 || f.n_expert >= 4 {
                    G::Q4_K
                } else if s_or_m {
                    G::IQ3_S
                } else {
                    G::Q2_K
                };
                self.i_attention_wv += 1;
            } else if f.n_expert == 8 && cat == Category::AttnK {
                t = G::Q4_K;
            } else if cat == Category::FfnDown {
                if self.i_ffn_down < n_layer / 8 {
                    t = if s_or_m { G::IQ3_S } else { G::Q2_K };
                }
                self.i_ffn_down += 1;
            } else if cat == Category::AttnOutput {
                if f.n_expert == 8 {
                    t = G::Q5_K;
                } else if matches!(ft, F::IQ1_S | F::IQ1_M) {
                    t = G::IQ2_XXS;
                } else if s_or_m {
                    t = G::IQ3_S;
                }
            }
        } else if is_attn_v(cat) {
            let gqa4 = f.n_gqa() >= 4;
            let i = self.i_attention_wv;
            match ft {
                F::Q2_K => t = if gqa4 { G::Q4_K } else { G::Q3_K },
                F::Q2_K_S if gqa4 => t = G::Q4_K,
                // Without an imatrix llama.cpp picks IQ3_S here.
                F::IQ3_XXS => t = if gqa4 { G::Q4_K } else { G::IQ3_S },
                F::IQ3_XS | F::IQ3_S if gqa4 => t = G::Q4_K,
                F::IQ3_M => t = G::Q4_K,
                F::Q3_K_M => t = if i < 2 { G::Q5_K } else { G::Q4_K },
                F::Q3_K_L => t = G::Q5_K,
                F::IQ4_NL | F::IQ4_XS if gqa4 => t = G::Q5_K,
                F::Q4_K_M | F::Q5_K_M if use_more_bits(i, self.n_attention_wv) => t = G::Q6_K,
                F::Q4_K_S if i < 4 => t = G::Q5_K,
                _ => {}
            }
            if f.is_70b() && matches!(t, G::Q3_K | G::Q4_K) {
                t = G::Q5_K;
            }
            if f.n_expert == 8 {
                t = G::Q8_0;
            }
            self.i_attention_wv += 1;
        } else if cat == Category::AttnK {
            if f.n_expert == 8 {
                t = G::Q8_0;
            } else if ft == F::IQ3_XS {
                t = G::IQ3_XXS;
            } else if ft == F::IQ3_XXS {
                t = G::IQ2_S;
            }
        } else if cat == Category::AttnQ {
            if ft == F::IQ3_XS {
                t = G::IQ3_XXS;
            } else if ft == F::IQ3_XXS {
                t = G::IQ2_S;
            }
        } else if cat == Category::FfnDown {
            let il = self.layer(self.i_ffn_down, name);
            let n = n_layer;
            let falcon = f.is_falcon();
            match ft {
                F::Q2_K => t = G::Q3_K,
                F::Q2_K_S if il < n / 8 => t = G::Q4_K,
                F::IQ3_XXS => t = if il < n / 8 { G::Q4_K } else { G::Q3_K },
                F::Q3_K_M => {
                    t = if il < n / 16 {
                        G::Q5_K
                    } else if !falcon || use_more_bits(il, n) {
                        G::Q4_K
                    } else {
                        G::Q3_K
                    }
                }
                F::IQ3_M if il < n / 8 || (f.n_expert == 8 && use_more_bits(il, n)) => t = G::Q4_K,
                F::Q3_K_L => t = if falcon { G::Q4_K } else { G::Q5_K },
                F::Q4_K_M => {
                    if falcon {
                        t = if il < n / 16 {
                            G::Q6_K
                        } else if use_more_bits(il, n) {
                            G::Q5_K
                        } else {
                            G::Q4_K
                        };
                    } else if use_more_bits(il, n) {
                        t = G::Q6_K;
                    }
                }
                F::IQ4_NL | F::IQ4_XS if il < n / 8 => t = G::Q5_K,
                F::Q5_K_M if use_more_bits(il, n) => t = G::Q6_K,
                F::Q4_K_S if !falcon && il < n / 8 => t = G::Q5_K,
                _ => {}
            }
            self.i_ffn_down += 1;
        } else if cat == Category::AttnOutput {
            if !f.is_falcon() {
                if f.n_expert == 8 {
                    if matches!(
                        ft,
                        F::Q2_K
                            | F::IQ3_XS
                            | F::IQ3_XXS
                            | F::Q3_K_S
                            | F::Q3_K_M
                            | F::IQ4_NL
                            | F::Q4_K_S
                            | F::Q4_K_M
                            | F::IQ3_S
                            | F::IQ3_M
                            | F::IQ4_XS
                    ) {
                        t = G::Q5_K;
                    }
                } else {
                    match ft {
                        F::Q2_K => t = G::Q3_K,
                        F::IQ3_XXS => t = G::IQ3_S,
                        F::Q3_K_M | F::IQ3_M => t = G::Q4_K,
                        F::Q3_K_L => t = G::Q5_K,
                        _ => {}
                    }
                }
            } else if ft == F::Q3_K_L {
                t = G::Q4_K;
            }
        } else if cat == Category::AttnQkv {
            match ft {
                F::Q3_K_M | F::Q3_K_L | F::IQ3_M => t = G::Q4_K,
                F::Q4_K_M => t = G::Q5_K,
                F::Q5_K_M => t = G::Q6_K,
                _ => {}
            }
        } else if cat == Category::FfnGate || cat == Category::FfnUp {
            let counter = if cat == Category::FfnGate {
                &mut self.i_ffn_gate
            } else {
                &mut self.i_ffn_up
            };
            let c = *counter;
            *counter += 1;
            let il = self.layer(c, name);
            if ft == F::IQ3_XS && il >= n_layer / 8 && il < 7 * n_layer / 8 {
                t = G::IQ3_XXS;
            }
        }
        t
    }
}

/// llama.cpp's tensor order (`weight_name_comparer`): tensors outside `blk.N.` first, then
/// by layer number, then by name.
pub fn llama_cpp_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn layer(n: &str) -> i64 {
        n.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1)
    }
    layer(a).cmp(&layer(b)).then_with(|| a.cmp(b))
}

/// Whether `--type` names a mixture whose tensors llama.cpp refuses to make without an
/// importance matrix (`tensor_requires_imatrix`), for the given tensor and target type.
pub fn requires_imatrix(name: &str, t: GgmlType, ft: FileType) -> bool {
    use GgmlType::*;
    if is_token_embd(name) || name == "output.weight" {
        return false;
    }
    match t {
        IQ3_XXS | IQ2_XXS | IQ2_XS | IQ2_S | IQ1_M | IQ1_S => true,
        Q2_K => ft == FileType::Q2_K_S,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_covers_every_file_type_once() {
        for r in TABLE {
            assert_eq!(TABLE.iter().filter(|o| o.1 == r.1).count(), 1, "{}", r.0);
            assert_eq!(FileType::parse(r.0), Some(r.1));
            assert_eq!(r.1.name(), r.0);
        }
        assert_eq!(FileType::parse("q4_k"), Some(FileType::Q4_K_M));
        assert_eq!(FileType::parse("Q4_K_X"), None);
    }

    #[test]
    fn fallback_follows_llama_cpp() {
        assert_eq!(fallback(256, GgmlType::Q4_K), (GgmlType::Q4_K, false));
        assert_eq!(fallback(320, GgmlType::Q4_K), (GgmlType::Q5_0, true));
        assert_eq!(fallback(320, GgmlType::Q6_K), (GgmlType::Q8_0, true));
        assert_eq!(fallback(320, GgmlType::Q2_K), (GgmlType::Q4_0, true));
        assert_eq!(fallback(320, GgmlType::IQ2_XS), (GgmlType::IQ4_NL, true));
        assert_eq!(fallback(48, GgmlType::Q4_K), (GgmlType::F16, true));
        assert_eq!(fallback(48, GgmlType::Q8_0), (GgmlType::F16, true));
    }

    #[test]
    fn norms_and_vectors_are_never_quantized() {
        assert!(!allows_quantization("blk.0.attn_norm.weight", &[64, 1]));
        assert!(!allows_quantization("blk.0.attn_q.bias", &[64]));
        assert!(!allows_quantization("blk.0.attn_q_norm.weight", &[32]));
        assert!(!allows_quantization("blk.0.ffn_gate_inp.weight", &[64, 8]));
        assert!(allows_quantization("blk.0.attn_q.weight", &[64, 64]));
    }

    #[test]
    fn order_puts_globals_first_then_layers_numerically() {
        let mut v = vec![
            "blk.10.a",
            "output.weight",
            "blk.2.b",
            "blk.2.a",
            "token_embd.weight",
        ];
        v.sort_by(|a, b| llama_cpp_order(a, b));
        assert_eq!(
            v,
            [
                "output.weight",
                "token_embd.weight",
                "blk.2.a",
                "blk.2.b",
                "blk.10.a"
            ]
        );
    }
}
