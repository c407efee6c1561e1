//! Native CUDA lane: every op of the contract on CUDA C kernels (`cuda/*.cu`), driven through
//! cudarc's driver API — the elementwise, copy and norm ops here, the dense linears in `linear.rs`
//! (linear, linear_pair, the aligner's GEMM), the vision tower's own in `vision.rs` (2-D RoPE,
//! attention, unfold), the language-model ops in `lm_small.rs` (embeddings, hyper-connections,
//! RoPE tail, routing), `lm_attention.rs` (sink attention, indexer, compressor, grouped
//! projection) and `moe.rs` (routed experts); `kernels.rs` holds what is compiled (the files,
//! units and builds, the kernel lists, NVRTC's PTX), `memory.rs` the tensors, weights and buffer
//! pool, `launch.rs` the launches, `timing.rs` the kernel timer, `tests.rs` the lane's unit tests.
//! Checked on an H200; `auto` does not pick it (name `--backend cuda`).
//!
//! - Loading: the CUDA driver (`libcuda.so`) and NVRTC (`libnvrtc.so.13`) are opened at run time
//!   (cudarc `dynamic-loading`), so the binary builds and starts on machines without CUDA. Both
//!   libraries are probed before anything else is called (cudarc panics when one is missing);
//!   a missing one is an `Error::Device` naming it.
//! - Kernels: why NVRTC at run time rather than nvcc at build time? The build machines and CI have
//!   no nvcc; one binary serves every architecture; and the kernels are compiled for the exact
//!   compute capability of the device found (`--gpu-architecture=compute_XY`, PTX that the driver
//!   turns into sm_XY code at module load), not for a guessed list.
//!   Each file is compiled at its first use and the PTX is cached per architecture for the life
//!   of the process (every backend on a device of that architecture reuses it) and on disk for
//!   later processes (`ptx_cache.rs`: keyed by program text, options and NVRTC version); each
//!   backend loads the module into its own context once.
//! - Memory: every tensor and weight is one plain device allocation (`CudaSlice<u8>`); weights
//!   keep their checkpoint format (f32, f16, bf16, or a block format: `crate::formats`) and the
//!   kernels decode them as they load them (cuda/dequant.cuh for the block formats): device bytes
//!   are the weight's bytes.
//!   Allocations are never zero-sized (at least 4 bytes).
//! - Ordering: one stream carries every copy and kernel of a backend, so ops run in issue order
//!   (the context's default stream; with programmatic dependent launch a non-blocking stream of
//!   the backend's own, so nothing orders two such backends: a tensor never passes from one to
//!   another); cudarc's per-allocation event tracking is switched off (it only matters with
//!   several streams). `download` synchronises and reports asynchronous kernel faults.
//! - Guard bands (`Options::guard_words`, diagnostic): every activation gets extra words filled
//!   with `GUARD_SENTINEL`; `check_guards` / `download` report a write past the end.
//! - `gather_rows` bounds-checks every index on the device: one outside `0..m` yields a row of NaN
//!   (the CPU lane returns an error; a GPU lane cannot without a host round trip).
//! - `rope_2d` takes its cos/sin table from the host (f32, the reference's recipe), cached per
//!   (grid, head dim, θ) and counted as weight memory while cached.
//! - `moe_experts` passes its experts to the kernels as a device table of their weights'
//!   addresses, cached per set of addresses and counted as weight memory while cached.

mod linear;
mod lm_small;
mod vision;

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig};

use launch::KernelArgs;

use crate::backend::checks;
use crate::backend::{
    Backend, Capacity, DType, DeviceTensor, HostClock, HostData, HostProfile, HostTensor, HostWeight, KernelTime,
    MemoryReport, Op, Precision, WeightFormat,
};
use crate::error::{Error, Result};

mod blas;
mod kernels;
mod launch;
mod lm_attention;
mod memory;
mod moe;
mod ptx_cache;
mod timing;

pub use kernels::{
    EMBED_ROWS_KERNELS, GROUPED_LINEAR_KERNELS, KERNELS, LINEAR_KERNELS, LINEAR_PAIR_KERNELS, LINEAR_Q8X_MIN_COLS,
    MOE_DOWN_KERNELS, MOE_GATE_KERNELS, MOE_UP_KERNELS, Source, UNFOLD_LINEAR_GELU_KERNELS, Unit, WEIGHT_F16_KERNELS,
    WEIGHT_KERNELS, WeightKernels, linear_q8x_kernel, moe_q8x_kernels, q8x_format,
};
pub use memory::{CudaTensor, CudaWeight};

use kernels::{Build, Q8X_BLOCK_COLS, Q8X_THREADS, forget_ptx, ptx_for, q8x_shared_bytes};
use memory::{BufferPool, Counters, Role};

const LANE: &str = "cuda";
/// Bit pattern written into guard bands (a quiet NaN with a recognisable payload).
pub const GUARD_SENTINEL: u32 = 0x7FC0_DEAD;
/// Threads per block of the 1-D (grid-stride) kernels.
const THREADS: u32 = 256;
/// Threads per block of a kernel whose block reduces one row of `cols` elements (`rms_norm_f32`,
/// `rms_norm_heads_f32`): 1024 for rows of 4096 and more, so that a decode step's single long row
/// (the 4·4096-wide hyper-connection norm, one block) keeps four times the loads in flight; the
/// one-block norms of a q2 decode step took 6-10 µs each at 256 (Nsight, H200).
fn row_threads(cols: usize) -> u32 {
    if cols >= 4096 { 1024 } else { THREADS }
}
/// Cap on the blocks of a 1-D launch (the kernels grid-stride over the rest).
const MAX_BLOCKS: usize = 1 << 20;

/// One block of `row_threads(cols)` per row, rows grid-strided past `MAX_BLOCKS`: the launch of
/// the kernels whose block reduces one row (the RMS norms and the ops fused with them).
fn cfg_rows(rows: usize, cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows.min(MAX_BLOCKS) as u32, 1, 1),
        block_dim: (row_threads(cols), 1, 1),
        shared_mem_bytes: 0,
    }
}
/// Largest grid y (and z) dimension.
const GRID_Y: usize = 65535;
/// Threads per block of `attention_f32` (`ATT_THREADS` in cuda/attention.cu).
const ATTENTION_THREADS: u32 = 128;
/// Queries per block of `attention_f32` (`ATT_ROWS`).
const ATTENTION_ROWS: usize = 32;
/// Keys per shared-memory chunk of `attention_f32` (`ATT_KEYS`).
const ATTENTION_KEYS: usize = 32;
/// Threads per block of `attention_fast_d*` (32 · `FA_WARPS` in cuda/attention.cu).
const FAST_ATTENTION_THREADS: u32 = 128;
/// Queries per block of `attention_fast_d*` (16 · `FA_WARPS`).
const FAST_ATTENTION_ROWS: usize = 64;
/// Keys per shared-memory chunk of `attention_fast_d*` (`FA_KEYS`); `attention_kv_f16` pads the
/// keys to a multiple of it.
const FAST_ATTENTION_KEYS: usize = 64;
/// Threads a block of `attention_qkv_rope_f16` (`QKV_THREADS` in cuda/attention.cu).
const QKV_ROPE_THREADS: u32 = 256;
/// `attention_fast_d*`'s instantiations: the padded head widths, each with its kernel.
const FAST_ATTENTION_WIDTHS: [(usize, &str); 4] =
    [(16, "attention_fast_d16"), (32, "attention_fast_d32"), (64, "attention_fast_d64"), (128, "attention_fast_d128")];
