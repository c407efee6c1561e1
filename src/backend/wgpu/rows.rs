//! The small-row path of the GEMM ops (`shaders/rows.wgsl`): `linear`, `grouped_linear` and the
//! experts' gate, up and down when x has at most [`SMALL_ROWS`] rows (decode: one token, or one
//! per sequence of a batched step). The tile kernels spend almost all their work on padding
//! there; these kernels give each output column one workgroup that reads its weight row once
//! (see rows.wgsl), in every weight format and both precisions, built like the tile kernels:
//! the same float weight parts (`linear_packed.wgsl` with its `FMT`, `linear_f16.wgsl`) or block
//! decoders, the same operands files.

use std::num::NonZeroU64;

use super::formats::BlockKernel;
use super::{Shader, WgpuBackend, WgpuTensor, WgpuWeight, grid};
use crate::backend::{DType, checks};
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

/// How many rows of x a small-row build accumulates (rows.wgsl's `ROWS`, set by the file
/// [`Self::part`] puts before it): a lone sequence's decode step takes the one-row build, without the
/// accumulators, x offsets, slot lists and per-row tests of [`SMALL_ROWS`] (as the CUDA lane's
/// one-row gemv_cols). A constant of the text, not a pipeline-override one: with the arrays
/// sized 8 and their loops bounded by an override of 1, the H200's Vulkan compiler kept all
/// eight entries, and the 8-layer q2 decode step took 8.1–8.3 ms against 6.9–7.0 with them one
/// long (3bfecc4 against the same tree with `ROWS` 1, H200 under Vulkan, 2026-12-04).
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

    /// The file that sets `ROWS` for rows.wgsl and the reductions: its name and WGSL.
    pub(super) fn part(self) -> (&'static str, &'static str) {
        match self {
            RowBound::One => ("rows_one.wgsl", include_str!("../../../shaders/rows_one.wgsl")),
            RowBound::Small => ("rows_eight.wgsl", include_str!("../../../shaders/rows_eight.wgsl")),
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

    /// The files between the weight part and the body: `ROWS`, then the reduction.
    pub(super) fn parts(self) -> [(&'static str, &'static str); 2] {
        [self.bound.part(), self.reduction.part()]
    }
}

/// The small-row body, and the weight part that adapts the float formats' `load_pair` to it.
pub(super) const BODY: (&str, &str) = ("rows.wgsl", include_str!("../../../shaders/rows.wgsl"));
pub(super) const PAIRS: (&str, &str) = ("rows_pairs.wgsl", include_str!("../../../shaders/rows_pairs.wgsl"));

/// The small-row kernel for `format` as `build`, and its `FMT` override: as
/// [`super::linear::linear_shader`] chooses the tile kernel's weight part. In both precisions its
/// operands stay f32 (operands_exact.wgsl): fast precision rounds them to f16 for the f16
/// arithmetic of the tiles and attention, but these products read each weight once and are bound
/// by memory and latency, not arithmetic, so the rounding would only add work (≈ 25 % of these
/// kernels' time on an H200 under Vulkan) and error.
pub(super) fn rows_shader(format: WeightFormat, native_f16: bool, build: RowsBuild) -> (Shader, u32) {
    match format {
        WeightFormat::F32 => (Shader::Rows(build), 0),
        WeightFormat::BF16 => (Shader::Rows(build), 1),
        WeightFormat::F16 if native_f16 => (Shader::RowsF16(build), 0),
        WeightFormat::F16 => (Shader::Rows(build), 2),
        f => (Shader::Block(BlockKernel::Rows(build), f, Precision::Exact), 0),
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
    /// linear_rows split over k: the elements each grid layer sums (0: all of k, one layer).
    pub k_slice: usize,
}

/// Workgroups (column pairs) below which `linear` splits a small-row product over k
/// ([`k_slice`]).
const SPLIT_BELOW_GROUPS: usize = 512;
/// The fewest elements of k a slice takes: one 8-value run a thread of a 64-thread workgroup.
const MIN_SLICE: usize = 512;

/// The elements of k each grid layer of a small-row `linear` over `cols` columns sums: all of k
/// with enough workgroups, else slices (a multiple of 256, so every block format's blocks and
/// spans stay whole) until the dispatch has about [`SPLIT_BELOW_GROUPS`] workgroups. A workgroup
/// walks its slice one load latency a step, so few workgroups over long rows leave most of a GPU
/// idle: the hyper-connection mixes, 12 workgroups over 16 384 inputs, took 0.12 ms each on an
/// H200 under Vulkan.
pub(super) fn k_slice(cols: usize, k: usize) -> usize {
    let groups = cols.div_ceil(2);
    if groups >= SPLIT_BELOW_GROUPS || k < 2 * MIN_SLICE {
        return k;
    }
    let slices = SPLIT_BELOW_GROUPS.div_ceil(groups).min(k / MIN_SLICE);
    k.div_ceil(slices).next_multiple_of(256).min(k)
}

/// The weight rows a small-row dispatch binds: one chunk of a matrix, or every expert of a
/// projection at once ([`ExpertSpan`]).
pub(super) struct RowsWeight<'a> {
    /// The format, row stride and precision come from this matrix (an expert's, for a span).
    pub matrix: &'a WgpuWeight,
    pub binding: wgpu::BindingResource<'a>,
    /// Columns of the dispatch (rows of one matrix's chunk), and the first one's output column.
    pub cols: usize,
    pub col_off: usize,
    /// With every expert bound: the experts and the rows from one's first row to the next's.
    pub experts: Option<(usize, usize)>,
}

impl<'a> RowsWeight<'a> {
    /// Row chunk `chunk` of `w`.
    pub(super) fn chunk(w: &'a WgpuWeight, chunk: usize) -> RowsWeight<'a> {
        let c = &w.chunks[chunk];
        RowsWeight { matrix: w, binding: c.binding(), cols: c.rows, col_off: c.row0, experts: None }
    }
}

/// Every expert of one projection in one binding, equally spaced (`upload_experts` packs them
/// so when they fit): the experts' small-row kernels then take all of a step's slots in one
/// dispatch, each workgroup reading its expert from the ids on the device.
pub(super) struct ExpertSpan<'a> {
    first: &'a WgpuWeight,
    binding: wgpu::BufferBinding<'a>,
    stride_rows: usize,
    experts: usize,
}

impl<'a> ExpertSpan<'a> {
    /// The span of `experts` if they lie in one buffer at offsets `stride_rows` rows apart, in one
    /// format, shape and precision, each in one chunk, within `max_binding` bytes; else `None`.
    pub(super) fn of(experts: &'a [WgpuWeight], max_binding: u64) -> Option<ExpertSpan<'a>> {
        let first = experts.first()?;
        let row_bytes = first.stride_words as u64 * 4;
        let chunk = |w: &'a WgpuWeight| (w.chunks.len() == 1).then(|| &w.chunks[0]);
        let c0 = chunk(first)?;
        let step = match experts.get(1) {
            Some(w) => chunk(w)?.offset.checked_sub(c0.offset)?,
            None => c0.bytes,
        };
        if row_bytes == 0 || step % row_bytes != 0 || step < c0.bytes {
            return None;
        }
        let same = |(e, w): (usize, &'a WgpuWeight)| {
            chunk(w).is_some_and(|c| c.buf == c0.buf && c.offset == c0.offset + e as u64 * step && c.bytes == c0.bytes)
                && (w.format, w.rows, w.cols, w.stride_words, w.exact)
                    == (first.format, first.rows, first.cols, first.stride_words, first.exact)
        };
        let bytes = step * (experts.len() as u64 - 1) + c0.bytes;
        if bytes > max_binding || !experts.iter().enumerate().all(same) {
            return None;
        }
        let binding = wgpu::BufferBinding { buffer: &c0.buf, offset: c0.offset, size: NonZeroU64::new(bytes.max(4)) };
        Some(ExpertSpan { first, binding, stride_rows: (step / row_bytes) as usize, experts: experts.len() })
    }

    pub(super) fn weight(&self) -> RowsWeight<'a> {
        RowsWeight {
            matrix: self.first,
            binding: wgpu::BindingResource::Buffer(self.binding.clone()),
            cols: self.first.rows,
            col_off: 0,
            experts: Some((self.experts, self.stride_rows)),
        }
    }
}

impl<'a> ExpertSpan<'a> {
    /// One span over these experts and then `up`'s, where `upload_expert_pair` placed `up`'s
    /// right after them in one buffer, alike (format, shape, spacing, precision), within
    /// `max_binding` bytes: `up`'s expert e is the span's expert `experts + e`; else `None`.
    pub(super) fn joined(&self, up: &ExpertSpan<'a>, max_binding: u64) -> Option<ExpertSpan<'a>> {
        let (a, b) = (self.first, up.first);
        let ([ca, ..], [cb, ..]) = (a.chunks.as_slice(), b.chunks.as_slice()) else { return None };
        let step = self.stride_rows as u64 * a.stride_words as u64 * 4;
        let alike = (a.format, a.rows, a.cols, a.stride_words, a.exact)
            == (b.format, b.rows, b.cols, b.stride_words, b.exact)
            && (self.stride_rows, self.experts) == (up.stride_rows, up.experts);
        if !alike || ca.buf != cb.buf || Some(cb.offset) != ca.offset.checked_add(step * self.experts as u64) {
            return None;
        }
        let bytes = cb.offset - ca.offset + up.binding.size?.get();
        if bytes > max_binding {
            return None;
        }
        let binding = wgpu::BufferBinding { buffer: &ca.buf, offset: ca.offset, size: NonZeroU64::new(bytes) };
        Some(ExpertSpan { first: a, binding, stride_rows: self.stride_rows, experts: 2 * self.experts })
    }
}

/// Two weights `upload_weight_pair` placed in one binding: a's rows, then b's from row `b_row`
/// (a's rows rounded up to an aligned offset), one format, width and precision, each one chunk,
/// a's rows even, so `linear_rows_pair` takes a decode step's pair in one dispatch.
pub(super) struct PairSpan<'a> {
    binding: wgpu::BufferBinding<'a>,
    b_row: usize,
}

impl<'a> PairSpan<'a> {
    /// The span of `a` then `b` if they lie so, within `max_binding` bytes; else `None`.
    pub(super) fn of(a: &'a WgpuWeight, b: &'a WgpuWeight, max_binding: u64) -> Option<PairSpan<'a>> {
        let ([ca], [cb]) = (a.chunks.as_slice(), b.chunks.as_slice()) else { return None };
        let row_bytes = a.stride_words as u64 * 4;
        let gap = cb.offset.checked_sub(ca.offset)?;
        let bytes = gap + cb.bytes;
        let alike = (a.format, a.cols, a.stride_words, a.exact) == (b.format, b.cols, b.stride_words, b.exact);
        if !alike || ca.buf != cb.buf || row_bytes == 0 || gap % row_bytes != 0 || gap < ca.bytes || bytes > max_binding
        {
            return None;
        }
        if a.rows == 0 || !a.rows.is_multiple_of(2) || b.rows == 0 {
            return None;
        }
        let binding = wgpu::BufferBinding { buffer: &ca.buf, offset: ca.offset, size: NonZeroU64::new(bytes) };
        Some(PairSpan { binding, b_row: (gap / row_bytes) as usize })
    }
}

