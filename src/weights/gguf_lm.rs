//! A text GGUF of llama.cpp's `deepseek4` architecture read as the language model: the config
//! from the `deepseek4.*` keys, the parameters under their official names (a [`ParamSource`]),
//! and the same two-way accounting as [`super::check_lm`], from headers only, before anything
//! is uploaded.
//!
//! The names are those llama.cpp's converter writes (`DeepseekV4Model._map_dsv4_tensor_name` in
//! `conversion/deepseek.py` with gguf-py's `TENSOR_NAMES`; `fixtures/gen/real/gguf_weights.py`
//! runs the same tables in Python). The converter's one re-layout is the routed experts: stacked
//! per layer as `blk.N.ffn_{gate,up,down}_exps` `[E, out, in]` for w1, w3, w2; expert `j` is the
//! row range `[j·out, (j+1)·out)`, borrowed from the map like any other matrix.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use serde_json::{Map, Value as Json, json};

use super::gguf::{GgmlType, Gguf, TensorInfo, Value};
use super::lm::{ExpectedLm, ValueKind, lm_manifest};
use crate::backend::{HostWeight, WeightFormat, decode_row};
use crate::config::LmConfig;
use crate::error::{Error, Result};
use crate::model::ParamSource;

/// `general.architecture` of a DeepSeek-V4 text GGUF.
pub const ARCH: &str = "deepseek4";
/// llama.cpp's `LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS` (src/llama-hparams.h).
const GATING_SQRT_SOFTPLUS: i128 = 4;

/// Plain integer keys: official config.json key → `deepseek4.` key (set_gguf_parameters of
/// `DeepseekV4Model` and the `TextModel` base it calls).
const INT_KEYS: [(&str, &str); 18] = [
    ("hidden_size", "embedding_length"),
    ("num_attention_heads", "attention.head_count"),
    ("head_dim", "attention.key_length"),
    ("qk_rope_head_dim", "rope.dimension_count"),
    ("q_lora_rank", "attention.q_lora_rank"),
    ("o_groups", "attention.output_group_count"),
    ("o_lora_rank", "attention.output_lora_rank"),
    ("n_routed_experts", "expert_count"),
    ("num_experts_per_tok", "expert_used_count"),
    ("n_shared_experts", "expert_shared_count"),
    ("moe_intermediate_size", "expert_feed_forward_length"),
    ("num_hash_layers", "hash_layer_count"),
    ("sliding_window", "attention.sliding_window"),
    ("index_n_heads", "attention.indexer.head_count"),
    ("index_head_dim", "attention.indexer.key_length"),
    ("index_topk", "attention.indexer.top_k"),
    ("hc_mult", "hyper_connection.count"),
    ("hc_sinkhorn_iters", "hyper_connection.sinkhorn_iterations"),
];

/// Plain float keys: official key → `deepseek4.` key.
const FLOAT_KEYS: [(&str, &str); 5] = [
    ("routed_scaling_factor", "expert_weights_scale"),
    ("compress_rope_theta", "attention.compress_rope_freq_base"),
    ("rope_theta", "rope.freq_base"),
    ("hc_eps", "hyper_connection.epsilon"),
    ("rms_norm_eps", "attention.layer_norm_rms_epsilon"),
];

/// The GGUF key an official config key was read from (for the messages of
/// [`LmConfig::from_value`]'s checks, which name official keys).
fn gguf_key_of(official: &str) -> String {
    let sub = match official {
        "num_hidden_layers" => "block_count",
        "compress_ratios" => "attention.compress_ratios",
        "swiglu_limit" => "swiglu_clamp_exp",
        "scoring_func" => "expert_gating_func",
        "vocab_size" => "vocab_size",
        "rope_scaling" | "rope_scaling.factor" => "rope.scaling.factor",
        "rope_scaling.original_max_position_embeddings" => "rope.scaling.original_context_length",
        "rope_scaling.beta_fast" => "rope.scaling.yarn_beta_fast",
        "rope_scaling.beta_slow" => "rope.scaling.yarn_beta_slow",
        k => match INT_KEYS.iter().chain(FLOAT_KEYS.iter()).find(|(o, _)| *o == k) {
            Some((_, g)) => g,
            None => return k.to_string(),
        },
    };
    format!("{ARCH}.{sub}")
}

/// Reads `deepseek4.*` keys with messages naming the key and the file.
struct Keys<'g> {
    g: &'g Gguf,
    file: &'g Path,
}

