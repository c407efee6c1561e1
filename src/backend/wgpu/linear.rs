//! The GEMM ops, `linear`, `grouped_linear` and `moe_experts` (the routed experts), and the kernel
//! each weight format takes in each.
//!
//! - `linear` runs `shaders/linear_tile.wgsl`'s tile loads (output tiles of 64 rows × 64 or 128
//!   weight rows, `Tiles::columns`) and a tile body (`tile_fma.wgsl`, or `tile_coop.wgsl` on
//!   cooperative matrices: [`Tiles`]), x read as f32 in exact precision and in fast as the f16
//!   copy `half_rows.wgsl` makes once an op ([`TileX`]), over a weight read by
//!   `linear_packed.wgsl` (f32, bf16 as `u << 16`, f16 by an exact integer half→f32 decode),
//!   `linear_f16.wgsl` (`array<vec2<f16>>`, when the device has SHADER_F16) or a block format's
//!   build of `dequant/linear.wgsl`. The integer decode is used rather than `unpack2x16float`,
//!   which needs naga's SHADER_FLOAT16_IN_FLOAT32 capability and may flush subnormals. A weight
//!   split into row chunks (larger than one binding) takes one dispatch per chunk, each writing
//!   its own output columns.
//! - In fast precision on cooperative matrices, `linear` over a weight of any format with k a
//!   multiple of 16 and at least 64 rows of x takes the direct tiles instead
//!   (`shaders/tile_coop_direct.wgsl`, [`Options::direct_tiles`](super::Options)): W's row chunk
//!   rounded once into an f16 copy an op (`half_weight.wgsl`, `dequant/half_weight.wgsl` for a
//!   block format: the same decoding and rounding as the tile loads'), then every matrix load
//!   straight from the two copies, no workgroup staging; 64 or, from `DIRECT_WIDE_ROWS` rows of
//!   x, 128 rows a workgroup. With 128 rows and k a multiple of
//!   32 (`main_wide`, [`Options::wide_tiles`](super::Options)) both operands go through
//!   workgroup memory after all, copied in 16-byte pieces 32 of k at a time: 2.3× faster than
//!   the direct loads on an H100 (the 1920×1080 image's GEMMs 54.4 → 23.8 ms).
//! - `grouped_linear` takes `linear`'s tiles too, one dispatch per group (per piece of a group in
//!   each row chunk).
//! - The routed experts of more than `SMALL_ROWS` tokens take `linear`'s tiles over x's rows
//!   gathered in expert order: one dispatch a projection over every expert's 64-row tiles (a
//!   table of tiles, `row_tiles`) where the projection's experts share one binding
//!   (`ExpertSpan`), else one dispatch per expert and projection over its own rows; each expert
//!   matrix must fit one binding.
//! - With at most `SMALL_ROWS` (8) rows of x — decode, the experts counting tokens — each of the
//!   three takes its small-row kernel instead (`rows.rs`, `shaders/rows.wgsl`: a workgroup per
//!   output column reading its weight row once), for every format and both precisions; in fast
//!   precision one token's experts, and one row against a wide weight, in Q8_0, Q2_K or IQ2_XXS
//!   take int8 activations instead (`q8x.rs`).
//! - Each product runs in the precision of its weight (`gemm_precision`): the lane's, or exact for
//!   a weight from `upload_weight_exact`.

use super::formats::BlockKernel;
use super::rows::{ExpertSpan, RowsParams, RowsWeight, SMALL_ROWS};
use super::tensor::WeightChunk;
use super::{Shader, Tiles, WgpuBackend, WgpuTensor, WgpuWeight, grid};
use crate::backend::{Backend, DType, DeviceTensor, HostTensor, Op, Precision, WeightFormat, checks};
use crate::error::{Error, Result};

/// The rows of x the tiles cover a workgroup (both bodies', and the direct tiles').
const TILE_ROWS: usize = 64;
/// The weight rows an output tile of the direct tiles covers (`tile_coop_direct.wgsl`'s BN): their
/// f16 copy of W is padded with zero rows to a multiple of it.
const DIRECT_TILE_COLS: usize = 128;
/// The rows of x from which the direct tiles take workgroups of 128 rows (`main_128`, 64 × 64
/// outputs a subgroup: half the matrix loads a product of `main`'s 32 × 64) rather than 64. On an
/// H100 (twenty-eighth sitting) the 1 920 × 1 080 ViT's 3 108 rows ran its GEMMs in 55.8 ms on
/// 128 against 67.8 on 64; its 392 × 392 (784 rows, a quarter of the workgroups, too few for
/// the GPU) took 39.5 ms an encode on 128 against 36.9. Between the two, unmeasured. With k a
/// multiple of 32 the 128-row workgroups stage their operands (`main_wide`) and take any rows:
/// the 392 × 392 encode then took 21.1–21.3 ms against 34.6 on 64 (H100, thirtieth sitting;
/// fewer than 784 rows unmeasured).
const DIRECT_WIDE_ROWS: usize = 2048;
/// Workgroup memory of the direct tiles' build (`tile_coop_direct.wgsl`): `main_wide`'s two tiles
/// 128 × (32 + 8) f16 and the 4 subgroups' output staging 16 × 20 f32, which the other entry
/// points use alone. Past `Tiles::COOP_WORKGROUP_BYTES`, so `main_wide` checks the adapter's.
const WIDE_WORKGROUP_BYTES: u32 = 2 * 128 * 40 * 2 + 4 * 16 * 20 * 4;
/// The largest f16 copy of a weight chunk the direct tiles make, a temporary of each op: past it
/// (a bf16 language model's widest matrices) the staged tiles read the weight as it is. The
/// vision tower's are a few MiB each (its MLP's 2 816 × 1 024: 5.5 MiB).
const DIRECT_WEIGHT_BYTES: usize = 256 << 20;