impl WgpuBackend {
    /// The span `linear_rows_pair` (and `linear_rows_swiglu`) take `wa` and `wb` through in one
    /// small-row dispatch for `n` rows of `k`: the lane's `pair_rows` option, at most
    /// [`SMALL_ROWS`] rows, neither weight on int8 activations, the two in one [`PairSpan`].
    fn pair_dispatch<'a>(&self, wa: &'a WgpuWeight, wb: &'a WgpuWeight, n: usize, k: usize) -> Option<PairSpan<'a>> {
        if !self.opts.pair_rows
            || !(1..=SMALL_ROWS).contains(&n)
            || self.linear_takes_q8x(wa, n, k)
            || self.linear_takes_q8x(wb, n, k)
        {
            return None;
        }
        PairSpan::of(wa, wb, self.max_binding)
    }

    /// Two linears of one input, no bias (`Backend::linear_pair`): with at most [`SMALL_ROWS`]
    /// rows, neither weight on int8 activations and the two in one [`PairSpan`], one small-row
    /// dispatch over both weights' columns (a decode step's wq_a and wkv, a compressor's wkv and
    /// wgate, the shared expert's w1 and w3: each pair was two dispatches, and a narrow weight's
    /// split over k a third); else `linear` of each.
    pub(super) fn linear_pair(
        &self,
        x: &WgpuTensor,
        wa: &WgpuWeight,
        wb: &WgpuWeight,
    ) -> Result<(WgpuTensor, WgpuTensor)> {
        const OP: &str = "linear_pair";
        let (n, k) = checks::linear_pair(x, wa, wb)?;
        let Some(span) = self.pair_dispatch(wa, wb, n, k) else {
            return Ok((self.linear(x, wa, None)?, self.linear(x, wb, None)?));
        };
        self.check_inputs(OP, [("x", x)])?;
        let ya = self.alloc(OP, vec![n, wa.rows], DType::F32)?;
        let yb = self.alloc(OP, vec![n, wb.rows], DType::F32)?;
        let weight = RowsWeight {
            matrix: wa,
            binding: wgpu::BindingResource::Buffer(span.binding),
            cols: wa.rows + wb.rows,
            col_off: 0,
            experts: None,
        };
        // rows.wgsl's linear_rows_pair reads a's columns from `group_rows` and b's first weight
        // row from `x_stride`
        let params = RowsParams { n, k, group_rows: wa.rows, x_stride: span.b_row, ..RowsParams::default() };
        self.dispatch_rows_over("linear_rows_pair", weight, n, params, x, &ya, &[(6, yb.binding())])?;
        Ok((ya, yb))
    }

