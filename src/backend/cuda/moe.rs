//! Routed experts (`moe_experts`) on the CUDA lane, kernels in cuda/moe.cu:
//! 1. `moe_route` (one block) groups the n·k slots by expert on the device: per-expert offsets
//!    (exclusive prefix of the counts) and the slot numbers in expert order (stable);
//! 2. per expert with slots, a gathered GEMM `x[tokens] · w13[e]ᵀ` with the clamped SwiGLU in its
//!    epilogue (`moe_up_*`), then `· w2[e]ᵀ` (`moe_down_*`) into a per-slot buffer;
//! 3. `moe_combine` sums each token's k slots in slot order (no float atomics: reproducible).
//!
//! First version: the expert weights are separate allocations (`&[CudaWeight]`), so the host
//! launches the two GEMMs per expert itself, after reading the per-expert offsets back once
//! (one synchronisation per call). The arithmetic stays on the device, in the shared GEMM of
//! cuda/common.cuh (tensor cores for bf16/f16 experts on sm_80+). A slot id outside `0..experts`
//! (the CPU lane's error) makes its token's row NaN.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::{CudaBackend, CudaTensor, CudaWeight, GEMM_BM, GEMM_BN, GEMM_THREADS, Source, check_u32};
use crate::backend::checks;
use crate::backend::{DType, WeightFormat};
use crate::error::{Error, Result};

/// Threads of the single `moe_route` block (`MR_THREADS` in cuda/moe.cu).
const ROUTE_THREADS: u32 = 256;
/// Largest grid y dimension.
const GRID_Y: usize = 65535;

fn fmt_kernel(format: WeightFormat, up: bool) -> &'static str {
    match (format, up) {
        (WeightFormat::F32, true) => "moe_up_f32",
        (WeightFormat::BF16, true) => "moe_up_bf16",
        (WeightFormat::F16, true) => "moe_up_f16",
        (WeightFormat::F32, false) => "moe_down_f32",
        (WeightFormat::BF16, false) => "moe_down_bf16",
        (WeightFormat::F16, false) => "moe_down_f16",
    }
}

impl CudaBackend {
    /// x `[n, d]`, ids i32 `[n, k]`, weights `[n, k]`, w13[e] `[2h, d]`, w2[e] `[d, h]` → `[n, d]`.
    pub(super) fn moe_experts(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        w13: &[CudaWeight],
        w2: &[CudaWeight],
        limit: f32,
    ) -> Result<CudaTensor> {
        const OP: &str = "moe_experts";
        let (n, d, k, h) = checks::moe_experts(x, ids, weights, w13, w2)?;
        let experts = w13.len();
        let slots = n * k;
        let (n_d, slots32) = (check_u32(OP, "outputs", n * d)?, check_u32(OP, "slots", slots)?);
        let (d32, h32, k32) = (check_u32(OP, "d", d)?, check_u32(OP, "h", h)?, check_u32(OP, "k", k)?);
        let e32 = check_u32(OP, "experts", experts)?;
        check_u32(OP, "hidden elements", slots * h)?;
        if slots.div_ceil(GEMM_BM as usize) > GRID_Y {
            return Err(Error::Device(format!("op `{OP}`: {slots} slots exceed the grid limit of the expert kernels")));
        }
        let mut y = self.alloc(OP, vec![n, d], DType::F32)?;
        if n == 0 || d == 0 {
            return Ok(y);
        }
        // per-slot expert outputs (row s = token s / k, slot s % k); every valid slot is written
        let mut ys = self.alloc(OP, vec![slots.max(1), d], DType::F32)?;
        if slots > 0 && experts > 0 {
            // 1. group the slots by expert
            let mut offsets = self.alloc(OP, vec![experts + 1], DType::I32)?;
            let mut order = self.alloc(OP, vec![slots], DType::I32)?;
            let mut cursor = self.alloc(OP, vec![experts], DType::I32)?;
            let f = self.func(Source::Moe, "moe_route")?;
            let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (ROUTE_THREADS, 1, 1), shared_mem_bytes: 0 };
            let mut l = self.stream.launch_builder(&f);
            l.arg(&ids.buf).arg(&mut offsets.buf).arg(&mut order.buf).arg(&mut cursor.buf).arg(&slots32).arg(&e32);
            // SAFETY: arguments match `moe_route` in cuda/moe.cu; offsets holds experts + 1,
            // order slots, cursor experts i32.
            unsafe { l.launch(cfg) }.map_err(|e| Self::launch_err(OP, "moe_route", e))?;
            // the per-expert ranges, read back once (this version launches per expert from the host)
            let raw = self.read_back(&offsets, 0, (experts + 1) * 4)?;
            let offs: Vec<i32> = bytemuck::pod_collect_to_vec(&raw);
            // 2. per expert with slots: gathered up GEMM + clamped SwiGLU, then down GEMM
            let mut hid = self.alloc(OP, vec![slots, h.max(1)], DType::F32)?;
            for (e, (a, b)) in w13.iter().zip(w2).enumerate() {
                let (p0, p1) = (offs[e], offs[e + 1]);
                if p1 <= p0 || p0 < 0 || p1 as usize > slots {
                    continue;
                }
                let (p0, cnt) = (p0 as u32, (p1 - p0) as u32);
                let gy = cnt.div_ceil(GEMM_BM);
                let block = (GEMM_THREADS, 1, 1);
                if h > 0 {
                    let kernel = fmt_kernel(a.format, true);
                    let f = self.func(Source::Moe, kernel)?;
                    let cfg = LaunchConfig {
                        // gate and up rows interleaved: 2h GEMM columns (the kernel counts them in u32)
                        grid_dim: (check_u32(OP, "w13 rows", 2 * h)?.div_ceil(GEMM_BN), gy, 1),
                        block_dim: block,
                        shared_mem_bytes: 0,
                    };
                    let mut l = self.stream.launch_builder(&f);
                    l.arg(&x.buf).arg(&order.buf).arg(&a.buf).arg(&mut hid.buf);
                    l.arg(&p0).arg(&cnt).arg(&d32).arg(&h32).arg(&k32).arg(&limit);
                    // SAFETY: arguments match `moe_up_*` in cuda/moe.cu; rows p0..p0+cnt of
                    // order lie in 0..slots, w13[e] is [2h, d].
                    unsafe { l.launch(cfg) }.map_err(|e| Self::launch_err(OP, kernel, e))?;
                }
                let kernel = fmt_kernel(b.format, false);
                let f = self.func(Source::Moe, kernel)?;
                let cfg =
                    LaunchConfig { grid_dim: (d32.div_ceil(GEMM_BN), gy, 1), block_dim: block, shared_mem_bytes: 0 };
                let mut l = self.stream.launch_builder(&f);
                l.arg(&hid.buf).arg(&order.buf).arg(&b.buf).arg(&mut ys.buf);
                l.arg(&p0).arg(&cnt).arg(&d32).arg(&h32);
                // SAFETY: arguments match `moe_down_*` in cuda/moe.cu; w2[e] is [d, h].
                unsafe { l.launch(cfg) }.map_err(|e| Self::launch_err(OP, kernel, e))?;
            }
        }
        // 3. weighted combine per token in slot order
        self.launch_1d(
            OP,
            Source::Moe,
            "moe_combine",
            &[&ys.buf, &weights.buf, &ids.buf],
            &mut y,
            &[n_d, d32, k32, e32],
            n * d,
        )?;
        Ok(y)
    }
}
