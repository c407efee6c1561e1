//! Strict accounting of the language-model tensors (language.md §5.1, official names), mirroring
//! the vision accounting: from headers only, before anything is uploaded.
//!
//! [`lm_manifest`] lists every tensor [`crate::model::lm::LmModel::load`] reads, with its shape
//! from the config. [`check_lm`] closes the accounting in both directions: every manifest entry
//! is present with its shape and an accepted dtype, and every checkpoint tensor is either in the
//! manifest, a vision-side tensor of a checkpoint that has a vision config (checked by
//! [`super::check_vision`]), or an `mtp.*` tensor (the multi-token-prediction block, recognised
//! by name and skipped: nothing here runs it). The official FP8/FP4 dtypes are accepted for
//! exactly the matrices formats.md §1 lists ([`ValueKind::Fp8`], [`ValueKind::Expert`]); each
//! one's `.scale` is part of it (its bytes are counted with the weight), not a tensor of its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use safetensors::Dtype;

use super::vision::is_vision_name;
use super::{Checkpoint, DtypeStat, fp8};
use crate::config::LmConfig;
use crate::error::{Error, Result};

/// Storage dtypes accepted for floating-point LM tensors.
pub const FLOAT_DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::BF16, Dtype::F16];
/// Storage dtypes accepted for the matrices the official checkpoint stores in FP8 (attention
/// `wq_a`, `wq_b`, `wkv`, `wo_a`, `wo_b`, the shared experts, the indexer's `wq_b`; formats.md §1).
pub const FP8_DTYPES: [Dtype; 4] = [Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F8_E4M3];
/// Storage dtypes accepted for routed experts: FP8, or FP4 packed two per byte as I8.
pub const EXPERT_DTYPES: [Dtype; 5] = [Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::F8_E4M3, Dtype::I8];
/// Storage dtypes accepted for `gate.tid2eid` (I64 in the HF checkpoint, I32 after llama.cpp's
/// conversion).
pub const INDEX_DTYPES: [Dtype; 2] = [Dtype::I64, Dtype::I32];
/// Prefix of the multi-token-prediction block's tensors, skipped by name (language.md §4.3).
pub const MTP_PREFIX: &str = "mtp.";
/// The image sentinel vectors (vision.md §5.1), read by the LM when present.
pub const SENTINELS: [&str; 4] = ["image_start", "image_pad", "image_newline", "image_end"];

/// What values a tensor holds, which decides its accepted dtypes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueKind {
    /// Weights, norms, biases: [`FLOAT_DTYPES`].
    Float,
    /// A matrix the official checkpoint stores in FP8: [`FP8_DTYPES`].
    Fp8,
    /// A routed expert's matrix (FP4 or FP8 officially): [`EXPERT_DTYPES`].
    Expert,
    /// Expert ids (`tid2eid`): [`INDEX_DTYPES`].
    Index,
}

impl ValueKind {
    pub fn accepted(self) -> &'static [Dtype] {
        match self {
            ValueKind::Float => &FLOAT_DTYPES,
            ValueKind::Fp8 => &FP8_DTYPES,
            ValueKind::Expert => &EXPERT_DTYPES,
            ValueKind::Index => &INDEX_DTYPES,
        }
    }
}

/// One tensor the language model reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExpectedLm {
    pub name: String,
    pub shape: Vec<usize>,
    pub kind: ValueKind,
    /// `false` for `gate.bias_vl`: a text-only checkpoint has none and the router falls back to
    /// the text bias.
    pub required: bool,
    /// Whether the model reads it as a weight matrix (`ParamSource::matrix`, uploaded in its
    /// storage format) rather than as a vector or integers (uploaded as f32 / i32): what
    /// [`super::footprint`] sizes it by.
    pub matrix: bool,
}

/// A required floating-point weight matrix.
fn matrix(name: String, shape: &[usize]) -> ExpectedLm {
    ExpectedLm { name, shape: shape.to_vec(), kind: ValueKind::Float, required: true, matrix: true }
}

