//! The dense linears of the CUDA lane (kernels in `cuda/linear.cu`, the one GEMM routine
//! `gemm_block` of `cuda/common.cuh`): `linear` (the small-row path up to `GEMV_ROWS` rows, the
//! tiles past it, narrow outputs split over k, one row of a wide q8x weight on int8 activations),
//! `linear_pair` (two weights over one x in one launch) and the aligner's `unfold_linear_gelu`
//! (its A rows gathered from the grid, GELU in the epilogue).

use std::sync::atomic::Ordering;

use cudarc::driver::{CudaSlice, LaunchConfig};

use super::blas::{Blas, Shape};
use super::launch::KernelArgs;
use super::{
    BLAS_MIN_ROWS, Build, CudaBackend, CudaTensor, CudaWeight, DEFAULT_SHARED_BYTES, GEMM_BM, GEMM_BN, GEMM_THREADS,
    GEMV_ROWS, GRID_Y, KEEP_F16_HEADROOM, LINEAR_KERNELS, LINEAR_PAIR_KERNELS, LINEAR_Q8X_MIN_COLS, Q8X_BLOCK_COLS,
    Q8X_THREADS, Source, TILE_SPLIT_BELOW, TILE_SPLIT_GRID, UNFOLD_LINEAR_GELU_KERNELS, WEIGHT_F16_KERNELS, cfg_1d,
    check_u32, gemm_grid, gemv_splits, k_splits, linear_q8x_kernel, q8x_shared_bytes, row_threads,
};
use crate::backend::{Backend, DType, DeviceTensor, Precision, WeightFormat, checks};
use crate::error::{Error, Result};

