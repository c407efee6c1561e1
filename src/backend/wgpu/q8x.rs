//! One token's GEMVs on int8 activations in fast precision (`shaders/dequant/q8x.wgsl`, built per
//! format after its `shaders/dequant/q8x/<format>.wgsl`): the routed experts of a decode step of
//! one sequence and its widest linears, in the formats whose codes multiply int8 values as
//! integers ([`formats::q8x_format`]: Q8_0, Q2_K, IQ2_XXS, the published Q2-class mix). The CUDA
//! lane's `*_q8x_*` kernels do the same: the small-row kernels (rows.rs) spend most of their time
//! decoding each weight to f32 and multiplying it, where an integer dot product takes four codes
//! an instruction and the block scales once per 32 values.
//!
//! The activation row is rounded to int8 per 32 values (ggml's q8_1 rule), an error of at most
//! half a step: tests/ops.rs holds each kernel to the f32 product of the rounded row at the exact
//! bound, and the experts' three projections together to `FAST_MOE_Q8X` (derived there); the
//! real checkpoints' fast-precision goldens run through them. Exact precision and weights from
//! `upload_weight_exact` never take them.

use super::formats::{self, BlockKernel};
use super::rows::RowsWeight;
use super::{Shader, WgpuBackend, WgpuTensor, WgpuWeight, grid};
use crate::backend::{Precision, WeightFormat};
use crate::error::{Error, Result};

/// The longest row of activations the kernels take (`MAX_K` in q8x.wgsl, whose workgroup memory
/// holds the row: k bytes and a scale per 32 values).
const MAX_K: usize = 8192;
/// Invocations of a workgroup (`WG` in q8x.wgsl), in teams of [`team`] that take
/// [`TEAM_COLS`] columns each.
const WG: usize = 256;
/// Columns of one team (`TEAM_COLS` in q8x.wgsl).
const TEAM_COLS: usize = 4;
/// The team sizes the kernels take. Teams of 64 and 128 (16 and 8 columns a workgroup, so
/// more workgroups) measured slower on every product of a decode step (H100, timed: the head
/// 217 µs with teams of 32, 268 with 64, 463 with 128; the routed gate and up 46, 56, 79).
pub(super) const TEAMS: [usize; 3] = [8, 16, 32];
/// The narrowest weight whose one-row linear takes the int8 kernel by default
/// (`Options::q8x_linear_min_cols`): 32 to 128 columns a workgroup leave a narrower weight few
/// workgroups to keep a GPU's loads in flight (the CUDA lane measured its 4 096-output Q8_0
/// projections slower on its int8 kernel and keeps them on the small rows from 8 192: its
/// `LINEAR_Q8X_MIN_COLS`). Here, H100, timed, one run: from 4 096 (`FOVEA_WGPU_Q8X_MIN_COLS`)
/// wo_b (k 8 192, 128 workgroups) and the shared expert's down (k 2 048, 64) took 30.0 and
/// 18.5 µs on it, against 49.3 for the two on the small rows: no gain.
pub(super) const LINEAR_MIN_COLS: usize = 8192;

/// The int8 kernels' build for `format` (fast precision), for the [`formats::q8x_format`]s.
pub(super) fn q8x_shader(format: WeightFormat) -> Option<Shader> {
    formats::q8x_format(format).then_some(Shader::Block(BlockKernel::Q8x, format, Precision::Fast))
}

/// Invocations a team for rows of `k` inputs (a multiple of 32): the largest of [`TEAMS`] that
/// leaves each invocation at least four of the row's 32-value groups (8 for rows too short for
/// that). Measured on an H100 (timed dispatches of a 4-layer q2 decode step, one run, each size
/// forced by `FOVEA_WGPU_Q8X_TEAM`): wq_b (k 1 024) 31.0 µs with teams of 32, 28.3 with 16,
/// 26.3 with 8; the routed down (k 2 048) 30.3 with 32, 25.3 with 16; the routed gate and up
/// (k 4 096) 46 with 32, 58 with 16, the head (k 4 096) 217 and 213. With teams of 32
/// a short row left an invocation one or two groups, so the row rounded per workgroup, its
/// barrier and the 32-term column totals weighed against few loads.
fn team(k: usize) -> usize {
    let groups = k / 32;
    TEAMS.into_iter().rev().find(|&t| groups >= 4 * t).unwrap_or(TEAMS[0])
}

/// Whether the kernels take a product of `k` inputs: whole 32-value groups within [`MAX_K`].
fn takes_k(k: usize) -> bool {
    k.is_multiple_of(32) && (32..=MAX_K).contains(&k)
}

