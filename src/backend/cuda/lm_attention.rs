//! Language-model attention-side ops on the CUDA lane (kernels in cuda/lm_attention.cu):
//! `sink_attention`, `indexer_scores`, `compress_pool`, `grouped_linear`. Shape checks follow the
//! wgpu lane; operands the CPU lane rejects only after reading them (a window outside the raw
//! keys, a compressed index outside `-1..c`) give NaN heads here, as on wgpu (a GPU lane cannot
//! return an error without a host round trip).

use cudarc::driver::LaunchConfig;

use super::blas::Shape;
use super::launch::KernelArgs;

use super::{
    CudaBackend, CudaTensor, CudaWeight, GEMM_THREADS, GRID_Y, GROUPED_LINEAR_KERNELS, Source, cfg_1d, check_u32,
    flash_stride, gemm_grid,
};
use crate::backend::checks;
use crate::backend::{DType, Op, Precision};
use crate::error::{Error, Result};

/// Threads per block of `sink_attention_f32` (`SA_THREADS` in cuda/lm_attention.cu).
const SINK_THREADS: u32 = 256;
/// Heads per block of `sink_attention_f32` (`SA_HEADS`).
const SINK_HEADS: usize = 16;
/// Keys per shared-memory chunk of `sink_attention_f32` (`SA_KEYS`).
const SINK_KEYS: usize = 16;
/// Fewer (query, head group) blocks than this and `sink_attention` splits each query's keys over
/// more blocks (two waves of an H200's 132 SMs: decode has one query, 4 head groups).
const SINK_SPLIT_TARGET_BLOCKS: usize = 264;
/// Threads per block of `sink_attention_fast_d*` (32 · `SF_WARPS` in cuda/lm_attention.cu).
const SINK_FAST_THREADS: u32 = 256;
/// Heads per block of `sink_attention_fast_d*` (`SF_HEADS`).
const SINK_FAST_HEADS: usize = 64;
/// Keys per shared-memory chunk of `sink_attention_fast_d*` (`SF_KEYS`).
const SINK_FAST_KEYS: usize = 64;
/// `sink_attention_fast_d*`'s instantiations: the padded head widths, each with its kernel (the
/// released model's 512, and 128 for narrower heads).
const SINK_FAST_WIDTHS: [(usize, &str); 2] = [(128, "sink_attention_fast_d128"), (512, "sink_attention_fast_d512")];
/// Threads per block of `indexer_scores_f32` (`IX_THREADS`).
const INDEXER_THREADS: u32 = 256;
/// Keys per block of `indexer_scores_f32` (`IX_KEYS`).
const INDEXER_KEYS: usize = 64;