impl<'g> Keys<'g> {
    fn err(&self, key: &str, msg: impl fmt::Display) -> Error {
        Error::config(key, format!("{msg} (in {})", self.file.display()))
    }
    fn get(&self, key: &str) -> Result<Value<'g>> {
        self.g.kv(key).ok_or_else(|| self.err(key, "missing"))
    }
    fn uint(&self, key: &str) -> Result<u64> {
        let v = self.get(key)?;
        v.as_int()
            .and_then(|i| u64::try_from(i).ok())
            .ok_or_else(|| self.err(key, format!("is {}, expected a non-negative integer", v.describe())))
    }
    fn opt_uint(&self, key: &str) -> Result<Option<u64>> {
        if self.g.kv(key).is_none() { Ok(None) } else { self.uint(key).map(Some) }
    }
    /// A float key as the value the converter was given: it writes config.json's f64 as f32, and
    /// the shortest decimal that round-trips that f32 recovers any value of up to 7 significant
    /// digits exactly (1e-6 is stored as 9.9999999747e-7 and read back as 1e-6).
    fn float(&self, key: &str) -> Result<f64> {
        match self.get(key)? {
            Value::F32(x) => {
                Ok(x.to_string().parse::<f64>().map_err(|e| self.err(key, format!("f32 {x} does not parse: {e}")))?)
            }
            Value::F64(x) => Ok(x),
            v => Err(self.err(key, format!("is {}, expected a float", v.describe()))),
        }
    }
    fn uint_array(&self, key: &str) -> Result<Vec<u64>> {
        let v = self.get(key)?;
        let a = v.as_array().ok_or_else(|| self.err(key, format!("is {}, expected an array", v.describe())))?;
        // the array was bounds-checked against the file when it was opened
        a.iter()
            .enumerate()
            .map(|(i, e)| {
                e.as_int().and_then(|x| u64::try_from(x).ok()).ok_or_else(|| {
                    self.err(key, format!("entry {i} is {}, expected a non-negative integer", e.describe()))
                })
            })
            .collect()
    }
    fn float_array(&self, key: &str) -> Result<Vec<f64>> {
        let v = self.get(key)?;
        let a = v.as_array().ok_or_else(|| self.err(key, format!("is {}, expected an array", v.describe())))?;
        a.iter()
            .enumerate()
            .map(|(i, e)| match e {
                Value::F32(x) => x.to_string().parse::<f64>().map_err(|err| self.err(key, err)),
                Value::F64(x) => Ok(x),
                e => Err(self.err(key, format!("entry {i} is {}, expected a float", e.describe()))),
            })
            .collect()
    }
}