impl WgpuBackend {
    /// Whether `w`'s products take int8 activations at all: the lane's `q8x` option, fast
    /// precision for this weight, a q8x format.
    fn q8x_weight(&self, w: &WgpuWeight) -> bool {
        self.opts.q8x && self.gemm_precision(w) == Precision::Fast && formats::q8x_format(w.format)
    }

    /// Whether one token's projection of `k` inputs over the experts of `w` takes the int8
    /// kernel ([`Self::dispatch_experts_q8x`]): one token, every expert bound, an int8 weight
    /// ([`Self::q8x_weight`]) and k it takes.
    pub(super) fn experts_take_q8x(&self, w: &RowsWeight<'_>, tokens: usize, k: usize) -> bool {
        tokens == 1 && w.experts.is_some() && self.q8x_weight(w.matrix) && takes_k(k)
    }

    /// One token's projection `entry` (`moe_gate_q8x`, `moe_up_q8x`, `moe_down_q8x`) over every
    /// expert of `w` on int8 activations: a workgroup per (256 / team) · 4 columns of each of the
    /// `slots` slots' experts, x at binding 1 (the token's row, or hid's rows for the down), y at
    /// 4, the ids at 5. Only where [`Self::experts_take_q8x`].
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_experts_q8x(
        &self,
        entry: &'static str,
        w: RowsWeight<'_>,
        slots: usize,
        k: usize,
        limit: f32,
        x: &WgpuTensor,
        y: &WgpuTensor,
        ids: &WgpuTensor,
    ) -> Result<()> {
        let Some((experts, expert_stride)) = w.experts else {
            return Err(Error::Device(format!("{entry}: `{}` is not every expert in one binding", w.matrix.name)));
        };
        let params = Q8xParams { cols: w.cols, slots, experts, expert_stride, limit, ..self.q8x_params(k) };
        let bindings = [(1, x.binding()), (2, w.binding), (4, y.binding()), (5, ids.binding())];
        self.dispatch_q8x(entry, w.matrix, params, &bindings)
    }

