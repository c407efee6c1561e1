//! The small language-model ops of the CUDA lane (kernels in `cuda/lm_small.cu`): embeddings,
//! hyper-connections, per-head RMS norm, tail RoPE, top-k, the router's elementwise ops and the
//! fused router (`route_experts`).
//! Shape checks follow the wgpu lane's; every size passed to a kernel goes through `check_u32`.
//! Where the CPU lane returns an error for a bad index (a negative token id in `embed_rows`, an
//! expert id outside `0..e` in `route_weights` and `route_experts`), these kernels write NaN
//! instead: a GPU lane cannot see the indices without a host round trip.

use cudarc::driver::LaunchConfig;

use super::launch::KernelArgs;

use super::{CudaBackend, CudaTensor, CudaWeight, EMBED_ROWS_KERNELS, GRID_Y, MAX_BLOCKS, Source, cfg_rows, check_u32};
use crate::backend::{DType, DeviceTensor, WeightFormat};
use crate::backend::{checks, hc_mix_split_parts};
use crate::error::{Error, Result};

/// Threads per block of `topk_rows_i32` (`LMS_TOPK_THREADS` in cuda/lm_small.cu).
const TOPK_THREADS: u32 = 256;
/// Threads per block of `route_experts_f32`: one block per token (`LMS_ROUTE_THREADS`).
const ROUTE_THREADS: u32 = 256;
/// Threads per block of `hc_mix_partials_f32` and `hc_mix_split_f32` (`LMS_MIX_THREADS`).
const MIX_THREADS: u32 = 256;
/// Most mix rows `hc_mix_partials_f32` sums, (2 + hc)·hc for hc ≤ 4 (`LMS_MIX_MAX`).
const MIX_MAX: usize = 24;
/// Columns of the residual each `hc_mix_partials_f32` block sums (the released model's 16 384
/// in 32 ranges: a block each, every SM busy at one token).
const MIX_SPAN: usize = 512;
/// Columns a block of `hc_mix_partials_rows4_f32` sums (a prefill chunk's: 4 ranges of a 16 384
/// residual).
const MIX_SPAN_ROWS4: usize = 4096;
/// From this many rows `hc_mix_partials_rows4_f32` takes them (a prefill chunk's 2 048 measured:
/// 9.35 → 6.66 ms of a 4-layer prefill on an H100): its grid, 4 ranges by ⌈n / 4⌉, keeps at least
/// 512 blocks. Fewer rows (decode batches, a short last chunk) keep `hc_mix_partials_f32`'s 32
/// ranges a row. The ranges differ, so a row's sums differ in their last bits between the two.
const MIX_ROWS4_MIN: usize = 512;
/// The most tokens `hc_mix_split_f32` gives a block each (its 8 warps sum a token's ranges); more
/// take a warp each (cuda/lm_small.cu says why).
const MIX_BLOCK_A_TOKEN_MAX: usize = 64;

/// The code by which the kernels shared by the float formats tell them apart (0 f32, 1 bf16,
/// 2 f16, as `load_w`'s FMT in cuda/common.cuh); `None` for a block format.
fn float_code(format: WeightFormat) -> Option<u32> {
    match format {
        WeightFormat::F32 => Some(0),
        WeightFormat::BF16 => Some(1),
        WeightFormat::F16 => Some(2),
        _ => None,
    }
}

/// `rope_tail`'s and `rope_tail_at`'s first four sizes: rows, cols, head dim, rotary dims.
fn rope_sizes(op: &'static str, n: usize, cols: usize, hd: usize, rd: usize) -> Result<[u32; 4]> {
    Ok([
        check_u32(op, "rows", n)?,
        check_u32(op, "cols", cols)?,
        check_u32(op, "head dim", hd)?,
        check_u32(op, "rotary dims", rd)?,
    ])
}

impl CudaBackend {
    /// table `[vocab, d]` (any weight format, decoded in the kernel), ids i32 `[n]` → `[n, d]`; an
    /// id ≥ vocab gives a zero row, a negative id a row of NaN.
    pub(super) fn embed_rows(&self, table: &CudaWeight, ids: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "embed_rows";
        let (n, d) = checks::embed_rows(table, ids)?;
        let mut y = self.alloc(OP, vec![n, d], DType::F32)?;
        let mut sizes = vec![check_u32(OP, "ids", n)?, check_u32(OP, "cols", d)?, check_u32(OP, "vocab", table.rows)?];
        // the float formats share embed_rows_f32 and tell it theirs by a code; a block format has
        // its own kernel
        sizes.extend(float_code(table.format));
        let kernel = EMBED_ROWS_KERNELS.of(table.format);
        self.launch_1d(OP, Source::LmSmall, kernel, &[&table.buf, &*ids.buf], &mut y, &sizes, n * d)?;
        Ok(y)
    }

