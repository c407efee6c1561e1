//! The vision tower's `attention` on `shaders/attention.wgsl`: flash-style, one workgroup per
//! block of 16 queries of one head, keys and values walked in tiles through workgroup memory; in
//! fast precision where the GEMM tiles run on cooperative matrices, for the ViT's head dim, 64,
//! `shaders/attention_coop_direct.wgsl` (the same online softmax, its two products on
//! cooperative matrices, f16 operands, over f16 copies of q, k and v that `half_rows` makes):
//! `attention_coop_wide` where the adapter has its 44 KiB of workgroup memory (NVIDIA's 48, RADV's
//! 64), its key and value tiles copied into workgroup memory in 16-byte pieces, else
//! `attention_coop_direct`, every matrix load straight from the copies (an older kernel that
//! staged the tiles element by element, retired in the twenty-eighth sitting, was 3× slower than
//! it on an H200; the 16-byte copies took the 1920×1080 image's attention 48.4 → 31.0 ms on an
//! H100, thirtieth sitting).
//! (The language model's `sink_attention` is an entry point of lm.wgsl: lm.rs.)

use super::{Shader, Tiles, WgpuBackend, WgpuTensor};
use crate::backend::{Backend, DType, Op, WeightFormat, checks};
use crate::error::Result;

/// Workgroup memory the kernel needs (see shaders/attention.wgsl).
pub(super) const SHARED_BYTES: u32 = (2048 + 4096 + 512) * 4;
/// Workgroup memory of the direct cooperative kernel (see shaders/attention_coop_direct.wgsl):
/// per subgroup (2) S-then-P·V `[32][68]` f32 and P `[32][72]` f16.
const DIRECT_SHARED_BYTES: u32 = 2 * 32 * (68 * 4 + 72 * 2);
/// attention_coop_wide's: the direct kernel's and its key and value tiles, `[64][72]` f16 each.
const WIDE_SHARED_BYTES: u32 = DIRECT_SHARED_BYTES + 2 * 64 * 72 * 2;
/// The queries a workgroup of the direct kernel takes, and its key tile: its f16 copies of q, k
/// and v are padded with zero rows to a multiple of this, so that every matrix load is in bounds.
const DIRECT_ROWS: usize = 64;
/// The head dim the cooperative kernels are written for (their subgroups' 16×16 blocks cover it).
const COOP_HEAD_DIM: usize = 64;
/// The largest head dim the kernel's workgroup arrays hold.
const MAX_HEAD_DIM: usize = 128;

impl WgpuBackend {
    /// Whether the ViT's attention runs `attention_coop_wide` here (head dim 64, fast
    /// precision): [`Options::wide_attention`](super::Options) on an adapter whose cooperative
    /// tiles the lane uses and whose workgroup memory holds the kernel's 44 KiB.
    pub fn wide_attention(&self) -> bool {
        self.tiles == Tiles::Coop
            && self.opts.wide_attention
            && self.limits.max_compute_workgroup_storage_size >= WIDE_SHARED_BYTES
    }

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
        let params = [n as u32, n_heads as u32, hd as u32, scale.to_bits()];
        let coop = self.tiles == Tiles::Coop && hd == COOP_HEAD_DIM;
        let storage = self.limits.max_compute_workgroup_storage_size;
        if coop && storage >= DIRECT_SHARED_BYTES {
            let rows = n.div_ceil(DIRECT_ROWS) * DIRECT_ROWS;
            let q16 = self.half_rows(q, rows)?;
            let k16 = self.half_rows(k, rows)?;
            let v16 = self.half_rows(v, rows)?;
            if self.wide_attention() {
                return self
                    .dispatch(
                        Shader::AttentionCoopDirect,
                        "attention_coop_wide",
                        0,
                        &params,
                        &[(1, q16.binding()), (5, k16.binding()), (6, v16.binding()), (4, y.binding())],
                        ((rows / DIRECT_ROWS) as u32, n_heads as u32, 1),
                    )
                    .map(|()| y);
            }
            self.dispatch(
                Shader::AttentionCoopDirect,
                "attention_coop_direct",
                0,
                &params,
                &[(1, q16.binding()), (2, k16.binding()), (3, v16.binding()), (4, y.binding())],
                ((rows / DIRECT_ROWS) as u32, n_heads as u32, 1),
            )?;
            return Ok(y);
        }
        // f32, 16 queries a workgroup
        self.dispatch(
            Shader::Attention,
            OP,
            0,
            &params,
            &[(1, q.binding()), (2, k.binding()), (3, v.binding()), (4, y.binding())],
            (n.div_ceil(16) as u32, n_heads as u32, 1),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The cooperative kernels' sizes are the shader's: 2 subgroups of 32 queries a workgroup
    /// (their rows), key tiles of as many, and the workgroup memory of the build as naga lays
    /// it out (both entry points': the wide kernel's tiles and the direct kernel's arrays, which
    /// the wide one uses too).
    #[test]
    fn direct_attention_sizes_match_its_wgsl() {
        let wgsl = include_str!("../../../shaders/attention_coop_direct.wgsl");
        for line in [
            "const HD: u32 = 64u;",
            "const BKEY: u32 = 64u;",
            "const SUBGROUPS: u32 = 2u;",
            "const QROWS: u32 = 32u;",
            "@compute @workgroup_size(64, 1, 1)",
        ] {
            assert!(wgsl.contains(line), "attention_coop_direct.wgsl lacks `{line}`");
        }
        assert_eq!(DIRECT_ROWS, 2 * 32);
        assert_eq!(COOP_HEAD_DIM, 64);
        assert!(wgsl.contains("const KV_ROW: u32 = 18u;"), "attention_coop_wide's tile rows are not 72 f16");
        assert_eq!(Shader::AttentionCoopDirect.workgroup_bytes(), WIDE_SHARED_BYTES, "workgroup memory");
    }
}
