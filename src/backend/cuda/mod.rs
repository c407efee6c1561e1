//! Native CUDA lane: every op of the contract on CUDA C kernels (`cuda/*.cu`), driven through
//! cudarc's driver API — the shared and vision ops here, the language-model ops in `lm_small.rs`
//! (embeddings, hyper-connections, RoPE tail, routing), `lm_attention.rs` (sink attention,
//! indexer, compressor, grouped projection) and `moe.rs` (routed experts); `kernels.rs` holds what
//! is compiled (the files, units and builds, the kernel lists, NVRTC's PTX), `memory.rs` the
//! tensors, weights and buffer pool, `launch.rs` the launches, `timing.rs` the kernel timer.
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

mod lm_small;

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig};

use launch::KernelArgs;

use crate::backend::checks;
use crate::backend::cpu::rope_2d_tables;
use crate::backend::{
    Backend, Capacity, DType, DeviceTensor, HostClock, HostData, HostProfile, HostTensor, HostWeight, KernelTime,
    MemoryReport, Op, Precision, WeightFormat,
};
use crate::error::{Error, Result};

mod kernels;
mod launch;
mod lm_attention;
mod memory;
mod moe;
mod ptx_cache;
mod timing;

pub use kernels::{
    EMBED_ROWS_KERNELS, GROUPED_LINEAR_KERNELS, KERNELS, LINEAR_KERNELS, LINEAR_PAIR_KERNELS, LINEAR_Q8X_MIN_COLS,
    MOE_DOWN_KERNELS, MOE_GATE_KERNELS, MOE_UP_KERNELS, Source, UNFOLD_LINEAR_GELU_KERNELS, Unit, WEIGHT_KERNELS,
    WeightKernels, linear_q8x_kernel, moe_q8x_kernels, q8x_format,
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
/// `attention_fast_d*`'s instantiations: the padded head widths, each with its kernel.
const FAST_ATTENTION_WIDTHS: [(usize, &str); 4] =
    [(16, "attention_fast_d16"), (32, "attention_fast_d32"), (64, "attention_fast_d64"), (128, "attention_fast_d128")];
/// Block tile of the shared GEMM (`GEMM_BM` rows x `GEMM_BN` columns in cuda/common.cuh) behind
/// `linear`, `grouped_linear` and `moe_experts`, and its threads per block (`GEMM_THREADS`, 1-D).
/// Its shared memory is static (at most 25 KiB, the tensor-core path with f16 weights).
const GEMM_BM: u32 = 64;
const GEMM_BN: u32 = 64;
const GEMM_THREADS: u32 = 128;
/// At most this many rows (`GEMV_ROWS`), `gemm_block` takes the small-row path: a block per
/// pair of output columns (its threads split k) and one row block.
const GEMV_ROWS: usize = 8;

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
        })
    }

    /// `func`, allowed `bytes` of dynamic shared memory: above the 48 KiB default the kernel opts
    /// in, up to the device's per-block limit (less the kernel's static shared memory); beyond
    /// that `op` is unsupported at this size (`what` says which size).
    fn func_shared(&self, op: Op, src: Source, name: &'static str, bytes: usize, what: &str) -> Result<CudaFunction> {
        use cudarc::driver::sys::{CUdevice_attribute_enum, CUfunction_attribute_enum};
        let f = self.func(src, name)?;
        let mut optin = self.shared_optin.lock().unwrap_or_else(|e| e.into_inner());
        if bytes <= DEFAULT_SHARED_BYTES || optin.get(name).is_some_and(|&granted| bytes <= granted) {
            return Ok(f);
        }
        let err = |e| dev_err(format!("shared memory limits of kernel `{name}`"), e);
        let limit = self
            .ctx
            .attribute(CUdevice_attribute_enum::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .map_err(err)?;
        let statics = f.shared_size_bytes().map_err(err)?;
        let available = (limit.max(0) as usize).saturating_sub(statics.max(0) as usize);
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

    fn unsupported(op: Op, what: impl Into<String>) -> Error {
        Error::Unsupported { lane: LANE, op: op.name(), what: what.into() }
    }

    /// The int8-activation kernel `linear` takes for `n` rows of `k` against `w`, if any: one row
    /// in fast precision against a weight of at least `LINEAR_Q8X_MIN_COLS` outputs in a q8x format.
    fn linear_q8x(&self, n: usize, k: usize, w: &CudaWeight) -> Option<&'static str> {
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
    fn linear_pair(&self, x: &CudaTensor, wa: &CudaWeight, wb: &CudaWeight) -> Result<(CudaTensor, CudaTensor)> {
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

    /// x `[n, k]` · W `[out, k]`ᵀ + b `[out]` → `[n, out]` (the shared GEMM, weight decoded in it).
    fn linear(&self, x: &CudaTensor, w: &CudaWeight, bias: Option<&CudaTensor>) -> Result<CudaTensor> {
        const OP: &str = "linear";
        let (n, k) = checks::linear(x, w, bias)?;
        let mut y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        if n == 0 || w.rows == 0 {
            return Ok(y);
        }
        let has_bias = bias.is_some() as u32;
        let bias_buf = bias.map_or(&self.dummy, |b| &*b.buf);
        // one row in fast precision against a wide weight: int8 activations (linear_q8x_*)
        let shared = q8x_shared_bytes(k);
        if let Some(kernel) = self.linear_q8x(n, k, w) {
            let f = self.func_in(Source::Linear, kernel, Build::Rows)?;
            let (k32, o32) = (check_u32(OP, "in_features", k)?, check_u32(OP, "out_features", w.rows)?);
            let cfg = LaunchConfig {
                grid_dim: (w.rows.div_ceil(Q8X_BLOCK_COLS) as u32, 1, 1),
                block_dim: (Q8X_THREADS, 1, 1),
                shared_mem_bytes: shared as u32,
            };
            let mut l = KernelArgs::new(&self.stream, &f);
            l.arg(&*x.buf).arg(&w.buf).arg(bias_buf).arg(&mut *y.buf).arg(&k32).arg(&o32).arg(&has_bias);
            // SAFETY: arguments match `linear_q8x_*` in cuda/linear.cu; x is one row of k (a
            // multiple of the format's block, so of 32), y one row of out, the bias out floats
            // where has_bias; the shared memory is q8x_shared_bytes(k).
            self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
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

    /// x `[n, d]`, weight `[d]` → `[n, d]`, one block per row.
    fn rms_norm(&self, x: &CudaTensor, weight: &CudaTensor, eps: f32) -> Result<CudaTensor> {
        const OP: &str = "rms_norm";
        let (n, d) = checks::rms_norm(x, weight)?;
        let mut y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        if n == 0 || d == 0 {
            return Ok(y);
        }
        let f = self.func(Source::Norm, "rms_norm_f32")?;
        let (n32, d32) = (n as u32, d as u32);
        let cfg = cfg_rows(n, d);
        let mut l = KernelArgs::new(&self.stream, &f);
        l.arg(&*x.buf).arg(&*weight.buf).arg(&mut *y.buf).arg(&n32).arg(&d32).arg(&eps);
        // SAFETY: arguments match `rms_norm_f32` in cuda/norm.cu; shapes checked above.
        self.launched(OP, "rms_norm_f32", cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
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

    /// x `[gh·gw, heads·hd]` → same shape; cos/sin table computed on the host in f32 and cached.
    fn rope_2d(&self, x: &CudaTensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<CudaTensor> {
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
    fn attention(&self, q: &CudaTensor, k: &CudaTensor, v: &CudaTensor, n_heads: usize) -> Result<CudaTensor> {
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
            // k and v once as f16 operands, padded to `keys` and `width` (kh then vt: cuda/attention.cu)
            let keys = n.div_ceil(FAST_ATTENTION_KEYS) * FAST_ATTENTION_KEYS;
            let words = n_heads * keys * width / 2;
            let mut kv16 = self.alloc(OP, vec![2 * words], DType::I32)?;
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
            // two stages of a key chunk and its transposed values, in words
            let shared = 4 * 2 * (FAST_ATTENTION_KEYS * (width / 2 + 4) + width * (FAST_ATTENTION_KEYS / 2 + 4));
            let f = self.func_shared(Op::Attention, Source::Attention, kernel, shared, &format!("head dim {hd}"))?;
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(FAST_ATTENTION_ROWS) as u32, h32, 1),
                block_dim: (FAST_ATTENTION_THREADS, 1, 1),
                shared_mem_bytes: shared as u32,
            };
            let keys32 = keys as u32;
            let mut l = KernelArgs::new(&self.stream, &f);
            l.arg(&*q.buf).arg(&*kv16.buf).arg(&mut *y.buf).arg(&n32).arg(&h32).arg(&hd32).arg(&keys32).arg(&scale);
            // SAFETY: arguments match `attention_fast_d*` in cuda/attention.cu; kv16 holds the
            // 2 · heads · keys · width / 2 words it reads, shapes checked above.
            self.launched(OP, kernel, cfg, |cfg| unsafe { l.launch(cfg, self.pdl) })?;
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

    /// x `[h·w, c]` → `[ceil(h/r)·ceil(w/r), c·r²]`.
    fn unfold(&self, x: &CudaTensor, h: usize, w: usize, r: usize) -> Result<CudaTensor> {
        const OP: &str = "unfold";
        let c = checks::unfold(x, h, w, r)?;
        let (gh, gw) = (h.div_ceil(r), w.div_ceil(r));
        let feat = c.checked_mul(r * r).ok_or_else(|| Error::shape(OP, format!("r = {r} is too large")))?;
        let mut y = self.alloc(OP, vec![gh * gw, feat], DType::F32)?;
        let sizes = [c as u32, h as u32, w as u32, r as u32, gw as u32, (gh * gw) as u32];
        self.launch_1d(OP, Source::Copy, "unfold_f32", &[&*x.buf], &mut y, &sizes, gh * gw * feat)?;
        Ok(y)
    }

    /// x `[h·w, c]`, weight `[out, c·r²]` → `[ceil(h/r)·ceil(w/r), out]`: one GEMM whose A rows
    /// are gathered from the grid (no unfold buffer), GELU in its epilogue (cuda/linear.cu).
    fn unfold_linear_gelu(
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
mod tests {
    use super::kernels::dequant_tables;
    use super::*;

    /// Here (no driver) the probe explains why; on a GPU machine it describes the device. With
    /// `FOVEA_REQUIRE_CUDA=1` (set on the GPU machines) only the description passes.
    #[test]
    fn probe_describes_the_device_or_says_why_not() {
        match probe() {
            Ok(desc) => assert!(desc.contains("sm_") && desc.contains("NVRTC"), "{desc}"),
            Err(e) if std::env::var("FOVEA_REQUIRE_CUDA").is_ok_and(|v| v.trim() == "1") => {
                panic!("FOVEA_REQUIRE_CUDA=1 but the CUDA probe failed: {e}")
            }
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("CUDA"), "{msg}");
                // the probe itself found what is missing; cudarc was never left to panic
                assert!(!msg.contains("panic"), "{msg}");
                assert!(matches!(e, Error::Device(_)), "{e:?}");
            }
        }
    }

    /// The kernels of every file of cuda/, by the text after each kernel qualifier's opening brace
    /// (macro continuations skipped): (file, the qualifier's line, the body's start).
    fn kernel_bodies() -> Vec<(&'static str, String, String)> {
        let mut out = Vec::new();
        for src in Source::ALL {
            let text = src.text();
            for (at, _) in text
                .match_indices("__global__")
                .chain(text.match_indices("BASE_KERNEL "))
                .chain(text.match_indices("GEMM_KERNEL "))
            {
                let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
                let line = text[line_start..].lines().next().unwrap_or_default();
                // comments, the qualifiers' own #defines, and `extern "C" __global__` found twice
                let before = &text[line_start..at];
                if before.trim_start().starts_with("//")
                    || line.starts_with("#define")
                    || (text[at..].starts_with("__global__") && before.contains("BASE_KERNEL"))
                {
                    continue;
                }
                let open = at + text[at..].find('{').expect("a kernel has a body");
                let body = text[open + 1..].trim_start_matches([' ', '\\', '\n']);
                out.push((src.file(), line.trim().to_owned(), body.chars().take(40).collect()));
            }
        }
        out
    }

    /// Programmatic dependent launch (src/backend/cuda/launch.rs) is safe only if every kernel
    /// waits for the one before it before it touches memory: `grid_wait();` opens every kernel.
    #[test]
    fn every_kernel_starts_by_waiting_for_the_previous_one() {
        let kernels = kernel_bodies();
        // the files hold 75 kernel definitions (the block-format ones as macros): the scan found them
        assert!(kernels.len() >= 75, "found only {} kernels", kernels.len());
        let missing: Vec<_> = kernels.iter().filter(|(_, _, body)| !body.starts_with("grid_wait();")).collect();
        assert!(missing.is_empty(), "kernels that do not start with grid_wait(): {missing:#?}");
    }

    /// Every kernel the lane launches is a `BASE_KERNEL` (`extern "C" __global__` in the base unit's
    /// tiles build) or a `GEMM_KERNEL` (also in the rows build) of the file it is loaded from, or
    /// an `extern "C" __global__` of a file without weight kernels (the GEMM kernels carry their
    /// launch bounds, `GEMM_LAUNCH`).
    #[test]
    fn every_launched_kernel_is_defined_in_its_file() {
        let declared = |src: &Source, name: &str| {
            let qualifiers: &[&str] =
                if src.takes_weights() { &["BASE_KERNEL", "GEMM_KERNEL"] } else { &["extern \"C\" __global__"] };
            let text = src.text();
            qualifiers.iter().any(|q| {
                text.contains(&format!("{q} void {name}(")) || text.contains(&format!("{q} void GEMM_LAUNCH {name}("))
            })
        };
        for (src, name) in KERNELS {
            assert_eq!(Unit::of(name), Unit::Base, "{name}");
            assert!(declared(src, name), "{name} is not defined in cuda/{}", src.file());
        }
        // and the list holds every kernel the host names by its file and a literal (launch_1d,
        // func), so the device test compiles and loads each one
        let host = [
            include_str!("mod.rs"),
            include_str!("lm_small.rs"),
            include_str!("lm_attention.rs"),
            include_str!("moe.rs"),
        ];
        let mut named = 0;
        for part in host.iter().flat_map(|text| text.split("Source::").skip(1)) {
            let Some((src, rest)) = part.split_once(',').filter(|(s, _)| s.chars().all(|c| c.is_ascii_alphanumeric()))
            else {
                continue;
            };
            let Some(name) = rest.trim_start().strip_prefix('"').and_then(|r| r.split_once('"')).map(|(n, _)| n) else {
                continue;
            };
            named += 1;
            assert!(
                KERNELS.iter().any(|(s, n)| format!("{s:?}") == src && *n == name),
                "{src}'s {name} is launched but not in KERNELS"
            );
        }
        assert!(named > 20, "found {named} kernel names in the host's launches");
        // weight kernels: the float formats' written out, the block formats' instantiated by
        // FOR_EACH_BLOCK_FORMAT(X) in cuda/dequant.cuh with X defining `{family}_##SFX(`
        let dequant = include_str!("../../../cuda/dequant.cuh");
        for (src, kernels) in WEIGHT_KERNELS {
            for format in WeightFormat::ALL {
                let name = kernels.of(format);
                let suffix = format.name().to_lowercase();
                if !format.is_block() {
                    assert_eq!(Unit::of(name), Unit::Base, "{name}");
                    assert!(declared(src, name), "{name} is not defined in cuda/{}", src.file());
                    continue;
                }
                assert_eq!(Unit::of(name), Unit::Block(format), "{name}");
                let family = name.strip_suffix(&format!("_{suffix}")).expect("block kernel names end in the format");
                assert!(src.takes_weights(), "cuda/{} gets no dequant.cuh", src.file());
                assert!(dequant.contains(&format!("X({suffix}, WF_{})", format.name())), "{format} not in dequant.cuh");
                let text = src.text();
                let definer = format!("void GEMM_LAUNCH {family}_##SFX(");
                let definer_1d = format!("void {family}_##SFX(");
                let at = text.find(&definer).or_else(|| text.find(&definer_1d));
                let at = at.unwrap_or_else(|| panic!("no block-format kernel {family}_##SFX in cuda/{}", src.file()));
                // the macro defined on the lines before is the one instantiated for every format
                let macro_name = text[..at].rsplit("#define ").next().and_then(|m| m.split('(').next()).unwrap_or("");
                assert!(
                    text.contains(&format!("FOR_EACH_BLOCK_FORMAT({macro_name})")),
                    "cuda/{} does not instantiate {macro_name}",
                    src.file()
                );
            }
        }
        // the one-token q8x kernels: one list of formats (Q8X_IF_<format> in cuda/dequant.cuh)
        // instantiates them in cuda/moe.cu and cuda/linear.cu (in their rows builds), each name in
        // its format's unit, for exactly the formats the host launches them for
        let dequant = include_str!("../../../cuda/dequant.cuh");
        let (moe, linear) = (Source::Moe.text(), Source::Linear.text());
        for (file, text, instance) in [
            ("moe.cu", moe, "MOE_Q8X_KERNEL(SFX, FMT) Q8X_IF_##SFX(MOE_Q8X_DEFINE(SFX, FMT))"),
            ("linear.cu", linear, "LINEAR_Q8X_KERNEL(SFX, FMT) Q8X_IF_##SFX(LINEAR_Q8X_DEFINE(SFX, FMT))"),
        ] {
            assert!(text.contains(&format!("#define {instance}\n")), "cuda/{file} lacks `#define {instance}`");
            let macro_name = instance.split('(').next().expect("a name");
            assert!(
                text.contains(&format!("FOR_EACH_BLOCK_FORMAT({macro_name})")),
                "cuda/{file} does not instantiate {macro_name}"
            );
        }
        for format in WeightFormat::ALL.into_iter().filter(|f| f.is_block()) {
            let sfx = format.name().to_lowercase();
            let defined = dequant.contains(&format!("#define Q8X_IF_{sfx}(M) M\n"));
            let empty = dequant.contains(&format!("#define Q8X_IF_{sfx}(M)\n"));
            assert!(defined != empty, "cuda/dequant.cuh: Q8X_IF_{sfx} must be M or empty, once");
            assert_eq!(defined, q8x_format(format), "{format}: q8x_format and cuda/dequant.cuh disagree");
            assert_eq!(defined, moe_q8x_kernels(format).is_some(), "{format}: moe_q8x_kernels");
            assert_eq!(defined, linear_q8x_kernel(format).is_some(), "{format}: linear_q8x_kernel");
            let moe_names = moe_q8x_kernels(format).into_iter().flatten();
            let names = moe_names.map(|n| (moe, n));
            for (text, name) in names.chain(linear_q8x_kernel(format).map(|n| (linear, n))) {
                assert_eq!(Unit::of(name), Unit::Block(format), "{name}");
                let family = name.strip_suffix(&format!("_{sfx}")).expect("ends in the format");
                assert!(text.contains(&format!("{family}_##SFX(")), "{name} is not defined");
            }
        }
        for src in Source::ALL {
            assert!(
                KERNELS.iter().any(|(s, _)| *s == src) || WEIGHT_KERNELS.iter().any(|(s, _)| *s == src),
                "cuda/{} has no kernel in KERNELS",
                src.file()
            );
        }
    }

    /// Every kernel the lane launches, with its file and build: the base kernels (`KERNELS`), the
    /// one-token int8 kernels (rows build), and each weight kernel in every format and every build
    /// the lane loads it in.
    fn every_launch() -> Vec<(Source, &'static str, Build)> {
        let mut all: Vec<(Source, &'static str, Build)> =
            KERNELS.iter().map(|&(src, name)| (src, name, Build::Tiles(Precision::Exact))).collect();
        for format in WeightFormat::ALL {
            for name in moe_q8x_kernels(format).into_iter().flatten() {
                all.push((Source::Moe, name, Build::Rows));
            }
        }
        all.extend(
            WeightFormat::ALL.into_iter().filter_map(linear_q8x_kernel).map(|n| (Source::Linear, n, Build::Rows)),
        );
        for (src, kernels) in WEIGHT_KERNELS {
            // the GEMMs through gemm_block also in their rows build (not the aligner's tile, nor
            // the embedding gather)
            let rows =
                [&LINEAR_KERNELS, &GROUPED_LINEAR_KERNELS, &MOE_GATE_KERNELS, &MOE_UP_KERNELS, &MOE_DOWN_KERNELS]
                    .iter()
                    .any(|k| k.0 == kernels.0);
            let builds: &[Build] = match (kernels.0 == LINEAR_PAIR_KERNELS.0, rows) {
                (true, _) => &[Build::Rows],
                (false, true) => &[Build::Tiles(Precision::Exact), Build::Tiles(Precision::Fast), Build::Rows],
                (false, false) => &[Build::Tiles(Precision::Exact), Build::Tiles(Precision::Fast)],
            };
            for format in WeightFormat::ALL {
                all.extend(builds.iter().map(|&build| (*src, kernels.of(format), build)));
            }
        }
        all
    }

    /// NVRTC compiles every file for this device (the weight files with the emitted tables and
    /// cuda/dequant.cuh) and every kernel the lane launches, each weight kernel in every format,
    /// is in its module. On a GPU machine only: skips without a driver, fails instead under
    /// `FOVEA_REQUIRE_CUDA=1`.
    #[test]
    fn every_kernel_compiles_and_loads() {
        let b = match CudaBackend::new(0) {
            Ok(b) => b,
            Err(e) if std::env::var("FOVEA_REQUIRE_CUDA").is_ok_and(|v| v.trim() == "1") => {
                panic!("FOVEA_REQUIRE_CUDA=1 but no CUDA lane: {e}")
            }
            Err(_) => return,
        };
        for (src, name, build) in every_launch() {
            b.func_in(src, name, build).unwrap_or_else(|e| panic!("{name} ({build}): {e}"));
        }
    }

    /// NVRTC alone — no driver, no device — compiles every unit the lane loads (each file's base
    /// unit and each block format's weight kernels, in every build it is loaded in) for sm_90
    /// (the H200: tensor-core tiles, `griddepcontrol`), sm_80 and sm_75 (the FMA tiles), and each
    /// launched kernel is an entry of its unit's PTX. So a kernel that does not compile under
    /// NVRTC fails here, where CI runs, not first on a GPU machine. Skips where NVRTC is not
    /// found, and where a CUDA driver is (a GPU machine: `every_kernel_compiles_and_loads`
    /// compiles and loads for its device, and these three architectures would cost minutes of
    /// device time, the compiles being serial); `FOVEA_REQUIRE_NVRTC=1` runs it regardless and
    /// makes a missing NVRTC a failure (`.ci/run` installs NVRTC from PyPI's `nvidia-cuda-nvrtc`
    /// and sets it).
    #[test]
    fn every_unit_compiles_under_nvrtc() {
        let required = std::env::var("FOVEA_REQUIRE_NVRTC").is_ok_and(|v| v.trim() == "1");
        // SAFETY: only tries to dlopen the library under its usual names.
        if !required && unsafe { cudarc::driver::sys::is_culib_present() } {
            eprintln!("SKIPPED: a CUDA driver is present; every_kernel_compiles_and_loads compiles for its device");
            return;
        }
        // SAFETY: as above.
        if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
            assert!(!required, "FOVEA_REQUIRE_NVRTC=1 but NVRTC (libnvrtc.so.13) was not found");
            eprintln!("SKIPPED: NVRTC (libnvrtc.so.13) not found; the CUDA kernels were not compiled");
            return;
        }
        let launches = every_launch();
        for arch in [90, 80, 75] {
            let mut units: Vec<(Source, Build, Unit)> = Vec::new();
            for &(src, name, build) in &launches {
                let unit = Unit::of(name);
                let (ptx, _) = ptx_for(arch, src, build, unit)
                    .unwrap_or_else(|e| panic!("sm_{arch}: cuda/{} ({build}): {e}", src.file()));
                let text = ptx.to_src();
                assert!(
                    text.contains(&format!(".entry {name}(")),
                    "sm_{arch}: `{name}` is not an entry of cuda/{} ({build}, {unit:?})",
                    src.file()
                );
                if !units.contains(&(src, build, unit)) {
                    units.push((src, build, unit));
                }
            }
            eprintln!("sm_{arch}: {} units compiled, {} kernels found in them", units.len(), launches.len());
        }
    }

    /// The block formats' codes in cuda/dequant.cuh (`WF_*`, the kernels' compile-time FMT) are
    /// their positions in `WeightFormat::ALL` (which `WeightKernels` indexes by), and its block
    /// geometry is `crate::formats`'.
    #[test]
    fn dequant_codes_and_geometry_match_weight_format() {
        let dequant = include_str!("../../../cuda/dequant.cuh");
        let common = include_str!("../../../cuda/common.cuh");
        for (i, format) in WeightFormat::ALL.into_iter().enumerate() {
            assert_eq!(format as usize, i, "{format}");
            if !format.is_block() {
                continue;
            }
            let code = format!("#define WF_{} {i}\n", format.name());
            assert!(dequant.contains(&code), "cuda/dequant.cuh lacks `{}`", code.trim_end());
            let geometry = format!("WBLOCK(WF_{}, {}, {}, ", format.name(), format.block_elems(), format.block_bytes());
            assert!(dequant.contains(&geometry), "cuda/dequant.cuh lacks `{}`", geometry.trim_end());
        }
        let first_block = WeightFormat::ALL.iter().position(|f| f.is_block()).expect("block formats exist");
        assert!(WeightFormat::ALL[first_block..].iter().all(|f| f.is_block()));
        assert!(common.contains(&format!("#define WF_FIRST_BLOCK {first_block}\n")));
    }

    /// The lookup tables in the NVRTC source are `crate::formats::tables`' arrays, entry for entry,
    /// each in global memory.
    #[test]
    fn emitted_tables_are_the_rust_tables() {
        use crate::formats::tables::*;
        let text = dequant_tables();
        let entries = |name: &str| -> Vec<String> {
            let start = text.find(&format!(" {name}[")).unwrap_or_else(|| panic!("{name} not emitted"));
            let body = &text[start..];
            let open = body.find('{').expect("array body");
            let close = body.find('}').expect("array end");
            body[open + 1..close].split(',').map(|e| e.trim().to_string()).collect()
        };
        let hex =
            |e: &str| u64::from_str_radix(e.trim_start_matches("0x").trim_end_matches("ull").trim_end_matches('u'), 16);
        let as_u64 = |name: &str| -> Vec<u64> { entries(name).iter().map(|e| hex(e).expect("hex entry")).collect() };
        let as_i64 =
            |name: &str| -> Vec<i64> { entries(name).iter().map(|e| e.parse().expect("integer entry")).collect() };
        assert_eq!(as_u64("IQ2XXS_GRID"), IQ2XXS_GRID);
        assert_eq!(as_u64("IQ2XS_GRID"), IQ2XS_GRID);
        assert_eq!(as_u64("IQ1S_GRID"), IQ1S_GRID);
        assert_eq!(as_u64("IQ3XXS_GRID"), IQ3XXS_GRID.map(u64::from));
        assert_eq!(as_i64("KSIGNS_IQ2XS"), KSIGNS_IQ2XS.map(i64::from));
        assert_eq!(as_i64("KVALUES_IQ4NL"), KVALUES_IQ4NL.map(i64::from));
        assert_eq!(as_i64("KVALUES_MXFP4"), KVALUES_MXFP4.map(i64::from));
        assert!(text.contains(&format!("#define IQ1_DELTA {:?}f\n", IQ1_DELTA)));
        // kmask_iq2xs, not emitted, is what the decoders shift: entry j is 1 << j
        assert!(KMASK_IQ2XS.iter().enumerate().all(|(j, &m)| m == 1 << j));
        assert_eq!(text.matches("__device__ const ").count(), 7);
        assert!(!text.contains("__constant__"));
    }

    /// The launch geometry of the shared GEMM matches the kernels' `#define`s in cuda/common.cuh.
    #[test]
    fn gemm_launch_constants_match_common_cuh() {
        let common = include_str!("../../../cuda/common.cuh");
        for (name, value) in [
            ("GEMM_BM", GEMM_BM),
            ("GEMM_BN", GEMM_BN),
            ("GEMM_THREADS", GEMM_THREADS),
            ("GEMV_ROWS", GEMV_ROWS as u32),
        ] {
            let define = format!("#define {name} {value}\n");
            assert!(common.contains(&define), "cuda/common.cuh lacks `{}`", define.trim_end());
        }
        // gemv_cols: a block per column pair, as gemm_grid's small-row arm sizes the grid
        assert!(common.contains("    const unsigned int c = 2u * block;\n"));
        assert_eq!(gemm_grid(GEMV_ROWS, 1025), (513, 1));
        // the one-token q8x kernels: Q8X_WARPS warps of Q8X_COLS columns a block
        let dequant = include_str!("../../../cuda/dequant.cuh");
        let (warps, cols) = (Q8X_THREADS / 32, Q8X_BLOCK_COLS as u32 / (Q8X_THREADS / 32));
        for define in [format!("#define Q8X_WARPS {warps}\n"), format!("#define Q8X_COLS {cols}\n")] {
            assert!(dequant.contains(&define), "cuda/dequant.cuh lacks `{}`", define.trim_end());
        }
    }

    /// The tile path's k splits: a grid of fewer blocks than the device has SMs gets about
    /// TILE_SPLIT_GRID; wide grids and short rows are not split.
    #[test]
    fn tile_splits_fill_the_device() {
        // a hyper-connection mix over a 512-token chunk: 1 column block x 8 row tiles
        assert_eq!(k_splits(8, 16384, TILE_SPLIT_BELOW, TILE_SPLIT_GRID), (16, 1024));
        // the router (4 x 8 blocks over 4096): 4 ranges
        assert_eq!(k_splits(32, 4096, TILE_SPLIT_BELOW, TILE_SPLIT_GRID), (4, 1024));
        // a ViT projection (16 x 49 blocks) and short rows stay whole
        assert_eq!(k_splits(16 * 49, 1024, TILE_SPLIT_BELOW, TILE_SPLIT_GRID).0, 1);
        assert_eq!(k_splits(8, 1000, TILE_SPLIT_BELOW, TILE_SPLIT_GRID).0, 1);
    }

    /// The small-row linear's k splits: narrow outputs get about GEMV_SPLIT_GRID blocks, in
    /// ranges of whole GEMV_SPLIT_K that cover k; wider ones and short rows are not split.
    #[test]
    fn gemv_splits_cover_k_in_whole_chunks() {
        assert_eq!(gemv_splits(12, 16384), (16, 1024)); // a hyper-connection mix
        assert_eq!(gemv_splits(2, 16384), (16, 1024));
        assert_eq!(gemv_splits(63, 4096), (4, 1024));
        assert_eq!(gemv_splits(40, 5000), (3, 2048)); // 4 wanted: ranges of 1250, rounded up to 2048
        assert_eq!(gemv_splits(GEMV_SPLIT_BELOW, 16384).0, 1);
        assert_eq!(gemv_splits(3, 1000).0, 1);
        for pairs in [1, 5, 33, 63] {
            for k in [1024, 3072, 5000, 16384, 65536] {
                let (splits, chunk) = gemv_splits(pairs, k);
                assert_eq!(chunk % GEMV_SPLIT_K, 0, "{pairs} {k}");
                assert!(splits * chunk >= k && (splits - 1) * chunk < k, "{pairs} {k}: every range is in k");
            }
        }
    }
}