/// Free device memory a kept f16 copy of a weight must leave (`kept_weight_f16`): a prefill
/// chunk's activations (1.06 GiB at the peak of the whole q2 model's 2048-token chunks on an H200)
/// several times over; below it the copy is made for each call instead.
const KEEP_F16_HEADROOM: u64 = 4 << 30;
/// Block tile of the shared GEMM (`GEMM_BM` rows x `GEMM_BN` columns in cuda/common.cuh) behind
/// `linear`, `grouped_linear` and `moe_experts`, and its threads per block (`GEMM_THREADS`, 1-D).
/// Its shared memory is static (at most 25 KiB, the tensor-core path with f16 weights).
const GEMM_BM: u32 = 64;
const GEMM_BN: u32 = 64;
const GEMM_THREADS: u32 = 128;
/// At most this many rows (`GEMV_ROWS`), `gemm_block` takes the small-row path: a block per
/// pair of output columns (its threads split k) and one row block.
const GEMV_ROWS: usize = 8;
/// More rows than this, fast precision's `linear` and `grouped_linear` take cuBLASLt where it is
/// loaded (blas.rs). Measured at a ViT layer's 3 108 rows and a prefill chunk's 2 048 only. The
/// path costs about 4 bytes of traffic a weight element more than the tile (its f16 copy written,
/// then read), ≈ 1.3 ps an element at 3 TB/s, where the tile's f16 MMAs at the ≈ 80 TFLOP/s
/// measured take 2·n / 80e12 s: ≈ 1.6 ps an element at 64 rows, break-even by that estimate.
const BLAS_MIN_ROWS: usize = 64;

/// Tokens a prefill forward takes by default on this lane (`Backend::prefill_chunk`). A chunk's
/// 256 experts see chunk × 6 / 256 rows each, cut into row tiles of 64 (`GEMM_BM`): 12 rows at
/// 512 tokens, so most of each tile's MMA rows were zeros. Measured on an H200 (q2 mix, 43
/// layers, a 4096-token prefill, one call, 2026-12-02): chunks of 512 / 1024 / 2048 / 4096 tokens
/// 1 417–1 420 / 1 587 / 1 684 / 1 725 tokens/s, activations peak 0.33 / 0.60 / 1.14 / 2.15 GiB.
const CUDA_PREFILL_CHUNK: usize = 2048;

/// A small-row `linear` with fewer column pairs than this (a block for every other SM of an
/// H200) splits k (cuda/linear.cu) into about `GEMV_SPLIT_GRID` blocks. Measured on an H200
/// (Nsight, a q2 decode step): a hyper-connection mix (12 pairs of 16384) 10.8 µs whole, 4.3 µs
/// in 16 ranges + 2.8 µs for their sum; 128 pairs of 4096 5.3 µs whole, 4.8 + 2.5 µs in 4.
const GEMV_SPLIT_BELOW: usize = 64;
const GEMV_SPLIT_GRID: usize = 528;
/// A split's k range is a multiple of this: every thread of a block gets whole 8-runs (and a
/// block format's runs lie in its blocks: k is a whole number of them).
const GEMV_SPLIT_K: usize = 1024;

/// A tile-path `linear` of fewer blocks than this (one a SM of an H200) splits k into about
/// `TILE_SPLIT_GRID` blocks, in ranges of whole `GEMV_SPLIT_K`. Measured on an H200 (Nsight, a
/// q2 prefill chunk of 512 tokens): each hyper-connection mix (24 columns of 16384: 8 blocks)
/// took 1.55 ms whole, a sixth of the layer's chunk.
const TILE_SPLIT_BELOW: usize = 132;
const TILE_SPLIT_GRID: usize = 264;

/// (k splits, k per split) for a grid of `blocks` over rows of `k`: about `grid` blocks when
/// there are fewer than `below`, never ranges shorter than `GEMV_SPLIT_K`.
fn k_splits(blocks: usize, k: usize, below: usize, grid: usize) -> (usize, usize) {
    let want = if blocks >= below { 1 } else { grid.div_ceil(blocks).min(k / GEMV_SPLIT_K).max(1) };
    let chunk = k.div_ceil(want).div_ceil(GEMV_SPLIT_K) * GEMV_SPLIT_K;
    (k.div_ceil(chunk.max(1)).max(1), chunk)
}

/// (k splits, k per split) for a small-row `linear` of `pairs` column pairs over rows of `k`.
fn gemv_splits(pairs: usize, k: usize) -> (usize, usize) {
    k_splits(pairs, k, GEMV_SPLIT_BELOW, GEMV_SPLIT_GRID)
}

/// `gemm_block`'s grid for `cols` output columns when no block sees more than `bound_rows` rows
/// (cuda/common.cuh): (column blocks, row tiles).
fn gemm_grid(bound_rows: usize, cols: usize) -> (usize, usize) {
    if bound_rows <= GEMV_ROWS {
        (cols.div_ceil(2), 1)
    } else {
        (cols.div_ceil(GEMM_BN as usize), bound_rows.div_ceil(GEMM_BM as usize))
    }
}
/// Dynamic shared memory a block may use without opting in.
const DEFAULT_SHARED_BYTES: usize = 48 * 1024;

/// Run `f`, turning a panic inside cudarc (a missing library symbol, say) into `Error::Device`.
fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|p| {
        let msg = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic without a message".into());
        Err(Error::Device(format!("{what}: caught a panic inside cudarc: {msg}")))
    })
}

/// Check that the CUDA driver and NVRTC libraries can be opened (cudarc panics on first use of a
/// missing one, so this runs before any other CUDA call).
fn check_libraries() -> Result<()> {
    // SAFETY: only tries to dlopen the library under its usual names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(Error::Device(
            "no CUDA driver (libcuda.so) found: the cuda lane needs an NVIDIA GPU with its driver installed".into(),
        ));
    }
    // SAFETY: as above.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(Error::Device(
            "NVRTC (libnvrtc.so.13) not found: the CUDA lane compiles its kernels at run time; install the CUDA 13 \
             NVRTC package (cuda-nvrtc-13-0) or add its lib directory to LD_LIBRARY_PATH"
                .into(),
        ));
    }
    Ok(())
}

fn nvrtc_version() -> Option<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: writes two ints; the library was found by `check_libraries`.
    let r = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (r == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

fn driver_version() -> Option<i32> {
    let mut v = 0;
    // SAFETY: writes one int; the library was found by `check_libraries`.
    let r = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut v) };
    (r == cudarc::driver::sys::CUresult::CUDA_SUCCESS).then_some(v)
}

fn dev_err(what: impl std::fmt::Display, e: impl std::fmt::Debug) -> Error {
    Error::Device(format!("{what}: {e:?}"))
}

/// Open device `ordinal` (libraries probed first).
fn open_context(ordinal: usize) -> Result<Arc<CudaContext>> {
    check_libraries()?;
    no_panic("CUDA driver", || {
        let count = CudaContext::device_count().map_err(|e| dev_err("CUDA driver: cuDeviceGetCount", e))?;
        if count <= 0 {
            return Err(Error::Device("the CUDA driver found no device".into()));
        }
        if ordinal >= count as usize {
            return Err(Error::Device(format!("no CUDA device {ordinal}: the driver found {count}")));
        }
        CudaContext::new(ordinal).map_err(|e| dev_err(format!("CUDA device {ordinal}: creating its context"), e))
    })
}