impl CudaBackend {
    /// x `[n, k]` · W `[out, k]`ᵀ + b `[out]` → `[n, out]` (the shared GEMM, weight decoded in it).
    pub(super) fn linear(&self, x: &CudaTensor, w: &CudaWeight, bias: Option<&CudaTensor>) -> Result<CudaTensor> {
        const OP: &str = "linear";
        let (n, k) = checks::linear(x, w, bias)?;
        let mut y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        if n == 0 || w.rows == 0 {
            return Ok(y);
        }
        let has_bias = bias.is_some() as u32;
        let bias_buf = bias.map_or(&self.dummy, |b| &*b.buf);
        // one row in fast precision against a wide weight: int8 activations (linear_q8x_*)
        if let Some(kernel) = self.linear_q8x(n, k, w) {
            self.launch_linear_q8x(OP, kernel, x, None, w, bias, &mut y)?;
            return Ok(y);
        }
        if let Some(blas) = self.blas_for(n, k, w.rows, w) {
            self.blas_gemm(OP, blas, x, w, (bias, None), &mut y, Shape { n, k, r: w.rows, groups: 1 })?;
            return Ok(y);
        }
        let (gx, gy) = gemm_grid(n, w.rows);
        if gy > GRID_Y {
            return Err(Error::Device(format!("op `linear`: {n} rows exceed the grid limit of the linear kernel")));
        }
        // narrow outputs split k: the small-row path's splits are grid y, the tile path's grid z
        // (its y being the row tiles)
        let (splits, chunk) =
            if n <= GEMV_ROWS { gemv_splits(gx, k) } else { k_splits(gx * gy, k, TILE_SPLIT_BELOW, TILE_SPLIT_GRID) };
        let kernel = LINEAR_KERNELS.of(w.format);
        let f = self.gemm_func(Source::Linear, kernel, w.exact, n)?;
        let (n32, k32, o32) = (check_u32(OP, "rows", n)?, check_u32(OP, "in_features", k)?, w.rows as u32);
        let chunk32 = check_u32(OP, "k per split", chunk)?;
        // k-range s's sums, [splits, n, out]; the kernel writes y directly when there is one range
        let mut part = if splits > 1 { Some(self.alloc(OP, vec![splits, n, w.rows], DType::F32)?) } else { None };
        let grid = match (splits > 1, n <= GEMV_ROWS) {
            (true, true) => (gx, splits, 1),
            (true, false) => (gx, gy, splits),
            (false, _) => (gx, gy, 1),
        };
        let cfg = LaunchConfig {
            grid_dim: (grid.0 as u32, grid.1 as u32, grid.2 as u32),
            block_dim: (GEMM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&w.buf).arg(bias_buf).arg(&mut *y.buf);
        match part.as_mut() {
            Some(p) => l.arg(&mut *p.buf),
            None => l.arg(&self.dummy),
        };
        l.arg(&n32).arg(&k32).arg(&o32).arg(&has_bias).arg(&chunk32);
        // SAFETY: arguments match `linear_*` in cuda/linear.cu; shapes checked above; with
        // splits > 1 (grid y on the small-row path, z on the tile path), part holds splits·n·out
        // and the ranges of `chunk` cover k.
        self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        if let Some(p) = part {
            let sizes = [check_u32(OP, "outputs", n * w.rows)?, o32, splits as u32, has_bias];
            self.launch_1d(
                OP,
                Source::Elementwise,
                "sum_splits_f32",
                &[&*p.buf, bias_buf],
                &mut y,
                &sizes,
                n * w.rows,
            )?;
        }
        Ok(y)
    }

    /// residual + x · Wᵀ + b: on cuBLASLt the residual is the matmul's addend (no pass of its
    /// own); one row without a bias (a decode step's shared expert) takes the residual row as
    /// `linear`'s bias, one launch with the bits of two (f32 addition commutes; but for a zero's
    /// sign: a −0 product plus a −0 residual, +0 through `add`); elsewhere `linear` then `add`.
    pub(super) fn linear_add(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaTensor>,
        residual: &CudaTensor,
    ) -> Result<CudaTensor> {
        const OP: &str = "linear_add";
        let (n, k) = checks::linear_add(x, w, bias, residual)?;
        let Some(blas) = self.blas_for(n, k, w.rows, w) else {
            return match (n, bias) {
                // the residual [1, out] is a bias's out floats
                (1, None) if !self.opts.separate_linear_add => self.linear(x, w, Some(residual)),
                _ => self.add(residual, &self.linear(x, w, bias)?),
            };
        };
        let mut y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        self.blas_gemm(OP, blas, x, w, (bias, Some(residual)), &mut y, Shape { n, k, r: w.rows, groups: 1 })?;
        Ok(y)
    }

    /// `linear_q8x_*` (`kernel`) of one row x `[1, k]` against w into y `[1, w.rows]`, with
    /// `norm` = (weight `[k]`, eps) of `rms_norm(x)` first, in the same launch.
    #[allow(clippy::too_many_arguments)]
    fn launch_linear_q8x(
        &self,
        op: &'static str,
        kernel: &'static str,
        x: &CudaTensor,
        norm: Option<(&CudaTensor, f32)>,
        w: &CudaWeight,
        bias: Option<&CudaTensor>,
        y: &mut CudaTensor,
    ) -> Result<()> {
        let k = x.cols();
        let f = self.func_in(Source::Linear, kernel, Build::Rows)?;
        let (k32, o32) = (check_u32(op, "in_features", k)?, check_u32(op, "out_features", w.rows)?);
        let has_bias = bias.is_some() as u32;
        let bias_buf = bias.map_or(&self.dummy, |b| &*b.buf);
        // the normed row follows the int8 row and its scales in shared memory (k floats)
        let shared = q8x_shared_bytes(k) + norm.map_or(0, |_| 4 * k);
        let cfg = LaunchConfig {
            grid_dim: (w.rows.div_ceil(Q8X_BLOCK_COLS) as u32, 1, 1),
            block_dim: (Q8X_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let (null, eps) = (0u64, norm.map_or(0.0, |(_, eps)| eps));
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&w.buf).arg(bias_buf).arg(&mut *y.buf).arg(&k32).arg(&o32).arg(&has_bias);
        match norm {
            Some((weight, _)) => l.arg(&*weight.buf),
            None => l.arg(&null),
        };
        l.arg(&eps);
        // SAFETY: arguments match `linear_q8x_*` in cuda/linear.cu; x is one row of k (a
        // multiple of the format's block, so of 32), y one row of out, the bias out floats
        // where has_bias, the norm k floats or null; the shared memory is what the kernel takes
        // (q8x_shared_bytes(k), and the normed row's k floats), checked against the default
        // limit by the callers (`linear_q8x`, `rms_norm_linear`).
        self.launched(op, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })
    }

    /// linear(rms_norm(x)): on cuBLASLt the norm writes the GEMM's f16 operand (`rms_norm_f16`,
    /// no f32 rows and no `f32_to_f16` pass); one row on int8 activations (`linear_q8x_*`) norms
    /// it in the same launch, with `rms_norm_f32`'s bits where its block is the q8x block's
    /// (`row_threads(k)` = `Q8X_THREADS`: k below 4 096; a decode step's q_norm before wq_b, k
    /// 1 024); elsewhere `rms_norm` then `linear`.
    pub(super) fn rms_norm_linear(
        &self,
        x: &CudaTensor,
        norm: &CudaTensor,
        eps: f32,
        w: &CudaWeight,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "rms_norm_linear";
        let (n, k) = checks::rms_norm_linear(x, norm, w, bias)?;
        let q8x = self.linear_q8x(n, k, w).filter(|_| {
            !self.opts.separate_rms_norm_linear
                && row_threads(k) == Q8X_THREADS
                && q8x_shared_bytes(k) + 4 * k <= DEFAULT_SHARED_BYTES
        });
        if let Some(kernel) = q8x {
            let mut y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
            self.launch_linear_q8x(OP, kernel, x, Some((norm, eps)), w, bias, &mut y)?;
            return Ok(y);
        }
        let Some(blas) = self.blas_for(n, k, w.rows, w) else {
            return self.linear(&self.rms_norm(x, norm, eps)?, w, bias);
        };
        // x16: the n·k/2 words rms_norm_f16 writes (k a multiple of 8, as `blas_for` asks; x and
        // norm each an allocation of its own, so on 16 bytes)
        let mut x16 = self.alloc(OP, vec![n, k / 2], DType::F32)?;
        self.launch_rms_norm(OP, "rms_norm_f16", x, norm, &mut x16, (n, k), eps)?;
        let mut y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        self.blas_gemm_f16(OP, blas, &x16, w, (bias, None), &mut y, Shape { n, k, r: w.rows, groups: 1 })?;
        Ok(y)
    }

    /// residual + linear(swiglu(gate_up)): on cuBLASLt the gating writes the GEMM's f16 operand
    /// (`swiglu_f16`) and the residual is its addend, elsewhere `swiglu` then `linear_add`.
    pub(super) fn swiglu_linear_add(
        &self,
        gate_up: &CudaTensor,
        w: &CudaWeight,
        residual: &CudaTensor,
    ) -> Result<CudaTensor> {
        const OP: &str = "swiglu_linear_add";
        let (n, h) = checks::swiglu_linear_add(gate_up, w, residual)?;
        let Some(blas) = self.blas_for(n, h, w.rows, w) else {
            return self.linear_add(&self.swiglu(gate_up)?, w, None, residual);
        };
        let mut x16 = self.alloc(OP, vec![n, h / 2], DType::F32)?;
        let sizes = [check_u32(OP, "rows", n)?, check_u32(OP, "h", h)?];
        // gate_up rows of 2h floats, h a multiple of 8 (`blas_for`): every quad on 16 bytes
        self.launch_1d(OP, Source::Elementwise, "swiglu_f16", &[&*gate_up.buf], &mut x16, &sizes, n * h / 4)?;
        let mut y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        self.blas_gemm_f16(OP, blas, &x16, w, (None, Some(residual)), &mut y, Shape { n, k: h, r: w.rows, groups: 1 })?;
        Ok(y)
    }

    /// cuBLASLt, where a GEMM of `n` rows of `k` by `r` outputs (a group's) against `w` takes it
    /// (blas.rs): fast precision for this weight, more than `BLAS_MIN_ROWS` rows, k and r not zero
    /// (the lane's own kernels take empty products), k a multiple of 8 (`weight_f16`'s runs, and
    /// the f16 rows on 16 bytes) and r of 4 (y's f32 rows and groups on 16 bytes).
    pub(super) fn blas_for(&self, n: usize, k: usize, r: usize, w: &CudaWeight) -> Option<&Blas> {
        self.blas.as_ref().filter(|_| {
            n > BLAS_MIN_ROWS
                && k > 0
                && r > 0
                && k.is_multiple_of(8)
                && r.is_multiple_of(4)
                && self.weight_precision(w.exact) == Precision::Fast
        })
    }

    /// y = x by W (+ b) (+ an addend of y's shape) as `shape` says, on cuBLASLt: x and W as f16
    /// (the fast tiles' rounding), then one matmul (a strided batch for several groups), timed
    /// (`FOVEA_GPU_TIMES`) as kernel `cublaslt_f16` with grid (groups·r, n, k).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn blas_gemm(
        &self,
        op: &'static str,
        blas: &Blas,
        x: &CudaTensor,
        w: &CudaWeight,
        (bias, add): (Option<&CudaTensor>, Option<&CudaTensor>),
        y: &mut CudaTensor,
        shape: Shape,
    ) -> Result<()> {
        let (n, k) = (shape.n, shape.groups * shape.k);
        // x [n, k] f16 in [n, k / 2] words
        let mut x16 = self.alloc(op, vec![n, k / 2], DType::F32)?;
        let quads = n * k / 4;
        self.launch_1d(
            op,
            Source::Elementwise,
            "f32_to_f16",
            &[&*x.buf],
            &mut x16,
            &[check_u32(op, "x / 4", quads)?],
            quads,
        )?;
        self.blas_gemm_f16(op, blas, &x16, w, (bias, add), y, shape)
    }

