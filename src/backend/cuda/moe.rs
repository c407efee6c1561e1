//! Routed experts (`moe_experts`) on the CUDA lane, kernels in cuda/moe.cu:
//! 1. `moe_route` (one block) groups the n·k slots by expert on the device (slot numbers in expert
//!    order, stable) and cuts each expert's range into row tiles (of `GEMV_ROWS` for at most that many tokens, else `GEMM_BM`: the tile list);
//! 2. one launch of a gathered GEMM `x[tokens] · w1[e]ᵀ` storing the gate (`moe_gate_*`), one of
//!    `x[tokens] · w3[e]ᵀ` with the clamped SwiGLU of the stored gate in its epilogue
//!    (`moe_up_*`), then one of `· w2[e]ᵀ` (`moe_down_*`) into a per-slot buffer: each block
//!    takes one tile and its expert's weight from a device table of expert weight addresses.
//!    Gate and up are separate launches so that each is built for its own weight's format (GGUF
//!    mixes store w1 and w3 in different block formats); together they do the work of one
//!    `[2h, d]` GEMM;
//!    In fast precision a decode step of one sequence takes `moe_{gate,up,down}_q8x_*` instead
//!    where the projection's format has them (Q8_0, Q2_K, IQ2_XXS, MXFP4: `moe_q8x_kernels`): the same
//!    arguments and tiles, the activations rounded to int8 a 32-value group and multiplied with
//!    the codes as integers (cuda/moe.cu says why). (Gate and up in one launch, the row
//!    quantized once, measured slower than the two with programmatic dependent launch on an H100
//!    in the twenty-fourth sitting and was dropped.)
//! 3. `moe_combine` sums each token's k slots in slot order (no float atomics: reproducible).
//!
//! Nothing is read back: the GEMM grids are sized for the most tiles any routing of these slots
//! can give, and the blocks past the routing's tile count exit at once, so a call is five launches
//! whatever the routing. The expert weights stay separate allocations (`&[CudaWeight]`); the
//! kernels take them by address, which is why all experts of a call must share one weight format
//! per projection (`checks::moe_one_format`; a GGUF stores each projection's experts in one
//! tensor, so in one format). The arithmetic is the shared GEMM of
//! cuda/common.cuh (tensor cores for bf16/f16 experts on sm_80+). A slot id outside `0..experts`
//! (the CPU lane's error) makes its token's row NaN.

use std::sync::Arc;

use cudarc::driver::{DevicePtr, LaunchConfig};

use super::launch::KernelArgs;

use super::{
    Build, CudaBackend, CudaTensor, CudaWeight, DEFAULT_SHARED_BYTES, GEMM_BM, GEMM_THREADS, GEMV_ROWS, GRID_Y, LANE,
    MOE_DOWN_KERNELS, MOE_GATE_KERNELS, MOE_UP_KERNELS, Q8X_BLOCK_COLS, Q8X_THREADS, Role, Source, WeightKernels,
    check_u32, gemm_grid, moe_q8x_kernels, q8x_shared_bytes,
};
use crate::backend::checks;
use crate::backend::{DType, Op, Precision, WeightFormat};
use crate::error::{Error, Result};

/// Threads of the single `moe_route` block (`MR_THREADS` in cuda/moe.cu).
const ROUTE_THREADS: u32 = 256;
/// Address tables kept by `expert_table` before it starts over (a model has one per MoE layer).
const EXPERT_TABLES_MAX: usize = 256;

impl CudaBackend {
    /// The device addresses of every w1[e], then every w3[e], then every w2[e] (u64 each, stored as
    /// pairs of i32 words: the lane's tensors have 4-byte elements), for the grouped GEMMs.
    ///
    /// Cached rather than uploaded per call: a copy from pageable host memory may be synchronous
    /// with respect to the host (CUDA's notes on API synchronisation), the very wait the grouped
    /// launches remove, and a model passes the same experts every step. The key is the addresses
    /// themselves, so an entry is never stale, even when a freed weight's address is reused. A table dropped from the cache
    /// while a kernel still reads it is safe: cudarc frees a `CudaSlice` in stream order
    /// (`cuMemFreeAsync` on this lane's one stream, or a synchronise first where the device has no
    /// stream-ordered allocator), so after every kernel issued before the drop.
    fn expert_table(&self, w1: &[CudaWeight], w3: &[CudaWeight], w2: &[CudaWeight]) -> Result<Arc<CudaTensor>> {
        // The guard of `device_ptr` records a read event; a no-op here (event tracking is off).
        let key: Vec<u64> = w1.iter().chain(w3).chain(w2).map(|w| w.buf.device_ptr(&self.stream).0).collect();
        let mut tables = self.expert_tables.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(t) = tables.get(&key) {
            return Ok(t.clone());
        }
        let t = Arc::new(self.new_tensor(
            "moe_experts",
            vec![2 * key.len()],
            DType::I32,
            Role::Weight,
            Some(bytemuck::cast_slice(&key)),
        )?);
        if tables.len() >= EXPERT_TABLES_MAX {
            tables.clear();
        }
        tables.insert(key, t.clone());
        Ok(t)
    }