fn describe(ctx: &CudaContext) -> Result<(String, u32)> {
    let name = ctx.name().map_err(|e| dev_err("CUDA device name", e))?;
    let (major, minor) = ctx.compute_capability().map_err(|e| dev_err("CUDA compute capability", e))?;
    let mem = ctx.total_mem().map_err(|e| dev_err("CUDA device memory", e))?;
    let driver = driver_version().map_or("?".into(), |v| format!("{}.{}", v / 1000, v % 1000 / 10));
    let nvrtc = nvrtc_version().map_or("?".into(), |(a, b)| format!("{a}.{b}"));
    let arch = (major * 10 + minor) as u32;
    Ok((
        format!("{name} (sm_{arch}, {:.1} GiB, CUDA driver {driver}, NVRTC {nvrtc})", mem as f64 / (1u64 << 30) as f64),
        arch,
    ))
}

/// The first CUDA device's description ("NVIDIA H200 (sm_90, …)"), or why the lane cannot run
/// here (no driver, no NVRTC, no device). Never panics.
pub fn probe() -> Result<String> {
    let ctx = open_context(0)?;
    no_panic("CUDA driver", || describe(&ctx).map(|(d, _)| d))
}

/// Construction options. `Default` is what the CLI uses.
#[derive(Clone, Debug)]
pub struct Options {
    /// CUDA device ordinal.
    pub ordinal: usize,
    /// Guard words appended to every activation output (0 = off). Diagnostic.
    pub guard_words: u32,
    /// How the GEMM tiles round their operands ([`Precision`]; `Exact` by default here, the CLI
    /// picks `Fast` for this lane unless asked otherwise).
    pub precision: Precision,
    /// Time every launch on the device (`Backend::kernel_times`). Diagnostic; by default on with
    /// `FOVEA_GPU_TIMES=1` or `=grid`.
    pub kernel_times: bool,
    /// With `kernel_times`, sum the times by kernel and grid (`"linear_q8_0 2048x1x1"`). By
    /// default on with `FOVEA_GPU_TIMES=grid`.
    pub kernel_times_by_grid: bool,
    /// Launch each kernel with programmatic dependent launch where the device has it (sm_90+;
    /// see src/backend/cuda/launch.rs). On by default (a decode step 12 % faster on an H100,
    /// twenty-fourth sitting); `FOVEA_PDL=0` turns it off (a diagnostic).
    pub dependent_launch: bool,
    /// Two linears of one input (`Backend::linear_pair`) in two launches even where one takes both
    /// (`linear_pair_*`; the same bits). Diagnostic: `FOVEA_LINEAR_PAIR=separate`.
    pub separate_linear_pair: bool,
    /// In fast precision, one token's experts and widest linears in a [`q8x_format`] take int8
    /// activations (`*_q8x_*`). On by default; off when `FOVEA_CUDA_Q8X=0`, to time both in one
    /// build (the mxfp4 mix: a decoded layer 0.40 → 0.34 ms on an H100, twenty-fourth sitting).
    /// Diagnostic.
    pub q8x: bool,
    /// In fast precision, `linear` and `grouped_linear` over more than [`BLAS_MIN_ROWS`] rows run
    /// on cuBLASLt where `libcublasLt.so.13` is found (blas.rs; a backend in exact precision never
    /// opens it). On by default; off when `FOVEA_CUDA_BLAS=0`, to time the lane's own tiles against
    /// it in one build. Diagnostic.
    pub blas: bool,
    /// In fast precision, a prefill chunk's `sink_attention` runs on tensor cores
    /// (`sink_attention_fast_d*`, cuda/lm_attention.cu). On by default; off when
    /// `FOVEA_CUDA_SINK_TC=0`, to time the f32 kernel against it in one build. Diagnostic.
    pub sink_tensor_cores: bool,
    /// A decode step's `hc_mix_split_pre_norm` in three launches (partial sums, split, norm) even
    /// where two take it (`hc_mix_split_pre_norm_f32`; the same bits). Diagnostic:
    /// `FOVEA_CUDA_HC_SPLIT_NORM=separate`.
    pub separate_hc_split_norm: bool,
    /// A decode step's `hc_post_mix_split_pre_norm` as `hc_post` then `hc_mix_split_pre_norm`
    /// even where the post rides in the partial sums' launch (`hc_post_mix_partials_f32`; the
    /// same bits). Diagnostic: `FOVEA_CUDA_HC_POST=separate`. (`separate_hc_split_norm` takes the
    /// composition too.)
    pub separate_hc_post: bool,
    /// `linear_add` of one row without a bias as `linear` then `add` even where the residual
    /// rides in as the linear's bias (the same bits). Diagnostic: `FOVEA_CUDA_LINEAR_ADD=separate`.
    pub separate_linear_add: bool,
    /// `rms_norm_linear` of one row on int8 activations as `rms_norm` then `linear` even where
    /// the norm rides in the linear's launch (the same bits). Diagnostic:
    /// `FOVEA_CUDA_NORM_LINEAR=separate`.
    pub separate_rms_norm_linear: bool,
}

impl Default for Options {
    fn default() -> Self {
        let times = std::env::var("FOVEA_GPU_TIMES").unwrap_or_default();
        Options {
            ordinal: 0,
            guard_words: 0,
            precision: Precision::default(),
            kernel_times: times == "1" || times == "grid",
            kernel_times_by_grid: times == "grid",
            dependent_launch: std::env::var("FOVEA_PDL").map_or(true, |v| v != "0"),
            separate_linear_pair: std::env::var("FOVEA_LINEAR_PAIR").is_ok_and(|v| v == "separate"),
            q8x: std::env::var("FOVEA_CUDA_Q8X").map_or(true, |v| v != "0"),
            blas: std::env::var("FOVEA_CUDA_BLAS").map_or(true, |v| v != "0"),
            sink_tensor_cores: std::env::var("FOVEA_CUDA_SINK_TC").map_or(true, |v| v != "0"),
            separate_hc_split_norm: std::env::var("FOVEA_CUDA_HC_SPLIT_NORM").is_ok_and(|v| v == "separate"),
            separate_hc_post: std::env::var("FOVEA_CUDA_HC_POST").is_ok_and(|v| v == "separate"),
            separate_linear_add: std::env::var("FOVEA_CUDA_LINEAR_ADD").is_ok_and(|v| v == "separate"),
            separate_rms_norm_linear: std::env::var("FOVEA_CUDA_NORM_LINEAR").is_ok_and(|v| v == "separate"),
        }
    }
}