/// A required floating-point vector (norm, bias, sink; the 2-D `ape` too, read as f32 values).
fn vector(name: String, shape: &[usize]) -> ExpectedLm {
    ExpectedLm { name, shape: shape.to_vec(), kind: ValueKind::Float, required: true, matrix: false }
}

/// A required matrix the official checkpoint stores in FP8.
fn fp8(name: String, shape: &[usize]) -> ExpectedLm {
    ExpectedLm { name, shape: shape.to_vec(), kind: ValueKind::Fp8, required: true, matrix: true }
}

/// A required routed-expert matrix.
fn expert(name: String, shape: &[usize]) -> ExpectedLm {
    ExpectedLm { name, shape: shape.to_vec(), kind: ValueKind::Expert, required: true, matrix: true }
}

/// `a · b` for a shape, refusing a config whose product overflows (named by `keys`).
fn mul(a: usize, b: usize, keys: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| Error::config(keys, format!("{a} × {b} overflows: the config describes an impossible tensor")))
}

/// The manifest as it is listed, up to `max_required` required tensors: the listing stops there
/// (`truncated`), so a config that describes absurdly many tensors costs no more than the
/// checkpoint could hold.
struct Manifest {
    entries: Vec<ExpectedLm>,
    required: usize,
    max_required: usize,
    truncated: bool,
}

impl Manifest {
    fn push(&mut self, e: ExpectedLm) {
        if self.truncated || (e.required && self.required == self.max_required) {
            self.truncated = true;
            return;
        }
        self.required += usize::from(e.required);
        self.entries.push(e);
    }
}

/// Every tensor [`crate::model::lm::LmModel::load`] reads, in model order, with its torch shape
/// `[out, in]` from the config. Sentinels are not listed (see [`check_lm`]).
pub fn lm_manifest(cfg: &LmConfig) -> Result<Vec<ExpectedLm>> {
    Ok(manifest_upto(cfg, usize::MAX)?.entries)
}