    /// x `[n, d]` → `[n, hc·d]`.
    pub(super) fn hc_expand(&self, x: &CudaTensor, hc: usize) -> Result<CudaTensor> {
        const OP: &str = "hc_expand";
        let (n, d) = checks::hc_expand(x)?;
        let cols = hc.checked_mul(d).ok_or_else(|| Error::shape(OP, format!("hc = {hc} is too large")))?;
        let mut y = self.alloc(OP, vec![n, cols], DType::F32)?;
        let sizes = [check_u32(OP, "rows", n)?, check_u32(OP, "cols", d)?, check_u32(OP, "hc", hc)?];
        self.launch_1d(OP, Source::LmSmall, "hc_expand_f32", &[&*x.buf], &mut y, &sizes, n * cols)?;
        Ok(y)
    }

    /// x `[n, heads·hd]` → per-head unweighted RMS norm; one block per (row, head) segment.
    pub(super) fn rms_norm_heads(&self, x: &CudaTensor, n_heads: usize, eps: f32) -> Result<CudaTensor> {
        const OP: &str = "rms_norm_heads";
        let (n, cols) = checks::rms_norm_heads(x, n_heads)?;
        let mut y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let (segs, hd) = (n * n_heads, cols / n_heads);
        if segs == 0 || hd == 0 {
            return Ok(y);
        }
        let (segs32, hd32) = (check_u32(OP, "segments", segs)?, check_u32(OP, "head dim", hd)?);
        let f = self.func(Source::LmSmall, "rms_norm_heads_f32")?;
        let cfg = cfg_rows(segs, hd);
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&mut *y.buf).arg(&segs32).arg(&hd32).arg(&eps);
        // SAFETY: arguments match `rms_norm_heads_f32` in cuda/lm_small.cu; shapes checked above.
        self.launched(OP, "rms_norm_heads_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(y)
    }

    /// mHC split with Sinkhorn: mix `[n, (2+hc)·hc]`, scale `[3]`, base `[(2+hc)·hc]` → same
    /// shape as mix; a warp per token (one thread of it when hc·hc > 32).
    pub(super) fn hc_split(
        &self,
        mix: &CudaTensor,
        scale: &CudaTensor,
        base: &CudaTensor,
        hc: usize,
        iters: usize,
        eps: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "hc_split";
        let (n, w) = checks::hc_split(mix, scale, base, hc)?;
        let mut y = self.alloc(OP, vec![n, w], DType::F32)?;
        let sizes =
            [check_u32(OP, "rows", n)?, check_u32(OP, "hc", hc)?, check_u32(OP, "iters", iters)?, eps.to_bits()];
        // 32 threads per token: a warp each (cuda/lm_small.cu); n fits u32, so this fits usize
        self.launch_1d(
            OP,
            Source::LmSmall,
            "hc_split_f32",
            &[&*mix.buf, &*scale.buf, &*base.buf],
            &mut y,
            &sizes,
            n * 32,
        )?;
        Ok(y)
    }

    /// The partial-sum kernels' format code for a mix `[w, k]` over n rows, where they take it: a
    /// float format with f32 products, at most `MIX_MAX` rows, something to sum.
    fn mix_code(&self, mix: &CudaWeight, n: usize, k: usize, w: usize) -> Option<u32> {
        let f32_products = mix.exact || self.opts.precision == crate::backend::Precision::Exact;
        float_code(mix.format).filter(|_| w <= MIX_MAX && f32_products && n > 0 && k > 0)
    }