/// x of a tiled GEMM: the f32 tensor, which exact precision's kernels read, and its f16 copy
/// (`half_rows`), which fast precision's read: their tile loads then copy operands instead of
/// rounding every value once per column tile. Made once per op and shared by its dispatches.
struct TileX<'a> {
    f32: &'a WgpuTensor,
    half: Option<WgpuTensor>,
}

/// The part of a tiled product one dispatch computes: x's rows `rows` (y's rows are the same),
/// x's columns `x_cols` (first, count = the product's k) against the binding's weight rows
/// `w_rows` (first, count), written to y's columns from `y_col`.
struct TilePart<'a> {
    rows: TileRowSource<'a>,
    x_cols: (usize, usize),
    w_rows: (usize, usize),
    y_col: usize,
}

/// The rows of x and y each workgroup row of a tile dispatch covers (tile_rows.wgsl's
/// `tile_rows`).
enum TileRowSource<'a> {
    /// Rows first .. first + count, 64 a workgroup row.
    Range(usize, usize),
    /// Entry i of `table` for workgroup row i ([`expert_row_tiles`]: first row, count ≤ 64,
    /// expert; `tiles` entries), the experts' matrices `expert_stride` weight rows apart in the
    /// binding: a dispatch over every expert of a projection.
    Experts { table: &'a WgpuTensor, tiles: usize, expert_stride: usize },
}

/// The kernel of `linear` for `format` in `precision` on `tiles` (the FMA tiles in exact
/// precision: the cooperative ones take f16 operands), with its `FMT` override and the tiles it
/// runs on:
/// `linear_packed.wgsl` for f32 (0), bf16 (1) and f16 without SHADER_F16 (2, integer decode),
/// `linear_f16.wgsl` for f16 with it (`native_f16`), else the format's block build of
/// dequant/linear.wgsl.
pub(super) fn linear_shader(
    format: WeightFormat,
    native_f16: bool,
    precision: Precision,
    tiles: Tiles,
) -> (Shader, u32, Tiles) {
    let tiles = if precision == Precision::Fast { tiles } else { Tiles::Fma };
    let (shader, fmt) = match format {
        WeightFormat::F32 => (Shader::Linear(precision, tiles), 0),
        WeightFormat::BF16 => (Shader::Linear(precision, tiles), 1),
        WeightFormat::F16 if native_f16 => (Shader::LinearF16(precision, tiles), 0),
        WeightFormat::F16 => (Shader::Linear(precision, tiles), 2),
        f => (Shader::Block(BlockKernel::Linear(tiles), f, precision), 0),
    };
    (shader, fmt, tiles)
}

/// The kernel that rounds a weight of `format` to f16 for the direct tiles (`half_weight.wgsl`),
/// with its `FMT` override: over `linear_packed.wgsl` for f32 (0) and bf16 (1), over
/// `linear_f16.wgsl` for f16 (fast precision has SHADER_F16); for a block format its build of
/// `dequant/half_weight.wgsl` (a thread per run of 8 values, not per pair).
pub(super) fn half_weight_shader(format: WeightFormat) -> (Shader, u32) {
    match format {
        WeightFormat::F32 => (Shader::HalfWeight(false), 0),
        WeightFormat::BF16 => (Shader::HalfWeight(false), 1),
        WeightFormat::F16 => (Shader::HalfWeight(true), 0),
        f => (Shader::Block(BlockKernel::HalfWeight, f, Precision::Fast), 0),
    }
}

/// The kernel of `embed_rows` (lm.wgsl's one weight op, a lookup: the exact build) for `format`,
/// with the `fmt` parameter it reads: lm.wgsl itself for the float formats (0 f32, 1 bf16, 2
/// f16), else the format's block build of dequant/lm.wgsl (which has no `fmt`).
pub(super) fn lm_weight_shader(format: WeightFormat) -> (Shader, u32) {
    match format {
        WeightFormat::F32 => (Shader::Lm, 0),
        WeightFormat::BF16 => (Shader::Lm, 1),
        WeightFormat::F16 => (Shader::Lm, 2),
        f => (Shader::Block(BlockKernel::Lm, f, Precision::Exact), 0),
    }
}

impl WgpuBackend {
    /// The precision of the products with `w`: the lane's, or exact for a weight from
    /// `upload_weight_exact`.
    pub(super) fn gemm_precision(&self, w: &WgpuWeight) -> Precision {
        if w.exact { Precision::Exact } else { self.opts.precision }
    }