/// The CUDA lane.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    description: String,
    /// Compute capability as `major·10 + minor` (the NVRTC target `sm_{arch}`).
    arch: u32,
    opts: Options,
    counters: Arc<Counters>,
    pool: Arc<BufferPool>,
    modules: Mutex<HashMap<(Source, Build, Unit), Arc<CudaModule>>>,
    functions: Mutex<HashMap<(&'static str, Build), CudaFunction>>,
    /// Dynamic shared memory each kernel was opted in to beyond `DEFAULT_SHARED_BYTES` (by
    /// `func_shared`), so a launch on the hot path does not ask the driver again.
    shared_optin: Mutex<HashMap<&'static str, usize>>,
    /// Bound in place of an absent bias (never read).
    dummy: CudaSlice<u8>,
    /// cos/sin tables of rope_2d keyed by (n, grid_w, hd, theta bits).
    rope_tables: Mutex<HashMap<(usize, usize, usize, u32), Arc<CudaTensor>>>,
    /// Device tables of expert weight addresses for `moe_experts`, keyed by those addresses.
    expert_tables: Mutex<HashMap<Vec<u64>, Arc<CudaTensor>>>,
    /// `Backend::kernel_times` (`FOVEA_GPU_TIMES=1`).
    timer: timing::KernelTimer,
    /// Launches carry the programmatic-stream-serialization attribute ([`Options::dependent_launch`]
    /// on an sm_90+ device).
    pdl: bool,
    /// cuBLASLt for fast precision's dense GEMMs ([`Options::blas`], an sm_80+ device, the
    /// library found).
    blas: Option<blas::Blas>,
}

fn check_u32(op: &'static str, what: &str, v: usize) -> Result<u32> {
    u32::try_from(v).map_err(|_| {
        Error::Device(format!("op `{op}`: {what} = {v} exceeds the 32-bit sizes of the cuda lane's kernels"))
    })
}

/// Row stride in floats of the flash-attention kernels' shared tiles (`fa_stride` in
/// cuda/common.cuh): `hd` rounded up to 4, plus 4 when that is a multiple of 8.
fn flash_stride(hd: usize) -> usize {
    let s = hd.next_multiple_of(4);
    if s % 8 == 0 { s + 4 } else { s }
}