fn manifest_upto(cfg: &LmConfig, max_required: usize) -> Result<Manifest> {
    let d = cfg.hidden_size;
    let hc = cfg.hc_mult;
    let (nh, hd, q) = (cfg.num_attention_heads, cfg.head_dim, cfg.q_lora_rank);
    let (e, k, inter) = (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size);
    let hc_d = mul(hc, d, "hc_mult × hidden_size")?;
    // `(2 + hc)·hc` mixing rows per sublayer: pre (hc), post (hc), comb (hc·hc)
    let hc_rows = mul(hc.saturating_add(2), hc, "hc_mult")?;
    let q_width = mul(nh, hd, "num_attention_heads × head_dim")?;
    let o_rank = mul(cfg.o_groups, cfg.o_lora_rank, "o_groups × o_lora_rank")?;
    // the reference (R1) sizes the shared expert at n_shared_experts · moe_intermediate_size
    // (language.md §1); transformers ignores n_shared_experts, identical for every released config
    let shared = mul(cfg.n_shared_experts, inter, "n_shared_experts × moe_intermediate_size")?;
    let index_q = mul(cfg.index_n_heads, cfg.index_head_dim, "index_n_heads × index_head_dim")?;
    let index_w = mul(2, cfg.index_head_dim, "index_head_dim")?;

    let mut m = Manifest { entries: Vec::new(), required: 0, max_required, truncated: false };
    m.push(matrix("embed.weight".into(), &[cfg.vocab_size, d]));
    for l in 0..cfg.num_hidden_layers {
        if m.truncated {
            break;
        }
        let p = format!("layers.{l}.");
        m.push(vector(format!("{p}attn_norm.weight"), &[d]));
        m.push(vector(format!("{p}ffn_norm.weight"), &[d]));
        for s in ["attn", "ffn"] {
            m.push(matrix(format!("{p}hc_{s}_fn"), &[hc_rows, hc_d]));
            m.push(vector(format!("{p}hc_{s}_base"), &[hc_rows]));
            m.push(vector(format!("{p}hc_{s}_scale"), &[3]));
        }
        let a = format!("{p}attn.");
        m.push(vector(format!("{a}attn_sink"), &[nh]));
        m.push(fp8(format!("{a}wq_a.weight"), &[q, d]));
        m.push(vector(format!("{a}q_norm.weight"), &[q]));
        m.push(fp8(format!("{a}wq_b.weight"), &[q_width, q]));
        m.push(fp8(format!("{a}wkv.weight"), &[hd, d]));
        m.push(vector(format!("{a}kv_norm.weight"), &[hd]));
        m.push(fp8(format!("{a}wo_a.weight"), &[o_rank, q_width / cfg.o_groups]));
        m.push(fp8(format!("{a}wo_b.weight"), &[d, o_rank]));
        let ratio = cfg.ratio(l);
        if ratio != 0 {
            // ratio 4 overlaps two blocks: every compressor row is twice as wide (§2.2)
            let w = if ratio == 4 { mul(2, hd, "head_dim")? } else { hd };
            let c = format!("{a}compressor.");
            m.push(matrix(format!("{c}wkv.weight"), &[w, d]));
            m.push(matrix(format!("{c}wgate.weight"), &[w, d]));
            m.push(vector(format!("{c}ape"), &[ratio, w]));
            m.push(vector(format!("{c}norm.weight"), &[hd]));
        }
        if ratio == 4 {
            let i = format!("{a}indexer.");
            m.push(fp8(format!("{i}wq_b.weight"), &[index_q, q]));
            m.push(matrix(format!("{i}weights_proj.weight"), &[cfg.index_n_heads, d]));
            m.push(matrix(format!("{i}compressor.wkv.weight"), &[index_w, d]));
            m.push(matrix(format!("{i}compressor.wgate.weight"), &[index_w, d]));
            m.push(vector(format!("{i}compressor.ape"), &[4, index_w]));
            m.push(vector(format!("{i}compressor.norm.weight"), &[cfg.index_head_dim]));
        }
        let f = format!("{p}ffn.");
        m.push(matrix(format!("{f}gate.weight"), &[e, d]));
        if l < cfg.num_hash_layers {
            m.push(ExpectedLm {
                name: format!("{f}gate.tid2eid"),
                shape: vec![cfg.vocab_size, k],
                kind: ValueKind::Index,
                required: true,
                matrix: false,
            });
        } else {
            m.push(vector(format!("{f}gate.bias"), &[e]));
        }
        m.push(ExpectedLm {
            name: format!("{f}gate.bias_vl"),
            shape: vec![e],
            kind: ValueKind::Float,
            required: false,
            matrix: false,
        });
        for j in 0..e {
            if m.truncated {
                break;
            }
            m.push(expert(format!("{f}experts.{j}.w1.weight"), &[inter, d]));
            m.push(expert(format!("{f}experts.{j}.w2.weight"), &[d, inter]));
            m.push(expert(format!("{f}experts.{j}.w3.weight"), &[inter, d]));
        }
        m.push(fp8(format!("{f}shared_experts.w1.weight"), &[shared, d]));
        m.push(fp8(format!("{f}shared_experts.w2.weight"), &[d, shared]));
        m.push(fp8(format!("{f}shared_experts.w3.weight"), &[shared, d]));
    }
    m.push(matrix("hc_head_fn".into(), &[hc, hc_d]));
    m.push(vector("hc_head_base".into(), &[hc]));
    m.push(vector("hc_head_scale".into(), &[1]));
    m.push(vector("norm.weight".into(), &[d]));
    m.push(matrix("head.weight".into(), &[cfg.vocab_size, d]));
    Ok(m)
}

/// Count and bytes of a group of tensors.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TensorGroup {
    pub tensors: usize,
    pub bytes: u64,
}

