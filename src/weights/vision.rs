//! Strict accounting of the vision-side tensors (spec vision.md §3, §4, §6.2, HF names).
//!
//! Every checkpoint tensor whose name starts with `vision.`, `aligner.` or `image_` must be in
//! [`vision_manifest`], every manifest entry must be present with exactly the expected shape, and
//! its dtype must be F32, BF16 or F16. All checks read headers only. Other tensors (the language
//! model's) are counted as "not vision" and left to the LM accounting.

use std::collections::BTreeMap;
use std::fmt;

use safetensors::Dtype;

use super::{Checkpoint, DtypeStat};
use crate::config::VisionConfig;
use crate::error::{Error, Result};

/// Name prefixes that belong to the vision side.
pub const VISION_PREFIXES: [&str; 3] = ["vision.", "aligner.", "image_"];

/// Storage dtypes accepted for vision tensors.
pub const ACCEPTED_DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::BF16, Dtype::F16];

/// One expected tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expected {
    pub name: String,
    pub shape: Vec<usize>,
}

impl Expected {
    fn new(name: impl Into<String>, shape: &[usize]) -> Self {
        Self { name: name.into(), shape: shape.to_vec() }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Whether `name` belongs to the vision side (and so must be in the manifest).
pub fn is_vision_name(name: &str) -> bool {
    VISION_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Number of vision tensors for `n_layers` blocks: 8 per block + 2 patch + 1 norm + 4 aligner
/// + 4 sentinels (267 for the released 32 layers).
pub fn vision_tensor_count(n_layers: usize) -> usize {
    8 * n_layers + 2 + 1 + 4 + 4
}

/// Every vision tensor the checkpoint must hold, with its torch shape, in model order.
pub fn vision_manifest(cfg: &VisionConfig) -> Vec<Expected> {
    let (d, inter, h) = (cfg.dim, cfg.inter_dim, cfg.hidden_size);
    let mut m = Vec::with_capacity(vision_tensor_count(cfg.n_layers));
    m.push(Expected::new("vision.patch_embed.proj.weight", &[d, cfg.patch_dim()]));
    m.push(Expected::new("vision.patch_embed.proj.bias", &[d]));
    for n in 0..cfg.n_layers {
        let b = format!("vision.blocks.{n}");
        m.push(Expected::new(format!("{b}.norm1.weight"), &[d]));
        m.push(Expected::new(format!("{b}.attn.wqkv.weight"), &[3 * d, d]));
        m.push(Expected::new(format!("{b}.attn.wqkv.bias"), &[3 * d]));
        m.push(Expected::new(format!("{b}.attn.wo.weight"), &[d, d]));
        m.push(Expected::new(format!("{b}.attn.wo.bias"), &[d]));
        m.push(Expected::new(format!("{b}.norm2.weight"), &[d]));
        m.push(Expected::new(format!("{b}.mlp.w1.weight"), &[2 * inter, d]));
        m.push(Expected::new(format!("{b}.mlp.w2.weight"), &[d, inter]));
    }
    m.push(Expected::new("vision.norm.weight", &[d]));
    m.push(Expected::new("aligner.w1.weight", &[h, cfg.aligner_in_dim()]));
    m.push(Expected::new("aligner.w1.bias", &[h]));
    m.push(Expected::new("aligner.w2.weight", &[h, h]));
    m.push(Expected::new("aligner.w2.bias", &[h]));
    for s in ["image_start", "image_pad", "image_newline", "image_end"] {
        m.push(Expected::new(s, &[h]));
    }
    debug_assert_eq!(m.len(), vision_tensor_count(cfg.n_layers));
    m
}

/// Result of a successful [`check_vision`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VisionAccounting {
    /// Vision tensors expected (= found: the check passed).
    pub vision_tensors: usize,
    /// Vision parameters (elements).
    pub vision_params: u64,
    /// Vision bytes in storage.
    pub vision_bytes: u64,
    /// Vision tensors per storage dtype.
    pub by_dtype: BTreeMap<Dtype, DtypeStat>,
    /// Tensors that are not vision-side (left to the language-model accounting).
    pub not_vision_tensors: usize,
    pub not_vision_bytes: u64,
}

impl fmt::Display for VisionAccounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "vision accounting: OK, {} tensors, {} parameters, {} bytes",
            self.vision_tensors, self.vision_params, self.vision_bytes
        )?;
        for (d, s) in &self.by_dtype {
            writeln!(f, "  {d:>5}: {:>6} tensors, {:>14} bytes", s.count, s.bytes)?;
        }
        write!(
            f,
            "  not vision: {} tensors, {} bytes (not checked here)",
            self.not_vision_tensors, self.not_vision_bytes
        )
    }
}