/// The language-model config of a `deepseek4` GGUF, every key validated by name; the checks of
/// [`LmConfig`] run on the result, their messages renamed to the GGUF key.
pub fn lm_config(g: &Gguf) -> Result<LmConfig> {
    let file = g.files()[0];
    let k = Keys { g, file };
    let key = |sub: &str| format!("{ARCH}.{sub}");
    let arch_key = "general.architecture";
    match k.get(arch_key)?.as_str() {
        Some(ARCH) => {}
        other => return Err(k.err(arch_key, format!("is {other:?}, expected \"{ARCH}\" (a DeepSeek-V4 text GGUF)"))),
    }
    let mut o = Map::new();
    for (official, sub) in INT_KEYS {
        o.insert(official.into(), json!(k.uint(&key(sub))?));
    }
    for (official, sub) in FLOAT_KEYS {
        o.insert(official.into(), json!(k.float(&key(sub))?));
    }
    // the MTP block, when exported, is counted in block_count (the converter's `mtp_only`)
    let blocks = k.uint(&key("block_count"))?;
    let nextn = k.opt_uint(&key("nextn_predict_layers"))?.unwrap_or(0);
    let layers = blocks
        .checked_sub(nextn)
        .ok_or_else(|| k.err(&key("nextn_predict_layers"), format!("{nextn} exceeds {ARCH}.block_count {blocks}")))?;
    o.insert("num_hidden_layers".into(), json!(layers));
    // llama.cpp takes the vocabulary size from the tokenizer unless the arch key is present
    let vocab = match k.opt_uint(&key("vocab_size"))? {
        Some(v) => v,
        None => {
            let t = "tokenizer.ggml.tokens";
            let v = k.get(t)?;
            v.as_array().ok_or_else(|| k.err(t, format!("is {}, expected an array", v.describe())))?.len() as u64
        }
    };
    o.insert("vocab_size".into(), json!(vocab));
    o.insert("compress_ratios".into(), json!(k.uint_array(&key("attention.compress_ratios"))?));
    let gating = key("expert_gating_func");
    let g_v = k.get(&gating)?;
    if g_v.as_int() != Some(GATING_SQRT_SOFTPLUS) {
        return Err(
            k.err(&gating, format!("is {}, only {GATING_SQRT_SOFTPLUS} (sqrt-softplus) is supported", g_v.describe()))
        );
    }
    o.insert("scoring_func".into(), json!("sqrtsoftplus"));
    let norm = key("expert_weights_norm");
    match k.get(&norm)?.as_bool() {
        Some(true) => {}
        _ => return Err(k.err(&norm, "must be true: the graph renormalises the top-k weights (norm_topk_prob)")),
    }
    // one clamp per layer for the routed and the shared experts; the graph has a single limit
    let (exp, shexp) = (key("swiglu_clamp_exp"), key("swiglu_clamp_shexp"));
    let clamps = k.float_array(&exp)?;
    let first = *clamps.first().ok_or_else(|| k.err(&exp, "is empty"))?;
    if let Some(i) = clamps.iter().position(|&c| c != first) {
        return Err(k.err(
            &exp,
            format!("entry {i} is {}, entry 0 is {first}: one limit for every layer is supported", clamps[i]),
        ));
    }
    if let Some(c) = k.float_array(&shexp)?.into_iter().find(|&c| c != first) {
        return Err(k.err(&shexp, format!("holds {c}, {exp} holds {first}: the graph uses one limit")));
    }
    o.insert("swiglu_limit".into(), json!(first));
    for (sub, want) in [("attention.head_count_kv", 1u64)] {
        let got = k.uint(&key(sub))?;
        if got != want {
            return Err(k.err(&key(sub), format!("is {got}, expected {want} (one shared K = V latent)")));
        }
    }
    let (kl, vl) = (k.uint(&key("attention.key_length"))?, k.uint(&key("attention.value_length"))?);
    if kl != vl {
        return Err(k.err(&key("attention.value_length"), format!("is {vl}, expected key_length {kl} (K = V)")));
    }
    let scaling = key("rope.scaling.type");
    match g.kv(&scaling) {
        None => {}
        Some(v) if v.as_str() == Some("none") => {}
        Some(v) if v.as_str() == Some("yarn") => {
            o.insert(
                "rope_scaling".into(),
                json!({
                    "type": "yarn",
                    "factor": k.float(&key("rope.scaling.factor"))?,
                    "original_max_position_embeddings": k.uint(&key("rope.scaling.original_context_length"))?,
                    "beta_fast": k.float(&key("rope.scaling.yarn_beta_fast"))?,
                    "beta_slow": k.float(&key("rope.scaling.yarn_beta_slow"))?,
                }),
            );
        }
        Some(v) => return Err(k.err(&scaling, format!("is {}, only \"yarn\" is supported", v.describe()))),
    }
    let cfg = LmConfig::from_value(&Json::Object(o)).map_err(|e| match e {
        Error::Config { key, msg } => k.err(&gguf_key_of(&key), msg),
        e => e,
    })?;
    if let Some(out) = k.opt_uint(&key("embedding_length_out"))?
        && Some(out) != (cfg.hidden_size as u64).checked_mul(cfg.hc_mult as u64)
    {
        return Err(k.err(&key("embedding_length_out"), format!("is {out}, expected hidden_size × hc_mult")));
    }
    Ok(cfg)
}

/// Where an official parameter lives in the GGUF: a tensor, and for a routed expert its index
/// in the stacked `[E, out, in]` tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufName {
    pub tensor: String,
    pub expert: Option<usize>,
}