    /// One token's gate and up (`moe_gate_up_q8x`) over `joined`, the gate's `count` experts and
    /// then the up's in one binding ([`ExpertSpan::joined`](super::rows::ExpertSpan::joined)): the
    /// clamped SwiGLU of the two into hid `[slots, h]`. Only where [`Self::experts_take_q8x`]
    /// takes both projections.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_gate_up_q8x(
        &self,
        joined: RowsWeight<'_>,
        count: usize,
        slots: usize,
        k: usize,
        limit: f32,
        x: &WgpuTensor,
        hid: &WgpuTensor,
        ids: &WgpuTensor,
    ) -> Result<()> {
        const ENTRY: &str = "moe_gate_up_q8x";
        let Some((experts, expert_stride)) = joined.experts.filter(|&(e, _)| e == 2 * count) else {
            return Err(Error::Device(format!(
                "{ENTRY}: `{}` is not a gate's and an up's experts",
                joined.matrix.name
            )));
        };
        let params =
            Q8xParams { cols: joined.cols, slots, experts: experts / 2, expert_stride, limit, ..self.q8x_params(k) };
        let bindings = [(1, x.binding()), (2, joined.binding), (4, hid.binding()), (5, ids.binding())];
        self.dispatch_q8x(ENTRY, joined.matrix, params, &bindings)
    }

    /// Whether a linear of one row against `w` (`k` inputs) takes the int8 kernel
    /// ([`Self::linear_q8x`]): an int8 weight ([`Self::q8x_weight`]) of at least
    /// `Options::q8x_linear_min_cols` outputs, and k it takes.
    pub(super) fn linear_takes_q8x(&self, w: &WgpuWeight, rows: usize, k: usize) -> bool {
        rows == 1 && w.rows >= self.opts.q8x_linear_min_cols && self.q8x_weight(w) && takes_k(k)
    }

    /// x `[1, k]` · chunk `chunk` of W → its columns of y `[1, w.rows]` (+ bias) on int8
    /// activations (`linear_q8x`). Only where [`Self::linear_takes_q8x`].
    pub(super) fn linear_q8x(
        &self,
        w: &WgpuWeight,
        chunk: usize,
        x: &WgpuTensor,
        k: usize,
        bias: Option<&WgpuTensor>,
        y: &WgpuTensor,
    ) -> Result<()> {
        let c = &w.chunks[chunk];
        let params =
            Q8xParams { cols: c.rows, slots: 1, col_off: c.row0, has_bias: bias.is_some(), ..self.q8x_params(k) };
        let bias = bias.map_or_else(|| self.dummy.as_entire_binding(), |b| b.binding());
        let bindings = [(1, x.binding()), (2, c.binding()), (3, bias), (4, y.binding())];
        self.dispatch_q8x("linear_q8x", w, params, &bindings)
    }

    /// The parameters of a product of `k` inputs: k and the team size (`Options::q8x_team`, else
    /// [`team`]).
    fn q8x_params(&self, k: usize) -> Q8xParams {
        Q8xParams { k, team: self.opts.q8x_team.unwrap_or_else(|| team(k)), ..Q8xParams::default() }
    }

    /// One dispatch of q8x.wgsl's `entry` for `w`'s format: a workgroup per (256 / team) · 4
    /// columns, a grid layer per slot.
    fn dispatch_q8x(
        &self,
        entry: &'static str,
        w: &WgpuWeight,
        params: Q8xParams,
        bindings: &[(u32, wgpu::BindingResource<'_>)],
    ) -> Result<()> {
        let Some(shader) = q8x_shader(w.format) else {
            return Err(Error::Device(format!("{entry}: `{}` ({}) has no int8 kernel", w.name, w.format)));
        };
        if params.cols == 0 || params.slots == 0 {
            return Ok(());
        }
        if !TEAMS.contains(&params.team) {
            return Err(Error::Device(format!(
                "{entry}: teams of {} invocations (the kernels take {TEAMS:?})",
                params.team
            )));
        }
        let (gx, gy, _) = grid(params.cols.div_ceil(WG / params.team * TEAM_COLS));
        let max = self.limits.max_compute_workgroups_per_dimension;
        if gy > max || params.slots > max as usize {
            let (cols, slots) = (params.cols, params.slots);
            return Err(Error::Device(format!("{entry}: {cols} columns × {slots} slots exceed the dispatch limit")));
        }
        self.dispatch(shader, entry, 0, &params.block(w), bindings, (gx, gy, params.slots as u32))
    }
}

/// q8x.wgsl's parameter block `P`, less the weight's row stride.
#[derive(Default)]
struct Q8xParams {
    k: usize,
    cols: usize,
    slots: usize,
    experts: usize,
    expert_stride: usize,
    limit: f32,
    col_off: usize,
    has_bias: bool,
    team: usize,
}

impl Q8xParams {
    fn block(&self, w: &WgpuWeight) -> Vec<u32> {
        let mut block = [self.k, w.stride_words, self.cols, self.slots, self.experts, self.expert_stride]
            .map(|v| v as u32)
            .to_vec();
        block.extend([self.limit.to_bits(), self.col_off as u32, self.has_bias as u32, self.team as u32]);
        block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_are_the_kernels() {
        let src = include_str!("../../../shaders/dequant/q8x.wgsl");
        assert!(src.contains(&format!("\nconst MAX_K: u32 = {MAX_K}u;")));
        assert!(src.contains(&format!("\nconst WG: u32 = {WG}u;")));
        assert!(src.contains(&format!("\nconst TEAM_COLS: u32 = {TEAM_COLS}u;")));
        assert!(src.contains(&format!("var<workgroup> red: array<f32, {}>;", WG * TEAM_COLS)));
        // the workgroup arrays hold MAX_K / 4 words of int8 values and MAX_K / 32 scales
        assert!(src.contains(&format!("var<workgroup> xq: array<u32, {}>;", MAX_K / 4)));
        assert!(src.contains(&format!("var<workgroup> xs: array<f32, {}>;", MAX_K / 32)));
        // four groups an invocation where the row has them, and every team within the workgroup
        assert_eq!([32, 1024, 2048, 4096, MAX_K].map(team), [8, 8, 16, 32, 32]);
        assert!(TEAMS.iter().all(|t| WG.is_multiple_of(*t)));
        assert!(takes_k(32) && takes_k(MAX_K) && !takes_k(MAX_K + 32) && !takes_k(48) && !takes_k(0));
    }

    /// Every format's int8 build fits WebGPU's guaranteed 16 KiB of workgroup memory (IQ2_XXS's
    /// with its grid's copy the fullest).
    #[test]
    fn builds_fit_the_default_workgroup_memory() {
        for f in WeightFormat::ALL.into_iter().filter(|&f| formats::q8x_format(f)) {
            let bytes = q8x_shader(f).unwrap().workgroup_bytes();
            assert!(bytes <= 16384, "{f}: {bytes} bytes");
        }
        assert_eq!(q8x_shader(WeightFormat::IQ2_XXS).unwrap().workgroup_bytes(), 4 * (2048 + 256 + 1024 + 512));
    }
}