impl TensorGroup {
    fn add(&mut self, bytes: usize) {
        self.tensors += 1;
        self.bytes = self.bytes.saturating_add(bytes as u64);
    }
}

/// Result of a successful [`check_lm`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LmAccounting {
    pub layers: usize,
    /// LM tensors found (= required ones + the optional ones present).
    pub lm_tensors: usize,
    /// LM parameters (elements).
    pub lm_params: u64,
    /// LM bytes in storage.
    pub lm_bytes: u64,
    /// LM tensors per storage dtype (a quantized weight's bytes include its `.scale`).
    pub by_dtype: BTreeMap<Dtype, DtypeStat>,
    /// Layers carrying `gate.bias_vl` (the others route image tokens with the text bias).
    pub bias_vl_layers: usize,
    /// Whether the image sentinels are counted here (a checkpoint without a vision config that
    /// carries them, like `lm-tiny`); with a vision config they belong to the vision accounting.
    pub sentinels: bool,
    /// `mtp.*` tensors: recognised by name and skipped.
    pub mtp: TensorGroup,
    /// Vision-side tensors of a checkpoint with a vision config (left to the vision accounting).
    pub vision: TensorGroup,
}

impl fmt::Display for LmAccounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "LM accounting: OK, {} layers, {} tensors, {} parameters, {} bytes",
            self.layers, self.lm_tensors, self.lm_params, self.lm_bytes
        )?;
        for (d, s) in &self.by_dtype {
            writeln!(f, "  {d:>5}: {:>6} tensors, {:>14} bytes", s.count, s.bytes)?;
        }
        writeln!(
            f,
            "  gate.bias_vl on {} of {} layers{}",
            self.bias_vl_layers,
            self.layers,
            if self.sentinels { "; image sentinels included" } else { "" }
        )?;
        writeln!(f, "  mtp.* skipped: {} tensors, {} bytes", self.mtp.tensors, self.mtp.bytes)?;
        write!(f, "  vision side: {} tensors, {} bytes (vision accounting)", self.vision.tensors, self.vision.bytes)
    }
}