/// Official suffixes under `layers.N.` → GGUF suffixes under `blk.N.`.
const LAYER_NAMES: [(&str, &str); 33] = [
    ("attn_norm.weight", "attn_norm.weight"),
    ("ffn_norm.weight", "ffn_norm.weight"),
    ("hc_attn_fn", "hc_attn_fn.weight"),
    ("hc_attn_base", "hc_attn_base.weight"),
    ("hc_attn_scale", "hc_attn_scale.weight"),
    ("hc_ffn_fn", "hc_ffn_fn.weight"),
    ("hc_ffn_base", "hc_ffn_base.weight"),
    ("hc_ffn_scale", "hc_ffn_scale.weight"),
    ("attn.attn_sink", "attn_sinks.weight"),
    ("attn.wq_a.weight", "attn_q_a.weight"),
    ("attn.q_norm.weight", "attn_q_a_norm.weight"),
    ("attn.wq_b.weight", "attn_q_b.weight"),
    ("attn.wkv.weight", "attn_kv.weight"),
    ("attn.kv_norm.weight", "attn_kv_a_norm.weight"),
    ("attn.wo_a.weight", "attn_output_a.weight"),
    ("attn.wo_b.weight", "attn_output_b.weight"),
    ("attn.compressor.wkv.weight", "attn_compressor_kv.weight"),
    ("attn.compressor.wgate.weight", "attn_compressor_gate.weight"),
    ("attn.compressor.ape", "attn_compressor_ape.weight"),
    ("attn.compressor.norm.weight", "attn_compressor_norm.weight"),
    ("attn.indexer.wq_b.weight", "indexer.attn_q_b.weight"),
    ("attn.indexer.weights_proj.weight", "indexer.proj.weight"),
    ("attn.indexer.compressor.wkv.weight", "indexer_compressor_kv.weight"),
    ("attn.indexer.compressor.wgate.weight", "indexer_compressor_gate.weight"),
    ("attn.indexer.compressor.ape", "indexer_compressor_ape.weight"),
    ("attn.indexer.compressor.norm.weight", "indexer_compressor_norm.weight"),
    ("ffn.gate.weight", "ffn_gate_inp.weight"),
    ("ffn.gate.bias", "exp_probs_b.bias"),
    ("ffn.gate.bias_vl", "exp_probs_b_vl.bias"),
    ("ffn.gate.tid2eid", "ffn_gate_tid2eid.weight"),
    ("ffn.shared_experts.w1.weight", "ffn_gate_shexp.weight"),
    ("ffn.shared_experts.w2.weight", "ffn_down_shexp.weight"),
    ("ffn.shared_experts.w3.weight", "ffn_up_shexp.weight"),
];

/// Routed experts `layers.N.ffn.experts.J.<official>` → the stacked `blk.N.<GGUF>` `[E, out, in]`.
const EXPERT_NAMES: [(&str, &str); 3] =
    [("w1.weight", "ffn_gate_exps.weight"), ("w2.weight", "ffn_down_exps.weight"), ("w3.weight", "ffn_up_exps.weight")];

/// Official names outside the layers → GGUF names.
const TOP_NAMES: [(&str, &str); 6] = [
    ("embed.weight", "token_embd.weight"),
    ("head.weight", "output.weight"),
    ("norm.weight", "output_norm.weight"),
    ("hc_head_fn", "output_hc_fn.weight"),
    ("hc_head_base", "output_hc_base.weight"),
    ("hc_head_scale", "output_hc_scale.weight"),
];

/// The GGUF tensor holding an official parameter, `None` for a name the converter does not
/// write (or not a language-model name).
pub fn gguf_name(official: &str) -> Option<GgufName> {
    let plain = |tensor: String| Some(GgufName { tensor, expert: None });
    if let Some((_, g)) = TOP_NAMES.iter().find(|(o, _)| *o == official) {
        return plain(g.to_string());
    }
    let rest = official.strip_prefix("layers.")?;
    let (n, suffix) = rest.split_once('.')?;
    let layer: usize = n.parse().ok().filter(|_| n.bytes().all(|b| b.is_ascii_digit()))?;
    if let Some(e) = suffix.strip_prefix("ffn.experts.") {
        let (j, w) = e.split_once('.')?;
        let expert: usize = j.parse().ok().filter(|_| j.bytes().all(|b| b.is_ascii_digit()))?;
        let (_, g) = EXPERT_NAMES.iter().find(|(o, _)| *o == w)?;
        return Some(GgufName { tensor: format!("blk.{layer}.{g}"), expert: Some(expert) });
    }
    let (_, g) = LAYER_NAMES.iter().find(|(o, _)| *o == suffix)?;
    plain(format!("blk.{layer}.{g}"))
}

/// A `deepseek4` GGUF as the language model's parameters under their official names.
pub struct GgufLm {
    gguf: Gguf,
    config: LmConfig,
}

impl fmt::Debug for GgufLm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufLm").field("gguf", &self.gguf).finish()
    }
}

impl GgufLm {
    /// Open a text GGUF (its only file or first shard) and read its config.
    pub fn open(path: &Path) -> Result<GgufLm> {
        let gguf = Gguf::open(path)?;
        let config = lm_config(&gguf)?;
        Ok(GgufLm { gguf, config })
    }

    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    pub fn config(&self) -> &LmConfig {
        &self.config
    }

