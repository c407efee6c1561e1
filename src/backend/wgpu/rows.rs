//! The small-row path of the GEMM ops (`shaders/rows.wgsl`): `linear`, `grouped_linear` and the
//! experts' gate, up and down when x has at most [`SMALL_ROWS`] rows (decode: one token, or one
//! per sequence of a batched step). The tile kernels spend almost all their work on padding
//! there; these kernels give each output column one workgroup that reads its weight row once
//! (see rows.wgsl), in every weight format and both precisions, built like the tile kernels:
//! the same float weight parts (`linear_packed.wgsl` with its `FMT`, `linear_f16.wgsl`) or block
//! decoders, the same operands files.

use super::formats::BlockKernel;
use super::{Shader, WgpuBackend, WgpuTensor, WgpuWeight, grid};
use crate::backend::{Precision, WeightFormat};
use crate::error::{Error, Result};

/// The most rows (or expert slots per batch) one small-row workgroup accumulates: `ROWS` in
/// rows.wgsl. The ops take the small-row path up to this many rows of x (the experts: tokens).
pub(super) const SMALL_ROWS: usize = 8;

/// How a small-row workgroup sums its threads' partial dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// `subgroupAdd`, then the subgroups' totals (`rows_subgroup.wgsl`): with wgpu's SUBGROUP.
    Subgroup,
    /// A tree in workgroup memory (`rows_workgroup.wgsl`): without it, or when
    /// `Options::force_workgroup_reduction` asks for it.
    Workgroup,
}

impl Reduction {
    pub const ALL: [Reduction; 2] = [Reduction::Subgroup, Reduction::Workgroup];

    /// The reduction file: its name and WGSL.
    pub(super) fn part(self) -> (&'static str, &'static str) {
        match self {
            Reduction::Subgroup => ("rows_subgroup.wgsl", include_str!("../../../shaders/rows_subgroup.wgsl")),
            Reduction::Workgroup => ("rows_workgroup.wgsl", include_str!("../../../shaders/rows_workgroup.wgsl")),
        }
    }
}

/// How many rows of x a small-row pipeline accumulates (rows.wgsl's `ROW_BOUND`, a
/// pipeline-override constant): a lone sequence's decode step takes the one-row pipeline, without
/// the accumulators and per-row tests of [`SMALL_ROWS`] (as the CUDA lane's one-row gemv_cols).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowBound {
    One,
    Small,
}

impl RowBound {
    pub const ALL: [RowBound; 2] = [RowBound::One, RowBound::Small];

    /// The bound for `rows` rows of x (or, for the experts, tokens).
    pub(super) fn of(rows: usize) -> RowBound {
        if rows == 1 { RowBound::One } else { RowBound::Small }
    }

    pub(super) fn rows(self) -> usize {
        match self {
            RowBound::One => 1,
            RowBound::Small => SMALL_ROWS,
        }
    }
}

/// A small-row build: its reduction and row bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowsBuild {
    pub reduction: Reduction,
    pub bound: RowBound,
}

impl RowsBuild {
    /// Every build of a weight format.
    pub(super) fn all() -> impl Iterator<Item = RowsBuild> {
        Reduction::ALL.into_iter().flat_map(|reduction| RowBound::ALL.map(|bound| RowsBuild { reduction, bound }))
    }

    /// rows.wgsl's override constants.
    pub(super) fn constants(self) -> Vec<(&'static str, f64)> {
        vec![("ROW_BOUND", self.bound.rows() as f64)]
    }
}

/// The small-row body, and the weight part that adapts the float formats' `load_pair` to it.
pub(super) const BODY: (&str, &str) = ("rows.wgsl", include_str!("../../../shaders/rows.wgsl"));
pub(super) const PAIRS: (&str, &str) = ("rows_pairs.wgsl", include_str!("../../../shaders/rows_pairs.wgsl"));

/// The small-row kernel for `format` in `precision` as `build`, and its `FMT` override: as
/// [`super::linear::linear_shader`] chooses the tile kernel's weight part.
pub(super) fn rows_shader(format: WeightFormat, native_f16: bool, precision: Precision, build: RowsBuild) -> (Shader, u32) {
    match format {
        WeightFormat::F32 => (Shader::Rows(precision, build), 0),
        WeightFormat::BF16 => (Shader::Rows(precision, build), 1),
        WeightFormat::F16 if native_f16 => (Shader::RowsF16(precision, build), 0),
        WeightFormat::F16 => (Shader::Rows(precision, build), 2),
        f => (Shader::Block(BlockKernel::Rows(build), f, precision), 0),
    }
}

/// rows.wgsl's parameter block `P`, less what the weight chunk gives (`w_stride`, `cols`,
/// `col_off`).
#[derive(Default)]
pub(super) struct RowsParams {
    pub n: usize,
    pub k: usize,
    pub out_cols: usize,
    pub has_bias: bool,
    pub x_stride: usize,
    pub group_rows: usize,
    pub topk: usize,
    pub expert: usize,
    pub limit: f32,
}

impl WgpuBackend {
    /// One small-row dispatch of `entry` over the chunk `c` of `w` (one workgroup per pair of
    /// columns), x at binding 1, y at 4, and `extra` bindings (bias at 3, ids at 5). `rows`: the
    /// rows of x (tokens, for the experts), which pick the pipeline's row bound.
    pub(super) fn dispatch_rows(
        &self,
        entry: &'static str,
        w: &WgpuWeight,
        chunk: usize,
        rows: usize,
        params: RowsParams,
        x: &WgpuTensor,
        y: &WgpuTensor,
        extra: &[(u32, wgpu::BindingResource<'_>)],
    ) -> Result<()> {
        let c = &w.chunks[chunk];
        if c.rows == 0 {
            return Ok(());
        }
        let groups = grid(c.rows.div_ceil(2));
        if groups.1 > self.limits.max_compute_workgroups_per_dimension {
            return Err(Error::Device(format!("{entry}: {} columns exceed the dispatch limit", c.rows)));
        }
        let build = RowsBuild { reduction: self.reduction, bound: RowBound::of(rows) };
        let (shader, fmt) = rows_shader(w.format, self.native_f16, self.gemm_precision(w), build);
        let words = [
            params.n,
            params.k,
            w.stride_words,
            c.rows,
            c.row0,
            params.out_cols,
            params.has_bias as usize,
            params.x_stride,
            params.group_rows,
            params.topk,
            params.expert,
        ]
        .map(|v| v as u32);
        let mut block: Vec<u32> = words.to_vec();
        block.push(params.limit.to_bits());
        let mut bindings = vec![(1, x.binding()), (2, c.binding()), (4, y.binding())];
        bindings.extend(extra.iter().cloned());
        self.dispatch(shader, entry, fmt, &block, &bindings, groups)
    }
}