fn dtype_list(accepted: &[Dtype]) -> String {
    accepted.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

/// Check the checkpoint's tensors against [`lm_manifest`] from headers only.
///
/// The image sentinels are LM tensors too when the checkpoint has no vision config: optional,
/// but all four or none, each `[hidden_size]`. With a vision config every vision-side name
/// (`vision.*`, `aligner.*`, `image_*`) is left to [`super::check_vision`]; without one a
/// `vision.*` or `aligner.*` tensor is unknown.
///
/// Problems are collected in a fixed order (unknown tensors by name, then per manifest entry:
/// missing, wrong shape, wrong dtype); the first is returned as an `Error::Tensor` naming the
/// tensor, with the count and the next few names of the others appended.
pub fn check_lm(ckpt: &Checkpoint, cfg: &LmConfig) -> Result<LmAccounting> {
    // one required tensor more than the checkpoint holds is enough to name a missing one
    let listed = manifest_upto(cfg, ckpt.len().saturating_add(1))?;
    // truncated: more distinct required names were listed than the checkpoint has, so one is missing
    if listed.truncated
        && let Some(exp) = listed.entries.iter().find(|e| e.required && !ckpt.contains(&e.name))
    {
        return Err(Error::tensor(
            &exp.name,
            format!(
                "missing from the checkpoint (expected shape {:?}); the config describes more language-model \
                 tensors than the {} this checkpoint holds",
                exp.shape,
                ckpt.len()
            ),
        ));
    }
    let mut manifest = listed.entries;
    let has_vision = ckpt.vision_config().is_some();
    let sentinels = !has_vision && SENTINELS.iter().any(|s| ckpt.contains(s));
    if sentinels {
        manifest.extend(SENTINELS.iter().map(|s| vector(s.to_string(), &[cfg.hidden_size])));
    }
    let expected: BTreeSet<&str> = manifest.iter().map(|e| e.name.as_str()).collect();
    let mut problems: Vec<(String, String)> = Vec::new();
    let (mut mtp, mut vision) = (TensorGroup::default(), TensorGroup::default());
    for meta in ckpt.metas() {
        if expected.contains(meta.name) {
            continue;
        }
        // a quantized weight's block scale is part of it (paired when the checkpoint opened):
        // counted with it below
        let weight = fp8::weight_name(meta.name).filter(|w| expected.contains(w.as_str()));
        if weight.and_then(|w| ckpt.meta(&w)).is_some_and(|w| fp8::is_quantized(w.dtype)) {
            continue;
        }
        if meta.name.starts_with(MTP_PREFIX) {
            mtp.add(meta.nbytes);
        } else if has_vision && is_vision_name(meta.name) {
            vision.add(meta.nbytes);
        } else {
            let why = if is_vision_name(meta.name) {
                "a vision-side tensor, but config.json has no vision config (no `vision_*` keys)".to_string()
            } else {
                format!(
                    "not a tensor of this language model ({} layers, compress_ratios {:?}, {} hash layers, {} experts)",
                    cfg.num_hidden_layers, cfg.compress_ratios, cfg.num_hash_layers, cfg.n_routed_experts
                )
            };
            problems.push((
                meta.name.to_string(),
                format!("unknown tensor (shape {:?}, {}, in {}): {why}", meta.shape, meta.dtype, meta.file.display()),
            ));
        }
    }

    let mut by_dtype: BTreeMap<Dtype, DtypeStat> = BTreeMap::new();
    let (mut lm_tensors, mut lm_params, mut lm_bytes, mut bias_vl_layers) = (0, 0u64, 0u64, 0);
    for exp in &manifest {
        let Some(meta) = ckpt.meta(&exp.name) else {
            if exp.required {
                problems
                    .push((exp.name.clone(), format!("missing from the checkpoint (expected shape {:?})", exp.shape)));
            }
            continue;
        };
        // FP4 stores two values per I8 byte: the header's in-dim is half the matrix's
        let fp4 = meta.dtype == Dtype::I8 && exp.kind == ValueKind::Expert;
        let logical: Vec<usize> = match meta.shape {
            [r, c] if fp4 => vec![*r, c.saturating_mul(2)],
            s => s.to_vec(),
        };
        if logical != exp.shape {
            let packed = if fp4 { format!(" (I8 {:?}, two FP4 values per byte)", meta.shape) } else { String::new() };
            problems.push((
                exp.name.clone(),
                format!(
                    "wrong shape: found {logical:?}{packed}, expected {:?} (in {})",
                    exp.shape,
                    meta.file.display()
                ),
            ));
            continue;
        }
        let accepted = exp.kind.accepted();
        if !accepted.contains(&meta.dtype) {
            problems.push((
                exp.name.clone(),
                format!(
                    "unsupported dtype {} (accepted: {}) in {}",
                    meta.dtype,
                    dtype_list(accepted),
                    meta.file.display()
                ),
            ));
            continue;
        }
        // a quantized weight's bytes include its `.scale`'s
        let scale = if fp8::is_quantized(meta.dtype) {
            fp8::scale_name(&exp.name).and_then(|n| ckpt.meta(&n)).map_or(0, |m| m.nbytes as u64)
        } else {
            0
        };
        let s = by_dtype.entry(meta.dtype).or_default();
        s.count += 1;
        s.bytes += meta.nbytes as u64 + scale;
        lm_tensors += 1;
        // header sizes: the safetensors crate checked dtype × shape against the byte span
        lm_params += logical.iter().product::<usize>() as u64;
        lm_bytes += meta.nbytes as u64 + scale;
        bias_vl_layers += usize::from(exp.name.ends_with(".gate.bias_vl"));
    }

    if let Some((name, msg)) = problems.first() {
        let more = &problems[1..];
        let msg = if more.is_empty() {
            msg.clone()
        } else {
            let names: Vec<String> = more.iter().take(4).map(|(n, _)| format!("`{n}`")).collect();
            let etc = if more.len() > names.len() { ", …" } else { "" };
            format!("{msg} (and {} more LM accounting problem(s): {}{etc})", more.len(), names.join(", "))
        };
        return Err(Error::tensor(name, msg));
    }
    Ok(LmAccounting {
        layers: cfg.num_hidden_layers,
        lm_tensors,
        lm_params,
        lm_bytes,
        by_dtype,
        bias_vl_layers,
        sentinels,
        mtp,
        vision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The released V4-Flash config (language.md §1).
    fn flash() -> LmConfig {
        let mut ratios = vec![0, 0];
        for _ in 0..20 {
            ratios.extend([4, 128]);
        }
        ratios.extend([4, 0]);
        LmConfig::from_value(&json!({
            "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": 43, "num_attention_heads": 64,
            "head_dim": 512, "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
            "n_routed_experts": 256, "num_experts_per_tok": 6, "n_shared_experts": 1,
            "moe_intermediate_size": 2048, "num_hash_layers": 3, "scoring_func": "sqrtsoftplus",
            "routed_scaling_factor": 1.5, "swiglu_limit": 10.0, "sliding_window": 128,
            "compress_ratios": ratios, "compress_rope_theta": 160000.0, "rope_theta": 10000.0,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                             "beta_fast": 32, "beta_slow": 1},
            "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512, "hc_mult": 4,
            "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6
        }))
        .unwrap()
    }

    /// language.md §7: 284.33e9 parameters with embed and head (routed experts 277.03e9), and
    /// 106,954,752 attention-linear parameters per layer; §5.1 shapes spot-checked.
    #[test]
    fn released_manifest_matches_the_published_sizes() {
        let m = lm_manifest(&flash()).unwrap();
        let mut names: Vec<&str> = m.iter().map(|e| e.name.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), m.len(), "duplicate names in manifest");
        let params = |pred: &dyn Fn(&str) -> bool| -> u64 {
            m.iter().filter(|e| pred(&e.name)).map(|e| e.shape.iter().product::<usize>() as u64).sum()
        };
        let total = params(&|_| true);
        assert_eq!((total as f64 / 1e7).round() / 100.0, 284.33, "{total}");
        let routed = params(&|n| n.contains(".experts."));
        assert_eq!((routed as f64 / 1e7).round() / 100.0, 277.03, "{routed}");
        let attn = ["wq_a.weight", "wq_b.weight", "wkv.weight", "wo_a.weight", "wo_b.weight"];
        assert_eq!(params(&|n| n.starts_with("layers.0.attn.") && attn.iter().any(|a| n.ends_with(a))), 106_954_752);
        let shape = |name: &str| m.iter().find(|e| e.name == name).unwrap().shape.clone();
        assert_eq!(shape("layers.2.attn.compressor.wkv.weight"), [1024, 4096]);
        assert_eq!(shape("layers.3.attn.compressor.ape"), [128, 512]);
        assert_eq!(shape("layers.2.attn.indexer.compressor.ape"), [4, 256]);
        assert_eq!(shape("layers.2.attn.indexer.wq_b.weight"), [8192, 1024]);
        assert_eq!(shape("layers.0.ffn.gate.tid2eid"), [129280, 6]);
        assert_eq!(shape("hc_head_fn"), [4, 16384]);
        assert_eq!(shape("layers.7.hc_ffn_fn"), [24, 16384]);
        assert!(!names.contains(&"layers.2.ffn.gate.bias") && names.contains(&"layers.3.ffn.gate.bias"));
        assert!(!names.contains(&"layers.0.attn.compressor.wkv.weight"));
        assert!(!names.contains(&"layers.3.attn.indexer.wq_b.weight"));
    }
}