    /// Bytes of the official parameter `official` in the file: its GGUF tensor's, or for a
    /// routed expert its share of the stacked tensor (every expert's rows are the same size).
    pub fn stored_bytes(&self, official: &str) -> Result<u64> {
        let (g, info, path, _) = self.locate(official)?;
        match (g.expert, info.shape().first()) {
            (None, _) => Ok(info.nbytes as u64),
            (Some(_), Some(&e)) if e > 0 => Ok((info.nbytes / e) as u64),
            (Some(_), _) => Err(refuse(official, &g, path, "an empty stack of experts")),
        }
    }

    /// The tensor of an official name with its file, or a refusal naming both names.
    fn locate(&self, official: &str) -> Result<(GgufName, &TensorInfo, &Path, &[u8])> {
        let g = gguf_name(official)
            .ok_or_else(|| Error::tensor(official, "not a parameter of a deepseek4 GGUF (no GGUF name maps to it)"))?;
        let (info, path) = self.gguf.tensor(&g.tensor).ok_or_else(|| {
            Error::tensor(official, format!("GGUF tensor `{}` is not in {}", g.tensor, self.gguf.files()[0].display()))
        })?;
        let data = self.gguf.data(&g.tensor).ok_or_else(|| Error::file(path, format!("no data for `{}`", g.tensor)))?;
        Ok((g, info, path, data))
    }
}

fn refuse(official: &str, g: &GgufName, path: &Path, msg: impl fmt::Display) -> Error {
    Error::tensor(official, format!("GGUF tensor `{}` in {}: {msg}", g.tensor, path.display()))
}

impl ParamSource for GgufLm {
    fn matrix(&self, name: &str) -> Result<HostWeight<'_>> {
        let (g, info, path, data) = self.locate(name)?;
        let GgmlType::Weight(format) = info.ty else {
            return Err(refuse(name, &g, path, format!("type {} is not a weight format", info.ty)));
        };
        let shape = info.shape();
        let (rows, cols, bytes) = match (g.expert, &shape[..]) {
            (None, &[rows, cols]) => (rows, cols, data),
            (Some(j), &[e, rows, cols]) if j < e => {
                // the reader checked the tensor's bytes = e · rows · row_bytes(cols)
                let per = rows * format.row_bytes(cols);
                (rows, cols, &data[j * per..(j + 1) * per])
            }
            (Some(j), &[e, _, _]) => {
                return Err(refuse(name, &g, path, format!("expert {j} of a stack of {e}")));
            }
            _ => {
                let want = if g.expert.is_some() { "[experts, out, in]" } else { "a 2-D matrix" };
                return Err(refuse(name, &g, path, format!("shape {shape:?}, expected {want}")));
            }
        };
        let w = HostWeight { name: name.to_string(), format, rows, cols, bytes: Cow::Borrowed(bytes) };
        w.validate()?;
        Ok(w)
    }

    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let (g, info, path, data) = self.locate(name)?;
        if g.expert.is_some() {
            return Err(refuse(name, &g, path, "a routed expert is a matrix"));
        }
        let GgmlType::Weight(format) = info.ty else {
            return Err(refuse(name, &g, path, format!("type {} is not a float type", info.ty)));
        };
        // row-local formats: decode each innermost row (the ape is Q8_0 in llama.cpp's mixes)
        let cols = *info.ne.first().ok_or_else(|| refuse(name, &g, path, "has no dimensions"))? as usize;
        let n = info.numel() as usize;
        format.check_cols(cols).map_err(|m| refuse(name, &g, path, m))?;
        let row_bytes = format.row_bytes(cols);
        if cols == 0 || n % cols != 0 || data.len() != (n / cols) * row_bytes {
            return Err(refuse(name, &g, path, format!("{} bytes for {n} {format} values", data.len())));
        }
        let mut out = vec![0f32; n];
        for (o, b) in out.chunks_exact_mut(cols).zip(data.chunks_exact(row_bytes)) {
            decode_row(format, b, o);
        }
        Ok(out)
    }

    fn integers(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let (g, info, path, data) = self.locate(name)?;
        let vals: Vec<i64> = match info.ty {
            GgmlType::I32 => {
                data.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect()
            }
            GgmlType::I64 => {
                data.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().expect("8-byte chunk"))).collect()
            }
            t => return Err(refuse(name, &g, path, format!("type {t} is not an integer type (accepted: I32, I64)"))),
        };
        Ok((info.shape(), vals))
    }

    fn has(&self, name: &str) -> bool {
        gguf_name(name).is_some_and(|g| self.gguf.tensor(&g.tensor).is_some())
    }
}