    /// `blas_gemm` of x already f16 (`x16` `[n, groups·k / 2]` words, as `f32_to_f16` writes
    /// them).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn blas_gemm_f16(
        &self,
        op: &'static str,
        blas: &Blas,
        x16: &CudaTensor,
        w: &CudaWeight,
        (bias, add): (Option<&CudaTensor>, Option<&CudaTensor>),
        y: &mut CudaTensor,
        shape: Shape,
    ) -> Result<()> {
        let n = shape.n;
        let call_copy;
        let w16 = match w.format {
            WeightFormat::F16 => &w.buf,
            _ => match self.kept_weight_f16(op, w)? {
                Some(copy) => copy,
                None => {
                    let mut t = self.alloc(op, vec![w.rows, w.cols / 2], DType::F32)?;
                    self.write_weight_f16(op, w, &mut t.buf)?;
                    call_copy = t;
                    &*call_copy.buf
                }
            },
        };
        let grid = (
            check_u32(op, "outputs", shape.groups * shape.r)?,
            check_u32(op, "rows", n)?,
            check_u32(op, "k", shape.k)?,
        );
        let cfg = LaunchConfig { grid_dim: grid, block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        let mut result = Ok(());
        self.launched(op, "cublaslt_f16", cfg, |_| {
            // SAFETY: x16 holds n·groups·k f16, w16 groups·r·k, y and the addend n·groups·r f32,
            // the bias r f32 (the callers checked the shapes); all on this lane's device and stream.
            result = unsafe {
                let (bias, add) = (bias.map(|b| &*b.buf), add.map(|a| &*a.buf));
                blas.matmul(&self.stream, &x16.buf, w16, bias, add, &y.buf, shape)
            };
            Ok::<(), cudarc::driver::DriverError>(())
        })?;
        result.map_err(|e| Error::Device(format!("op `{op}`, weight `{}`: {e}", w.name)))
    }

    /// W's f16 copy kept beside it (`CudaWeight::f16`), made on the first call, or none (the
    /// caller converts W for this call): a block format (its copy would be larger than it is),
    /// a device with less than the copy plus `KEEP_F16_HEADROOM` free, or a copy that could not
    /// be allocated. A BF16 matrix then takes twice its bytes on the device, an F32 one 1.5×; the
    /// copy counts as weight memory until W drops.
    fn kept_weight_f16<'w>(&self, op: &'static str, w: &'w CudaWeight) -> Result<Option<&'w CudaSlice<u8>>> {
        if let Some(copy) = w.f16.get() {
            return Ok(Some(copy));
        }
        if !matches!(w.format, WeightFormat::BF16 | WeightFormat::F32) {
            return Ok(None);
        }
        let bytes = w.rows * w.cols * 2;
        let free = self.ctx.mem_get_info().map_or(0, |(free, _)| free as u64);
        if free < bytes as u64 + KEEP_F16_HEADROOM {
            return Ok(None);
        }
        let Ok(mut copy) = self.raw_alloc(op, bytes) else { return Ok(None) };
        self.write_weight_f16(op, w, &mut copy)?;
        let len = copy.len() as u64;
        if w.f16.set(copy).is_ok() {
            w.counters.weight.fetch_add(len, Ordering::Relaxed);
        }
        // set just now, or by a caller that won the race (whose copy is the same)
        Ok(w.f16.get())
    }

    /// W `[rows, cols]` in its format → `dst` as rows·cols f16 (`weight_f16_*`).
    fn write_weight_f16(&self, op: &'static str, w: &CudaWeight, dst: &mut CudaSlice<u8>) -> Result<()> {
        let kernel = WEIGHT_F16_KERNELS.of(w.format);
        let runs = check_u32(op, "weight / 8", w.rows * w.cols / 8)?;
        let f = self.func_in(Source::Linear, kernel, Build::Tiles(Precision::Fast))?;
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&w.buf).arg(dst).arg(&runs);
        // SAFETY: arguments match `weight_f16_*` in cuda/linear.cu: W holds rows·cols values of
        // its format (cols a multiple of 8, as `blas_for` asks: whole runs; an allocation's base
        // has every format's alignment), dst rows·cols f16 (its callers allocate it so).
        self.launched(op, kernel, cfg_1d(runs as usize), |cfg| unsafe { l.launch(cfg, self.pdl) })
    }

    /// The int8-activation kernel `linear` takes for `n` rows of `k` against `w`, if any: one row
    /// in fast precision against a weight of at least `LINEAR_Q8X_MIN_COLS` outputs in a q8x format.
    pub(super) fn linear_q8x(&self, n: usize, k: usize, w: &CudaWeight) -> Option<&'static str> {
        linear_q8x_kernel(w.format).filter(|_| {
            self.opts.q8x
                && n == 1
                && w.rows >= LINEAR_Q8X_MIN_COLS
                && self.weight_precision(w.exact) == Precision::Fast
                && q8x_shared_bytes(k) <= DEFAULT_SHARED_BYTES
        })
    }

    /// `linear_pair`: both weights in one launch of the small-row path (`linear_pair_*`, the bits
    /// of two `linear` launches) where both would take it unsplit in one format, else two linears.
    pub(super) fn linear_pair(
        &self,
        x: &CudaTensor,
        wa: &CudaWeight,
        wb: &CudaWeight,
    ) -> Result<(CudaTensor, CudaTensor)> {
        const OP: &str = "linear_pair";
        let (n, k) = checks::linear_pair(x, wa, wb)?;
        let (pairs_a, pairs_b) = (wa.rows.div_ceil(2), wb.rows.div_ceil(2));
        let unsplit = |pairs: usize| pairs > 0 && gemv_splits(pairs, k).0 == 1;
        let one_launch = (1..=GEMV_ROWS).contains(&n)
            && wa.format == wb.format
            && unsplit(pairs_a)
            && unsplit(pairs_b)
            && self.linear_q8x(n, k, wa).is_none()
            && self.linear_q8x(n, k, wb).is_none()
            && !self.opts.separate_linear_pair;
        if !one_launch {
            return Ok((Backend::linear(self, x, wa, None)?, Backend::linear(self, x, wb, None)?));
        }
        let mut ya = self.alloc(OP, vec![n, wa.rows], DType::F32)?;
        let mut yb = self.alloc(OP, vec![n, wb.rows], DType::F32)?;
        let kernel = LINEAR_PAIR_KERNELS.of(wa.format);
        let f = self.func_in(Source::Linear, kernel, Build::Rows)?;
        let (n32, k32) = (check_u32(OP, "rows", n)?, check_u32(OP, "in_features", k)?);
        let (a32, b32) = (check_u32(OP, "out_features", wa.rows)?, check_u32(OP, "out_features", wb.rows)?);
        let cfg = LaunchConfig {
            grid_dim: (check_u32(OP, "column pairs", pairs_a + pairs_b)?, 1, 1),
            block_dim: (GEMM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&wa.buf).arg(&wb.buf).arg(&mut *ya.buf).arg(&mut *yb.buf);
        l.arg(&n32).arg(&k32).arg(&a32).arg(&b32);
        // SAFETY: arguments match `linear_pair_*` in cuda/linear.cu; x is [n, k] with n <= GEMV_ROWS,
        // Wa [a, k] and Wb [b, k] in this kernel's format, ya [n, a], yb [n, b].
        self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok((ya, yb))
    }

    /// x `[h·w, c]`, weight `[out, c·r²]` → `[ceil(h/r)·ceil(w/r), out]`: one GEMM whose A rows
    /// are gathered from the grid (no unfold buffer), GELU in its epilogue (cuda/linear.cu).
    pub(super) fn unfold_linear_gelu(
        &self,
        x: &CudaTensor,
        h: usize,
        w: usize,
        r: usize,
        weight: &CudaWeight,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        const OP: &str = "unfold_linear_gelu";
        let (c, cells, _) = checks::unfold_linear_gelu(x, h, w, r, weight, bias)?;
        let mut y = self.alloc(OP, vec![cells, weight.rows], DType::F32)?;
        if cells == 0 || weight.rows == 0 {
            return Ok(y);
        }
        let gy = cells.div_ceil(GEMM_BM as usize);
        if gy > GRID_Y {
            return Err(Error::Device(format!("op `{OP}`: {cells} cells exceed the grid limit of the kernel")));
        }
        let kernel = UNFOLD_LINEAR_GELU_KERNELS.of(weight.format);
        // the aligner's GEMM is always the tile (it has no rows build)
        let f = self.func_in(Source::Linear, kernel, Build::Tiles(self.weight_precision(weight.exact)))?;
        // the kernel indexes features (c·r²) and grid positions in u32
        check_u32(OP, "in_features", weight.cols)?; // c·r², so c and r fit too (c > 0)
        let (h32, w32, r32) =
            (check_u32(OP, "grid height", h)?, check_u32(OP, "grid width", w)?, check_u32(OP, "r", r)?);
        let (c32, cw32, cells32, o32) =
            (c as u32, w.div_ceil(r) as u32, check_u32(OP, "cells", cells)?, weight.rows as u32);
        let has_bias = bias.is_some() as u32;
        let bias_buf = bias.map_or(&self.dummy, |b| &*b.buf);
        let cfg = LaunchConfig {
            grid_dim: (weight.rows.div_ceil(GEMM_BN as usize) as u32, gy as u32, 1),
            block_dim: (GEMM_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&weight.buf).arg(bias_buf).arg(&mut *y.buf);
        l.arg(&c32).arg(&h32).arg(&w32).arg(&r32).arg(&cw32).arg(&cells32).arg(&o32).arg(&has_bias);
        // SAFETY: arguments match `unfold_linear_gelu_*` in cuda/linear.cu; shapes checked above.
        self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(y)
    }
}