    /// x `[n, d]`, ids i32 `[n, k]`, weights `[n, k]`, w1[e] and w3[e] `[h, d]`, w2[e] `[d, h]` →
    /// `[n, d]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn moe_experts(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        w1: &[CudaWeight],
        w3: &[CudaWeight],
        w2: &[CudaWeight],
        limit: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "moe_experts";
        let (n, d, k, h) = checks::moe_experts(x, ids, weights, w1, w3, w2)?;
        let (gate_format, up_format, down_format) = checks::moe_one_format(LANE, w1, w3, w2)?;
        let experts = w1.len();
        let slots = n * k;
        let (n_d, slots32) = (check_u32(OP, "outputs", n * d)?, check_u32(OP, "slots", slots)?);
        let (d32, h32, k32) = (check_u32(OP, "d", d)?, check_u32(OP, "h", h)?, check_u32(OP, "k", k)?);
        let e32 = check_u32(OP, "experts", experts)?;
        check_u32(OP, "hidden elements", slots * h)?;
        // Row tiles: of GEMV_ROWS when at most that many tokens route (an expert then sees a few
        // rows, and the small-row path streams its weights once: a batched decode step), else
        // of the GEMM tile's GEMM_BM. Every tile holds at least one slot, and each expert has at
        // most one partial tile.
        let tile_rows = if n <= GEMV_ROWS { GEMV_ROWS } else { GEMM_BM as usize };
        let tile_rows32 = tile_rows as u32;
        let max_tiles = slots.min(slots.div_ceil(tile_rows) + experts);
        if max_tiles > GRID_Y {
            return Err(Error::Device(format!(
                "op `{OP}`: {slots} slots over {experts} experts give up to {max_tiles} row tiles, more than the \
                 grid limit of the expert kernels ({GRID_Y})"
            )));
        }
        let mut y = self.alloc(OP, vec![n, d], DType::F32)?;
        if n == 0 || d == 0 {
            return Ok(y);
        }
        // per-slot expert outputs (row s = token s / k, slot s % k); every valid slot is written
        let mut ys = self.alloc(OP, vec![slots.max(1), d], DType::F32)?;
        if slots > 0 && experts > 0 {
            // 1. group the slots by expert, cut the groups into row tiles
            let mut order = self.alloc(OP, vec![slots], DType::I32)?;
            let mut tiles = self.alloc(OP, vec![1 + 3 * max_tiles], DType::I32)?;
            let mut cursor = self.alloc(OP, vec![experts], DType::I32)?;
            // a row of expert counts per warp (cuda/moe.cu)
            let shared = 4 * (ROUTE_THREADS as usize / 32) * experts;
            let f =
                self.func_shared(Op::MoeExperts, Source::Moe, "moe_route", shared, &format!("{experts} experts"))?;
            let cfg =
                LaunchConfig { grid_dim: (1, 1, 1), block_dim: (ROUTE_THREADS, 1, 1), shared_mem_bytes: shared as u32 };
            let mut l = KernelArgs::new(&self.stream, &f);
            l.arg(&*ids.buf).arg(&mut *order.buf).arg(&mut *tiles.buf).arg(&mut *cursor.buf).arg(&slots32).arg(&e32);
            l.arg(&tile_rows32);
            // SAFETY: arguments match `moe_route` in cuda/moe.cu; order holds slots, tiles
            // 1 + 3·max_tiles (the most any routing gives), cursor experts i32.
            self.launched(OP, "moe_route", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
            // 2. every tile at once: gathered gate GEMM, up GEMM + clamped SwiGLU, then down GEMM
            let table = self.expert_table(w1, w3, w2)?;
            let w3_table = table.buf.slice(experts * 8..);
            let w2_table = table.buf.slice(2 * experts * 8..);
            let mut hid = self.alloc(OP, vec![slots, h.max(1)], DType::F32)?;
            let gy = max_tiles as u32;
            // The kernel, function and launch shape of one projection (`which`: 0 gate, 1 up, 2
            // down) of `cols` outputs over rows of `k`: for one token in fast precision the q8x
            // kernel where the format has one (a block per Q8X_BLOCK_COLS columns, the int8 row
            // and its scales in shared memory), else the GEMM's small-row or tile path. Routed
            // experts are never exact weights: the lane's precision.
            let pick = |family: &WeightKernels, which: usize, format: WeightFormat, k: usize, cols: usize| {
                let shared = q8x_shared_bytes(k);
                if let Some(names) = moe_q8x_kernels(format)
                    && self.opts.q8x
                    && self.opts.precision == Precision::Fast
                    && n == 1
                    && shared <= DEFAULT_SHARED_BYTES
                {
                    let cfg = LaunchConfig {
                        grid_dim: (cols.div_ceil(Q8X_BLOCK_COLS) as u32, gy, 1),
                        block_dim: (Q8X_THREADS, 1, 1),
                        shared_mem_bytes: shared as u32,
                    };
                    return Ok((names[which], self.func_in(Source::Moe, names[which], Build::Rows)?, cfg));
                }
                let kernel = family.of(format);
                let cfg = LaunchConfig {
                    grid_dim: (gemm_grid(tile_rows, cols).0 as u32, gy, 1),
                    block_dim: (GEMM_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                Ok::<_, Error>((kernel, self.gemm_func(Source::Moe, kernel, false, tile_rows)?, cfg))
            };
            if h > 0 {
                let (kernel, f, cfg) = pick(&MOE_GATE_KERNELS, 0, gate_format, d, h)?;
                let mut l = KernelArgs::new(&self.stream, &f);
                l.arg(&*x.buf).arg(&*order.buf).arg(&*tiles.buf).arg(&*table.buf).arg(&mut *hid.buf);
                l.arg(&tile_rows32).arg(&d32).arg(&h32).arg(&k32);
                // SAFETY: arguments match `moe_gate_*` (and `moe_gate_q8x_*`) in cuda/moe.cu; the tiles' rows lie in
                // 0..slots, the table's first `experts` addresses are the w1[e] [h, d], all in
                // this kernel's format.
                self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
                let (kernel, f, cfg) = pick(&MOE_UP_KERNELS, 1, up_format, d, h)?;
                let mut l = KernelArgs::new(&self.stream, &f);
                l.arg(&*x.buf).arg(&*order.buf).arg(&*tiles.buf).arg(&w3_table).arg(&mut *hid.buf);
                l.arg(&tile_rows32).arg(&d32).arg(&h32).arg(&k32).arg(&limit);
                // SAFETY: arguments match `moe_up_*` (and `moe_up_q8x_*`) in cuda/moe.cu; w3_table holds the addresses
                // of the w3[e] [h, d], all in this kernel's format; hid holds the gates the
                // previous launch (same stream) wrote.
                self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
            }
            let (kernel, f, cfg) = pick(&MOE_DOWN_KERNELS, 2, down_format, h, d)?;
            let mut l = KernelArgs::new(&self.stream, &f);
            l.arg(&*hid.buf).arg(&*order.buf).arg(&*tiles.buf).arg(&w2_table).arg(&mut *ys.buf);
            l.arg(&tile_rows32).arg(&d32).arg(&h32);
            // SAFETY: arguments match `moe_down_*` (and `moe_down_q8x_*`) in cuda/moe.cu; w2_table holds the addresses
            // of the w2[e] [d, h], all in this kernel's format.
            self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        }
        // 3. weighted combine per token in slot order
        self.launch_1d(
            OP,
            Source::Moe,
            "moe_combine",
            &[&*ys.buf, &*weights.buf, &*ids.buf],
            &mut y,
            &[n_d, d32, k32, e32],
            n * d,
        )?;
        Ok(y)
    }
}