/// Result of a successful [`check_gguf_lm`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufLmAccounting {
    pub layers: usize,
    /// GGUF tensors the language model reads.
    pub tensors: usize,
    pub bytes: u64,
    /// Layers carrying `exp_probs_b_vl.bias`.
    pub bias_vl_layers: usize,
    /// MTP block tensors (`blk.N`, N ≥ the main layers): recognised and skipped.
    pub mtp_tensors: usize,
    pub mtp_bytes: u64,
}

impl fmt::Display for GgufLmAccounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "LM accounting (GGUF): OK, {} layers, {} tensors, {} bytes; exp_probs_b_vl on {} of {} layers",
            self.layers, self.tensors, self.bytes, self.bias_vl_layers, self.layers
        )?;
        write!(f, "  MTP block skipped: {} tensors, {} bytes", self.mtp_tensors, self.mtp_bytes)
    }
}

/// Vectors must be plain floats; matrices (and the 2-D `ape`) any row-local weight format.
fn type_ok(exp: &ExpectedLm, ty: GgmlType, cols: usize) -> bool {
    match (exp.kind, ty) {
        (ValueKind::Index, t) => matches!(t, GgmlType::I32 | GgmlType::I64),
        (ValueKind::Float, GgmlType::Weight(f)) if exp.shape.len() == 1 => {
            matches!(f, WeightFormat::F32 | WeightFormat::F16 | WeightFormat::BF16)
        }
        // the matrices the official release stores in FP8/FP4 take any block format here
        (ValueKind::Float | ValueKind::Fp8 | ValueKind::Expert, GgmlType::Weight(f)) => f.check_cols(cols).is_ok(),
        (ValueKind::Float | ValueKind::Fp8 | ValueKind::Expert, _) => false,
    }
}

/// The `blk.N.` layer of a GGUF name.
fn block_of(name: &str) -> Option<usize> {
    let rest = name.strip_prefix("blk.")?;
    let (n, _) = rest.split_once('.')?;
    n.parse().ok()
}