    /// [`Self::linear_pair`] of a gate `wa` and an up `wb` of as many rows through the clamped
    /// SwiGLU (the shared expert's hidden `[n, rows]`) in one small-row dispatch
    /// (`linear_rows_swiglu`: a workgroup per column pair of both weights, so the SwiGLU is its
    /// epilogue: one `swiglu_clamp` dispatch fewer, the composition's bits) where linear_pair
    /// would take one; `None` where it would not (the caller composes).
    pub(super) fn linear_pair_swiglu(
        &self,
        x: &WgpuTensor,
        wa: &WgpuWeight,
        wb: &WgpuWeight,
        limit: f32,
    ) -> Result<Option<WgpuTensor>> {
        const OP: &str = "linear_pair_swiglu";
        let (n, k) = checks::linear_pair(x, wa, wb)?;
        let Some(span) = self.pair_dispatch(wa, wb, n, k).filter(|_| wa.rows == wb.rows) else {
            return Ok(None);
        };
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, vec![n, wa.rows], DType::F32)?;
        let weight = RowsWeight {
            matrix: wa,
            binding: wgpu::BindingResource::Buffer(span.binding),
            cols: wa.rows,
            col_off: 0,
            experts: None,
        };
        // rows.wgsl's linear_rows_swiglu reads b's first weight row from `x_stride`
        let params = RowsParams { n, k, x_stride: span.b_row, limit, ..RowsParams::default() };
        self.dispatch_rows_over("linear_rows_swiglu", weight, n, params, x, &y, &[])?;
        Ok(Some(y))
    }

    /// One small-row dispatch of `entry` over the chunk `c` of `w`: [`Self::dispatch_rows_over`].
    #[allow(clippy::too_many_arguments)]
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
        self.dispatch_rows_over(entry, RowsWeight::chunk(w, chunk), rows, params, x, y, extra)
    }

    /// One small-row dispatch of `entry` over `w`'s columns (one workgroup per pair, times the
    /// slots `params.n` or the experts, the fewer, when every expert is bound, or times the k
    /// slices of a split linear_rows), x at binding 1, y at 4, and `extra` bindings (bias at 3,
    /// ids at 5). `rows`: the rows of x (tokens, for the experts), which pick the pipeline's row
    /// bound.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_rows_over(
        &self,
        entry: &'static str,
        w: RowsWeight<'_>,
        rows: usize,
        params: RowsParams,
        x: &WgpuTensor,
        y: &WgpuTensor,
        extra: &[(u32, wgpu::BindingResource<'_>)],
    ) -> Result<()> {
        if w.cols == 0 {
            return Ok(());
        }
        // with every expert bound, a grid layer per slot or per expert, whichever are fewer; split
        // over k, a layer a slice
        let k_slice = if params.k_slice == 0 { params.k } else { params.k_slice };
        let layers = match w.experts {
            Some((experts, _)) => params.n.min(experts),
            None => params.k.div_ceil(k_slice.max(1)).max(1),
        };
        let (gx, gy, _) = grid(w.cols.div_ceil(2));
        let max = self.limits.max_compute_workgroups_per_dimension;
        if gy > max || layers > max as usize {
            return Err(Error::Device(format!("{entry}: {} columns × {layers} exceed the dispatch limit", w.cols)));
        }
        let m = w.matrix;
        let build = RowsBuild { reduction: self.reduction, bound: RowBound::of(rows) };
        let (shader, fmt) = rows_shader(m.format, self.native_f16, build);
        let (experts, expert_stride) = w.experts.unwrap_or((0, 0));
        let words = [
            params.n,
            params.k,
            m.stride_words,
            w.cols,
            w.col_off,
            params.out_cols,
            params.has_bias as usize,
            params.x_stride,
            params.group_rows,
            params.topk,
            params.expert,
        ]
        .map(|v| v as u32);
        let mut block: Vec<u32> = words.to_vec();
        block.extend([params.limit.to_bits(), experts as u32, expert_stride as u32]);
        block.extend([k_slice as u32, (params.n * w.cols) as u32]);
        let mut bindings = vec![(1, x.binding()), (2, w.binding), (4, y.binding())];
        bindings.extend(extra.iter().cloned());
        self.dispatch(shader, entry, fmt, &block, &bindings, (gx, gy, layers as u32))
    }

    /// linear's small-row path over chunk `chunk` of `w`: x `[n, k]` → columns `row0 ..` of y
    /// `[n, w.rows]` (+ bias). Few columns over long rows ([`k_slice`]) are split over k: each
    /// slice's partial sums into a scratch `[slices, n, cols]`, then elementwise.wgsl's
    /// `sum_slices` adds them in slice order (and the bias) into y.
    pub(super) fn linear_rows(
        &self,
        w: &WgpuWeight,
        chunk: usize,
        x: &WgpuTensor,
        (n, k): (usize, usize),
        bias: Option<&WgpuTensor>,
        y: &WgpuTensor,
    ) -> Result<()> {
        let bias_at = (3, bias.map_or_else(|| self.dummy.as_entire_binding(), |b| b.binding()));
        let weight = RowsWeight::chunk(w, chunk);
        let slice = if self.opts.split_rows_k { k_slice(weight.cols, k) } else { k };
        let has_bias = bias.is_some();
        if slice >= k {
            let params = RowsParams { n, k, out_cols: w.rows, has_bias, ..RowsParams::default() };
            return self.dispatch_rows_over("linear_rows", weight, n, params, x, y, &[bias_at]);
        }
        let (cols, col_off, slices) = (weight.cols, weight.col_off, k.div_ceil(slice));
        let part = self.alloc("linear", vec![slices, n, cols], DType::F32)?;
        let params = RowsParams { n, k, out_cols: cols, k_slice: slice, ..RowsParams::default() };
        let no_bias = (3, self.dummy.as_entire_binding());
        self.dispatch_rows_over("linear_rows", RowsWeight { col_off: 0, ..weight }, n, params, x, &part, &[no_bias])?;
        let params = [n * cols, 0, cols, slices, w.rows, col_off, has_bias as usize].map(|v| v as u32);
        let bindings = [(1, part.binding()), (2, bias_at.1), (3, y.binding())];
        self.dispatch_1d(Shader::Elementwise, "sum_slices", n * cols, &params, &bindings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_bounds_emit_the_rows_the_lane_dispatches() {
        assert!(RowBound::One.part().1.contains("\nconst ROWS: u32 = 1u;\n"));
        assert!(RowBound::Small.part().1.contains(&format!("\nconst ROWS: u32 = {SMALL_ROWS}u;\n")));
        assert_eq!(RowBound::of(1), RowBound::One);
        assert_eq!(RowBound::of(2), RowBound::Small);
    }
}