fn accepted_list() -> String {
    ACCEPTED_DTYPES.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
}

/// Check the checkpoint's vision tensors against [`vision_manifest`] from headers only.
///
/// Problems are collected in a fixed order (unexpected tensors by name, then per manifest entry:
/// missing, wrong shape, wrong dtype); the first is returned as an `Error::Tensor` naming the
/// tensor, with the number of further problems appended.
pub fn check_vision(ckpt: &Checkpoint, cfg: &VisionConfig) -> Result<VisionAccounting> {
    let manifest = vision_manifest(cfg);
    let expected: BTreeMap<&str, &Expected> = manifest.iter().map(|e| (e.name.as_str(), e)).collect();
    let mut problems: Vec<(String, String)> = Vec::new();

    let mut not_vision_tensors = 0;
    let mut not_vision_bytes = 0u64;
    for meta in ckpt.metas() {
        if !is_vision_name(meta.name) {
            not_vision_tensors += 1;
            not_vision_bytes += meta.nbytes as u64;
        } else if !expected.contains_key(meta.name) {
            problems.push((
                meta.name.to_string(),
                format!(
                    "unexpected vision-side tensor (shape {:?}, {}, in {}): not in the vision manifest for {} layers",
                    meta.shape,
                    meta.dtype,
                    meta.file.display(),
                    cfg.n_layers
                ),
            ));
        }
    }

    let mut by_dtype: BTreeMap<Dtype, DtypeStat> = BTreeMap::new();
    let mut vision_params = 0u64;
    let mut vision_bytes = 0u64;
    for exp in &manifest {
        let Some(meta) = ckpt.meta(&exp.name) else {
            problems.push((exp.name.clone(), format!("missing from the checkpoint (expected shape {:?})", exp.shape)));
            continue;
        };
        if meta.shape != exp.shape.as_slice() {
            problems.push((
                exp.name.clone(),
                format!("wrong shape: found {:?}, expected {:?} (in {})", meta.shape, exp.shape, meta.file.display()),
            ));
            continue;
        }
        if !ACCEPTED_DTYPES.contains(&meta.dtype) {
            problems.push((
                exp.name.clone(),
                format!("unsupported dtype {} (accepted: {}) in {}", meta.dtype, accepted_list(), meta.file.display()),
            ));
            continue;
        }
        let s = by_dtype.entry(meta.dtype).or_default();
        s.count += 1;
        s.bytes += meta.nbytes as u64;
        vision_params += meta.numel() as u64;
        vision_bytes += meta.nbytes as u64;
    }

    if let Some((name, msg)) = problems.first() {
        let more = problems.len() - 1;
        let msg = if more > 0 { format!("{msg} (and {more} more vision accounting problem(s))") } else { msg.clone() };
        return Err(Error::tensor(name, msg));
    }
    Ok(VisionAccounting {
        vision_tensors: manifest.len(),
        vision_params,
        vision_bytes,
        by_dtype,
        not_vision_tensors,
        not_vision_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn released_manifest_counts_and_params() {
        let cfg = VisionConfig::from_value(json!({
            "vision_n_layers": 32, "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816,
            "vision_patch_size": 14, "vision_rope_theta": 10000, "vision_downsample_ratio": 3,
            "vision_max_n_token": 384, "vision_min_pixels": 147456, "vision_max_wh_ratio": 8,
            "hidden_size": 4096
        }))
        .unwrap();
        let m = vision_manifest(&cfg);
        assert_eq!(m.len(), 267);
        let mut names: Vec<&str> = m.iter().map(|e| e.name.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), 267, "duplicate names in manifest");
        assert!(m.iter().all(|e| is_vision_name(&e.name)));
        // Spec §1.3: ViT 411,842,560; aligner 54,534,144; sentinels 16,384.
        let count =
            |pred: &dyn Fn(&str) -> bool| -> usize { m.iter().filter(|e| pred(&e.name)).map(Expected::numel).sum() };
        assert_eq!(count(&|n| n.starts_with("vision.")), 411_842_560);
        assert_eq!(count(&|n| n.starts_with("aligner.")), 54_534_144);
        assert_eq!(count(&|n| n.starts_with("image_")), 16_384);
    }
}