/// A 1-D grid-stride launch over `total` items.
fn cfg_1d(total: usize) -> LaunchConfig {
    let blocks = total.div_ceil(THREADS as usize).clamp(1, MAX_BLOCKS);
    LaunchConfig { grid_dim: (blocks as u32, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

impl CudaBackend {
    /// Open CUDA device `ordinal` (0 = the first). Probes the driver and NVRTC first; never
    /// panics when they are missing.
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_options(Options { ordinal, ..Options::default() })
    }

    pub fn with_options(opts: Options) -> Result<Self> {
        let ctx = open_context(opts.ordinal)?;
        no_panic("CUDA driver", || {
            let (description, arch) = describe(&ctx)?;
            // SAFETY: this lane issues all work on one stream, so no cross-stream synchronisation
            // (what the per-allocation events are for) is ever needed.
            unsafe { ctx.disable_event_tracking() };
            // programmatic dependent launch wants a stream of its own (not the legacy default
            // stream, which synchronises with every other)
            let pdl = opts.dependent_launch && arch >= 90;
            let stream = match pdl {
                true => ctx.new_stream().map_err(|e| dev_err("CUDA stream creation", e))?,
                false => ctx.default_stream(),
            };
            let dummy = stream.alloc_zeros::<u8>(16).map_err(|e| dev_err("CUDA allocation", e))?;
            // fast precision only (exact keeps the tiles' f32-accurate split); the f16 operands
            // need sm_80's conversions (f16x2_rn)
            let fast = opts.precision == Precision::Fast;
            let lib = if fast && opts.blas && arch >= 80 { blas::probe() } else { None };
            let named = |what: String| description.strip_suffix(')').map(|d| format!("{d}, {what})"));
            let (blas, description) = match lib {
                Some((version, true)) => {
                    (Some(blas::Blas::new(&stream)?), named(format!("cuBLASLt {version}")).unwrap_or(description))
                }
                Some((version, false)) => {
                    (None, named(format!("cuBLASLt {version} not used: not CUDA 13's")).unwrap_or(description))
                }
                None => (None, description),
            };
            Ok(CudaBackend {
                ctx: ctx.clone(),
                stream,
                description,
                arch,
                timer: timing::KernelTimer::new(opts.kernel_times, opts.kernel_times_by_grid),
                opts,
                counters: Arc::new(Counters { clock: HostClock::from_env(), ..Counters::default() }),
                pool: Arc::default(),
                modules: Mutex::default(),
                functions: Mutex::default(),
                shared_optin: Mutex::default(),
                dummy,
                rope_tables: Mutex::default(),
                expert_tables: Mutex::default(),
                pdl,
                blas,
            })
        })
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Compute capability as `major·10 + minor` (90 on an H100/H200).
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// Whether fast precision's dense GEMMs over many rows run on cuBLASLt ([`Options::blas`], an
    /// sm_80+ device, `libcublasLt` found).
    pub fn blas(&self) -> bool {
        self.blas.is_some()
    }

    /// Whether launches carry programmatic dependent launch ([`Options::dependent_launch`] on an
    /// sm_90+ device).
    pub fn dependent_launch(&self) -> bool {
        self.pdl
    }

    /// Wait for all issued work; reports asynchronous faults (illegal address, ...).
    pub fn sync(&self) -> Result<()> {
        self.counters.clock.wait(|| self.stream.synchronize()).map_err(|e| dev_err("CUDA stream synchronize", e))?;
        self.ctx.check_err().map_err(|e| dev_err("CUDA (recorded in a destructor)", e))
    }

    /// Compile (at the first use in this process, for this architecture) and load `name`.
    fn func(&self, src: Source, name: &'static str) -> Result<CudaFunction> {
        self.func_in(src, name, Build::Tiles(Precision::Exact))
    }

    /// The precision a weight's GEMMs take: the lane's, or exact for a weight from
    /// `upload_weight_exact`.
    fn weight_precision(&self, exact_weight: bool) -> Precision {
        if exact_weight { Precision::Exact } else { self.opts.precision }
    }

    /// A `gemm_block` kernel (linear, grouped projection, experts) for operands of at most
    /// `bound_rows` rows: its build is `Build::gemm`'s.
    fn gemm_func(
        &self,
        src: Source,
        name: &'static str,
        exact_weight: bool,
        bound_rows: usize,
    ) -> Result<CudaFunction> {
        self.func_in(src, name, Build::gemm(bound_rows, self.weight_precision(exact_weight)))
    }

    fn func_in(&self, src: Source, name: &'static str, build: Build) -> Result<CudaFunction> {
        if let Some(f) = self.functions.lock().unwrap_or_else(|e| e.into_inner()).get(&(name, build)) {
            return Ok(f.clone());
        }
        let unit = Unit::of(name);
        let module = {
            let mut modules = self.modules.lock().unwrap_or_else(|e| e.into_inner());
            match modules.get(&(src, build, unit)) {
                Some(m) => m.clone(),
                None => {
                    let (ptx, file) = ptx_for(self.arch, src, build, unit)?;
                    // PTX from the disk cache that the driver refuses: compiled again, once
                    let loaded = match (self.ctx.load_module(ptx), file) {
                        (Err(_), Some(file)) => {
                            forget_ptx(self.arch, src, build, unit, &file);
                            self.ctx.load_module(ptx_for(self.arch, src, build, unit)?.0)
                        }
                        (loaded, _) => loaded,
                    };
                    let m = loaded.map_err(|e| {
                        let what = match unit {
                            Unit::Base => String::new(),
                            Unit::Block(f) => format!(", {f} kernels"),
                        };
                        dev_err(format!("loading cuda/{} ({build}{what}) for sm_{}", src.file(), self.arch), e)
                    })?;
                    modules.insert((src, build, unit), m.clone());
                    m
                }
            }
        };
        let f =
            module.load_function(name).map_err(|e| dev_err(format!("kernel `{name}` of cuda/{}", src.file()), e))?;
        self.functions.lock().unwrap_or_else(|e| e.into_inner()).insert((name, build), f.clone());
        Ok(f)
    }

    /// Copy a weight to the device in its storage format; `exact` keeps its products f32 in fast
    /// mode (see `Backend::upload_weight_exact`).
    fn upload_weight_as(&self, w: &HostWeight<'_>, exact: bool) -> Result<CudaWeight> {
        w.validate()?;
        check_u32("upload_weight", &format!("rows of `{}`", w.name), w.rows)?;
        check_u32("upload_weight", &format!("cols of `{}`", w.name), w.cols)?;
        // validated: the bytes are exactly the rows as stored, which the lane keeps
        let counted = Self::weight_alloc_bytes(w.format, w.rows, w.cols);
        let mut buf = self.raw_alloc("upload_weight", counted as usize)?;
        if !w.bytes.is_empty() {
            self.stream
                .memcpy_htod(&w.bytes[..], &mut buf.slice_mut(0..w.bytes.len()))
                .map_err(|e| dev_err(format!("uploading weight `{}`", w.name), e))?;
        }
        self.counters.weight.fetch_add(counted, Ordering::Relaxed);
        self.counters.matrix.fetch_add(counted, Ordering::Relaxed);
        Ok(CudaWeight {
            name: w.name.clone(),
            format: w.format,
            rows: w.rows,
            cols: w.cols,
            buf,
            counted,
            counters: self.counters.clone(),
            exact,
            f16: OnceLock::new(),
        })
    }

    /// `func`, allowed `bytes` of dynamic shared memory: above the 48 KiB default the kernel opts
    /// in, up to the device's per-block limit (less the kernel's static shared memory); beyond
    /// that `op` is unsupported at this size (`what` says which size).
    fn func_shared(&self, op: Op, src: Source, name: &'static str, bytes: usize, what: &str) -> Result<CudaFunction> {
        use cudarc::driver::sys::CUfunction_attribute_enum;
        let f = self.func(src, name)?;
        let mut optin = self.shared_optin.lock().unwrap_or_else(|e| e.into_inner());
        if bytes <= DEFAULT_SHARED_BYTES || optin.get(name).is_some_and(|&granted| bytes <= granted) {
            return Ok(f);
        }
        let err = |e| dev_err(format!("shared memory limits of kernel `{name}`"), e);
        let available = self.shared_available(name, &f)?;
        if bytes > available {
            return Err(Self::unsupported(
                op,
                format!("{what} (needs {bytes} bytes of shared memory per block, the device allows {available})"),
            ));
        }
        f.set_attribute(CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)
            .map_err(err)?;
        optin.insert(name, bytes);
        Ok(f)
    }

    /// The dynamic shared memory a block of kernel `f` may opt in to on this device: the
    /// per-block opt-in limit less the kernel's static shared memory (227 KiB on an H100, 163 on
    /// an A100, 99 on sm_86/89).
    fn shared_available(&self, name: &str, f: &CudaFunction) -> Result<usize> {
        use cudarc::driver::sys::CUdevice_attribute_enum;
        let err = |e| dev_err(format!("shared memory limits of kernel `{name}`"), e);
        let limit = self
            .ctx
            .attribute(CUdevice_attribute_enum::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(err)?;
        let statics = f.shared_size_bytes().map_err(err)?;
        Ok((limit.max(0) as usize).saturating_sub(statics.max(0) as usize))
    }

    // ---- allocation ----------------------------------------------------------------------------

    fn raw_alloc(&self, op: &'static str, bytes: usize) -> Result<CudaSlice<u8>> {
        let len = bytes.max(4);
        if let Some(buf) = self.pool.take(len) {
            return Ok(buf);
        }
        // SAFETY: the contents are written (upload, kernel, copy) before anything reads them.
        let alloc = || self.counters.clock.allocation(|| unsafe { self.stream.alloc::<u8>(len) });
        // a device that is full may be full of kept buffers: give them back and ask once more
        alloc()
            .or_else(|_| {
                self.pool.drain();
                alloc()
            })
            .map_err(|e| dev_err(format!("op `{op}`: allocating {bytes} bytes of device memory"), e))
    }

    fn new_tensor(
        &self,
        op: &'static str,
        shape: Vec<usize>,
        dtype: DType,
        role: Role,
        contents: Option<&[u8]>,
    ) -> Result<CudaTensor> {
        if shape.is_empty() {
            return Err(Error::shape(op, "a tensor needs at least one dimension"));
        }
        let numel: usize = shape.iter().product();
        check_u32(op, "elements", numel)?;
        let bytes = numel * 4;
        let guard_words = if role == Role::Activation { self.opts.guard_words } else { 0 };
        let guard = guard_words as usize * 4;
        let mut buf = self.raw_alloc(op, bytes + guard)?;
        if let Some(data) = contents {
            if !data.is_empty() {
                self.counters
                    .clock
                    .copy(|| self.stream.memcpy_htod(data, &mut buf.slice_mut(0..data.len())))
                    .map_err(|e| dev_err(format!("op `{op}`: host-to-device copy"), e))?;
            }
        }
        if guard > 0 {
            let words: Vec<u8> = GUARD_SENTINEL.to_le_bytes().repeat(guard_words as usize);
            self.stream
                .memcpy_htod(&words[..], &mut buf.slice_mut(bytes..bytes + guard))
                .map_err(|e| dev_err(format!("op `{op}`: writing the guard band"), e))?;
        }
        let counted = buf.len() as u64;
        match role {
            Role::Activation => self.counters.add_activation(counted),
            Role::Weight => {
                self.counters.weight.fetch_add(counted, Ordering::Relaxed);
            }
        }
        Ok(CudaTensor {
            buf: ManuallyDrop::new(buf),
            pool: self.pool.clone(),
            bytes,
            guard_words,
            counted,
            role,
            shape,
            dtype,
            producer: op,
            counters: self.counters.clone(),
        })
    }

    /// A new activation output of `shape` (contents undefined; guard band filled when on).
    fn alloc(&self, op: &'static str, shape: Vec<usize>, dtype: DType) -> Result<CudaTensor> {
        self.new_tensor(op, shape, dtype, Role::Activation, None)
    }

    /// A launch's result: counted (`Backend::launches`) and, if it failed, named by op and kernel.
    fn launched<T>(
        &self,
        op: &'static str,
        kernel: &str,
        cfg: LaunchConfig,
        launch: impl FnOnce(LaunchConfig) -> std::result::Result<T, cudarc::driver::DriverError>,
    ) -> Result<()> {
        self.counters.launches.fetch_add(1, Ordering::Relaxed);
        let r = self.counters.clock.launch(|| self.timer.time(&self.ctx, &self.stream, kernel, cfg, launch));
        r.map(|_| ()).map_err(|e| Self::launch_err(op, kernel, e))
    }

    /// `rms_norm_f32` or `rms_norm_f16` (cuda/norm.cu) of x `[n, d]` by weight `[d]` into `out`,
    /// a block a row: `out` holds n·d f32, or n·d/2 words of f16 pairs (d a multiple of 4, x and
    /// weight on 16 bytes).
    #[allow(clippy::too_many_arguments)]
    fn launch_rms_norm(
        &self,
        op: &'static str,
        kernel: &'static str,
        x: &CudaTensor,
        weight: &CudaTensor,
        out: &mut CudaTensor,
        (n, d): (usize, usize),
        eps: f32,
    ) -> Result<()> {
        let f = self.func(Source::Norm, kernel)?;
        let (n32, d32) = (check_u32(op, "rows", n)?, check_u32(op, "row width", d)?);
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&*weight.buf).arg(&mut *out.buf).arg(&n32).arg(&d32).arg(&eps);
        // SAFETY: arguments match `rms_norm_f32` / `rms_norm_f16` in cuda/norm.cu; the callers
        // checked x and weight and allocate out as the kernel writes it (above).
        self.launched(op, kernel, cfg_rows(n, d), |cfg| unsafe { l.launch(cfg, self.pdl) })
    }

    fn launch_err(op: &'static str, kernel: &str, e: impl std::fmt::Debug) -> Error {
        Error::Device(format!("op `{op}`: launching kernel `{kernel}`: {e:?}"))
    }

    fn read_back(&self, t: &CudaTensor, from: usize, len: usize) -> Result<Vec<u8>> {
        if len == 0 {
            return self.sync().map(|_| Vec::new());
        }
        // the copy waits for the work before it (pageable memory): the host's wait
        let out = self
            .counters
            .clock
            .wait(|| self.stream.clone_dtoh(&t.buf.slice(from..from + len)))
            .map_err(|e| dev_err(format!("device-to-host copy of {t:?}"), e))?;
        self.stream.synchronize().map_err(|e| dev_err("CUDA stream synchronize", e))?;
        self.ctx.check_err().map_err(|e| dev_err("CUDA (recorded in a destructor)", e))?;
        Ok(out)
    }

    /// Check that nothing wrote past the end of `t` (its guard band still holds the sentinel).
    /// Ok when guards are off or `t` has none.
    pub fn check_guards(&self, t: &CudaTensor) -> Result<()> {
        if t.guard_words == 0 {
            return Ok(());
        }
        let raw = self.read_back(t, t.bytes, t.guard_words as usize * 4)?;
        let words: Vec<u32> = bytemuck::pod_collect_to_vec(&raw);
        let bad: Vec<usize> = words.iter().enumerate().filter(|(_, w)| **w != GUARD_SENTINEL).map(|(i, _)| i).collect();
        if bad.is_empty() {
            return Ok(());
        }
        Err(Error::Device(format!(
            "op `{}` wrote past the end of its {:?} output: guard words {:?} of {} overwritten (first value {:#010x})",
            t.producer,
            t.shape,
            bad,
            words.len(),
            words[bad[0]]
        )))
    }

    /// Test hook: a kernel writes `value` at element `index` of `t`'s allocation, guard band
    /// included (`index >= numel` simulates an out-of-bounds write).
    #[doc(hidden)]
    pub fn debug_poke(&self, t: &CudaTensor, index: u32, value: u32) -> Result<()> {
        if index as usize * 4 + 4 > t.buf.len() {
            return Err(Error::Invalid(format!("debug_poke: index {index} is outside the allocation of {t:?}")));
        }
        let f = self.func(Source::Debug, "debug_poke_u32")?;
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*t.buf).arg(&index).arg(&value);
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: arguments match `debug_poke_u32` in cuda/debug.cu; the index is inside the buffer.
        self.launched("debug_poke", "debug_poke_u32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(())
    }

    fn unsupported(op: Op, what: impl Into<String>) -> Error {
        Error::Unsupported { lane: LANE, op: op.name(), what: what.into() }
    }

    /// One 1-D elementwise launch of `kernel(x, [y,] out, sizes...)`, skipped when `total` is 0.
    fn launch_1d(
        &self,
        op: &'static str,
        src: Source,
        kernel: &'static str,
        inputs: &[&CudaSlice<u8>],
        out: &mut CudaTensor,
        sizes: &[u32],
        total: usize,
    ) -> Result<()> {
        if total == 0 {
            return Ok(());
        }
        let f = self.func(src, kernel)?;
        let mut l = KernelArgs::new(&self.stream, &f);
        for &i in inputs {
            l.arg(i);
        }
        l.arg(&mut *out.buf);
        for s in sizes {
            l.arg(s);
        }
        // SAFETY: the argument list matches the kernel's signature in `src` (buffers, then
        // `unsigned int` sizes), and the host checked every size against the buffers.
        self.launched(op, kernel, cfg_1d(total), |cfg| unsafe { l.launch(cfg, self.pdl) })?;
        Ok(())
    }
}

impl Backend for CudaBackend {
    type Tensor = CudaTensor;
    type Weight = CudaWeight;

    fn lane(&self) -> &'static str {
        LANE
    }

    fn device_name(&self) -> String {
        self.description.clone()
    }

    /// Every op of the contract, language-model ops included, for every weight format (the block
    /// formats decoded in the kernels by cuda/dequant.cuh).
    fn supports(&self, _op: Op, _format: WeightFormat) -> bool {
        true
    }

    fn memory(&self) -> MemoryReport {
        let c = &self.counters;
        MemoryReport {
            weight_bytes: c.weight.load(Ordering::Relaxed),
            matrix_bytes: c.matrix.load(Ordering::Relaxed),
            activation_bytes: c.activation.load(Ordering::Relaxed),
            peak_activation_bytes: c.peak.load(Ordering::Relaxed),
        }
    }

    fn launches(&self) -> Option<u64> {
        Some(self.counters.launches.load(Ordering::Relaxed))
    }

    fn host_profile(&self) -> Option<HostProfile> {
        self.counters.clock.profile()
    }

    fn kernel_times(&self) -> Result<Option<Vec<KernelTime>>> {
        self.timer.read(&self.stream).map_err(|e| dev_err("reading the kernels' timing events", e))
    }

    /// `CUDA_PREFILL_CHUNK`: more rows a forward keep the experts' row tiles fuller.
    fn prefill_chunk(&self) -> usize {
        CUDA_PREFILL_CHUNK
    }

    /// The driver's free and total bytes of this context's device (`cuMemGetInfo`).
    fn capacity(&self) -> Option<Capacity> {
        let (free, total) = self.ctx.mem_get_info().ok()?;
        Some(Capacity { free_bytes: free as u64, total_bytes: total as u64 })
    }

    fn upload(&self, host: &HostTensor) -> Result<CudaTensor> {
        let (raw, dtype): (&[u8], DType) = match &host.data {
            HostData::F32(v) => (bytemuck::cast_slice(v), DType::F32),
            HostData::I32(v) => (bytemuck::cast_slice(v), DType::I32),
        };
        if raw.len() != host.numel() * 4 {
            return Err(Error::shape("upload", format!("shape {:?} but {} bytes of data", host.shape, raw.len())));
        }
        self.new_tensor("upload", host.shape.clone(), dtype, Role::Activation, Some(raw))
    }

    fn upload_param(&self, host: &HostTensor) -> Result<CudaTensor> {
        let (raw, dtype): (&[u8], DType) = match &host.data {
            HostData::F32(v) => (bytemuck::cast_slice(v), DType::F32),
            HostData::I32(v) => (bytemuck::cast_slice(v), DType::I32),
        };
        if raw.len() != host.numel() * 4 {
            return Err(Error::shape(
                "upload_param",
                format!("shape {:?} but {} bytes of data", host.shape, raw.len()),
            ));
        }
        self.new_tensor("upload_param", host.shape.clone(), dtype, Role::Weight, Some(raw))
    }

    fn upload_weight(&self, w: &HostWeight<'_>) -> Result<CudaWeight> {
        self.upload_weight_as(w, false)
    }

    fn upload_weight_exact(&self, w: &HostWeight<'_>) -> Result<CudaWeight> {
        self.upload_weight_as(w, true)
    }

    fn precision(&self) -> Precision {
        self.opts.precision
    }

    fn download(&self, t: &CudaTensor) -> Result<HostTensor> {
        let raw = self.read_back(t, 0, t.bytes)?;
        self.check_guards(t)?;
        match t.dtype {
            DType::F32 => HostTensor::f32(t.shape.clone(), bytemuck::pod_collect_to_vec(&raw)),
            DType::I32 => HostTensor::i32(t.shape.clone(), bytemuck::pod_collect_to_vec(&raw)),
        }
    }

    fn sync(&self) -> Result<()> {
        CudaBackend::sync(self)
    }

    /// x `[n, k]` · W `[out, k]`ᵀ + b `[out]` → `[n, out]` (linear.rs).
    fn linear(&self, x: &CudaTensor, w: &CudaWeight, bias: Option<&CudaTensor>) -> Result<CudaTensor> {
        self.linear(x, w, bias)
    }

    /// x `[n, d]`, weight `[d]` → `[n, d]`, one block per row.
    fn rms_norm(&self, x: &CudaTensor, weight: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        const OP: &str = "rms_norm";
        let (n, d) = checks::rms_norm(x, weight)?;
        let mut y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        if n == 0 || d == 0 {
            return Ok(y);
        }
        self.launch_rms_norm(OP, "rms_norm_f32", x, weight, &mut y, (n, d), eps)?;
        Ok(y)
    }

    /// a, b `[n, d]` → `[n, d]`.
    fn add(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "add";
        checks::add(a, b)?;
        let mut y = self.alloc(OP, a.shape.clone(), DType::F32)?;
        let n = a.numel();
        self.launch_1d(OP, Source::Elementwise, "add_f32", &[&*a.buf, &*b.buf], &mut y, &[n as u32], n)?;
        Ok(y)
    }

    /// x `[n, d]` → `[n, len]`.
    fn slice_cols(&self, x: &CudaTensor, start: usize, len: usize) -> Result<CudaTensor> {
        const OP: &str = "slice_cols";
        let (n, d) = checks::slice_cols(x, start, len)?;
        let mut y = self.alloc(OP, vec![n, len], DType::F32)?;
        let sizes = [n as u32, len as u32, d as u32, start as u32];
        self.launch_1d(OP, Source::Copy, "slice_cols_f32", &[&*x.buf], &mut y, &sizes, n * len)?;
        Ok(y)
    }

    /// `[n, d]`, `[m, d]` → `[n+m, d]` (f32 or i32): one `concat_rows_u32` launch, or two
    /// device-to-device copies past 2^32 words.
    fn concat_rows(&self, a: &CudaTensor, b: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "concat_rows";
        checks::concat_rows(a, b)?;
        let mut y = self.alloc(OP, vec![a.rows() + b.rows(), a.cols()], a.dtype)?;
        // one launch for both parts (every dtype is 4 bytes); copies past 2^32 words
        let (a_words, total) = (a.bytes / 4, (a.bytes + b.bytes) / 4);
        if let (Ok(a32), Ok(total32)) = (u32::try_from(a_words), u32::try_from(total)) {
            let inputs = [&*a.buf, &*b.buf];
            self.launch_1d(OP, Source::Copy, "concat_rows_u32", &inputs, &mut y, &[a32, total32], total)?;
            return Ok(y);
        }
        let copy_err = |e| dev_err("op `concat_rows`: device-to-device copy", e);
        if a.bytes > 0 {
            let dst = &mut y.buf.slice_mut(0..a.bytes);
            self.counters.clock.copy(|| self.stream.memcpy_dtod(&a.buf.slice(0..a.bytes), dst)).map_err(copy_err)?;
        }
        if b.bytes > 0 {
            let end = a.bytes + b.bytes;
            let dst = &mut y.buf.slice_mut(a.bytes..end);
            self.counters.clock.copy(|| self.stream.memcpy_dtod(&b.buf.slice(0..b.bytes), dst)).map_err(copy_err)?;
        }
        Ok(y)
    }

    /// src `[m, d]`, idx i32 `[n]` → `[n, d]`; an index outside `0..m` yields a row of NaN.
    fn gather_rows(&self, src: &CudaTensor, idx: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "gather_rows";
        let (m, d, n) = checks::gather_rows(src, idx)?;
        let mut y = self.alloc(OP, vec![n, d], DType::F32)?;
        let sizes = [n as u32, d as u32, check_u32(OP, "src rows", m)?];
        self.launch_1d(OP, Source::Copy, "gather_rows_f32", &[&*src.buf, &*idx.buf], &mut y, &sizes, n * d)?;
        Ok(y)
    }

    /// x `[n, 2h]` → `[n, h]`, gate = first half.
    fn swiglu(&self, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "swiglu";
        let (n, h) = checks::swiglu(x)?;
        let mut y = self.alloc(OP, vec![n, h], DType::F32)?;
        self.launch_1d(OP, Source::Elementwise, "swiglu_f32", &[&*x.buf], &mut y, &[n as u32, h as u32], n * h)?;
        Ok(y)
    }

    /// `[n, d]` → `[n, d]`, exact (erf) GELU.
    fn gelu_erf(&self, x: &CudaTensor) -> Result<CudaTensor> {
        const OP: &str = "gelu_erf";
        checks::gelu_erf(x)?;
        let mut y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let n = x.numel();
        self.launch_1d(OP, Source::Elementwise, "gelu_erf_f32", &[&*x.buf], &mut y, &[n as u32], n)?;
        Ok(y)
    }

    // ---- the vision tower (vision.rs) ----
    fn rope_2d(&self, x: &CudaTensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<CudaTensor> {
        self.rope_2d(x, n_heads, grid_w, theta)
    }

    fn attention(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, n_heads: usize) -> Result<CudaTensor> {
        self.attention(q, k, v, n_heads)
    }

    fn linear_add(
        &self,
        x: &CudaTensor,
        w: &CudaWeight,
        bias: Option<&CudaTensor>,
        residual: &CudaTensor,
    ) -> Result<CudaTensor> {
        CudaBackend::linear_add(self, x, w, bias, residual)
    }

    fn rms_norm_linear(
        &self,
        x: &CudaTensor,
        norm: &CudaTensor,
        eps: f32,
        w: &CudaWeight,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        CudaBackend::rms_norm_linear(self, x, norm, eps, w, bias)
    }

    fn swiglu_linear_add(&self, gate_up: &CudaTensor, w: &CudaWeight, residual: &CudaTensor) -> Result<CudaTensor> {
        CudaBackend::swiglu_linear_add(self, gate_up, w, residual)
    }

    fn attention_rope_2d(&self, qkv: &CudaTensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<CudaTensor> {
        self.attention_rope_2d(qkv, n_heads, grid_w, theta)
    }

    fn unfold(&self, x: &CudaTensor, h: usize, w: usize, r: usize) -> Result<CudaTensor> {
        self.unfold(x, h, w, r)
    }

    fn unfold_linear_gelu(
        &self,
        x: &CudaTensor,
        h: usize,
        w: usize,
        r: usize,
        weight: &CudaWeight,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor> {
        self.unfold_linear_gelu(x, h, w, r, weight, bias)
    }

    // ---- language model: small ops (lm_small.rs) ----
    fn embed_rows(&self, table: &CudaWeight, ids: &CudaTensor) -> Result<CudaTensor> {
        self.embed_rows(table, ids)
    }
    fn hc_expand(&self, x: &CudaTensor, hc: usize) -> Result<CudaTensor> {
        self.hc_expand(x, hc)
    }
    fn rms_norm_heads(&self, x: &CudaTensor, n_heads: usize, eps: f32) -> Result<CudaTensor> {
        self.rms_norm_heads(x, n_heads, eps)
    }
    fn hc_split(
        &self,
        m: &CudaTensor,
        s: &CudaTensor,
        b: &CudaTensor,
        hc: usize,
        it: usize,
        eps: f32,
    ) -> Result<CudaTensor> {
        self.hc_split(m, s, b, hc, it, eps)
    }
    fn hc_mix_split(
        &self,
        x: &CudaTensor,
        mix: &CudaWeight,
        s: &CudaTensor,
        b: &CudaTensor,
        hc: usize,
        it: usize,
        eps: f32,
        norm_eps: f32,
    ) -> Result<CudaTensor> {
        self.hc_mix_split(x, mix, s, b, hc, it, eps, norm_eps)
    }
    fn hc_mix_split_pre_norm(
        &self,
        x: &CudaTensor,
        mix: &CudaWeight,
        s: &CudaTensor,
        b: &CudaTensor,
        hc: usize,
        it: usize,
        eps: f32,
        norm_eps: f32,
        weight: &CudaTensor,
    ) -> Result<(CudaTensor, CudaTensor)> {
        self.hc_mix_split_pre_norm(x, mix, s, b, hc, it, eps, norm_eps, weight)
    }
    fn hc_post_mix_split_pre_norm(
        &self,
        x: &CudaTensor,
        f: &CudaTensor,
        split: &CudaTensor,
        mix: &CudaWeight,
        s: &CudaTensor,
        b: &CudaTensor,
        hc: usize,
        it: usize,
        eps: f32,
        norm_eps: f32,
        weight: &CudaTensor,
    ) -> Result<(CudaTensor, CudaTensor, CudaTensor)> {
        self.hc_post_mix_split_pre_norm(x, f, split, mix, s, b, hc, it, eps, norm_eps, weight)
    }
    fn linear_pair(&self, x: &CudaTensor, wa: &CudaWeight, wb: &CudaWeight) -> Result<(CudaTensor, CudaTensor)> {
        CudaBackend::linear_pair(self, x, wa, wb)
    }
    fn hc_pre(&self, x: &CudaTensor, w: &CudaTensor, hc: usize) -> Result<CudaTensor> {
        self.hc_pre(x, w, hc)
    }
    fn hc_pre_norm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        hc: usize,
        weight: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor> {
        self.hc_pre_norm(x, w, hc, weight, eps)
    }
    fn hc_post(&self, x: &CudaTensor, f: &CudaTensor, split: &CudaTensor) -> Result<CudaTensor> {
        self.hc_post(x, f, split)
    }
    fn hc_head_weights(&self, mix: &CudaTensor, scale: &CudaTensor, base: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        self.hc_head_weights(mix, scale, base, eps)
    }
    fn rope_tail(
        &self,
        x: &CudaTensor,
        h: usize,
        f: &CudaTensor,
        pos0: usize,
        st: usize,
        inv: bool,
    ) -> Result<CudaTensor> {
        self.rope_tail(x, h, f, pos0, st, inv)
    }
    fn rope_tail_at(
        &self,
        x: &CudaTensor,
        h: usize,
        f: &CudaTensor,
        pos: &CudaTensor,
        inv: bool,
    ) -> Result<CudaTensor> {
        self.rope_tail_at(x, h, f, pos, inv)
    }
    fn rms_norm_rope(
        &self,
        x: &CudaTensor,
        weight: Option<&CudaTensor>,
        h: usize,
        eps: f32,
        f: &CudaTensor,
        pos: &CudaTensor,
    ) -> Result<CudaTensor> {
        self.rms_norm_rope(x, weight, h, eps, f, pos)
    }
    fn topk_rows(&self, x: &CudaTensor, k: usize) -> Result<CudaTensor> {
        self.topk_rows(x, k)
    }
    fn sqrt_softplus(&self, x: &CudaTensor) -> Result<CudaTensor> {
        self.sqrt_softplus(x)
    }
    fn hash_route(&self, table: &CudaTensor, ids: &CudaTensor, fallback: &CudaTensor) -> Result<CudaTensor> {
        self.hash_route(table, ids, fallback)
    }
    fn route_weights(&self, scores: &CudaTensor, ids: &CudaTensor, scale: f32) -> Result<CudaTensor> {
        self.route_weights(scores, ids, scale)
    }
    fn route_experts(
        &self,
        logits: &CudaTensor,
        bias: &CudaTensor,
        kind: &CudaTensor,
        hash: Option<(&CudaTensor, &CudaTensor)>,
        k: usize,
        scale: f32,
    ) -> Result<(CudaTensor, CudaTensor)> {
        self.route_experts(logits, bias, kind, hash, k, scale)
    }
    fn swiglu_clamp(&self, g: &CudaTensor, u: &CudaTensor, limit: f32) -> Result<CudaTensor> {
        self.swiglu_clamp(g, u, limit)
    }
    // ---- language model: lm_attention.rs, moe.rs ----------------------------------------------
    fn sink_attention(
        &self,
        q: &CudaTensor,
        kv: &CudaTensor,
        window: &CudaTensor,
        comp: Option<(&CudaTensor, &CudaTensor)>,
        sinks: &CudaTensor,
        n_heads: usize,
    ) -> Result<CudaTensor> {
        CudaBackend::sink_attention(self, q, kv, window, comp, sinks, n_heads)
    }
    fn indexer_scores(
        &self,
        q: &CudaTensor,
        k: &CudaTensor,
        w: &CudaTensor,
        n_heads: usize,
        scale: f32,
        pos0: usize,
        ratio: usize,
    ) -> Result<CudaTensor> {
        CudaBackend::indexer_scores(self, q, k, w, n_heads, scale, pos0, ratio)
    }
    fn compress_pool(
        &self,
        kv: &CudaTensor,
        gate: &CudaTensor,
        ape: &CudaTensor,
        ratio: usize,
        overlap: bool,
    ) -> Result<CudaTensor> {
        CudaBackend::compress_pool(self, kv, gate, ape, ratio, overlap)
    }
    fn grouped_linear(&self, x: &CudaTensor, w: &CudaWeight, groups: usize) -> Result<CudaTensor> {
        CudaBackend::grouped_linear(self, x, w, groups)
    }
    fn moe_experts(
        &self,
        x: &CudaTensor,
        ids: &CudaTensor,
        weights: &CudaTensor,
        w1: &[CudaWeight],
        w3: &[CudaWeight],
        w2: &[CudaWeight],
        limit: f32,
    ) -> Result<CudaTensor> {
        CudaBackend::moe_experts(self, x, ids, weights, w1, w3, w2, limit)
    }
}

#[cfg(test)]
mod tests;
