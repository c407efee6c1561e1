//! The vision tower's own ops on the CUDA lane: `rope_2d` (cos/sin from the host, cached),
//! `attention` (flash attention in `cuda/attention.cu`: f32, or on tensor cores in fast
//! precision; `attention_rope_2d` fuses its operands' preparation there) and `unfold` (the
//! aligner's 3×3 regrouping as a copy; the aligner's GEMM gathers its rows itself: linear.rs).

use std::sync::Arc;

use cudarc::driver::LaunchConfig;

use super::launch::KernelArgs;
use super::{
    ATTENTION_KEYS, ATTENTION_ROWS, ATTENTION_THREADS, CudaBackend, CudaTensor, FAST_ATTENTION_KEYS,
    FAST_ATTENTION_ROWS, FAST_ATTENTION_THREADS, FAST_ATTENTION_WIDTHS, GRID_Y, QKV_ROPE_THREADS, Role, Source,
    check_u32, flash_stride,
};
use crate::backend::cpu::rope_2d_tables;
use crate::backend::{DType, Op, Precision, attention_rope_2d_parts, checks};
use crate::error::{Error, Result};

impl CudaBackend {
    /// x `[gh·gw, heads·hd]` → same shape; cos/sin table computed on the host in f32 and cached.
    pub(super) fn rope_2d(&self, x: &CudaTensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<CudaTensor> {
        const OP: &str = "rope_2d";
        let (n, hd) = checks::rope_2d(x, n_heads, grid_w)?;
        let mut y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let total = n * n_heads * hd / 2;
        if total == 0 {
            return Ok(y);
        }
        let tab = self.rope_table(n, grid_w, hd, theta)?;
        let sizes = [n as u32, n_heads as u32, hd as u32];
        self.launch_1d(OP, Source::Rope, "rope_2d_f32", &[&*x.buf, &*tab.buf], &mut y, &sizes, total)?;
        Ok(y)
    }

    /// q, k, v `[n, heads·hd]` → `[n, heads·hd]`: flash attention, one block per (tile of
    /// `ATTENTION_ROWS` queries, head), keys streamed through shared memory; in fast precision on
    /// tensor cores (`fast_attention_kernel`, `FAST_ATTENTION_ROWS` queries a block).
    pub(super) fn attention(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        v: &CudaTensor,
        n_heads: usize,
    ) -> Result<CudaTensor> {
        const OP: &str = "attention";
        let (n, hd) = checks::attention(q, k, v, n_heads)?;
        if n_heads > GRID_Y {
            return Err(Self::unsupported(Op::Attention, format!("{n_heads} heads (grid limit {GRID_Y})")));
        }
        let mut y = self.alloc(OP, q.shape.clone(), DType::F32)?;
        if n == 0 || hd == 0 {
            return Ok(y);
        }
        let (n32, h32, hd32) = (check_u32(OP, "rows", n)?, n_heads as u32, check_u32(OP, "head dim", hd)?);
        let scale = 1.0 / (hd as f32).sqrt();
        if let Some((width, kernel)) = self.fast_attention_kernel(hd) {
            let (mut kv16, keys) = self.alloc_kv16(OP, n, n_heads, width)?;
            let words = n_heads * keys * width / 2;
            let sizes = [n32, h32, hd32, width as u32, check_u32(OP, "padded keys", keys)?];
            self.launch_1d(
                OP,
                Source::Attention,
                "attention_kv_f16",
                &[&*k.buf, &*v.buf],
                &mut kv16,
                &sizes,
                2 * words,
            )?;
            let op = (OP, Op::Attention);
            self.attention_on_tensor_cores(op, q, &kv16, &mut y, (n, n_heads, hd), (width, kernel))?;
            return Ok(y);
        }
        // q, k, v, acc tiles, then S, P^T, alpha and factor (the layout in cuda/attention.cu)
        let ld = flash_stride(hd);
        let shared = 4
            * ((2 * ATTENTION_ROWS + 2 * ATTENTION_KEYS) * ld
                + 2 * ATTENTION_ROWS * ATTENTION_KEYS
                + 2 * ATTENTION_ROWS);
        let f =
            self.func_shared(Op::Attention, Source::Attention, "attention_f32", shared, &format!("head dim {hd}"))?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(ATTENTION_ROWS) as u32, h32, 1),
            block_dim: (ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*q.buf).arg(&*k.buf).arg(&*v.buf).arg(&mut *y.buf).arg(&n32).arg(&h32).arg(&hd32).arg(&scale);
        // SAFETY: arguments match `attention_f32` in cuda/attention.cu; shapes checked above.
        self.launched(OP, "attention_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(y)
    }

    /// A ViT block's attention from its fused projection qkv `[n, 3·heads·hd]` → `[n, heads·hd]`.
    /// In fast precision one launch (`attention_qkv_rope_f16`) writes q rotated and k (rotated)
    /// and v as the tensor-core kernel's f16 operands, where `attention_rope_2d_parts` would take
    /// three column slices, two rotations and the conversion; otherwise those parts.
    pub(super) fn attention_rope_2d(
        &self,
        qkv: &CudaTensor,
        n_heads: usize,
        grid_w: usize,
        theta: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "attention_rope_2d";
        let (n, hd) = checks::attention_rope_2d(qkv, n_heads, grid_w)?;
        let Some((width, kernel)) = self.fast_attention_kernel(hd) else {
            return attention_rope_2d_parts(self, qkv, n_heads, grid_w, theta);
        };
        if n_heads > GRID_Y {
            return Err(Self::unsupported(Op::AttentionRope2d, format!("{n_heads} heads (grid limit {GRID_Y})")));
        }
        let mut y = self.alloc(OP, vec![n, n_heads * hd], DType::F32)?;
        if n == 0 || hd == 0 {
            return Ok(y);
        }
        let mut q = self.alloc(OP, vec![n, n_heads * hd], DType::F32)?;
        let tab = self.rope_table(n, grid_w, hd, theta)?;
        let (mut kv16, keys) = self.alloc_kv16(OP, n, n_heads, width)?;
        let (n32, h32, hd32) = (check_u32(OP, "rows", n)?, n_heads as u32, check_u32(OP, "head dim", hd)?);
        let (width32, keys32) = (width as u32, check_u32(OP, "padded keys", keys)?);
        let name = "attention_qkv_rope_f16";
        let f = self.func(Source::Attention, name)?;
        let cfg = LaunchConfig {
            grid_dim: ((keys / FAST_ATTENTION_KEYS) as u32, h32, 1),
            block_dim: (QKV_ROPE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*qkv.buf).arg(&*tab.buf).arg(&mut *q.buf).arg(&mut *kv16.buf);
        l.arg(&n32).arg(&h32).arg(&hd32).arg(&width32).arg(&keys32);
        // SAFETY: arguments match `attention_qkv_rope_f16` in cuda/attention.cu: qkv [n, 3·heads·hd]
        // and the table (2·n·hd/2) checked and built above, q [n, heads·hd], kv16 the
        // 2 · heads · keys · width / 2 words it writes.
        self.launched(OP, name, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        let op = (OP, Op::AttentionRope2d);
        self.attention_on_tensor_cores(op, &q, &kv16, &mut y, (n, n_heads, hd), (width, kernel))?;
        Ok(y)
    }

    /// The buffer of `attention_fast_d*`'s f16 keys and values (kh then vt, cuda/attention.cu)
    /// for n rows of `n_heads` heads padded to `width`, and the padded key count (a multiple of
    /// `FAST_ATTENTION_KEYS`).
    fn alloc_kv16(&self, op: &'static str, n: usize, n_heads: usize, width: usize) -> Result<(CudaTensor, usize)> {
        let keys = n.div_ceil(FAST_ATTENTION_KEYS) * FAST_ATTENTION_KEYS;
        Ok((self.alloc(op, vec![n_heads * keys * width], DType::I32)?, keys))
    }

    /// `attention_fast_d*` (`kernel`, padded head width `width`): q `[n, heads·hd]` f32 and kv16
    /// (k and v as f16 operands, padded to a multiple of `FAST_ATTENTION_KEYS` keys) → y.
    fn attention_on_tensor_cores(
        &self,
        (op, of): (&'static str, Op),
        q: &CudaTensor,
        kv16: &CudaTensor,
        y: &mut CudaTensor,
        (n, n_heads, hd): (usize, usize, usize),
        (width, kernel): (usize, &'static str),
    ) -> Result<()> {
        let (n32, h32, hd32) = (check_u32(op, "rows", n)?, n_heads as u32, check_u32(op, "head dim", hd)?);
        let keys32 = check_u32(op, "padded keys", n.div_ceil(FAST_ATTENTION_KEYS) * FAST_ATTENTION_KEYS)?;
        let scale = 1.0 / (hd as f32).sqrt();
        // two stages of a key chunk and its transposed values, in words
        let shared = 4 * 2 * (FAST_ATTENTION_KEYS * (width / 2 + 4) + width * (FAST_ATTENTION_KEYS / 2 + 4));
        let f = self.func_shared(of, Source::Attention, kernel, shared, &format!("head dim {hd}"))?;
        let cfg = LaunchConfig {
            grid_dim: (n.div_ceil(FAST_ATTENTION_ROWS) as u32, h32, 1),
            block_dim: (FAST_ATTENTION_THREADS, 1, 1),
            shared_mem_bytes: shared as u32,
        };
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*q.buf).arg(&*kv16.buf).arg(&mut *y.buf).arg(&n32).arg(&h32).arg(&hd32).arg(&keys32).arg(&scale);
        // SAFETY: arguments match `attention_fast_d*` in cuda/attention.cu; kv16 holds the
        // 2 · heads · keys · width / 2 words it reads (the callers allocate it so), y [n, heads·hd].
        self.launched(op, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })
    }

    /// x `[h·w, c]` → `[ceil(h/r)·ceil(w/r), c·r²]`.
    pub(super) fn unfold(&self, x: &CudaTensor, h: usize, w: usize, r: usize) -> Result<CudaTensor> {
        const OP: &str = "unfold";
        let c = checks::unfold(x, h, w, r)?;
        let (gh, gw) = (h.div_ceil(r), w.div_ceil(r));
        let feat = c.checked_mul(r * r).ok_or_else(|| Error::shape(OP, format!("r = {r} is too large")))?;
        let mut y = self.alloc(OP, vec![gh * gw, feat], DType::F32)?;
        let sizes = [c as u32, h as u32, w as u32, r as u32, gw as u32, (gh * gw) as u32];
        self.launch_1d(OP, Source::Copy, "unfold_f32", &[&*x.buf], &mut y, &sizes, gh * gw * feat)?;
        Ok(y)
    }

    fn rope_table(&self, n: usize, grid_w: usize, hd: usize, theta: f32) -> Result<Arc<CudaTensor>> {
        let key = (n, grid_w, hd, theta.to_bits());
        if let Some(t) = self.rope_tables.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(t.clone());
        }
        // The CPU lane's own tables (same f32 arithmetic), cos then sin.
        let (cos, sin) = rope_2d_tables(n, grid_w, hd, theta);
        let tab: Vec<f32> = cos.into_iter().chain(sin).collect();
        let t = Arc::new(self.new_tensor(
            "rope_2d",
            vec![tab.len()],
            DType::F32,
            Role::Weight,
            Some(bytemuck::cast_slice(&tab)),
        )?);
        let mut tables = self.rope_tables.lock().unwrap_or_else(|e| e.into_inner());
        if tables.len() >= 8 {
            tables.clear();
        }
        tables.insert(key, t.clone());
        Ok(t)
    }

    /// The tensor-core attention kernel for head width `hd` in fast precision (f16 operands, f32
    /// softmax: cuda/attention.cu) with its padded width, or none: exact precision, a device
    /// below sm_80 (no f16 MMA), or a head wider than the widest instantiation (those take
    /// `attention_f32`).
    fn fast_attention_kernel(&self, hd: usize) -> Option<(usize, &'static str)> {
        if self.opts.precision != Precision::Fast || self.arch < 80 {
            return None;
        }
        FAST_ATTENTION_WIDTHS.iter().find(|&&(width, _)| hd <= width).copied()
    }
}
