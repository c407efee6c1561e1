//! The vision path: ViT (patch embed → pre-norm blocks with 2-D RoPE → final norm) → aligner
//! (zero-pad + 3×3 unfold → Linear → exact GELU → Linear) → the N-layout image block with its
//! learned sentinel rows (spec vision.md §3, §4, §5.1).

use crate::backend::{Backend, DeviceTensor, HostTensor};
use crate::config::VisionConfig;
use crate::error::{Error, Result};
use crate::model::ParamSource;

/// One pre-norm ViT block: `x += wo(attn(rope(q), rope(k), v))`, `x += w2(swiglu(w1(norm2(x))))`.
struct VitBlock<B: Backend> {
    norm1: B::Tensor,
    wqkv: B::Weight,
    bqkv: B::Tensor,
    wo: B::Weight,
    bo: B::Tensor,
    norm2: B::Tensor,
    w1: B::Weight,
    w2: B::Weight,
}

/// The vision tower and aligner with their parameters resident on one lane.
pub struct VisionModel<B: Backend> {
    cfg: VisionConfig,
    patch_w: B::Weight,
    patch_b: B::Tensor,
    blocks: Vec<VitBlock<B>>,
    norm: B::Tensor,
    aligner_w1: B::Weight,
    aligner_b1: B::Tensor,
    aligner_w2: B::Weight,
    aligner_b2: B::Tensor,
    /// `[5, hidden]` in type order START, PAD, PAD (the IMAGE type's row, never gathered), NEWLINE,
    /// END — the reference's `params` stack (§5.1), so a sentinel of type t is row `n_grid + t`.
    sentinels: B::Tensor,
}

/// The stages one image produces, still on the device.
pub struct VisionStages<B: Backend> {
    /// `[n_vit_h·n_vit_w, vision_dim]` after the final norm.
    pub vit: B::Tensor,
    /// `[n_llm_h·n_llm_w, hidden]`, row-major over the merged grid, before the layout.
    pub aligner: B::Tensor,
}

fn param<B: Backend>(b: &B, src: &impl ParamSource, name: &str) -> Result<B::Tensor> {
    let v = src.vector(name)?;
    b.upload_param(&HostTensor::f32([v.len()], v)?)
}

impl<B: Backend> VisionModel<B> {
    /// Upload every vision parameter to the lane. Names are the official ones (§6.2).
    pub fn load(b: &B, src: &impl ParamSource, cfg: &VisionConfig) -> Result<Self> {
        let matrix = |name: &str| -> Result<B::Weight> { b.upload_weight(&src.matrix(name)?) };
        let mut blocks = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let p = format!("vision.blocks.{i}.");
            blocks.push(VitBlock {
                norm1: param(b, src, &format!("{p}norm1.weight"))?,
                wqkv: matrix(&format!("{p}attn.wqkv.weight"))?,
                bqkv: param(b, src, &format!("{p}attn.wqkv.bias"))?,
                wo: matrix(&format!("{p}attn.wo.weight"))?,
                bo: param(b, src, &format!("{p}attn.wo.bias"))?,
                norm2: param(b, src, &format!("{p}norm2.weight"))?,
                w1: matrix(&format!("{p}mlp.w1.weight"))?,
                w2: matrix(&format!("{p}mlp.w2.weight"))?,
            });
        }
        let mut table = Vec::with_capacity(5 * cfg.hidden_size);
        for name in ["image_start", "image_pad", "image_pad", "image_newline", "image_end"] {
            table.extend(src.vector(name)?);
        }
        Ok(VisionModel {
            cfg: cfg.clone(),
            patch_w: matrix("vision.patch_embed.proj.weight")?,
            patch_b: param(b, src, "vision.patch_embed.proj.bias")?,
            blocks,
            norm: param(b, src, "vision.norm.weight")?,
            aligner_w1: matrix("aligner.w1.weight")?,
            aligner_b1: param(b, src, "aligner.w1.bias")?,
            aligner_w2: matrix("aligner.w2.weight")?,
            aligner_b2: param(b, src, "aligner.w2.bias")?,
            sentinels: b.upload_param(&HostTensor::f32([5, cfg.hidden_size], table)?)?,
        })
    }

    /// ViT + aligner for one image: patches `[n_vit_h·n_vit_w, 3·p·p]` → stages.
    pub fn encode(&self, b: &B, patches: &B::Tensor, n_vit_h: usize, n_vit_w: usize) -> Result<VisionStages<B>> {
        let cfg = &self.cfg;
        let (heads, eps, theta) = (cfg.n_heads, cfg.norm_eps as f32, cfg.rope_theta as f32);
        let n = n_vit_h * n_vit_w;
        let want = [n, 3 * cfg.patch_size * cfg.patch_size];
        if patches.shape() != want {
            return Err(Error::shape("encode", format!("patches have shape {:?}, expected {want:?}", patches.shape())));
        }
        let mut x = b.linear(patches, &self.patch_w, Some(&self.patch_b))?; // [n, dim]
        for blk in &self.blocks {
            // rms_norm(x)·Wqkvᵀ + bqkv: [n, 3·dim] = q | k | v
            let qkv = b.rms_norm_linear(&x, &blk.norm1, eps, &blk.wqkv, Some(&blk.bqkv))?;
            // attention(rope_2d(q), rope_2d(k), v): [n, dim]
            let attn = b.attention_rope_2d(&qkv, heads, n_vit_w, theta)?;
            x = b.linear_add(&attn, &blk.wo, Some(&blk.bo), &x)?; // x + attn·Woᵀ + bo
            let gate_up = b.rms_norm_linear(&x, &blk.norm2, eps, &blk.w1, None)?; // [n, 2·inter]
            x = b.swiglu_linear_add(&gate_up, &blk.w2, &x)?; // x + swiglu(gate_up)·W2ᵀ: [n, dim]
        }
        let vit = b.rms_norm(&x, &self.norm, eps)?; // [n, dim]
        let r = cfg.downsample_ratio;
        // zero-pad + r×r unfold → Linear → GELU: [n_llm_h·n_llm_w, dim·r²] → [n_llm, aligner_w1 rows]
        let hidden = b.unfold_linear_gelu(&vit, n_vit_h, n_vit_w, r, &self.aligner_w1, Some(&self.aligner_b1))?;
        let aligner = b.linear(&hidden, &self.aligner_w2, Some(&self.aligner_b2))?; // [n_llm, hidden]
        Ok(VisionStages { vit, aligner })
    }

    /// The N-layout block: `rows[t]` indexes `[aligner rows ; sentinel table]` (see
    /// `processor::ImageBlock::rows`) → `[block_len, hidden]`.
    pub fn image_block(&self, b: &B, aligner: &B::Tensor, rows: &[u32]) -> Result<B::Tensor> {
        let table = b.concat_rows(aligner, &self.sentinels)?;
        let idx: Vec<i32> = rows.iter().map(|&r| r as i32).collect();
        let idx = b.upload(&HostTensor::i32([idx.len()], idx)?)?;
        b.gather_rows(&table, &idx)
    }
}