impl CudaBackend {
    /// q `[n, heads·hd]`, kv `[m, hd]`, window i32 `[n, 2]`, comp (`[c, hd]`, idx i32 `[n, k]`),
    /// sinks `[heads]` → `[n, heads·hd]`; one block per (query, group of `SINK_HEADS` heads,
    /// key split), the keys staged in shared memory once for the group. With few queries (decode)
    /// each query's keys are split over several blocks and `sink_attention_merge_f32` combines
    /// their partial softmax states. In fast precision a prefill chunk's many queries take the
    /// tensor-core kernel instead (`fast_sink_kernel`: one block a query's 64 heads, no splits).
    pub(super) fn sink_attention(
        &self,
        q: &CudaTensor,
        kv: &CudaTensor,
        window: &CudaTensor,
        comp: Option<(&CudaTensor, &CudaTensor)>,
        sinks: &CudaTensor,
        n_heads: usize,
    ) -> Result<CudaTensor> {
        const OP: &str = "sink_attention";
        let (n, cols, hd, m, c_rows, kk) = checks::sink_attention(q, kv, window, comp, sinks, n_heads)?;
        let groups = n_heads.div_ceil(SINK_HEADS);
        if groups > GRID_Y {
            return Err(Self::unsupported(Op::SinkAttention, format!("{n_heads} heads (grid limit {GRID_Y} groups)")));
        }
        let mut y = self.alloc(OP, vec![n, cols], DType::F32)?;
        if n == 0 || hd == 0 {
            return Ok(y);
        }
        // q, keys, acc tiles, then S, P^T, alpha, factor, present (the layout in cuda/lm_attention.cu)
        let shared = 4
            * ((2 * SINK_HEADS + SINK_KEYS) * flash_stride(hd)
                + 2 * SINK_HEADS * SINK_KEYS
                + 2 * SINK_HEADS
                + SINK_KEYS);
        let f = self.func_shared(
            Op::SinkAttention,
            Source::LmAttention,
            "sink_attention_f32",
            shared,
            &format!("head dim {hd}"),
        )?;
        let (n32, h32, hd32) = (check_u32(OP, "rows", n)?, n_heads as u32, check_u32(OP, "head dim", hd)?);
        let (m32, k32, c32) =
            (check_u32(OP, "kv rows", m)?, check_u32(OP, "comp_idx columns", kk)?, check_u32(OP, "comp rows", c_rows)?);
        // split the keys when the blocks would not fill the GPU; at most one chunk per split
        // of the most keys a query can see (the window lies in the m raw keys)
        let blocks = n * groups;
        let splits = if blocks >= SINK_SPLIT_TARGET_BLOCKS {
            1
        } else {
            SINK_SPLIT_TARGET_BLOCKS.div_ceil(blocks).min((m + kk).div_ceil(SINK_KEYS)).max(1)
        };
        // the splits' states [n, heads, splits, 2 + hd] (max, denominator, acc)
        let part =
            if splits > 1 { Some(self.alloc(OP, vec![n * n_heads * splits, 2 + hd], DType::F32)?) } else { None };
        let scale = 1.0 / (hd as f32).sqrt();
        let (cbuf, ibuf) = comp.map_or((&self.dummy, &self.dummy), |(c, i)| (&*c.buf, &*i.buf));
        if let Some((width, kernel, shared)) = self.fast_sink_kernel(n, n_heads, hd)? {
            // the keys (= values) once as f16 rows of `width` halves, zero-padded
            let rows_f16 = |x: &CudaTensor, rows: usize, rows32: u32| -> Result<CudaTensor> {
                let words = rows * width / 2;
                let mut y = self.alloc(OP, vec![words.max(1)], DType::I32)?;
                let sizes = [rows32, hd32, width as u32];
                self.launch_1d(OP, Source::LmAttention, "sink_rows_f16", &[&*x.buf], &mut y, &sizes, words)?;
                Ok(y)
            };
            let kv16 = rows_f16(kv, m, m32)?;
            let comp16 = comp.map(|(c, _)| rows_f16(c, c_rows, c32)).transpose()?;
            let f =
                self.func_shared(Op::SinkAttention, Source::LmAttention, kernel, shared, &format!("head dim {hd}"))?;
            let cfg = LaunchConfig {
                grid_dim: (n32, n_heads.div_ceil(SINK_FAST_HEADS) as u32, 1),
                block_dim: (SINK_FAST_THREADS, 1, 1),
                shared_mem_bytes: shared as u32,
            };
            let mut l = KernelArgs::new(&self.stream, &f);
            l.arg(&*q.buf).arg(&*kv16.buf).arg(&*window.buf).arg(comp16.as_ref().map_or(&self.dummy, |c| &*c.buf));
            l.arg(ibuf).arg(&*sinks.buf).arg(&mut *y.buf);
            l.arg(&h32).arg(&hd32).arg(&m32).arg(&k32).arg(&c32).arg(&scale);
            // SAFETY: arguments match `sink_attention_fast_d*` in cuda/lm_attention.cu; kv16 and
            // comp16 hold m and c rows of width / 2 words, shapes checked above (with no
            // compressed entries kk = 0 and the dummy buffers are never read).
            self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
            return Ok(y);
        }
        let cfg = LaunchConfig {
            grid_dim: (n32, groups as u32, splits as u32),
            block_dim: (SINK_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*q.buf).arg(&*kv.buf).arg(&*window.buf).arg(cbuf).arg(ibuf).arg(&*sinks.buf).arg(&mut *y.buf);
        l.arg(part.as_ref().map_or(&self.dummy, |p| &*p.buf));
        l.arg(&n32).arg(&h32).arg(&hd32).arg(&m32).arg(&k32).arg(&c32).arg(&scale);
        // SAFETY: arguments match `sink_attention_f32` in cuda/lm_attention.cu; shapes checked
        // above (with no compressed entries kk = 0, so the dummy buffers are never read; with one
        // split the kernel writes out, never part).
        self.launched(OP, "sink_attention_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        if let Some(part) = part {
            let total = n * cols;
            let merge = self.func(Source::LmAttention, "sink_attention_merge_f32")?;
            let (total32, s32) = (check_u32(OP, "outputs", total)?, splits as u32);
            let mut l = KernelArgs::new(&self.stream, &merge);
            l.arg(&*part.buf).arg(&*sinks.buf).arg(&mut *y.buf).arg(&total32).arg(&h32).arg(&hd32).arg(&s32);
            // SAFETY: arguments match `sink_attention_merge_f32`; part holds splits states per
            // (query, head), written by the launch above on the same stream.
            self.launched(OP, "sink_attention_merge_f32", cfg_1d(total), |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        }
        Ok(y)
    }

    /// The tensor-core sink attention for `n` queries of `heads` heads of width `hd` (f16
    /// operands, f32 softmax: cuda/lm_attention.cu): its padded width, kernel and dynamic shared
    /// memory, or none: exact precision, [`Options::sink_tensor_cores`](super::Options) off, a
    /// device below sm_80, a head wider than 512, too few (query, head group) blocks to fill the
    /// GPU without splitting keys (a decode step: `sink_attention_f32` splits), or a device whose
    /// blocks cannot have that much shared memory (the d512 kernel's 196 KiB fit sm_90's 227,
    /// not an A100's 163 or sm_86/89's 99).
    fn fast_sink_kernel(&self, n: usize, heads: usize, hd: usize) -> Result<Option<(usize, &'static str, usize)>> {
        if self.opts.precision != Precision::Fast || !self.opts.sink_tensor_cores || self.arch < 80 {
            return Ok(None);
        }
        if n * heads.div_ceil(SINK_FAST_HEADS) < SINK_SPLIT_TARGET_BLOCKS {
            return Ok(None);
        }
        let Some(&(width, kernel)) = SINK_FAST_WIDTHS.iter().find(|&&(width, _)| hd <= width) else {
            return Ok(None);
        };
        // q rows, then two stages of key rows and their present flags (words; cuda/lm_attention.cu)
        let row_words = width / 2 + 4;
        let shared = 4 * (SINK_FAST_HEADS * row_words + 2 * (SINK_FAST_KEYS * row_words + SINK_FAST_KEYS));
        let f = self.func(Source::LmAttention, kernel)?;
        Ok((shared <= self.shared_available(kernel, &f)?).then_some((width, kernel, shared)))
    }

    /// Whether `sink_attention` of `n` queries of `heads` heads of width `hd` runs on tensor cores
    /// here (`fast_sink_kernel`). Diagnostic: tests check the routing with it.
    pub fn sink_attention_on_tensor_cores(&self, n: usize, heads: usize, hd: usize) -> Result<bool> {
        Ok(self.fast_sink_kernel(n, heads, hd)?.is_some())
    }

    /// q `[n, heads·hd]`, k `[m, hd]`, w `[n, heads]` → `[n, m]`; one block per (query, key tile).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn indexer_scores(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        w: &CudaTensor,
        n_heads: usize,
        scale: f32,
        pos0: usize,
        ratio: usize,
    ) -> Result<CudaTensor> {
        const OP: &str = "indexer_scores";
        let (n, m, hd) = checks::indexer_scores(q, k, w, n_heads, ratio)?;
        let mut y = self.alloc(OP, vec![n, m], DType::F32)?;
        if n == 0 || m == 0 {
            return Ok(y);
        }
        let f = self.func(Source::LmAttention, "indexer_scores_f32")?;
        let sizes = [
            check_u32(OP, "rows", n)?,
            check_u32(OP, "keys", m)?,
            check_u32(OP, "heads", n_heads)?,
            check_u32(OP, "head dim", hd)?,
        ];
        let (pos32, r32) = (check_u32(OP, "pos0", pos0)?, check_u32(OP, "ratio", ratio)?);
        // key tiles x queries (y, continued in z past the grid's y limit)
        let gy = n.min(GRID_Y);
        let cfg = LaunchConfig {
            grid_dim: (m.div_ceil(INDEXER_KEYS) as u32, gy as u32, n.div_ceil(gy) as u32),
            block_dim: (INDEXER_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*q.buf).arg(&*k.buf).arg(&*w.buf).arg(&mut *y.buf);
        l.arg(&sizes[0]).arg(&sizes[1]).arg(&sizes[2]).arg(&sizes[3]).arg(&scale).arg(&pos32).arg(&r32);
        // SAFETY: arguments match `indexer_scores_f32` in cuda/lm_attention.cu; shapes checked above.
        self.launched(OP, "indexer_scores_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(y)
    }

    /// kv, gate `[T, w]`, ape `[r, w]` → `[⌊T/r⌋, d]`; one thread per (entry, channel).
    pub(super) fn compress_pool(
        &self,
        kv: &CudaTensor,
        gate: &CudaTensor,
        ape: &CudaTensor,
        ratio: usize,
        overlap: bool,
    ) -> Result<CudaTensor> {
        const OP: &str = "compress_pool";
        let (n, d, w) = checks::compress_pool(kv, gate, ape, ratio, overlap)?;
        let mut y = self.alloc(OP, vec![n, d], DType::F32)?;
        let sizes = [
            check_u32(OP, "outputs", n * d)?,
            check_u32(OP, "channels", d)?,
            check_u32(OP, "width", w)?,
            check_u32(OP, "ratio", ratio)?,
            overlap as u32,
        ];
        self.launch_1d(
            OP,
            Source::LmAttention,
            "compress_pool_f32",
            &[&*kv.buf, &*gate.buf, &*ape.buf],
            &mut y,
            &sizes,
            n * d,
        )?;
        Ok(y)
    }

    /// x `[n, g·k]`, W `[g·r, k]` (any format, decoded in the kernel) → `[n, g·r]`.
    pub(super) fn grouped_linear(&self, x: &CudaTensor, w: &CudaWeight, groups: usize) -> Result<CudaTensor> {
        const OP: &str = "grouped_linear";
        let (n, k, r) = checks::grouped_linear(x, w, groups)?;
        let mut y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        if n == 0 || r == 0 {
            return Ok(y);
        }
        if let Some(blas) = self.blas_for(n, k, r, w) {
            self.blas_gemm(OP, blas, x, w, (None, None), &mut y, Shape { n, k, r, groups })?;
            return Ok(y);
        }
        let (tiles_r, gy) = gemm_grid(n, r);
        let gx = groups * tiles_r;
        if gy > GRID_Y || gx > i32::MAX as usize {
            return Err(Error::Device(format!(
                "op `{OP}`: x {:?} / weight `{}` exceed the grid limits of the grouped kernel",
                x.shape, w.name
            )));
        }
        let kernel = GROUPED_LINEAR_KERNELS.of(w.format);
        let f = self.gemm_func(Source::LmAttention, kernel, w.exact, n)?;
        let sizes = [
            check_u32(OP, "rows", n)?,
            check_u32(OP, "group width", k)?,
            check_u32(OP, "group outputs", r)?,
            check_u32(OP, "groups", groups)?,
            tiles_r as u32,
        ];
        let cfg =
            LaunchConfig { grid_dim: (gx as u32, gy as u32, 1), block_dim: (GEMM_THREADS, 1, 1), shared_mem_bytes: 0 };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&w.buf).arg(&mut *y.buf);
        for s in &sizes {
            l.arg(s);
        }
        // SAFETY: arguments match `grouped_linear_*` in cuda/lm_attention.cu; shapes checked above.
        self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(y)
    }
}