    /// x as the tiled GEMMs over `weights` read it: with its f16 copy where any of them takes
    /// fast precision ([`TileX`]).
    fn tile_x<'a, 'w>(
        &self,
        x: &'a WgpuTensor,
        weights: impl IntoIterator<Item = &'w WgpuWeight>,
    ) -> Result<TileX<'a>> {
        let fast = weights.into_iter().any(|w| self.gemm_precision(w) == Precision::Fast);
        let half = if fast { Some(self.half_rows(x, x.rows())?) } else { None };
        Ok(TileX { f32: x, half })
    }

    /// x `[n, cols]` rounded to f16 as fast precision's GEMM operands are (`half_rows.wgsl`):
    /// `[rows, ⌈cols / 2⌉]` words of two f16 values, a row's odd tail and the rows past n (rows ≥
    /// n) zero.
    pub(super) fn half_rows(&self, x: &WgpuTensor, rows: usize) -> Result<WgpuTensor> {
        const OP: &str = "half_rows";
        let (n, cols) = (x.rows(), x.cols());
        if rows < n {
            return Err(Error::Device(format!("op `{OP}`: {rows} rows cannot hold x's {n}")));
        }
        let half = cols.div_ceil(2);
        let y = self.alloc(OP, vec![rows, half], DType::I32)?;
        let words = rows * half;
        self.dispatch_1d(
            Shader::HalfRows,
            OP,
            words,
            &[words as u32, cols as u32, half as u32, n as u32],
            &[(1, x.binding()), (4, y.binding())],
        )?;
        Ok(y)
    }

    /// x `[n, k]` · W `[out, k]`ᵀ + b `[out]` → `[n, out]`, one dispatch per weight chunk.
    pub(super) fn linear(&self, x: &WgpuTensor, w: &WgpuWeight, bias: Option<&WgpuTensor>) -> Result<WgpuTensor> {
        const OP: &str = "linear";
        let (n, k) = checks::linear(x, w, bias)?;
        self.check_inputs(OP, [("x", x)].into_iter().chain(bias.map(|b| ("bias", b))))?;
        let y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        if n == 0 || w.rows == 0 {
            return Ok(y);
        }
        if n <= SMALL_ROWS {
            // one row against a wide weight in a q8x format: int8 activations (fast precision)
            let q8x = self.linear_takes_q8x(w, n, k);
            for chunk in 0..w.chunks.len() {
                if q8x {
                    self.linear_q8x(w, chunk, x, k, bias, &y)?;
                } else {
                    self.linear_rows(w, chunk, x, (n, k), bias, &y)?;
                }
            }
            return Ok(y);
        }
        if self.takes_direct_tiles(w, n, k) {
            // x's copy padded with zero rows to whole row tiles, so every matrix load is in bounds
            let rows = self.direct_tile_rows(n, k);
            let half = self.half_rows(x, n.div_ceil(rows) * rows)?;
            for c in &w.chunks {
                self.linear_direct(&half, w, c, bias, &y, n)?;
            }
        } else {
            self.dispatch_tiles("linear_tiles", &self.tile_x(x, [w])?, w, bias, &y, 0, n)?;
        }
        Ok(y)
    }

    /// Whether `linear` over `w` with `n` rows of x and `k` columns takes the direct tiles
    /// (`tile_coop_direct.wgsl`): on cooperative matrices in fast precision, any weight format
    /// (a block format's f16 copy decoded as its tile loads decode it), k a multiple of 16
    /// (their matrix loads' alignment and width), at least a row tile of x
    /// (with fewer, W's copy would cost more than the loads it saves; where between one and a
    /// few row tiles it starts to pay is not measured), each chunk's f16 copy at most
    /// `DIRECT_WEIGHT_BYTES` and x's padded copy within one binding.
    fn takes_direct_tiles(&self, w: &WgpuWeight, n: usize, k: usize) -> bool {
        let copy_bytes = |c: &WeightChunk| c.rows.div_ceil(DIRECT_TILE_COLS) * DIRECT_TILE_COLS * k * 2;
        let rows = self.direct_tile_rows(n, k);
        let x_copy_bytes = n.div_ceil(rows) * rows * k * 2;
        self.opts.direct_tiles
            && x_copy_bytes as u64 <= self.max_binding
            && self.tiles == Tiles::Coop
            && self.gemm_precision(w) == Precision::Fast
            && k.is_multiple_of(16)
            && n >= TILE_ROWS
            && w.chunks.iter().all(|c| copy_bytes(c) <= DIRECT_WEIGHT_BYTES.min(self.max_binding as usize))
    }

    /// The rows of x a workgroup of the direct tiles covers with `n` rows of x: 128 (`main_128`)
    /// from `DIRECT_WIDE_ROWS` rows or where `main_wide` takes k (`wide_tiles`), else 64
    /// (`main`), unless [`Options::direct_tile_rows`](super::Options) forces one.
    fn direct_tile_rows(&self, n: usize, k: usize) -> usize {
        match self.opts.direct_tile_rows {
            Some(128) => 128,
            Some(_) => TILE_ROWS,
            None if n >= DIRECT_WIDE_ROWS || self.wide_tiles(k) => 128,
            None => TILE_ROWS,
        }
    }

    /// Whether the direct tiles' 128-row workgroups stage their operands (`main_wide`) for rows
    /// of `k`: its 16-byte copies need whole steps of 32 and rows starting 16-byte aligned (x's
    /// copy and W's both have k columns: multiples of 8 with k), and at least one step (with k
    /// 0 its copies' bindings would be below a `Piece`).
    fn wide_tiles(&self, k: usize) -> bool {
        self.opts.wide_tiles
            && k > 0
            && k.is_multiple_of(32)
            && self.limits.max_compute_workgroup_storage_size >= WIDE_WORKGROUP_BYTES
    }

    /// Weight chunk `c` of `w` `[c.rows, k]` rounded to f16 as fast precision's tile loads round it
    /// (`half_weight.wgsl`): `[rows, k / 2]` words of two f16 values, its rows padded with zero
    /// rows to a multiple of `DIRECT_TILE_COLS` (k even).
    fn half_weight(&self, w: &WgpuWeight, c: &WeightChunk) -> Result<WgpuTensor> {
        const OP: &str = "half_weight";
        let (shader, fmt) = half_weight_shader(w.format);
        // a float weight's kernel takes a pair a thread, a block format's a run of 8
        let per_thread = if matches!(shader, Shader::Block(..)) { 4 } else { 1 };
        if !w.cols.is_multiple_of(2 * per_thread) {
            return Err(Error::Device(format!(
                "op `{OP}`: `{}` has rows of {}, not a multiple of {}",
                w.name,
                w.cols,
                2 * per_thread
            )));
        }
        let (rows, half) = (c.rows.div_ceil(DIRECT_TILE_COLS) * DIRECT_TILE_COLS, w.cols / 2);
        let y = self.alloc(OP, vec![rows, half], DType::I32)?;
        let words = rows * half;
        if words == 0 {
            return Ok(y);
        }
        let params = [words as u32, w.cols as u32, w.stride_words as u32, c.rows as u32, 0];
        let groups = grid((words / per_thread).div_ceil(256));
        self.dispatch(shader, OP, fmt, &params, &[(2, c.binding()), (4, y.binding())], groups)?;
        Ok(y)
    }

    /// The direct tiles (`tile_coop_direct.wgsl`) over chunk `c` of `w` against x's f16 copy
    /// `half` (its rows padded to whole row tiles, `direct_tile_rows`), rows 0 .. n, into y's
    /// columns from the chunk's first row: tile_rows.wgsl's parameters, W's row length in f16
    /// elements.
    fn linear_direct(
        &self,
        half: &WgpuTensor,
        w: &WgpuWeight,
        c: &WeightChunk,
        bias: Option<&WgpuTensor>,
        y: &WgpuTensor,
        n: usize,
    ) -> Result<()> {
        // the entry point of the workgroup's rows, and its name in `kernel_times`
        let k = w.cols;
        let tile_rows = self.direct_tile_rows(n, k);
        let wide = tile_rows == 128 && self.wide_tiles(k);
        let (entry, label) = match (tile_rows, wide) {
            (128, true) => ("main_wide", "linear_wide_128"),
            (128, false) => ("main_128", "linear_direct_128"),
            _ => ("main", "linear_direct"),
        };
        let gy = n.div_ceil(tile_rows);
        if half.rows() < gy * tile_rows {
            return Err(Error::Device(format!("op `{label}`: x's copy has {} rows, not {n} padded", half.rows())));
        }
        let gx = c.rows.div_ceil(DIRECT_TILE_COLS);
        if gx.max(gy) > self.limits.max_compute_workgroups_per_dimension as usize {
            return Err(Error::Device(format!("op `{label}`: {gy} × {gx} tiles exceed the dispatch limit")));
        }
        let w16 = self.half_weight(w, c)?;
        let bias_res = bias.map_or_else(|| self.dummy.as_entire_binding(), |b| b.binding());
        let params = [
            n as u32,
            k as u32,
            y.cols() as u32,
            c.row0 as u32,
            c.rows as u32,
            k as u32, // w_stride: W's copy, in f16 elements
            bias.is_some() as u32,
            0,                        // row_off
            (2 * half.cols()) as u32, // x_stride, in f16 elements
            0,                        // x_col
            0,                        // w_row0
            0,                        // expert_stride
        ];
        // main_wide reads the same copies through its 16-byte views (bindings 6 and 7) only
        let (x_at, w_at) = if wide { (6, 7) } else { (1, 2) };
        let bindings = [
            (x_at, half.binding()),
            (w_at, w16.binding()),
            (3, bias_res),
            (4, y.binding()),
            (5, self.dummy.as_entire_binding()),
        ];
        let groups = (gx as u32, gy as u32, 1);
        self.dispatch_as(label, Shader::LinearCoopDirect, entry, 0, &params, &bindings, groups)
    }

    /// The tiled linear over rows `row_off .. row_off + n` of x into the same rows of y (y has
    /// `w.rows` columns), one dispatch per weight chunk, timed under `label`.
    #[allow(clippy::too_many_arguments)]
    fn dispatch_tiles(
        &self,
        label: &'static str,
        x: &TileX<'_>,
        w: &WgpuWeight,
        bias: Option<&WgpuTensor>,
        y: &WgpuTensor,
        row_off: usize,
        n: usize,
    ) -> Result<()> {
        for c in &w.chunks {
            let rows = TileRowSource::Range(row_off, n);
            let part = TilePart { rows, x_cols: (0, x.f32.cols()), w_rows: (0, c.rows), y_col: c.row0 };
            self.dispatch_tile_part(label, x, w, c.binding(), bias, y, part)?;
        }
        Ok(())
    }

    /// One dispatch of the tiled linear (linear_tile.wgsl, or the block formats'
    /// dequant/linear.wgsl) over `part`, timed under `label` (`FOVEA_GPU_TIMES`); its parameter
    /// block is tile_rows.wgsl's `P`.
    #[allow(clippy::too_many_arguments)]
    fn dispatch_tile_part(
        &self,
        label: &'static str,
        x: &TileX<'_>,
        w: &WgpuWeight,
        chunk: wgpu::BindingResource<'_>,
        bias: Option<&WgpuTensor>,
        y: &WgpuTensor,
        part: TilePart,
    ) -> Result<()> {
        let TilePart { rows, x_cols: (x_col, k), w_rows: (w_row0, w_rows), y_col } = part;
        // (row_off, n, expert_stride), the row tiles' binding, and the workgroup rows (both tile
        // bodies: 64 rows of x a workgroup)
        let ((row_off, n, expert_stride), row_tiles, gy) = match rows {
            TileRowSource::Range(row_off, n) => ((row_off, n, 0), self.dummy.as_entire_binding(), n.div_ceil(64)),
            TileRowSource::Experts { table, tiles, expert_stride } => ((0, 0, expert_stride), table.binding(), tiles),
        };
        if gy > self.limits.max_compute_workgroups_per_dimension as usize {
            return Err(Error::Device(format!("op `{label}`: {gy} row tiles exceed the dispatch limit")));
        }
        let precision = self.gemm_precision(w);
        let (shader, fmt, tiles) = linear_shader(w.format, self.native_f16, precision, self.tiles);
        // x's operands and row length in them: f32, or the f16 copy of fast precision
        let (x_res, x_stride) = match (precision, &x.half) {
            (Precision::Exact, _) => (x.f32.binding(), x.f32.cols()),
            (Precision::Fast, Some(half)) => (half.binding(), 2 * half.cols()),
            (Precision::Fast, None) => {
                return Err(Error::Device(format!(
                    "op `{label}`: `{}` takes fast precision, and x came without its f16 copy",
                    w.name
                )));
            }
        };
        let bias_res = bias.map_or_else(|| self.dummy.as_entire_binding(), |b| b.binding());
        let params = [
            n as u32,
            k as u32,
            y.cols() as u32,
            y_col as u32,
            w_rows as u32,
            w.stride_words as u32,
            bias.is_some() as u32,
            row_off as u32,
            x_stride as u32,
            x_col as u32,
            w_row0 as u32,
            expert_stride as u32,
        ];
        self.dispatch_as(
            label,
            shader,
            "main",
            fmt,
            &params,
            &[(1, x_res), (2, chunk), (3, bias_res), (4, y.binding()), (5, row_tiles)],
            (w_rows.div_ceil(tiles.columns()) as u32, gy as u32, 1),
        )
    }

    /// x `[n, g·k]`, W `[g·r, k]` (any format, possibly row-chunked) → `[n, g·r]`.
    pub(super) fn grouped_linear(&self, x: &WgpuTensor, w: &WgpuWeight, groups: usize) -> Result<WgpuTensor> {
        const OP: &str = "grouped_linear";
        let (n, k, r) = checks::grouped_linear(x, w, groups)?;
        self.check_inputs(OP, [("x", x)])?;
        let cols = x.cols();
        let y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        if n == 0 {
            return Ok(y);
        }
        if n <= SMALL_ROWS {
            for chunk in 0..w.chunks.len() {
                let params =
                    RowsParams { n, k, out_cols: w.rows, x_stride: cols, group_rows: r, ..RowsParams::default() };
                self.dispatch_rows("grouped_rows", w, chunk, n, params, x, &y, &[])?;
            }
            return Ok(y);
        }
        // linear's tiles, one dispatch per group (per piece of it in each row chunk): group gi's
        // weight rows gi·r .. against x's columns gi·k ..
        let x = self.tile_x(x, [w])?;
        for c in &w.chunks {
            for gi in c.row0 / r..(c.row0 + c.rows).div_ceil(r) {
                let (lo, hi) = ((gi * r).max(c.row0), ((gi + 1) * r).min(c.row0 + c.rows));
                let rows = TileRowSource::Range(0, n);
                let part = TilePart { rows, x_cols: (gi * k, k), w_rows: (lo - c.row0, hi - lo), y_col: lo };
                self.dispatch_tile_part("grouped_tiles", &x, w, c.binding(), None, &y, part)?;
            }
        }
        Ok(y)
    }

    /// Routed experts, each weight read by its own format's kernel, then a weighted sum over the
    /// slots in order. Each expert matrix must fit one binding. With at most `SMALL_ROWS` tokens
    /// and each projection's experts in one binding ([`ExpertSpan`]), one small-row dispatch a
    /// projection covers every slot, its workgroups reading their experts from `ids` on the
    /// device; with at most `SMALL_ROWS` tokens otherwise, one small-row (gate, up, down) triple
    /// per expert the ids name ([`Self::routed_experts`]); with more tokens, the slots grouped
    /// by expert and each expert's rows a tiled GEMM ([`Self::experts_as_tiles`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_experts(
        &self,
        x: &WgpuTensor,
        ids: &WgpuTensor,
        weights: &WgpuTensor,
        w1: &[WgpuWeight],
        w3: &[WgpuWeight],
        w2: &[WgpuWeight],
        limit: f32,
    ) -> Result<WgpuTensor> {
        const OP: &str = "moe_experts";
        let (n, d, k, h) = checks::moe_experts(x, ids, weights, w1, w3, w2)?;
        self.check_inputs(OP, [("x", x), ("ids", ids), ("weights", weights)])?;
        if let Some(w) = w1.iter().chain(w3).chain(w2).find(|w| w.chunks.len() != 1) {
            return Err(Self::unsupported(
                Op::MoeExperts,
                format!("expert `{}` split into row chunks (larger than one binding)", w.name),
            ));
        }

        let slots = n * k;
        let ys = if (1..=SMALL_ROWS).contains(&n) {
            let hid = self.alloc(OP, vec![slots, h], DType::F32)?;
            let ys = self.alloc(OP, vec![slots, d], DType::F32)?;
            let ids_at = [(5, ids.binding())];
            // gate, up (with the clamped SwiGLU over hid) and down, over `expert`'s slots, or every
            // slot when the weights span every expert. One token's projections in a q8x format
            // take int8 activations where `experts_take_q8x` says so (fast precision, every expert
            // bound), each its own choice: both kinds write hid and ys alike, so either kind of
            // gate feeds either kind of up.
            let project = |rows_entry: &'static str,
                           q8x_entry: &'static str,
                           w: RowsWeight<'_>,
                           k_len: usize,
                           x_in: &WgpuTensor,
                           y_out: &WgpuTensor,
                           expert: usize|
             -> Result<()> {
                if self.experts_take_q8x(&w, n, k_len) {
                    return self.dispatch_experts_q8x(q8x_entry, w, slots, k_len, limit, x_in, y_out, ids);
                }
                let out_cols = y_out.cols();
                let params =
                    RowsParams { n: slots, k: k_len, out_cols, topk: k, expert, limit, ..RowsParams::default() };
                self.dispatch_rows_over(rows_entry, w, n, params, x_in, y_out, &ids_at)
            };
            let down =
                |o: RowsWeight<'_>, expert: usize| project("moe_down_rows", "moe_down_q8x", o, h, &hid, &ys, expert);
            let triple = |[g, u, o]: [RowsWeight<'_>; 3], expert: usize| -> Result<()> {
                project("moe_gate_rows", "moe_gate_q8x", g, d, x, &hid, expert)?;
                project("moe_up_rows", "moe_up_q8x", u, d, x, &hid, expert)?;
                down(o, expert)
            };
            if let [Some(g), Some(u), Some(o)] = [w1, w3, w2].map(|w| ExpertSpan::of(w, self.max_binding)) {
                // no readback, so no wait for the work queued so far: a decode step's layers are
                // queued back to back. One token's gate and up on int8 activations, placed
                // together (`upload_expert_pair`), take one dispatch.
                let joined = g.joined(&u, self.max_binding).filter(|_| {
                    self.opts.fused_gate_up
                        && self.experts_take_q8x(&g.weight(), n, d)
                        && self.experts_take_q8x(&u.weight(), n, d)
                });
                match joined {
                    Some(gu) => {
                        self.dispatch_gate_up_q8x(gu.weight(), w1.len(), slots, d, limit, x, &hid, ids)?;
                        down(o.weight(), 0)?;
                    }
                    None => triple([g.weight(), u.weight(), o.weight()], 0)?,
                }
            } else {
                let routed = self.routed_experts(ids, w1.len(), slots)?;
                let experts = w1.iter().zip(w3).zip(w2).enumerate().filter(|(e, _)| routed[*e]);
                // the small-row path from the token count: a token routes each slot to a different
                // expert, so an expert gets at most n slots, one batch of rows per column
                for (e, ((g, u), o)) in experts {
                    triple([g, u, o].map(|w| RowsWeight::chunk(w, 0)), e)?;
                }
            }
            ys
        } else {
            self.experts_as_tiles(x, ids, w1, w3, w2, limit)?
        };
        let y = self.alloc(OP, vec![n, d], DType::F32)?;
        self.dispatch_1d(
            Shader::Lm,
            "moe_sum",
            n * d,
            &[(n * d) as u32, d as u32, k as u32, w1.len() as u32],
            &[(1, ys.binding()), (2, weights.binding()), (4, ids.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }

    /// The prefill's experts: the slots grouped by expert (one readback of the ids), x's rows
    /// gathered in that order `[runs, d]`, then a tiled GEMM a projection over each expert's own
    /// rows (its weight read once per 64 rows; the thread-per-output kernels this replaces
    /// re-read a weight row for every slot, 46 of 49 s of a 4-layer prefill on an H200 under
    /// Vulkan) — one dispatch over every expert where the projection's experts share a binding,
    /// else one an expert —, the clamped SwiGLU over every row at once, and the results gathered
    /// back into slot order `[n·k, d]`. A slot whose id is outside `0..experts` is in no run: its
    /// row is a copy of the first run's, and `moe_sum` makes its token NaN.
    fn experts_as_tiles(
        &self,
        x: &WgpuTensor,
        ids: &WgpuTensor,
        w1: &[WgpuWeight],
        w3: &[WgpuWeight],
        w2: &[WgpuWeight],
        limit: f32,
    ) -> Result<WgpuTensor> {
        const OP: &str = "moe_experts";
        let (slots, k, d, h) = (ids.rows() * ids.cols(), ids.cols(), x.cols(), w1[0].rows);
        let (order, at) = self.slots_by_expert(ids, w1.len())?;
        if order.is_empty() {
            return self.alloc(OP, vec![slots, d], DType::F32);
        }
        let runs = order.len();
        let tokens: Vec<i32> = order.iter().map(|&slot| (slot / k) as i32).collect();
        let xs = self.gather_rows(x, &self.upload(&HostTensor::i32([runs], tokens)?)?)?; // [runs, d]
        // Each projection one dispatch over every expert's tiles where its experts share a
        // binding: a prefill chunk routes its ~6·2048 slots over 256 experts, a few dozen rows
        // each, and a dispatch an expert was a few dozen workgroups, most of an H200 idle, 768
        // dispatches a layer one after another. Else one dispatch an expert (with rows).
        let spans = [w1, w3, w2].map(|w| ExpertSpan::of(w, self.max_binding));
        let table = if spans.iter().all(Option::is_some) {
            let row_tiles = expert_row_tiles(&at);
            Some((row_tiles.len() / 3, self.upload(&HostTensor::i32([row_tiles.len()], row_tiles)?)?))
        } else {
            None
        };
        // x's rows (in expert order) times projection `p`'s experts (`ws`) into y
        let project = |x: &TileX<'_>, p: usize, ws: &[WgpuWeight], y: &WgpuTensor| -> Result<()> {
            if let (Some(span), Some((tiles, table))) = (&spans[p], &table) {
                let span = span.weight();
                let (_, expert_stride) = span.experts.expect("a span over every expert");
                let rows = TileRowSource::Experts { table, tiles: *tiles, expert_stride };
                let part = TilePart { rows, x_cols: (0, x.f32.cols()), w_rows: (0, span.matrix.rows), y_col: 0 };
                return self.dispatch_tile_part("expert_tiles", x, span.matrix, span.binding, None, y, part);
            }
            for (e, w) in ws.iter().enumerate().filter(|&(e, _)| at[e + 1] > at[e]) {
                self.dispatch_tiles("expert_tiles", x, w, None, y, at[e], at[e + 1] - at[e])?;
            }
            Ok(())
        };
        let gate = self.alloc(OP, vec![runs, h], DType::F32)?;
        let up = self.alloc(OP, vec![runs, h], DType::F32)?;
        let xs_in = self.tile_x(&xs, w1.iter().chain(w3))?;
        project(&xs_in, 0, w1, &gate)?;
        project(&xs_in, 1, w3, &up)?;
        let hid = self.swiglu_clamp(&gate, &up, limit)?; // [runs, h]
        drop((gate, up, xs_in));
        drop(xs);
        let ys = self.alloc(OP, vec![runs, d], DType::F32)?;
        project(&self.tile_x(&hid, w2)?, 2, w2, &ys)?;
        let mut row_of_slot = vec![0i32; slots];
        for (row, &slot) in order.iter().enumerate() {
            row_of_slot[slot] = row as i32;
        }
        self.gather_rows(&ys, &self.upload(&HostTensor::i32([slots], row_of_slot)?)?)
    }

    /// The slots grouped by expert, read back from `ids` (one wait for the work queued so far):
    /// the slot numbers in expert order and where each expert's run starts, `experts + 1`
    /// bounds. A slot whose id is outside `0..experts` is in no run.
    fn slots_by_expert(&self, ids: &WgpuTensor, experts: usize) -> Result<(Vec<usize>, Vec<usize>)> {
        let ids: Vec<i32> = bytemuck::pod_collect_to_vec(&self.read_back(ids, 0, ids.bytes)?);
        let expert_of = |id: i32| usize::try_from(id).ok().filter(|&e| e < experts);
        let mut at = vec![0usize; experts + 1];
        for e in ids.iter().filter_map(|&id| expert_of(id)) {
            at[e + 1] += 1;
        }
        for e in 0..experts {
            at[e + 1] += at[e];
        }
        let mut next = at.clone();
        let mut order = vec![0usize; at[experts]];
        for (slot, e) in ids.iter().enumerate().filter_map(|(s, &id)| expert_of(id).map(|e| (s, e))) {
            order[next[e]] = slot;
            next[e] += 1;
        }
        Ok((order, at))
    }

    /// Which of `experts` experts the `slots` routed ids name. Every expert's dispatches cost a
    /// command even when no slot routes to it (the kernels compare ids on the device), and a
    /// decode step of the full model routes 6 slots among 256 experts: 768 dispatches a layer,
    /// most of a step on a GPU. So with more experts than slots the ids are read back (one wait
    /// for the work queued so far) and only the named experts run; otherwise all do (an id out
    /// of range names none, as on the device).
    fn routed_experts(&self, ids: &WgpuTensor, experts: usize, slots: usize) -> Result<Vec<bool>> {
        if experts <= slots {
            return Ok(vec![true; experts]);
        }
        let raw = self.read_back(ids, 0, ids.bytes)?;
        let mut routed = vec![false; experts];
        for id in bytemuck::pod_collect_to_vec::<u8, i32>(&raw) {
            if let Some(r) = usize::try_from(id).ok().and_then(|e| routed.get_mut(e)) {
                *r = true;
            }
        }
        Ok(routed)
    }
}

/// The row tiles of a dispatch over every expert: each expert's run of rows `at[e] .. at[e + 1]`
/// (in the rows gathered in expert order) cut into tiles of at most 64 rows, three words each
/// (first row, rows, expert), as `linear_tile.wgsl`'s `row_tiles` reads them.
fn expert_row_tiles(at: &[usize]) -> Vec<i32> {
    let mut tiles = Vec::new();
    for (e, run) in at.windows(2).enumerate() {
        for first in (run[0]..run[1]).step_by(64) {
            tiles.extend([first, (run[1] - first).min(64), e].map(|v| v as i32));
        }
    }
    tiles
}

#[cfg(test)]
mod tests {
    use super::{DIRECT_TILE_COLS, TILE_ROWS, WIDE_WORKGROUP_BYTES, expert_row_tiles};
    use crate::backend::wgpu::{Options, Shader, WgpuBackend};
    use crate::backend::{Backend, HostData, HostTensor, HostWeight, Precision, WeightFormat};

    /// A lane of `opts` in fast precision; `None`, saying so, where no adapter with f16 shaders
    /// opens, but a failure there under CI or `FOVEA_REQUIRE_WGPU=1` (as tests/common's lanes).
    fn fast_lane(opts: Options) -> Option<WgpuBackend> {
        match WgpuBackend::with_options(Options { precision: Precision::Fast, ..opts }) {
            Ok(lane) => Some(lane),
            Err(e) => {
                let required = std::env::var_os("CI").is_some()
                    || std::env::var("FOVEA_REQUIRE_WGPU").is_ok_and(|v| v.trim() == "1");
                assert!(!required, "no wgpu lane in fast precision where it must run: {e}");
                eprintln!("SKIPPED: no wgpu lane in fast precision ({e})");
                None
            }
        }
    }

    /// `half_rows` rounds each value to the nearest f16 (ties to even) and zeroes what lies past
    /// x: a row's odd tail and, asked for more rows than x has (the direct cooperative attention's
    /// padding to 64 rows, which only a GPU with cooperative matrices runs), the rows past n.
    /// Skips where no adapter with f16 shaders opens ([`fast_lane`]).
    #[test]
    fn half_rows_round_once_and_zero_the_padding() {
        let Some(lane) = fast_lane(Options::default()) else { return };
        let (n, cols, rows) = (3, 5, 8);
        // values whose f16 rounding is known: two ties (1 + 2^-11 → 1 and 1 + 3·2^-11 → 1 +
        // 2^-9, each to the even neighbour), a subnormal, and plain ones
        let x: Vec<f32> = (0..n * cols)
            .map(|i| match i % 5 {
                0 => 1.0 + 2f32.powi(-11),
                1 => 1.0 + 3.0 * 2f32.powi(-11),
                2 => 3.0e-7,
                3 => -(i as f32) * 0.25,
                _ => i as f32,
            })
            .collect();
        let t = lane.upload(&HostTensor::f32([n, cols], x.clone()).unwrap()).unwrap();
        let y = lane.download(&lane.half_rows(&t, rows).unwrap()).unwrap();
        assert_eq!(y.shape, [rows, cols.div_ceil(2)]);
        let HostData::I32(words) = y.data else { panic!("half_rows gave f32") };
        let half = |w: i32, hi: bool| half::f16::from_bits(((w as u32) >> if hi { 16 } else { 0 }) as u16);
        for r in 0..rows {
            for c in 0..2 * cols.div_ceil(2) {
                let got = half(words[r * cols.div_ceil(2) + c / 2], c % 2 == 1);
                let want = if r < n && c < cols { half::f16::from_f32(x[r * cols + c]) } else { half::f16::ZERO };
                assert_eq!(got.to_bits(), want.to_bits(), "row {r}, column {c}: {got} against {want}");
            }
        }
        assert!(lane.half_rows(&t, n - 1).is_err(), "fewer rows than x has");
    }

    /// `half_weight` rounds each value of a weight to the nearest f16 (ties to even) as the tile
    /// loads do, and pads the rows to the direct tiles' width with zeros; per float format (f32,
    /// bf16, f16), for a weight split into row chunks (f32 here: each chunk its own copy) and for
    /// a block format (Q8_0: its own kernel).
    /// Skips where no adapter with f16 shaders opens ([`fast_lane`]).
    #[test]
    fn half_weight_rounds_once_and_pads_to_the_direct_tiles() {
        let Some(lane) = fast_lane(Options { max_binding_bytes: Some(4096), ..Options::default() }) else { return };
        let (rows, cols) = (100, 12);
        // a tie to even (1 + 2^-11 → 1), a value past f16's precision, a subnormal, plain ones
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| match i % 4 {
                0 => 1.0 + 2f32.powi(-11),
                1 => 0.1 * i as f32,
                2 => -3.0e-7,
                _ => -(i as f32),
            })
            .collect();
        for format in [WeightFormat::F32, WeightFormat::BF16, WeightFormat::F16] {
            // the weight as stored, and each value as the lane decodes it
            let (bytes, decoded): (Vec<u8>, Vec<f32>) = match format {
                WeightFormat::F32 => (values.iter().flat_map(|v| v.to_le_bytes()).collect(), values.clone()),
                WeightFormat::BF16 => {
                    let b: Vec<half::bf16> = values.iter().map(|&v| half::bf16::from_f32(v)).collect();
                    (b.iter().flat_map(|v| v.to_le_bytes()).collect(), b.iter().map(|v| v.to_f32()).collect())
                }
                _ => {
                    let h: Vec<half::f16> = values.iter().map(|&v| half::f16::from_f32(v)).collect();
                    (h.iter().flat_map(|v| v.to_le_bytes()).collect(), h.iter().map(|v| v.to_f32()).collect())
                }
            };
            let host = HostWeight { name: format!("w {format}"), format, rows, cols, bytes: bytes.into() };
            let w = lane.upload_weight(&host).unwrap();
            // 4 800 bytes in f32 over bindings of 4 096; a chunk's copy, 128 rows of 24 bytes, fits
            assert_eq!(w.chunks.len() > 1, format == WeightFormat::F32, "{format}: the row chunks");
            for c in &w.chunks {
                let y = lane.download(&lane.half_weight(&w, c).unwrap()).unwrap();
                assert_eq!(y.shape, [DIRECT_TILE_COLS, cols / 2], "{format}");
                let HostData::I32(words) = y.data else { panic!("half_weight gave f32") };
                for r in 0..DIRECT_TILE_COLS {
                    for col in 0..cols {
                        let word = words[r * cols / 2 + col / 2] as u32;
                        let got = half::f16::from_bits((word >> (16 * (col % 2))) as u16);
                        let want = if r < c.rows {
                            half::f16::from_f32(decoded[(c.row0 + r) * cols + col])
                        } else {
                            half::f16::ZERO
                        };
                        assert_eq!(got.to_bits(), want.to_bits(), "{format} chunk row {r}, column {col}");
                    }
                }
            }
        }
        // a block format (Q8_0: an f16 scale and 32 int8 codes a block), decoded as the CPU lane
        // decodes it, then rounded: scales whose products with the codes need more than f16's
        // 11 bits (1 + 2^-9 times codes up to ±127), so the rounding is exercised
        let (rows, cols) = (70, 64);
        let bytes: Vec<u8> = (0..rows * cols / 32)
            .flat_map(|b| {
                let d = half::f16::from_f32((1.0 + 2f32.powi(-9)) * (1 + b % 5) as f32 * 0.01);
                d.to_le_bytes().into_iter().chain((0..32).map(move |j| ((b * 37 + j * 11) % 255) as u8))
            })
            .collect();
        let mut decoded = vec![0.0; rows * cols];
        for (row, out) in decoded.chunks_mut(cols).enumerate() {
            let row_bytes = WeightFormat::Q8_0.row_bytes(cols);
            crate::formats::decode_row(WeightFormat::Q8_0, &bytes[row * row_bytes..][..row_bytes], out);
        }
        let host = HostWeight { name: "q8".into(), format: WeightFormat::Q8_0, rows, cols, bytes: bytes.into() };
        drop(lane);
        let Some(lane) = fast_lane(Options::default()) else { return };
        let w = lane.upload_weight(&host).unwrap();
        let y = lane.download(&lane.half_weight(&w, &w.chunks[0]).unwrap()).unwrap();
        assert_eq!(y.shape, [DIRECT_TILE_COLS, cols / 2], "Q8_0");
        let HostData::I32(words) = y.data else { panic!("half_weight gave f32") };
        let mut inexact = 0;
        for r in 0..DIRECT_TILE_COLS {
            for col in 0..cols {
                let got = half::f16::from_bits((words[r * cols / 2 + col / 2] as u32 >> (16 * (col % 2))) as u16);
                let want = if r < rows { half::f16::from_f32(decoded[r * cols + col]) } else { half::f16::ZERO };
                assert_eq!(got.to_bits(), want.to_bits(), "Q8_0 row {r}, column {col}");
                inexact += usize::from(r < rows && want.to_f32() != decoded[r * cols + col]);
            }
        }
        assert!(inexact > rows * cols / 4, "only {inexact} decoded values needed rounding");
    }

    /// The direct tiles' sizes are the shader's: 64 rows of x and `DIRECT_TILE_COLS` weight rows
    /// an output tile, 4 subgroups, and workgroup memory (naga's layouter): `main_wide`'s, which
    /// `wide_tiles` checks against the adapter's.
    #[test]
    fn direct_tiles_sizes_match_their_wgsl() {
        let wgsl = include_str!("../../../shaders/tile_coop_direct.wgsl");
        for line in ["const BM: u32 = 64u;", "const BN: u32 = 128u;", "@compute @workgroup_size(128, 1, 1)"] {
            assert!(wgsl.contains(line), "tile_coop_direct.wgsl lacks `{line}`");
        }
        assert_eq!((TILE_ROWS, DIRECT_TILE_COLS), (64, 128));
        assert!(wgsl.contains("const WIDE_ROW: u32 = 10u;"), "main_wide's tile rows are not 40 f16");
        assert_eq!(Shader::LinearCoopDirect.workgroup_bytes(), WIDE_WORKGROUP_BYTES, "workgroup memory");
    }

    #[test]
    fn expert_row_tiles_cut_each_run_into_64_row_tiles() {
        // expert 0: 70 rows (64 + 6), expert 1: none, expert 2: 64 rows, expert 3: 1 row
        let tiles = expert_row_tiles(&[0, 70, 70, 134, 135]);
        assert_eq!(tiles, [0, 64, 0, 64, 6, 0, 70, 64, 2, 134, 1, 3]);
    }
}