/// Every tensor of [`lm_manifest`] present with its shape and an accepted type, and every GGUF
/// tensor read by the model or an MTP block's (skipped); refusals name the file and the tensor.
pub fn check_gguf_lm(m: &GgufLm) -> Result<GgufLmAccounting> {
    let cfg = &m.config;
    let file = m.gguf.files()[0];
    // the manifest lists ~25 names per layer and 3 per routed expert and layer: bound both
    // counts (unchecked header values) by what the file holds before listing anything
    let stack = "blk.0.ffn_gate_exps.weight";
    let stacked = m.gguf.tensor(stack).and_then(|(t, _)| t.ne.get(2).copied());
    if cfg.num_hidden_layers > m.gguf.len() || stacked != Some(cfg.n_routed_experts as u64) {
        return Err(Error::tensor(
            stack,
            format!(
                "{} holds {} tensors and {stacked:?} experts in its first stack; its keys say {} layers of {} \
                 experts ({ARCH}.block_count, {ARCH}.expert_count)",
                file.display(),
                m.gguf.len(),
                cfg.num_hidden_layers,
                cfg.n_routed_experts
            ),
        ));
    }
    let mut problems: Vec<(String, String)> = Vec::new();
    let mut used: BTreeSet<String> = BTreeSet::new();
    // the stacked experts: one entry per GGUF tensor, with the per-expert shape
    let mut stacks: BTreeMap<String, (String, Vec<usize>)> = BTreeMap::new();
    let (mut tensors, mut bytes, mut bias_vl_layers) = (0usize, 0u64, 0usize);
    for exp in lm_manifest(cfg)? {
        let Some(g) = gguf_name(&exp.name) else {
            problems.push((exp.name.clone(), "no GGUF name maps to this parameter".into()));
            continue;
        };
        if g.expert.is_some() {
            stacks.entry(g.tensor).or_insert_with(|| (exp.name.clone(), exp.shape.clone()));
            continue;
        }
        let Some((info, path)) = m.gguf.tensor(&g.tensor) else {
            if exp.required {
                problems.push((
                    g.tensor.clone(),
                    format!("missing from {} (official `{}`, shape {:?})", file.display(), exp.name, exp.shape),
                ));
            }
            continue;
        };
        used.insert(g.tensor.clone());
        let shape = info.shape();
        if shape != exp.shape {
            problems.push((
                g.tensor.clone(),
                format!("wrong shape in {}: {shape:?}, expected {:?} (`{}`)", path.display(), exp.shape, exp.name),
            ));
            continue;
        }
        if !type_ok(&exp, info.ty, exp.shape.last().copied().unwrap_or(0)) {
            problems.push((
                g.tensor.clone(),
                format!("type {} not accepted for `{}` (shape {:?}) in {}", info.ty, exp.name, shape, path.display()),
            ));
            continue;
        }
        tensors += 1;
        bytes += info.nbytes as u64;
        bias_vl_layers += usize::from(exp.name.ends_with(".gate.bias_vl"));
    }
    for (tensor, (official, per)) in &stacks {
        let want: Vec<usize> = std::iter::once(cfg.n_routed_experts).chain(per.iter().copied()).collect();
        let Some((info, path)) = m.gguf.tensor(tensor) else {
            problems.push((tensor.clone(), format!("missing from {} (experts, e.g. `{official}`)", file.display())));
            continue;
        };
        used.insert(tensor.clone());
        let shape = info.shape();
        let ok_type = matches!(info.ty, GgmlType::Weight(f) if f.check_cols(per[1]).is_ok());
        if shape != want {
            problems.push((tensor.clone(), format!("wrong shape in {}: {shape:?}, expected {want:?}", path.display())));
        } else if !ok_type {
            problems.push((tensor.clone(), format!("type {} is not a weight format in {}", info.ty, path.display())));
        } else {
            tensors += 1;
            bytes += info.nbytes as u64;
        }
    }
    let (mut mtp_tensors, mut mtp_bytes) = (0usize, 0u64);
    for (info, path) in m.gguf.tensors() {
        if used.contains(&info.name) {
            continue;
        }
        if block_of(&info.name).is_some_and(|b| b >= cfg.num_hidden_layers)
            && m.gguf.kv(&format!("{ARCH}.nextn_predict_layers")).is_some()
        {
            mtp_tensors += 1;
            mtp_bytes += info.nbytes as u64;
            continue;
        }
        problems.push((
            info.name.clone(),
            format!(
                "unknown tensor in {} (shape {:?}, {}): not read by this language model ({} layers, compress_ratios {:?}, {} hash layers)",
                path.display(),
                info.shape(),
                info.ty,
                cfg.num_hidden_layers,
                cfg.compress_ratios,
                cfg.num_hash_layers
            ),
        ));
    }
    if let Some((name, msg)) = problems.first() {
        let more = &problems[1..];
        let msg = if more.is_empty() {
            msg.clone()
        } else {
            let names: Vec<String> = more.iter().take(4).map(|(n, _)| format!("`{n}`")).collect();
            format!(
                "{msg} (and {} more problem(s): {}{})",
                more.len(),
                names.join(", "),
                if more.len() > 4 { ", …" } else { "" }
            )
        };
        return Err(Error::tensor(name, msg));
    }
    Ok(GgufLmAccounting { layers: cfg.num_hidden_layers, tensors, bytes, bias_vl_layers, mtp_tensors, mtp_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIX_A: &str = "fixtures/models/vl-real-tiny-gguf/text-mix-a.gguf";
    const MXFP4: &str = "fixtures/models/vl-real-tiny-gguf/text-MXFP4_MOE.gguf";

    fn fixture(p: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join(p)
    }

    /// The GGUF keys give back every field of the config.json llama.cpp's converter read.
    #[test]
    fn config_from_keys_equals_config_json() {
        let want = LmConfig::from_file(&fixture("fixtures/models/vl-real-tiny/config.json")).unwrap();
        for f in [MIX_A, MXFP4] {
            let m = GgufLm::open(&fixture(f)).unwrap();
            assert_eq!(m.config(), &want, "{f}");
        }
    }

    /// The converter's table (printed by running `_map_dsv4_tensor_name` + `TENSOR_NAMES` over
    /// the fixture's official names), spot-checked in each group.
    #[test]
    fn official_names_map_to_the_converters() {
        let n = |o: &str| gguf_name(o).map(|g| (g.tensor, g.expert));
        assert_eq!(n("embed.weight"), Some(("token_embd.weight".into(), None)));
        assert_eq!(n("hc_head_fn"), Some(("output_hc_fn.weight".into(), None)));
        assert_eq!(n("layers.1.attn.kv_norm.weight"), Some(("blk.1.attn_kv_a_norm.weight".into(), None)));
        assert_eq!(n("layers.0.attn.indexer.wq_b.weight"), Some(("blk.0.indexer.attn_q_b.weight".into(), None)));
        assert_eq!(
            n("layers.0.attn.indexer.compressor.ape"),
            Some(("blk.0.indexer_compressor_ape.weight".into(), None))
        );
        assert_eq!(n("layers.0.ffn.gate.tid2eid"), Some(("blk.0.ffn_gate_tid2eid.weight".into(), None)));
        assert_eq!(n("layers.1.ffn.gate.bias_vl"), Some(("blk.1.exp_probs_b_vl.bias".into(), None)));
        assert_eq!(n("layers.12.ffn.experts.3.w3.weight"), Some(("blk.12.ffn_up_exps.weight".into(), Some(3))));
        assert_eq!(n("layers.1.ffn.experts.0.w2.weight"), Some(("blk.1.ffn_down_exps.weight".into(), Some(0))));
        assert_eq!(n("layers.x.attn_norm.weight"), None);
        assert_eq!(n("layers.1.ffn.experts.+1.w1.weight"), None);
        assert_eq!(n("vision.blocks.0.attn.wqkv.weight"), None);
    }

    /// Both fixtures close the accounting: 70 tensors each, all read (no MTP block).
    #[test]
    fn fixtures_account_for_every_tensor() {
        for f in [MIX_A, MXFP4] {
            let m = GgufLm::open(&fixture(f)).unwrap();
            let a = check_gguf_lm(&m).unwrap();
            assert_eq!(a.tensors, m.gguf().len(), "{f}");
            assert_eq!((a.layers, a.bias_vl_layers, a.mtp_tensors), (2, 2, 0), "{f}");
        }
    }

    /// Expert j is rows `[j·out, (j+1)·out)` of the stack, borrowed; vectors decode to f32.
    #[test]
    fn experts_are_borrowed_row_ranges() {
        let m = GgufLm::open(&fixture(MIX_A)).unwrap();
        let stack = m.gguf().data("blk.1.ffn_gate_exps.weight").unwrap();
        let per = stack.len() / 4;
        let w = m.matrix("layers.1.ffn.experts.2.w1.weight").unwrap();
        assert_eq!((w.format, w.rows, w.cols), (WeightFormat::IQ2_XXS, 256, 256));
        assert!(matches!(w.bytes, Cow::Borrowed(_)));
        assert_eq!(w.bytes.as_ptr(), stack[2 * per..].as_ptr());
        assert!(m.matrix("layers.1.ffn.experts.4.w1.weight").is_err());
        let (shape, ids) = m.integers("layers.0.ffn.gate.tid2eid").unwrap();
        assert_eq!(shape, [320, 2]);
        assert!(ids.iter().all(|&e| (0..4).contains(&e)));
        assert_eq!(m.vector("layers.0.attn.compressor.ape").unwrap().len(), 4 * 128);
        assert!(m.has("layers.1.ffn.gate.bias_vl") && !m.has("layers.0.ffn.gate.bias"));
    }
}

/// A GGUF pair as one parameter source: vision-side names (`vision.*`, `aligner.*`, the `image_*`
/// sentinels) from the mmproj, the rest from the text GGUF, as a Vision checkpoint holds both.
pub struct GgufPair<'a> {
    pub lm: &'a GgufLm,
    pub mmproj: Option<&'a super::gguf_vision::Mmproj>,
}

impl GgufPair<'_> {
    fn vision(&self, name: &str) -> Option<&super::gguf_vision::Mmproj> {
        self.mmproj.filter(|_| super::vision::is_vision_name(name))
    }
}

impl ParamSource for GgufPair<'_> {
    fn matrix(&self, name: &str) -> Result<HostWeight<'_>> {
        match self.vision(name) {
            Some(m) => m.matrix(name),
            None => self.lm.matrix(name),
        }
    }
    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        match self.vision(name) {
            Some(m) => m.vector(name),
            None => self.lm.vector(name),
        }
    }
    fn integers(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        match self.vision(name) {
            Some(m) => m.integers(name),
            None => self.lm.integers(name),
        }
    }
    fn has(&self, name: &str) -> bool {
        match self.vision(name) {
            Some(m) => m.has(name),
            None => self.lm.has(name),
        }
    }
}