    /// `hc_mix_partials_f32` (or, from `MIX_ROWS4_MIN` rows, `_rows4_f32`) over X `[n, k]` and the mix `[w, k]`: each column range's w dot
    /// products and sum of squares, `[n, splits·(w + 1)]`, and the number of ranges; `None` where
    /// the lane's two-kernel split does not apply (a block-format mix, a mix in fast precision, more
    /// rows than `LMS_MIX_MAX`, nothing to sum), which then takes the trait's composition.
    /// With `post` = (f `[n, d]`, split, X' `[n, k]`), the sums are of X' = `hc_post(X, f, split)`,
    /// which `hc_post_mix_partials_f32` computes and writes into X' as it reads (a decode step's
    /// rows only: fewer than `MIX_ROWS4_MIN`).
    #[allow(clippy::too_many_arguments)]
    fn hc_mix_partials(
        &self,
        op: &'static str,
        x: &CudaTensor,
        mix: &CudaWeight,
        n: usize,
        k: usize,
        w: usize,
        post: Option<(&CudaTensor, &CudaTensor, &mut CudaTensor)>,
    ) -> Result<Option<(CudaTensor, usize)>> {
        let Some(code) = self.mix_code(mix, n, k, w) else { return Ok(None) };
        // fewer rows (decode): a block a row and range of MIX_SPAN; a prefill chunk's: four rows a
        // block (the mix loaded once for the four) and ranges of MIX_SPAN_ROWS4 (the block's
        // reduction, 4·25 sums, over 16 columns a thread)
        let (kernel, span, row_blocks) = match (n >= MIX_ROWS4_MIN, post.is_some()) {
            (true, true) => return Ok(None),
            (true, false) => ("hc_mix_partials_rows4_f32", MIX_SPAN_ROWS4, n.div_ceil(4)),
            (false, true) => ("hc_post_mix_partials_f32", MIX_SPAN, n),
            (false, false) => ("hc_mix_partials_f32", MIX_SPAN, n),
        };
        let splits = k.div_ceil(span);
        let mut part = self.alloc(op, vec![n, splits * (w + 1)], DType::F32)?;
        let (n32, k32, w32) = (check_u32(op, "rows", n)?, check_u32(op, "cols", k)?, w as u32);
        let splits32 = check_u32(op, "column ranges", splits)?;
        let f = self.func(Source::LmSmall, kernel)?;
        let cfg = LaunchConfig {
            grid_dim: (splits32, row_blocks.min(GRID_Y) as u32, 1),
            block_dim: (MIX_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // the post's d and hc (k = hc·d fits u32, so both do)
        let (d32, hc32) = post.as_ref().map_or((0, 0), |(fx, _, _)| (fx.cols() as u32, (k / fx.cols()) as u32));
        let mut l = KernelArgs::new(&self.stream, &f);
        match post {
            Some((fx, split, out)) => {
                l.arg(&*x.buf).arg(&*fx.buf).arg(&*split.buf).arg(&mut *out.buf).arg(&mix.buf).arg(&mut *part.buf);
                l.arg(&n32).arg(&d32).arg(&hc32).arg(&w32).arg(&splits32).arg(&code);
            }
            None => {
                l.arg(&*x.buf)
                    .arg(&mix.buf)
                    .arg(&mut *part.buf)
                    .arg(&n32)
                    .arg(&k32)
                    .arg(&w32)
                    .arg(&splits32)
                    .arg(&code);
            }
        }
        // SAFETY: arguments match `hc_mix_partials_f32` / `_rows4_f32` / `hc_post_mix_partials_f32`
        // in cuda/lm_small.cu; shapes checked by the caller.
        self.launched(op, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(Some((part, splits)))
    }

    /// `hc_split` of the residual's mix, norm factor taken out of the product: X `[n, k]`, mix
    /// `[(2+hc)·hc, k]` → `[n, (2+hc)·hc]`. Two kernels (the column ranges' partial sums, then a
    /// warp per token) where the mix is f32/bf16/f16, at most `MIX_MAX` rows and f32 products;
    /// else the trait's composition.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hc_mix_split(
        &self,
        x: &CudaTensor,
        mix: &CudaWeight,
        scale: &CudaTensor,
        base: &CudaTensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "hc_mix_split";
        let (n, k, w) = checks::hc_mix_split(x, mix, scale, base, hc)?;
        let Some((part, splits)) = self.hc_mix_partials(OP, x, mix, n, k, w, None)? else {
            return hc_mix_split_parts(self, x, mix, scale, base, hc, iters, eps, norm_eps);
        };
        let (n32, k32, splits32) = (check_u32(OP, "rows", n)?, check_u32(OP, "cols", k)?, splits as u32);
        let mut y = self.alloc(OP, vec![n, w], DType::F32)?;
        let (hc32, iters32, eps_bits) = (check_u32(OP, "hc", hc)?, check_u32(OP, "iters", iters)?, eps.to_bits());
        let f = self.func(Source::LmSmall, "hc_mix_split_f32")?;
        // a block a token for a decode step's few, a warp a token for a prefill chunk's many
        let token_warps = if n <= MIX_BLOCK_A_TOKEN_MAX { MIX_THREADS / 32 } else { 1 };
        let tokens_a_block = (MIX_THREADS / 32 / token_warps) as usize;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(tokens_a_block).min(MAX_BLOCKS) as u32, 1, 1),
            block_dim: (MIX_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*part.buf).arg(&*scale.buf).arg(&*base.buf).arg(&mut *y.buf);
        l.arg(&n32).arg(&k32).arg(&hc32).arg(&splits32).arg(&iters32).arg(&eps_bits).arg(&norm_eps).arg(&token_warps);
        // SAFETY: arguments match `hc_mix_split_f32` in cuda/lm_small.cu; shapes checked above.
        self.launched(OP, "hc_mix_split_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(y)
    }

    /// `hc_mix_split` then `hc_pre_norm` of its pre ([`Backend::hc_mix_split_pre_norm`]): for a
    /// decode step's rows (at most `MIX_BLOCK_A_TOKEN_MAX`, where `hc_mix_split_f32` gives a
    /// token a block) the partial sums and then one launch of `hc_mix_split_pre_norm_f32`, whose
    /// block splits the token and norms its collapsed streams with both kernels' bits (it takes
    /// `hc_pre_norm_f32`'s block size); elsewhere, or with
    /// [`Options::separate_hc_split_norm`](super::Options), the two ops.
    ///
    /// [`Backend::hc_mix_split_pre_norm`]: crate::backend::Backend::hc_mix_split_pre_norm
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hc_mix_split_pre_norm(
        &self,
        x: &CudaTensor,
        mix: &CudaWeight,
        scale: &CudaTensor,
        base: &CudaTensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
        weight: &CudaTensor,
    ) -> Result<(CudaTensor, CudaTensor)> {
        const OP: &str = "hc_mix_split_pre_norm";
        let (n, k, w, _) = checks::hc_mix_split_pre_norm(x, mix, scale, base, hc, weight)?;
        let parts = match n <= MIX_BLOCK_A_TOKEN_MAX && !self.opts.separate_hc_split_norm {
            true => self.hc_mix_partials(OP, x, mix, n, k, w, None)?,
            false => None,
        };
        let Some((part, splits)) = parts else {
            let split = self.hc_mix_split(x, mix, scale, base, hc, iters, eps, norm_eps)?;
            let y = self.hc_pre_norm(x, &split, hc, weight, norm_eps)?;
            return Ok((split, y));
        };
        self.mix_split_pre_norm(OP, &part, splits, x, scale, base, weight, hc, iters, eps, norm_eps)
    }

    /// `hc_mix_split_pre_norm_f32` over the partial sums `part` of X `[n, k]` in `splits` ranges
    /// (`hc_mix_partials` with or without its post): (split `[n, (2+hc)·hc]`, input `[n, k / hc]`).
    #[allow(clippy::too_many_arguments)]
    fn mix_split_pre_norm(
        &self,
        op: &'static str,
        part: &CudaTensor,
        splits: usize,
        x: &CudaTensor,
        scale: &CudaTensor,
        base: &CudaTensor,
        weight: &CudaTensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
    ) -> Result<(CudaTensor, CudaTensor)> {
        let (n, k, w) = (x.rows(), x.cols(), (2 + hc) * hc);
        let d = k / hc;
        let mut split = self.alloc(op, vec![n, w], DType::F32)?;
        let mut y = self.alloc(op, vec![n, d], DType::F32)?;
        let (n32, k32, d32, splits32) = (check_u32(op, "rows", n)?, check_u32(op, "cols", k)?, d as u32, splits as u32);
        let (hc32, iters32, eps_bits) = (check_u32(op, "hc", hc)?, check_u32(op, "iters", iters)?, eps.to_bits());
        let f = self.func(Source::LmSmall, "hc_mix_split_pre_norm_f32")?;
        // hc_pre_norm_f32's launch: a block a row of row_threads(d) ≥ MIX_THREADS threads
        let cfg = cfg_rows(n, d);
        debug_assert!(cfg.block_dim.0 >= MIX_THREADS, "the split needs MIX_THREADS / 32 warps");
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*part.buf).arg(&*scale.buf).arg(&*base.buf).arg(&mut *split.buf);
        l.arg(&*x.buf).arg(&*weight.buf).arg(&mut *y.buf);
        l.arg(&n32).arg(&k32).arg(&hc32).arg(&splits32).arg(&iters32).arg(&eps_bits).arg(&norm_eps).arg(&d32);
        // SAFETY: arguments match `hc_mix_split_pre_norm_f32` in cuda/lm_small.cu; shapes checked
        // by the callers (part holds n rows of splits·(w + 1) sums, written by the launch before).
        self.launched(op, "hc_mix_split_pre_norm_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok((split, y))
    }

    /// `hc_post` of a sublayer's output, then the next sublayer's `hc_mix_split_pre_norm` of the
    /// residual it writes ([`Backend::hc_post_mix_split_pre_norm`]): for a decode step's rows
    /// (at most `MIX_BLOCK_A_TOKEN_MAX`) two launches, `hc_post_mix_partials_f32` (the post
    /// computed as the partial sums read it) and `hc_mix_split_pre_norm_f32`, with the bits of
    /// the three; elsewhere, or with [`Options::separate_hc_post`](super::Options), `hc_post` then
    /// `hc_mix_split_pre_norm`. X, f, split → (X', split', input).
    ///
    /// [`Backend::hc_post_mix_split_pre_norm`]: crate::backend::Backend::hc_post_mix_split_pre_norm
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hc_post_mix_split_pre_norm(
        &self,
        x: &CudaTensor,
        f: &CudaTensor,
        split: &CudaTensor,
        mix: &CudaWeight,
        scale: &CudaTensor,
        base: &CudaTensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
        weight: &CudaTensor,
    ) -> Result<(CudaTensor, CudaTensor, CudaTensor)> {
        const OP: &str = "hc_post_mix_split_pre_norm";
        let (n, k, w) = checks::hc_post_mix_split_pre_norm(x, f, split, mix, scale, base, hc, weight)?;
        let fused = n <= MIX_BLOCK_A_TOKEN_MAX
            && !self.opts.separate_hc_post
            && !self.opts.separate_hc_split_norm
            && self.mix_code(mix, n, k, w).is_some();
        let parts = match fused {
            true => {
                let mut xp = self.alloc(OP, vec![n, k], DType::F32)?;
                self.hc_mix_partials(OP, x, mix, n, k, w, Some((f, split, &mut xp)))?.map(|p| (p, xp))
            }
            false => None,
        };
        let Some(((part, splits), xp)) = parts else {
            let xp = self.hc_post(x, f, split)?;
            let (split, y) = self.hc_mix_split_pre_norm(&xp, mix, scale, base, hc, iters, eps, norm_eps, weight)?;
            return Ok((xp, split, y));
        };
        let (split, y) =
            self.mix_split_pre_norm(OP, &part, splits, &xp, scale, base, weight, hc, iters, eps, norm_eps)?;
        Ok((xp, split, y))
    }

    /// X `[n, hc·d]`, w `[n, c ≥ hc]` (its first hc columns) → `[n, d]`.
    pub(super) fn hc_pre(&self, x: &CudaTensor, w: &CudaTensor, hc: usize) -> Result<CudaTensor> {
        const OP: &str = "hc_pre";
        let (n, d, wc) = checks::hc_pre(x, w, hc)?;
        let mut y = self.alloc(OP, vec![n, d], DType::F32)?;
        let sizes = [
            check_u32(OP, "rows", n)?,
            check_u32(OP, "cols", d)?,
            check_u32(OP, "hc", hc)?,
            check_u32(OP, "w cols", wc)?,
        ];
        self.launch_1d(OP, Source::LmSmall, "hc_pre_f32", &[&*x.buf, &*w.buf], &mut y, &sizes, n * d)?;
        Ok(y)
    }

    /// `rms_norm(hc_pre(X, w, hc), weight, eps)`: X `[n, hc·d]`, w `[n, c ≥ hc]`, weight `[d]` →
    /// `[n, d]`; one block per row.
    pub(super) fn hc_pre_norm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        hc: usize,
        weight: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "hc_pre_norm";
        let (n, d, wc) = checks::hc_pre_norm(x, w, hc, weight)?;
        let mut y = self.alloc(OP, vec![n, d], DType::F32)?;
        if n == 0 || d == 0 {
            return Ok(y);
        }
        let (n32, d32) = (check_u32(OP, "rows", n)?, check_u32(OP, "cols", d)?);
        let (hc32, wc32) = (check_u32(OP, "hc", hc)?, check_u32(OP, "w cols", wc)?);
        let f = self.func(Source::LmSmall, "hc_pre_norm_f32")?;
        let cfg = cfg_rows(n, d);
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&*w.buf).arg(&*weight.buf).arg(&mut *y.buf);
        l.arg(&n32).arg(&d32).arg(&hc32).arg(&wc32).arg(&eps);
        // SAFETY: arguments match `hc_pre_norm_f32` in cuda/lm_small.cu; shapes checked above.
        self.launched(OP, "hc_pre_norm_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(y)
    }

    /// X `[n, hc·d]`, f `[n, d]`, split `[n, (2+hc)·hc]` (hc_split's) → X' `[n, hc·d]`.
    pub(super) fn hc_post(&self, x: &CudaTensor, f: &CudaTensor, split: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "hc_post";
        let (n, cols, d, hc) = checks::hc_post(x, f, split)?;
        let mut y = self.alloc(OP, vec![n, cols], DType::F32)?;
        let sizes = [check_u32(OP, "rows", n)?, check_u32(OP, "cols", d)?, check_u32(OP, "hc", hc)?];
        let inputs = [&*x.buf, &*f.buf, &*split.buf];
        self.launch_1d(OP, Source::LmSmall, "hc_post_f32", &inputs, &mut y, &sizes, n * cols)?;
        Ok(y)
    }

    /// mix `[n, hc]`, scale `[1]`, base `[hc]` → `σ(mix·scale + base) + eps`.
    pub(super) fn hc_head_weights(
        &self,
        mix: &CudaTensor,
        scale: &CudaTensor,
        base: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "hc_head_weights";
        let (n, hc) = checks::hc_head_weights(mix, scale, base)?;
        let mut y = self.alloc(OP, mix.shape.clone(), DType::F32)?;
        let sizes = [check_u32(OP, "elements", n * hc)?, check_u32(OP, "hc", hc)?, eps.to_bits()];
        let inputs = [&*mix.buf, &*scale.buf, &*base.buf];
        self.launch_1d(OP, Source::LmSmall, "hc_head_weights_f32", &inputs, &mut y, &sizes, n * hc)?;
        Ok(y)
    }

    /// Interleaved RoPE on the last `2·inv_freq.len()` dims of every head; row i at position
    /// `pos0 + i·stride` (computed in 64 bits on the device, then rounded to f32 as the CPU lane
    /// does).
    pub(super) fn rope_tail(
        &self,
        x: &CudaTensor,
        n_heads: usize,
        inv_freq: &CudaTensor,
        pos0: usize,
        stride: usize,
        inverse: bool,
    ) -> Result<CudaTensor> {
        const OP: &str = "rope_tail";
        let (n, cols, hd, rd) = checks::rope_tail(x, n_heads, inv_freq)?;
        let mut y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let sizes = [
            &rope_sizes(OP, n, cols, hd, rd)?[..],
            &[check_u32(OP, "pos0", pos0)?, check_u32(OP, "stride", stride)?, inverse as u32],
        ]
        .concat();
        self.launch_1d(OP, Source::LmSmall, "rope_tail_f32", &[&*x.buf, &*inv_freq.buf], &mut y, &sizes, n * cols)?;
        Ok(y)
    }

    /// [`Self::rope_tail`] with row i at `positions[i]` (≥ 0; read as u32 on the device, then
    /// rounded to f32 as the CPU lane does).
    pub(super) fn rope_tail_at(
        &self,
        x: &CudaTensor,
        n_heads: usize,
        inv_freq: &CudaTensor,
        positions: &CudaTensor,
        inverse: bool,
    ) -> Result<CudaTensor> {
        const OP: &str = "rope_tail_at";
        let (n, cols, hd, rd) = checks::rope_tail_at(x, n_heads, inv_freq, positions)?;
        let mut y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let sizes = [&rope_sizes(OP, n, cols, hd, rd)?[..], &[inverse as u32]].concat();
        let inputs = [&*x.buf, &*inv_freq.buf, &*positions.buf];
        self.launch_1d(OP, Source::LmSmall, "rope_tail_at_f32", &inputs, &mut y, &sizes, n * cols)?;
        Ok(y)
    }

    /// Per-head RMS norm (times `weight` `[hd]` with one head), then RoPE at `positions[i]`:
    /// x `[n, heads·hd]` → `[n, heads·hd]`; one block per (row, head) segment.
    pub(super) fn rms_norm_rope(
        &self,
        x: &CudaTensor,
        weight: Option<&CudaTensor>,
        n_heads: usize,
        eps: f32,
        inv_freq: &CudaTensor,
        positions: &CudaTensor,
    ) -> Result<CudaTensor> {
        const OP: &str = "rms_norm_rope";
        let (n, _, hd, rd) = checks::rms_norm_rope(x, weight, n_heads, inv_freq, positions)?;
        let mut y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let segs = n * n_heads;
        if segs == 0 || hd == 0 {
            return Ok(y);
        }
        let (segs32, heads32) = (check_u32(OP, "segments", segs)?, check_u32(OP, "heads", n_heads)?);
        let (hd32, rd32) = (check_u32(OP, "head dim", hd)?, check_u32(OP, "rotary dims", rd)?);
        let has_weight = u32::from(weight.is_some());
        let f = self.func(Source::LmSmall, "rms_norm_rope_f32")?;
        let cfg = cfg_rows(segs, hd);
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(weight.map_or(&self.dummy, |w| &*w.buf)).arg(&*inv_freq.buf).arg(&*positions.buf);
        l.arg(&mut *y.buf).arg(&segs32).arg(&heads32).arg(&hd32).arg(&rd32).arg(&has_weight).arg(&eps);
        // SAFETY: arguments match `rms_norm_rope_f32` in cuda/lm_small.cu; shapes checked above
        // (the dummy stands in for an absent weight, which the kernel never reads).
        self.launched(OP, "rms_norm_rope_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(y)
    }

    /// Top-k columns per row (descending, ties to the lower column, −1 fill): x `[n, m]` → i32
    /// `[n, k]`; one block per row.
    pub(super) fn topk_rows(&self, x: &CudaTensor, k: usize) -> Result<CudaTensor> {
        const OP: &str = "topk_rows";
        let (n, m) = checks::topk_rows(x)?;
        let mut y = self.alloc(OP, vec![n, k], DType::I32)?;
        if n == 0 || k == 0 {
            return Ok(y);
        }
        let (n32, m32, k32) = (check_u32(OP, "rows", n)?, check_u32(OP, "cols", m)?, check_u32(OP, "k", k)?);
        let f = self.func(Source::LmSmall, "topk_rows_i32")?;
        let cfg = LaunchConfig {
            grid_dim: (n.min(MAX_BLOCKS) as u32, 1, 1),
            block_dim: (TOPK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&mut *y.buf).arg(&n32).arg(&m32).arg(&k32);
        // SAFETY: arguments match `topk_rows_i32` in cuda/lm_small.cu; shapes checked above.
        self.launched(OP, "topk_rows_i32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(y)
    }

    /// `sqrt(softplus(x))` elementwise (linear branch above 20, as the CPU lane).
    pub(super) fn sqrt_softplus(&self, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "sqrt_softplus";
        checks::sqrt_softplus(x)?;
        let mut y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let n = x.numel();
        self.launch_1d(
            OP,
            Source::LmSmall,
            "sqrt_softplus_f32",
            &[&*x.buf],
            &mut y,
            &[check_u32(OP, "elements", n)?],
            n,
        )?;
        Ok(y)
    }

    /// table i32 `[vocab, k]`, ids i32 `[n]`, fallback i32 `[n, k]` → i32 `[n, k]`.
    pub(super) fn hash_route(&self, table: &CudaTensor, ids: &CudaTensor, fallback: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "hash_route";
        let (vocab, k, n) = checks::hash_route(table, ids, fallback)?;
        let mut y = self.alloc(OP, vec![n, k], DType::I32)?;
        let sizes = [check_u32(OP, "rows", n)?, check_u32(OP, "k", k)?, check_u32(OP, "vocab", vocab)?];
        let inputs = [&*table.buf, &*ids.buf, &*fallback.buf];
        self.launch_1d(OP, Source::LmSmall, "hash_route_i32", &inputs, &mut y, &sizes, n * k)?;
        Ok(y)
    }

    /// scores `[n, e]`, ids i32 `[n, k]` → `[n, k]`, `s / (Σ s + 1e-20) · scale`; a row with an
    /// id outside `0..e` is NaN.
    pub(super) fn route_weights(&self, scores: &CudaTensor, ids: &CudaTensor, scale: f32) -> Result<CudaTensor> {
        const OP: &str = "route_weights";
        let (n, e, k) = checks::route_weights(scores, ids)?;
        let mut y = self.alloc(OP, vec![n, k], DType::F32)?;
        let sizes = [check_u32(OP, "rows", n)?, check_u32(OP, "k", k)?, check_u32(OP, "experts", e)?, scale.to_bits()];
        self.launch_1d(OP, Source::LmSmall, "route_weights_f32", &[&*scores.buf, &*ids.buf], &mut y, &sizes, n * k)?;
        Ok(y)
    }

    /// The fused router: logits `[n, e]`, bias `[kinds, e]`, kind i32 `[n]`, hash = (table i32
    /// `[vocab, k]`, token ids i32 `[n]`) → (ids i32 `[n, k]`, weights `[n, k]`), one warp per
    /// token. The selection is the composition's bit for bit (the same score function and
    /// ranking); a kind outside `0..kinds` or an id outside `0..e` gives NaN weights, as the
    /// composition on this lane does.
    pub(super) fn route_experts(
        &self,
        logits: &CudaTensor,
        bias: &CudaTensor,
        kind: &CudaTensor,
        hash: Option<(&CudaTensor, &CudaTensor)>,
        k: usize,
        scale: f32,
    ) -> Result<(CudaTensor, CudaTensor)> {
        const OP: &str = "route_experts";
        let (n, e) = checks::route_experts(logits, bias, kind, hash, k)?;
        let mut ids = self.alloc(OP, vec![n, k], DType::I32)?;
        let mut weights = self.alloc(OP, vec![n, k], DType::F32)?;
        if n == 0 || k == 0 {
            return Ok((ids, weights));
        }
        let (n32, e32, k32) = (check_u32(OP, "rows", n)?, check_u32(OP, "experts", e)?, check_u32(OP, "k", k)?);
        let kinds = check_u32(OP, "bias rows", bias.rows())?;
        // without a table the kernel never reads `table` / `tok`; `kind` stands in for both
        let (table, tok, hashed, vocab) = match hash {
            Some((table, tok)) => (&*table.buf, &*tok.buf, 1u32, check_u32(OP, "vocab", table.rows())?),
            None => (&*kind.buf, &*kind.buf, 0, 0),
        };
        let scale_bits = scale.to_bits();
        let f = self.func(Source::LmSmall, "route_experts_f32")?;
        let cfg = LaunchConfig {
            grid_dim: (n.min(MAX_BLOCKS) as u32, 1, 1),
            block_dim: (ROUTE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*logits.buf).arg(&*bias.buf).arg(&*kind.buf).arg(table).arg(tok);
        l.arg(&mut *ids.buf).arg(&mut *weights.buf);
        l.arg(&n32).arg(&e32).arg(&k32).arg(&kinds).arg(&hashed).arg(&vocab).arg(&scale_bits);
        // SAFETY: arguments match `route_experts_f32` in cuda/lm_small.cu; shapes checked above.
        self.launched(OP, "route_experts_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok((ids, weights))
    }

    /// g, u `[n, h]` → `silu(min(g, limit)) · clamp(u, ±limit)` `[n, h]`.
    pub(super) fn swiglu_clamp(&self, g: &CudaTensor, u: &CudaTensor, limit: f32) -> Result<CudaTensor> {
        const OP: &str = "swiglu_clamp";
        let (n, h) = checks::swiglu_clamp(g, u)?;
        let mut y = self.alloc(OP, vec![n, h], DType::F32)?;
        let sizes = [check_u32(OP, "rows", n)?, check_u32(OP, "cols", h)?, limit.to_bits()];
        self.launch_1d(OP, Source::LmSmall, "swiglu_clamp_f32", &[&*g.buf, &*u.buf], &mut y, &sizes, n * h)?;
        Ok(y)
    }
}
