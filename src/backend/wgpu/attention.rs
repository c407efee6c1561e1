//! The vision tower's `attention` on `shaders/attention.wgsl`: flash-style, one workgroup per
//! block of 16 queries of one head, keys and values walked in tiles through workgroup memory; in
//! fast precision where the GEMM tiles run on cooperative matrices, `shaders/attention_coop.wgsl`
//! (the same online softmax, its two products on cooperative matrices, f16 operands) for the
//! ViT's head dim, 64.
//! (The language model's `sink_attention` is an entry point of lm.wgsl: lm.rs.)

use super::{Shader, Tiles, WgpuBackend, WgpuTensor};
use crate::backend::{Backend, DType, Op, WeightFormat, checks};
use crate::error::Result;

/// Workgroup memory the kernel needs (see shaders/attention.wgsl).
pub(super) const SHARED_BYTES: u32 = (2048 + 4096 + 512) * 4;
/// Workgroup memory of the cooperative kernel (see shaders/attention_coop.wgsl).
const COOP_SHARED_BYTES: u32 = (2048 + 4096 + 2048) * 2 + (2048 + 256) * 4;
/// The head dim the cooperative kernel is written for (its subgroups' 16×16 blocks cover it).
const COOP_HEAD_DIM: usize = 64;
/// The largest head dim the kernel's workgroup arrays hold.
const MAX_HEAD_DIM: usize = 128;

impl WgpuBackend {
    /// q, k, v `[n, heads·hd]` → `[n, heads·hd]`, flash-style (no n×n matrix). A software adapter
    /// refuses keys past its loop budget (`attention_iterations`), which it has no other kernel for.
    pub(super) fn attention(
        &self,
        q: &WgpuTensor,
        k: &WgpuTensor,
        v: &WgpuTensor,
        n_heads: usize,
    ) -> Result<WgpuTensor> {
        const OP: &str = "attention";
        let (n, hd) = checks::attention(q, k, v, n_heads)?;
        self.check_inputs(OP, [("q", q), ("k", k), ("v", v)])?;
        if hd > MAX_HEAD_DIM || hd % 4 != 0 {
            return Err(Self::unsupported(
                Op::Attention,
                format!("head dim {hd} (a multiple of 4, at most {MAX_HEAD_DIM})"),
            ));
        }
        if !self.supports(Op::Attention, WeightFormat::F32) {
            return Err(Self::unsupported(
                Op::Attention,
                format!(
                    "{} bytes of workgroup memory (device has {})",
                    SHARED_BYTES, self.limits.max_compute_workgroup_storage_size
                ),
            ));
        }
        self.check_loop_budget(Op::Attention, attention_iterations(n, hd), || {
            format!("{n} rows of {n_heads} heads of dim {hd}")
        })?;
        let y = self.alloc(OP, q.shape.clone(), DType::F32)?;
        if n == 0 || hd == 0 {
            return Ok(y);
        }
        let scale = 1.0 / (hd as f32).sqrt();
        // the kernel, its entry point and the queries a workgroup takes (both read the same
        // parameters and bindings: attention_io.wgsl)
        let (shader, entry, queries) = if self.tiles == Tiles::Coop
            && hd == COOP_HEAD_DIM
            && self.limits.max_compute_workgroup_storage_size >= COOP_SHARED_BYTES
        {
            (Shader::AttentionCoop, "attention_coop", 32)
        } else {
            (Shader::Attention, OP, 16)
        };
        self.dispatch(
            shader,
            entry,
            0,
            &[n as u32, n_heads as u32, hd as u32, scale.to_bits()],
            &[(1, q.binding()), (2, k.binding()), (3, v.binding()), (4, y.binding())],
            (n.div_ceil(queries) as u32, n_heads as u32, 1),
        )?;
        Ok(y)
    }
}

/// An upper bound on the loop iterations of one invocation of attention.wgsl over `n` keys of
/// head dim `hd` (a multiple of 4): the Q block's load, then per tile of 32 keys (and once more
/// for the pass that leaves the loop) the K and V tile loads (⌈hd/32⌉ + 1 each), the two scores
/// (3, each a dot of hd/4 + 1), the max and the weighted sum over the tile's keys (33 each) and
/// the two probabilities (3).
fn attention_iterations(n: usize, hd: usize) -> usize {
    let tile_load = hd.div_ceil(32) + 1;
    let per_tile = 1 + 2 * tile_load + 3 + 2 * (hd / 4 + 1) + 1 + 33 + 3 + 33;
    hd.div_ceil(64) + 1 + (n.div_ceil(32) + 1) * per_tile
}
