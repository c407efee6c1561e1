//! wgpu lane: the model graph on WGSL compute shaders (Vulkan, Metal, DX12, or Mesa lavapipe).
//!
//! This file holds the device, upload and download, the diagnostics and the `Backend` impl;
//! encode.rs the pending encoder, pipelines, dispatch and submission; tensor.rs memory
//! (activations, weight pools, guard bands). The impl hands each op to the file of its shader
//! family (`shaders/`), where its notes are:
//! - linear.rs: `linear`, `grouped_linear`, `moe_experts`, and the kernel each weight format takes
//!   (`linear_tile.wgsl`'s tile loads with `linear_packed.wgsl` or `linear_f16.wgsl` and a tile
//!   body, the small rows of `rows.wgsl`, the `dequant/` builds of formats.rs);
//! - elementwise.rs, copy.rs, norm.rs, rope.rs, attention.rs: the ops of `elementwise.wgsl`,
//!   `copy.wgsl`, `norm.wgsl`, `rope.wgsl`, `attention.wgsl`;
//! - lm.rs: the other language-model ops, on `lm.wgsl`;
//! - here: `debug_poke`, the guard bands' test hook, on `debug.wgsl`.
//!
//! The ops that run one thread per output element share one path, `WgpuBackend::per_element`
//! (check the inputs against the binding limit, allocate the output, dispatch).
//!
//! - Ops encode their dispatches into one compute pass of one pending command encoder (a copy
//!   ends the pass, the next dispatch opens another; the kernel timer, whose timestamps are a
//!   pass's, gives each dispatch its own); only `download` (and the diagnostics) wait. The
//!   encoder is handed, without waiting, to a thread that finishes and submits encoders in order
//!   (submit.rs) every `FLUSH_EVERY` dispatches, so the device starts on a decode step's first
//!   kernels while the host still encodes the rest (an H200 decode step 3.1–3.2 → 2.6 ms with 16
//!   rather than 128), and wgpu's finish and submit (most of the host's time a step) run beside
//!   the encoding.
//! - Pipelines are created lazily, once per (shader, entry point, weight format), and cached.
//!   A dispatch pushes its parameters as immediate data (`PARAM_BYTES`) and binds only storage
//!   buffers, through a bind group kept for the next dispatch with the same pipeline and buffer
//!   ranges (bind_groups.rs).
//! - Weights keep their checkpoint format on the device (f32, f16, bf16, and every block format,
//!   decoded inside the kernels: see formats.rs and `shaders/dequant/`) and are sub-allocated
//!   from pool buffers at offsets aligned to `min_storage_buffer_offset_alignment`. Rows of 16-bit
//!   formats are padded to an even element count (one zero element for odd `cols`), and rows of
//!   block formats to a multiple of 4 bytes, so every row starts on a 32-bit word; the pad is
//!   counted in the memory report. A matrix larger than the
//!   binding limit is split into row chunks, each bound on its own and written into its own
//!   output columns by `linear`.
//! - Activations are buffers of their own (recycled through a free list by size class, at most
//!   `Options::free_list_bytes` of them); an activation larger than the binding limit is an
//!   `Error::Device` naming the op.
//! - Guard bands (`Options::guard_words`): every activation output gets extra words filled with
//!   `GUARD_SENTINEL` before the op; `check_guards` / `download` report a write past the end.
//! - Precision (`Options::precision`): every GEMM kernel (linear's tiles, which also take
//!   grouped_linear and the prefill's experts, and the small-row kernels; float and block
//!   formats) is built twice, with `shaders/operands_exact.wgsl`
//!   (f32 operands) and with `shaders/operands_fast.wgsl` (each operand rounded to the nearest
//!   f16, f16 tiles, f32 accumulation), which needs SHADER_F16; in fast precision the tiles
//!   multiply on cooperative matrices where the adapter has them (`Tiles`, `coop_tiles_fit`),
//!   else on f32 FMAs as in exact. A weight uploaded with
//!   `upload_weight_exact` (router, hyper-connection mixes) always takes the exact build; norms,
//!   softmax, attention, routing and the residual stream have one (f32) build.
//! - Threads: the backend is `Sync`; submissions keep encoding order across threads and blocking
//!   waits are serialised. Validation errors surface at the next `download`/`sync`/`flush` of any
//!   thread. On the NVIDIA driver, creating a second device while another thread works on a first
//!   one was seen to deadlock, so device creation is serialised here and tests that open extra
//!   devices run alone.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

mod adapter;
mod attention;
mod bind_groups;
mod copy;
mod elementwise;
mod encode;
pub mod formats;
mod linear;
mod lm;
mod norm;
mod q8x;
mod rope;
mod rows;
mod shader;
mod submit;
mod tensor;
mod timing;

use adapter::{DEVICE_CREATION, describe, select_adapter};
pub use adapter::{default_precision, list_adapters};
pub use rows::{Reduction, RowBound, RowsBuild};
use shader::Shader;
pub use shader::{ShaderBuild, Tiles, shader_builds};
use tensor::{Counters, Pool, Role, Shared, WeightChunk};
pub use tensor::{WgpuTensor, WgpuWeight};

use crate::backend::{
    Backend, Capacity, DType, HostClock, HostData, HostProfile, HostTensor, HostWeight, KernelTime, MemoryReport, Op,
    Precision, WeightFormat,
};
use crate::error::{Error, Result};

const LANE: &str = "wgpu";
/// Bit pattern written into guard bands (a quiet NaN with a recognisable payload).
pub const GUARD_SENTINEL: u32 = 0x7FC0_DEAD;
/// Submit the pending encoder (without waiting) after this many dispatches.
const FLUSH_EVERY: u32 = 16;
/// The most commands one submission holds (its timer's queries): `Options::flush_every` is at
/// most this.
const MAX_SUBMIT: u32 = 128;
/// Bytes of the parameter block every dispatch pushes as immediate data (the shaders'
/// `var<immediate> p: P`, 16 words each).
const PARAM_BYTES: usize = 64;

/// `Options::free_list_bytes` by default: above what a 2048-token prefill chunk of the released
/// geometry leaves free across its size classes (its live peak is 1.18 GiB, but the freed
/// buffers of a chunk pass 2 GiB), so chunk after chunk reuses every buffer. Measured on an H100
/// (4-layer prefill of 4096 tokens, `FOVEA_WGPU_FREE_LIST_MIB`): 2 GiB 152 allocations
/// (456–457 ms), 3, 4 and 8 GiB 15 each (383–386 ms).
const FREE_LIST_BYTES: u64 = 3 << 30;

/// Bytes of weight uploads staged by `Queue::write_buffer` before the lane submits them and waits
/// for the copies ([`Options::staging_flush_bytes`]). wgpu keeps each write's staging buffer until
/// the submission that carries it has finished, and gpu-allocator puts staging in device-local
/// memory wherever the host can map it (resizable BAR: every NVIDIA datacenter card; all of a
/// unified-memory APU's), so a model loaded with no submit in between held its weights twice
/// until the first forward: 36 q2 layers (67.8 GiB) ran out of memory on an 80 GB H100.
const STAGING_FLUSH_BYTES: u64 = 256 << 20;

/// The byte size of the buffer an activation of `bytes` gets: rounded up to a multiple of an
/// eighth of the power of two at or below it (at most 12.5 % more), so that a tensor growing a
/// row at a time (the compressed entries and indexer keys a decode step appends to) reuses a
/// buffer for many steps instead of leaving one of every size it passes through.
pub fn size_class(bytes: u64) -> u64 {
    let step = (1u64 << (63 - bytes.max(1).leading_zeros())).max(32) / 8;
    bytes.next_multiple_of(step)
}

/// The prefill chunk of an adapter whose bindings hold at least [`WIDE_BINDING`] bytes
/// (`Backend::prefill_chunk`).
const WIDE_PREFILL_CHUNK: usize = 2048;
const WIDE_BINDING: u64 = 1 << 30;

/// Mesa's llvmpipe (lavapipe) ends every loop of a shader invocation, silently, once the
/// invocation has run 65 535 loop iterations in all (gallivm's `LP_MAX_TGSI_LOOP_ITERATIONS`,
/// "shared between every loop"; counted per SIMD vector of invocations, one for each pass through
/// a loop body, the pass that leaves the loop included, so the vector's longest-running lane
/// counts). Measured with Mesa 22.3: `sink_attention_serial` over a window of 1 000 keys of hd 70
/// (about 71 000 iterations) returned a denominator of a key or two. On a software adapter a
/// kernel runs only where an upper bound on its invocations' iterations, from the op's shapes (a
/// `*_iterations` function beside its dispatch), stays within this budget: half the limit, a
/// margin for what a bound may miss. An op without a variant within it returns
/// `Error::Unsupported` there ([`WgpuBackend::check_loop_budget`]).
///
/// The audit (2026-12-02) of every kernel's bound, at the model's sizes (LM: hidden 4096, 64
/// heads of 512, window 128, index top-k 512, experts of 2048, hc 4; ViT: 16 heads of 64, up to
/// 3 429 patches at the 384-token image budget; D ≤ 42 is a block decoder's own loops):
/// - no loops: the elementwise and copy ops, rope_2d, rope_tail, embed_rows (float), hc_expand,
///   hc_head_weights, sqrt_softplus, swiglu_clamp, hash_route;
/// - rms_norm, rms_norm_heads: 2⌈d/1024⌉ + 11 (19; four elements a thread a pass, 2026-12-04);
///   hc_pre_norm: ⌈d/256⌉(hc + 2) + 11 (107);
///   hc_pre, hc_post, route_weights, moe_sum: hc + 1 or top-k + 1 (7); hc_split: ≈ 2 000 (hc 4, 20 iterations), hc_split_pre_norm (2026-12-06) that plus
///   2·slices + hc·4 + 20 (≈ 2 100); compress_pool:
///   3(2·ratio + 1) (387); indexer_scores: (heads + 1)(hd + 2) (8 450; its few-row kernel
///   indexer_scores_rows: ⌈heads/64⌉(hd + 66), 194; its tiles for many rows, 2026-12-05,
///   `indexer_tile_iterations`: 53 190, past the budget, so a software adapter keeps the
///   thread-per-output kernel at the model's sizes); topk_rows: ≈ 450 up to
///   2 048 columns, then ≈ ⌈k/2048⌉(9⌈m/256⌉ + 550) (9 800 for the top 512 of a 1M-token
///   context's 262 144 entries); its few-row kernel topk_rows_rank (2026-12-04): ⌈m/256⌉·65 + 10
///   (≤ 530 at its 2 048 columns);
/// - the small-row kernels (rows.wgsl): ≈ 2 200 at k 8 192; linear's tiles (also grouped_linear's
///   and the prefill's experts'):
///   26(⌈k/16⌉ + 1) (float), (k/32)(D + 77) + 30 (block): ≤ 30 500 at the widest k, 8 192;
/// - attention (ViT, `attention_iterations`): 12 400; past the budget beyond 9 152 patches of
///   hd 64 (an image budget, `--image-max-tokens`, past ≈ 1 000 tokens): refused;
/// - sink_attention: the serial kernel where `serial_attention_iterations` fits, else the
///   workgroup kernel (`workgroup_attention_iterations`): 15 100 for a CSA query, 23 200 for an
///   image token's (512-key window and 512 picks, one tile); ≈ 37 a key past one tile of 1 024
///   keys (an HCA layer past ≈ 115 000 tokens of context, a CSA layer's image window past the
///   384-token image budget): refused. Its split kernel (few pairs, `split_attention_keys`, run
///   on a software adapter past the serial kernel's budget; 2026-12-04): (⌈hd/32⌉ + 1)·150 +
///   (⌈hd/256⌉ + 1)·900 + 150 (≈ 5 400 at hd 512, 9 600 at the lane's largest, 1 024). Its
///   head-group kernel for many pairs (`sink_attention_heads`, 2026-12-05) is not bounded here:
///   a software adapter runs it only when forced, on the tests' small cases.
///
/// The bounds count fixed-count loops too, as naga emits them; Mesa 22.3 unrolls many of those
/// before its limiter sees them (the ViT kernel still matched at a bound of 71 834), so they
/// over-count there.
pub(super) const SOFTWARE_LOOP_BUDGET: usize = 65_535 / 2;

/// Construction options. `Default` is what the CLI uses.
#[derive(Clone, Debug)]
pub struct Options {
    /// Adapter whose name contains this (case-insensitive); `None` picks the best GPU.
    pub adapter_name: Option<String>,
    /// Cap on the bytes of one storage binding, below the adapter's
    /// `max_storage_buffer_binding_size` (tests use tiny values to force weight chunking).
    pub max_binding_bytes: Option<u64>,
    /// Guard words appended to every activation output (0 = off). Diagnostic.
    pub guard_words: u32,
    /// Behave as a device without SHADER_F16 even when it has it: the integer-decode f16 kernel,
    /// and fast precision refused.
    pub force_f16_fallback: bool,
    /// Sum the small-row kernels' partials through workgroup memory even where the adapter has
    /// SUBGROUP (which is then not requested), so that reduction is tested there too. Diagnostic.
    pub force_workgroup_reduction: bool,
    /// Run `sink_attention` in the GPUs' workgroup kernels even on a software adapter, which
    /// otherwise gets one thread per (query, head) where that thread's loops fit lavapipe's loop
    /// limit (lm.wgsl's `sink_attention_serial`: faster there) and a workgroup per (query, head)
    /// where they do not, so that lavapipe tests the GPUs' kernels (split over keys for few
    /// pairs, `sink_attention_heads` for many) on every case. Diagnostic.
    pub force_workgroup_attention: bool,
    /// Run `sink_attention` where it is not split as a workgroup per (query, head)
    /// (`sink_attention`: what a software adapter runs past the serial kernel's budget) rather
    /// than a workgroup per query's head group (`sink_attention_heads`), so that kernel is tested
    /// on every case. Off by default; on when `FOVEA_WGPU_ATTENTION_PER_PAIR=1`, to time both in
    /// one build. Diagnostic.
    pub per_pair_attention: bool,
    /// In fast precision where the tiles run on cooperative matrices, `linear` from an f16 copy
    /// of each weight chunk (any format) and of x (`tile_coop_direct.wgsl`, linear.rs), rather
    /// than through tiles staged in workgroup memory element by element (`tile_coop.wgsl`). On by default; off when
    /// `FOVEA_WGPU_TILES_DIRECT=0`, to time both in one build. Diagnostic.
    pub direct_tiles: bool,
    /// The rows of x a workgroup of the direct tiles covers, forced: `Some(64)` (`main`, each
    /// subgroup 32 × 64 outputs) or `Some(128)` (`main_128`, 64 × 64 a subgroup, or `main_wide`
    /// where it takes k) for every shape, so either can be timed or tested on any; `None` (the
    /// default) takes 128 where `main_wide` takes k, else chooses by the rows of x (linear.rs,
    /// `direct_tile_rows`). `FOVEA_WGPU_DIRECT_TILE_ROWS=64` or `=128` forces
    /// one. Diagnostic.
    pub direct_tile_rows: Option<usize>,
    /// The direct tiles' 128-row workgroups with both operands staged in workgroup memory by
    /// 16-byte copies where k is a multiple of 32 (`main_wide` in tile_coop_direct.wgsl), rather
    /// than every matrix load straight from the copies (`main_128`). On by default; off when
    /// `FOVEA_WGPU_WIDE_TILES=0`, to time both in one build. Diagnostic.
    pub wide_tiles: bool,
    /// The ViT attention on cooperative matrices with its key and value tiles staged in
    /// workgroup memory by 16-byte copies (`attention_coop_wide`, 44 KiB of it, where the
    /// adapter has that much) rather than read straight from their copies
    /// (`attention_coop_direct`, 26 KiB). On by default; off when `FOVEA_WGPU_WIDE_ATTENTION=0`,
    /// to time both in one build. Diagnostic.
    pub wide_attention: bool,
    /// The indexer's scores for more than 8 query rows (`rows::SMALL_ROWS`) as tiles
    /// (`indexer_scores_tiles`) where their loops fit (every GPU) rather than a thread per score.
    /// On by default; off when `FOVEA_WGPU_INDEXER_TILES=0`, to time both in one build. Diagnostic.
    pub indexer_tiles: bool,
    /// Run fast precision's tiled GEMMs on f32 FMAs even where the adapter has cooperative
    /// matrices (`Tiles::Fma`), so such a device tests that path too. Diagnostic; on by default
    /// when `FOVEA_WGPU_FMA_TILES=1` (to time both in one build).
    pub force_fma_tiles: bool,
    /// Create the shader modules with wgpu's runtime checks (naga's index clamping and loop
    /// counters), which the lane otherwise leaves out of its own, harness-proven kernels. Off by
    /// default; on when `FOVEA_WGPU_CHECKED_SHADERS=1`. Diagnostic.
    pub checked_shaders: bool,
    /// Split a small-row linear with few columns over k (`rows::k_slice`). On by default; off
    /// when `FOVEA_WGPU_ROWS_SPLIT=0`, to time both in one build. Diagnostic.
    pub split_rows_k: bool,
    /// `linear_pair` of two weights `upload_weight_pair` placed together in one small-row
    /// dispatch (`linear_rows_pair`). On by default; off when `FOVEA_WGPU_PAIR_ROWS=0`, to time
    /// the two dispatches against it. Diagnostic.
    pub pair_rows: bool,
    /// `hc_mix_split` of at most 8 rows in two dispatches (`hc_mix_rows`, then hc_split over its
    /// slices) rather than the composition's four. On by default; off when
    /// `FOVEA_WGPU_FUSED_HC_MIX=0`, to time both. Diagnostic.
    pub fused_hc_mix: bool,
    /// One token's gate and up on int8 activations in one dispatch (`moe_gate_up_q8x`) where
    /// `upload_expert_pair` placed them in one binding, rather than two. On by default; off when
    /// `FOVEA_WGPU_FUSED_GATE_UP=0`, to time both. Diagnostic.
    pub fused_gate_up: bool,
    /// The Sinkhorn block of four streams (`hc_split`, `hc_split_pre_norm`) in one invocation's
    /// registers (lm.wgsl's `hc_sinkhorn4`) rather than spread over 16 with a workgroup barrier a
    /// step. On by default; off when `FOVEA_WGPU_SINKHORN_ONE=0`, to time both. Diagnostic.
    pub sinkhorn_one_invocation: bool,
    /// Split `sink_attention` over its keys where it has few (query, head) pairs (lm.rs). On by
    /// default; off when `FOVEA_WGPU_ATTENTION_SPLIT=0`, to time both in one build and to test
    /// the unsplit kernel on decode's shapes. Diagnostic.
    pub split_attention_keys: bool,
    /// Give every dispatch a compute pass of its own, as `kernel_times` must (its timestamps are
    /// a pass's), rather than keeping one pass open across consecutive dispatches. Off by
    /// default; on when `FOVEA_WGPU_PASS_PER_DISPATCH=1`, to time both in one build. Diagnostic.
    pub pass_per_dispatch: bool,
    /// Submit the pending encoder after this many commands (1..=`MAX_SUBMIT`; `FLUSH_EVERY` by
    /// default, `FOVEA_WGPU_FLUSH_EVERY=n` to time another). Diagnostic.
    pub flush_every: u32,
    /// Finish and submit encoders on a thread of their own (submit.rs) rather than on the thread
    /// that encoded them. On by default; off when `FOVEA_WGPU_SUBMIT_THREAD=0`, to time both in
    /// one build. Diagnostic.
    pub submit_thread: bool,
    /// In fast precision, one token's experts and widest linears in a [`formats::q8x_format`]
    /// take int8 activations (q8x.rs). On by default; off when `FOVEA_WGPU_Q8X=0`, to time both
    /// in one build. Diagnostic.
    pub q8x: bool,
    /// The narrowest weight a one-row linear takes the int8 kernel for (with `q8x`):
    /// `q8x::LINEAR_MIN_COLS` by default, `FOVEA_WGPU_Q8X_MIN_COLS=n` to time another; tests set
    /// it low to run the kernel on small cases. Diagnostic.
    pub q8x_linear_min_cols: usize,
    /// Invocations a team of the int8 kernels (8, 16 or 32; `q8x::team` picks from k by default),
    /// `FOVEA_WGPU_Q8X_TEAM=n` to time one size for every product (another value is ignored;
    /// set here, one the kernels do not take is an error at their first dispatch). Diagnostic.
    pub q8x_team: Option<usize>,
    /// How the GEMM kernels round their operands ([`Precision`]; `Exact` by default here, the CLI
    /// picks the adapter's default, [`default_precision`]). `Fast` needs SHADER_F16.
    pub precision: Precision,
    /// Size of one weight pool buffer; matrices (or chunks) over half of it get their own buffer.
    /// Small (4 MiB) so the unused tail of the last pool stays a negligible share of the weights.
    pub weight_pool_bytes: u64,
    /// Weight bytes written through `Queue::write_buffer` (whose staging wgpu holds until the
    /// write is submitted and done) after which the lane submits and waits: 256 MiB by default
    /// (`STAGING_FLUSH_BYTES`: why).
    pub staging_flush_bytes: u64,
    /// Recycle freed activation buffers of the same size class ([`size_class`]).
    pub reuse_buffers: bool,
    /// Bytes of freed activation buffers the free list holds at most: a buffer freed past it
    /// lets the least recently used sizes go first (a long decode leaves a buffer of every size
    /// its growing cache tensors passed through; a prefill's chunk-sized ones stay unused during
    /// decode). 3 GiB by default (`FREE_LIST_BYTES`), `FOVEA_WGPU_FREE_LIST_MIB=n` to time another.
    pub free_list_bytes: u64,
    /// How long `download`/`sync` wait for the device before reporting an error.
    pub wait_timeout: std::time::Duration,
    /// Time every dispatch on the device (`Backend::kernel_times`) where the adapter has
    /// timestamp queries: each dispatch then runs in a compute pass of its own (the timestamps
    /// are a pass's), which makes a run with many small dispatches slower than an untimed one.
    /// Diagnostic; on by default when `FOVEA_GPU_TIMES=1` (or `=grid`).
    pub kernel_times: bool,
    /// With `kernel_times`, sum the times by entry point and grid size (`"linear_rows ×64640"`:
    /// the workgroups of the dispatch), so that one op's dispatches of different shapes (a
    /// decode step's head and its layers' projections) come apart. Diagnostic; on by default
    /// when `FOVEA_GPU_TIMES=grid`.
    pub kernel_times_by_grid: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            adapter_name: None,
            max_binding_bytes: None,
            guard_words: 0,
            force_f16_fallback: false,
            force_workgroup_reduction: false,
            force_workgroup_attention: false,
            per_pair_attention: std::env::var("FOVEA_WGPU_ATTENTION_PER_PAIR").is_ok_and(|v| v == "1"),
            direct_tiles: std::env::var("FOVEA_WGPU_TILES_DIRECT").map_or(true, |v| v != "0"),
            direct_tile_rows: std::env::var("FOVEA_WGPU_DIRECT_TILE_ROWS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|r| [64, 128].contains(r)),
            wide_tiles: std::env::var("FOVEA_WGPU_WIDE_TILES").map_or(true, |v| v != "0"),
            wide_attention: std::env::var("FOVEA_WGPU_WIDE_ATTENTION").map_or(true, |v| v != "0"),
            indexer_tiles: std::env::var("FOVEA_WGPU_INDEXER_TILES").map_or(true, |v| v != "0"),
            force_fma_tiles: std::env::var("FOVEA_WGPU_FMA_TILES").is_ok_and(|v| v == "1"),
            checked_shaders: std::env::var("FOVEA_WGPU_CHECKED_SHADERS").is_ok_and(|v| v == "1"),
            split_rows_k: std::env::var("FOVEA_WGPU_ROWS_SPLIT").map_or(true, |v| v != "0"),
            pair_rows: std::env::var("FOVEA_WGPU_PAIR_ROWS").map_or(true, |v| v != "0"),
            fused_hc_mix: std::env::var("FOVEA_WGPU_FUSED_HC_MIX").map_or(true, |v| v != "0"),
            fused_gate_up: std::env::var("FOVEA_WGPU_FUSED_GATE_UP").map_or(true, |v| v != "0"),
            sinkhorn_one_invocation: std::env::var("FOVEA_WGPU_SINKHORN_ONE").map_or(true, |v| v != "0"),
            split_attention_keys: std::env::var("FOVEA_WGPU_ATTENTION_SPLIT").map_or(true, |v| v != "0"),
            pass_per_dispatch: std::env::var("FOVEA_WGPU_PASS_PER_DISPATCH").is_ok_and(|v| v == "1"),
            flush_every: std::env::var("FOVEA_WGPU_FLUSH_EVERY")
                .ok()
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(FLUSH_EVERY),
            submit_thread: std::env::var("FOVEA_WGPU_SUBMIT_THREAD").map_or(true, |v| v != "0"),
            q8x: std::env::var("FOVEA_WGPU_Q8X").map_or(true, |v| v != "0"),
            q8x_linear_min_cols: std::env::var("FOVEA_WGPU_Q8X_MIN_COLS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(q8x::LINEAR_MIN_COLS),
            q8x_team: std::env::var("FOVEA_WGPU_Q8X_TEAM")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|t| q8x::TEAMS.contains(t)),
            precision: Precision::Exact,
            weight_pool_bytes: 4 << 20,
            staging_flush_bytes: STAGING_FLUSH_BYTES,
            reuse_buffers: true,
            free_list_bytes: std::env::var("FOVEA_WGPU_FREE_LIST_MIB")
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .map_or(FREE_LIST_BYTES, |mib| mib.saturating_mul(1 << 20)),
            wait_timeout: std::time::Duration::from_secs(600),
            kernel_times: std::env::var("FOVEA_GPU_TIMES").is_ok_and(|v| v == "1" || v == "grid"),
            kernel_times_by_grid: std::env::var("FOVEA_GPU_TIMES").is_ok_and(|v| v == "grid"),
        }
    }
}

type PipelineKey = (Shader, &'static str, u32);

/// The commands encoded since the last submit.
#[derive(Default)]
struct Pending {
    /// The compute pass consecutive dispatches share (`encoder`'s, which it locks until dropped:
    /// every other command and the submit end it first; declared first so it drops first).
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    dispatches: u32,
}

/// The wgpu lane.
pub struct WgpuBackend {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    opts: Options,
    /// Effective per-binding byte limit.
    max_binding: u64,
    native_f16: bool,
    /// How the small-row kernels reduce (subgroups where the device has them).
    reduction: Reduction,
    /// The tiled GEMMs' math in fast precision ([`Tiles::Coop`] where the adapter has it,
    /// [`Self::coop_tiles`]).
    tiles: Tiles,
    modules: Mutex<HashMap<Shader, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
    bind_groups: Mutex<bind_groups::BindGroups>,
    pending: Mutex<Pending>,
    /// Finishes and submits the encoders `pending` fills, in order.
    submitter: submit::Submitter,
    /// Held while a thread blocks on the device (download, sync).
    sync_lock: Mutex<()>,
    shared: Arc<Shared>,
    pools: Mutex<Vec<Pool>>,
    errors: Arc<Mutex<Vec<String>>>,
    /// Per-kernel device times (`FOVEA_GPU_TIMES=1`).
    timer: Option<timing::PassTimer>,
    /// Source of guard-band fills (guard_words sentinels), when guards are on.
    sentinel: Option<wgpu::Buffer>,
    /// Bound in place of an absent bias.
    dummy: wgpu::Buffer,
    /// The IQ/FP4 lookup tables the block decoders read (`formats::table_words`), uploaded once.
    lut: wgpu::Buffer,
    /// cos/sin tables of rope_2d (rope.rs).
    rope_tables: Mutex<rope::Tables>,
}

/// Whether `adapter` can run `shaders/tile_coop.wgsl`: cooperative matrices with a subgroup-scope
/// 16×16×16 f16 → f32 configuration, and subgroups of exactly 32 invocations (the body splits its
/// 256 invocations into 8 subgroups), and the tiles' workgroup memory. NVIDIA under Vulkan has
/// them; RADV's subgroups may be 32 or 64 and lavapipe has no cooperative matrices, so they take
/// the FMA tiles.
fn coop_tiles_fit(adapter: &wgpu::Adapter) -> bool {
    use wgpu::CooperativeScalarType::{F16, F32};
    let info = adapter.get_info();
    adapter.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.limits().max_compute_workgroup_storage_size >= Tiles::COOP_WORKGROUP_BYTES
        && adapter
            .cooperative_matrix_properties()
            .iter()
            .any(|c| (c.m_size, c.n_size, c.k_size) == (16, 16, 16) && c.ab_type == F16 && c.cr_type == F32)
}

fn device_err(e: impl std::fmt::Display) -> Error {
    Error::Device(e.to_string())
}

/// An input of a [`WgpuBackend::per_element`] op: the name a binding-limit error gives it, the
/// binding its shader reads it at, and the tensor.
type Input<'a> = (&'static str, u32, &'a WgpuTensor);

/// The output of a [`WgpuBackend::per_element`] op: the binding its shader writes it at, its
/// shape and dtype.
struct Output {
    binding: u32,
    shape: Vec<usize>,
    dtype: DType,
}

/// `workgroups` (at least one) laid out as `(gx, gy, 1)` with `gx` ≤ 32768 and `gx·gy` ≥
/// `workgroups`; the shaders number a workgroup `wg.y·gx + wg.x`.
fn grid(workgroups: usize) -> (u32, u32, u32) {
    let workgroups = workgroups.max(1);
    let gx = workgroups.min(32768);
    (gx as u32, workgroups.div_ceil(gx) as u32, 1)
}

impl WgpuBackend {
    /// A software rasterizer (lavapipe, SwiftShader): it runs on the CPU threads the CPU lane
    /// would use, far slower than that lane, so `auto` passes it over.
    pub fn is_software(&self) -> bool {
        self.info.device_type == wgpu::DeviceType::Cpu
    }

    /// Open an adapter: the first whose name contains `adapter_name` (case-insensitive), else the
    /// best one (discrete > integrated > virtual > CPU such as lavapipe).
    pub fn new(adapter_name: Option<&str>) -> Result<Self> {
        Self::with_options(Options { adapter_name: adapter_name.map(str::to_owned), ..Options::default() })
    }

    pub fn with_options(opts: Options) -> Result<Self> {
        let _one = DEVICE_CREATION.lock().unwrap_or_else(|e| e.into_inner());
        Self::on_adapter(select_adapter(opts.adapter_name.as_deref())?, opts)
    }

    /// The lane as the command line opens it: the adapter whose name contains `adapter_name`
    /// (else the best one), in `precision`, or when `None` in the adapter's default
    /// ([`default_precision`]).
    pub fn open(adapter_name: Option<&str>, precision: Option<Precision>) -> Result<Self> {
        let _one = DEVICE_CREATION.lock().unwrap_or_else(|e| e.into_inner());
        let adapter = select_adapter(adapter_name)?;
        let precision = precision.unwrap_or_else(|| default_precision(&adapter.get_info(), adapter.features()));
        let opts = Options { adapter_name: adapter_name.map(str::to_owned), precision, ..Options::default() };
        Self::on_adapter(adapter, opts)
    }

    fn on_adapter(adapter: wgpu::Adapter, mut opts: Options) -> Result<Self> {
        // a submission's timer queries hold at most MAX_SUBMIT commands
        opts.flush_every = opts.flush_every.clamp(1, MAX_SUBMIT);
        let info = adapter.get_info();
        let limits = adapter.limits();
        // every dispatch pushes its parameters as immediate data (PARAM_BYTES; bind_groups.rs
        // says why): Vulkan's push constants, Metal's and DX12's root constants
        if !adapter.features().contains(wgpu::Features::IMMEDIATES) || limits.max_immediate_size < PARAM_BYTES as u32 {
            return Err(Error::Unsupported {
                lane: LANE,
                op: "device",
                what: format!(
                    "{}: the lane pushes {PARAM_BYTES} bytes of immediate data a dispatch; this adapter offers {} \
                     (wgpu feature IMMEDIATES: {})",
                    describe(&info),
                    limits.max_immediate_size,
                    adapter.features().contains(wgpu::Features::IMMEDIATES)
                ),
            });
        }
        let mut features = wgpu::Features::IMMEDIATES;
        let has_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        if has_f16 {
            features |= wgpu::Features::SHADER_F16;
        }
        if adapter.features().contains(wgpu::Features::SUBGROUP) && !opts.force_workgroup_reduction {
            features |= wgpu::Features::SUBGROUP;
        }
        if opts.kernel_times && adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
            features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let coop = opts.precision == Precision::Fast
            && !opts.force_fma_tiles
            && has_f16
            && features.contains(wgpu::Features::SUBGROUP)
            && coop_tiles_fit(&adapter);
        if coop {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        if opts.precision == Precision::Fast && (!has_f16 || opts.force_f16_fallback) {
            let why = if has_f16 { "has but Options::force_f16_fallback turns off" } else { "lacks" };
            return Err(Error::Unsupported {
                lane: LANE,
                op: "precision",
                what: format!(
                    "fast on {}: its f16 GEMM operands need SHADER_F16, which this adapter {why} \
                     (use --precision exact)",
                    describe(&info)
                ),
            });
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("fovea"),
            required_features: features,
            required_limits: limits.clone(),
            // SAFETY: wgpu's experimental features are only requested for cooperative matrices,
            // whose kernels the op harness checks on such a device (FOVEA_REQUIRE_COOP_TILES).
            experimental_features: if coop {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| Error::Device(format!("{}: request_device failed: {e}", describe(&info))))?;

        let errors: Arc<Mutex<Vec<String>>> = Arc::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| sink.lock().unwrap().push(e.to_string())));

        let mut max_binding = limits.max_storage_buffer_binding_size as u64;
        if let Some(cap) = opts.max_binding_bytes {
            max_binding = max_binding.min(cap.max(4));
        }
        let native_f16 = features.contains(wgpu::Features::SHADER_F16) && !opts.force_f16_fallback;
        let reduction =
            if features.contains(wgpu::Features::SUBGROUP) { Reduction::Subgroup } else { Reduction::Workgroup };
        let sentinel = (opts.guard_words > 0).then(|| {
            let words = vec![GUARD_SENTINEL; opts.guard_words as usize];
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("guard sentinel"),
                contents: bytemuck::cast_slice(&words),
                usage: wgpu::BufferUsages::COPY_SRC,
            })
        });
        let dummy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("dummy"),
            size: 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let lut = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("block-format lookup tables"),
            contents: bytemuck::cast_slice(&formats::table_words()),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let shared = Arc::new(Shared {
            counters: Counters { clock: HostClock::from_env(), ..Counters::default() },
            free: Mutex::default(),
            reuse: opts.reuse_buffers,
            free_cap: opts.free_list_bytes,
            released: AtomicU64::default(),
        });
        let timer =
            if opts.kernel_times { timing::PassTimer::new(&device, &queue, opts.kernel_times_by_grid) } else { None };
        let submitter = submit::Submitter::new(&device, &queue, &shared, &errors, opts.submit_thread);
        Ok(Self {
            timer,
            submitter,
            queue,
            info,
            limits,
            max_binding,
            native_f16,
            reduction,
            tiles: if coop { Tiles::Coop } else { Tiles::Fma },
            opts,
            modules: Mutex::default(),
            pipelines: Mutex::default(),
            bind_groups: Mutex::default(),
            pending: Mutex::default(),
            sync_lock: Mutex::default(),
            shared,
            pools: Mutex::default(),
            errors,
            sentinel,
            dummy,
            lut,
            rope_tables: Mutex::default(),
            device,
        })
    }

    pub fn options(&self) -> &Options {
        &self.opts
    }
    /// Effective per-binding byte limit (adapter limit, capped by `Options::max_binding_bytes`).
    pub fn max_binding_bytes(&self) -> u64 {
        self.max_binding
    }
    /// Whether F16 weights use the native `array<vec2<f16>>` kernel (SHADER_F16 and not forced off).
    pub fn native_f16(&self) -> bool {
        self.native_f16
    }
    /// How the small-row kernels sum their partials on this device.
    pub fn reduction(&self) -> Reduction {
        self.reduction
    }
    /// Whether fast precision's tiled GEMMs run on cooperative matrices here ([`Tiles::Coop`]).
    pub fn coop_tiles(&self) -> bool {
        self.tiles == Tiles::Coop
    }
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }
    /// Bytes of freed activation buffers kept for reuse (not in `memory().activation_bytes`).
    pub fn cached_bytes(&self) -> u64 {
        self.shared.counters.cached.load(Ordering::Relaxed)
    }
    /// Bind groups made so far: launches whose bindings the cache had no group for
    /// (bind_groups.rs). Diagnostic.
    pub fn bind_groups_made(&self) -> u64 {
        self.bind_groups.lock().unwrap().made
    }
    /// Bytes in the live allocations of wgpu's memory allocator (gpu-allocator's report: weights,
    /// activations and the staging of queue writes alike), where the backend keeps one (Vulkan,
    /// DX12). Diagnostic.
    pub fn allocated_bytes(&self) -> Option<u64> {
        self.device.generate_allocator_report().map(|r| r.total_allocated_bytes)
    }
    /// Release the recycled activation buffers.
    pub fn trim(&self) {
        self.shared.empty_free_list(&mut self.shared.free.lock().unwrap());
    }

    // ---- diagnostics ---------------------------------------------------------------------------

    fn read_back(&self, t: &WgpuTensor, from: u64, len: u64) -> Result<Vec<u8>> {
        let size = len.max(4);
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("download"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        if len > 0 {
            self.with_encoder(|enc| enc.copy_buffer_to_buffer(&t.buf, t.offset + from, &staging, 0, len));
        }
        let _one = self.sync_lock.lock().unwrap();
        self.submit_pending();
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        let mut mapped = None;
        self.shared.counters.clock.wait(|| {
            self.wait_until("download", || {
                mapped = rx.try_recv().ok();
                mapped.is_some()
            })
        })?;
        mapped.unwrap().map_err(|e| Error::Device(format!("mapping the download buffer failed: {e}")))?;
        let out = staging.get_mapped_range(..).map_err(device_err)?[..len as usize].to_vec();
        staging.unmap();
        Ok(out)
    }

    /// Check that nothing wrote past the end of `t` (its guard band still holds the sentinel).
    /// Ok when guards are off or `t` has none.
    pub fn check_guards(&self, t: &WgpuTensor) -> Result<()> {
        if t.guard_words == 0 {
            return Ok(());
        }
        let raw = self.read_back(t, t.bytes, t.guard_words as u64 * 4)?;
        let words: &[u32] = bytemuck::cast_slice(&raw);
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

    /// Test hook: a kernel writes `value` at element `index` of `t`'s buffer, guard band included
    /// (`index >= numel` simulates an out-of-bounds write).
    #[doc(hidden)]
    pub fn debug_poke(&self, t: &WgpuTensor, index: u32, value: u32) -> Result<()> {
        if index as u64 * 4 >= t.bind_bytes() {
            return Err(Error::Invalid(format!("debug_poke: index {index} is outside the buffer of {t:?}")));
        }
        self.dispatch(Shader::Debug, "poke", 0, &[index, value], &[(1, t.binding())], (1, 1, 1))
    }

    fn unsupported(op: Op, what: impl Into<String>) -> Error {
        Error::Unsupported { lane: LANE, op: op.name(), what: what.into() }
    }

    /// On a software adapter, `Error::Unsupported` for `op` (its operands as `shape` says) when
    /// one invocation of its kernel may loop `iterations` times, past [`SOFTWARE_LOOP_BUDGET`]:
    /// lavapipe would end the loops early and return a wrong result without an error. Ok on
    /// every other adapter.
    fn check_loop_budget(&self, op: Op, iterations: usize, shape: impl FnOnce() -> String) -> Result<()> {
        if !self.is_software() || iterations <= SOFTWARE_LOOP_BUDGET {
            return Ok(());
        }
        Err(Self::unsupported(
            op,
            format!(
                "{} on the software adapter {}: one invocation of its kernel may loop {iterations} times, past the \
                 {SOFTWARE_LOOP_BUDGET} this lane allows for Mesa lavapipe's loop limiter (which silently ends a \
                 shader invocation's loops after 65 535 iterations)",
                shape(),
                self.info.name
            ),
        ))
    }
}

/// [`Backend::capacity`] of a device on wgpu's Vulkan backend, read through wgpu-hal.
#[cfg(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd"))]
fn vulkan_capacity(device: &wgpu::Device) -> Option<Capacity> {
    use ash::vk;
    // SAFETY: only queries of the physical device are made through the hal handles, which stay
    // alive while the guard is held; nothing is created or destroyed.
    unsafe {
        let hal = device.as_hal::<wgpu::hal::api::Vulkan>()?;
        let instance = hal.shared_instance().raw_instance();
        let physical = hal.raw_physical_device();
        let props = instance.get_physical_device_memory_properties(physical);
        let heaps = props.memory_heaps_as_slice();
        let (index, heap) = heaps
            .iter()
            .enumerate()
            .filter(|(_, h)| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
            .max_by_key(|(_, h)| h.size)?;
        let version_1_1 = hal.shared_instance().instance_api_version() >= vk::API_VERSION_1_1
            && instance.get_physical_device_properties(physical).api_version >= vk::API_VERSION_1_1;
        let free = if version_1_1 && hal.enabled_device_extensions().contains(&ash::ext::memory_budget::NAME) {
            let mut budget = vk::PhysicalDeviceMemoryBudgetPropertiesEXT::default();
            let mut props2 = vk::PhysicalDeviceMemoryProperties2::default().push_next(&mut budget);
            instance.get_physical_device_memory_properties2(physical, &mut props2);
            budget.heap_budget[index].saturating_sub(budget.heap_usage[index])
        } else {
            heap.size
        };
        Some(Capacity { free_bytes: free, total_bytes: heap.size })
    }
}

#[cfg(not(any(windows, target_os = "linux", target_os = "android", target_os = "freebsd")))]
fn vulkan_capacity(_device: &wgpu::Device) -> Option<Capacity> {
    None
}

impl Backend for WgpuBackend {
    type Tensor = WgpuTensor;
    type Weight = WgpuWeight;

    fn lane(&self) -> &'static str {
        LANE
    }

    fn device_name(&self) -> String {
        let i = &self.info;
        let tiles = if self.coop_tiles() { "; GEMM tiles on cooperative matrices" } else { "" };
        format!("{} ({:?}, {:?}; driver {} {}{tiles})", i.name, i.backend, i.device_type, i.driver, i.driver_info)
    }

    /// Every weight format is read inside the kernels that take weights (block formats through
    /// their `shaders/dequant/` builds), so only the op matters.
    fn supports(&self, op: Op, _format: WeightFormat) -> bool {
        match op {
            Op::Attention | Op::AttentionRope2d => {
                self.limits.max_compute_workgroup_storage_size >= attention::SHARED_BYTES
            }
            // every other op, the language-model ones included (shaders/lm.wgsl)
            _ => true,
        }
    }

    fn memory(&self) -> MemoryReport {
        let c = &self.shared.counters;
        MemoryReport {
            weight_bytes: c.weight.load(Ordering::Relaxed),
            matrix_bytes: c.matrix.load(Ordering::Relaxed),
            activation_bytes: c.activation.load(Ordering::Relaxed),
            peak_activation_bytes: c.peak.load(Ordering::Relaxed),
        }
    }

    /// On Vulkan, the largest device-local heap (the GPU's memory; lavapipe's is host memory):
    /// its size, and as free bytes the driver's budget less this process's usage when the device
    /// has `VK_EXT_memory_budget` enabled (wgpu enables it where offered), else the whole heap.
    /// wgpu has no such query of its own; other backends answer `None`.
    fn capacity(&self) -> Option<Capacity> {
        vulkan_capacity(&self.device)
    }

    fn launches(&self) -> Option<u64> {
        Some(self.shared.counters.commands.load(Ordering::Relaxed))
    }

    /// [`WIDE_PREFILL_CHUNK`] tokens where a binding holds [`WIDE_BINDING`] bytes, else the
    /// default: the prefill's projections and experts are 64-row tiles, which more rows a forward
    /// keep fuller (an H200 under Vulkan, 2 layers of the released geometry in the q2 mix, a
    /// 4096-token prefill: 9.31 s in chunks of 512, 3.08 s in chunks of 2048). A forward's largest
    /// activations grow with the chunk (the experts' gathered rows, 2048 · 6 × 4096 f32 = 192 MiB
    /// at the released geometry), past lavapipe's 128 MiB binding.
    fn prefill_chunk(&self) -> usize {
        if self.max_binding >= WIDE_BINDING { WIDE_PREFILL_CHUNK } else { crate::backend::PREFILL_CHUNK }
    }

    fn host_profile(&self) -> Option<HostProfile> {
        let made = self.bind_groups_made();
        self.shared.counters.clock.profile().map(|p| HostProfile { bind_groups: made, ..p })
    }

    fn kernel_times(&self) -> Result<Option<Vec<KernelTime>>> {
        self.pass_times()
    }

    /// Any host tensor → an activation buffer from the free list (elements, then the guard band
    /// when on), filled by a copy encoded with the pending work. An empty tensor's buffer holds
    /// whatever it held before (nothing reads it).
    fn upload(&self, host: &HostTensor) -> Result<WgpuTensor> {
        let (raw, dtype): (&[u8], DType) = match &host.data {
            HostData::F32(v) => (bytemuck::cast_slice(v), DType::F32),
            HostData::I32(v) => (bytemuck::cast_slice(v), DType::I32),
        };
        if host.shape.is_empty() {
            return Err(Error::shape("upload", "a tensor needs at least one dimension"));
        }
        self.check_binding("upload", "tensor", raw.len() as u64)?;
        // an activation buffer (the free list's, guard band written by alloc), filled by a copy
        // encoded in order with the pending dispatches: a decode step's uploads (token ids,
        // positions, windows) then reuse the buffers of the step before and the dispatches that
        // bind them find their bind groups cached (a buffer made per upload missed them every
        // step). Not `Queue::write_buffer`: it runs before the pending commands at their submit,
        // which may still read the buffer's former tensor.
        let t = self.alloc("upload", host.shape.clone(), dtype)?;
        if !raw.is_empty() {
            let staging = self.shared.counters.clock.copy(|| {
                self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some("upload"),
                    contents: raw,
                    usage: wgpu::BufferUsages::COPY_SRC,
                })
            });
            self.with_encoder(|enc| enc.copy_buffer_to_buffer(&staging, 0, &t.buf, t.offset, raw.len() as u64));
        }
        Ok(t)
    }

    /// A model parameter → a weight pool (counted as weight memory, no guard band).
    fn upload_param(&self, host: &HostTensor) -> Result<WgpuTensor> {
        let (raw, dtype): (&[u8], DType) = match &host.data {
            HostData::F32(v) => (bytemuck::cast_slice(v), DType::F32),
            HostData::I32(v) => (bytemuck::cast_slice(v), DType::I32),
        };
        if host.shape.is_empty() {
            return Err(Error::shape("upload_param", "a tensor needs at least one dimension"));
        }
        self.pooled_tensor(raw, host.shape.clone(), dtype, "upload_param")
    }

    /// W `[rows, cols]` → row chunks in weight pools, in the checkpoint's bytes, each row padded to
    /// a 4-byte stride (16-bit rows to an even length, block rows by at most 3 bytes).
    fn upload_weight(&self, w: &HostWeight<'_>) -> Result<WgpuWeight> {
        w.validate()?;
        let row_bytes = w.format.row_bytes(w.cols);
        let stride_words = formats::stride_words(w.format, w.cols);
        let padded_row = (stride_words * 4) as u64;
        if padded_row > self.max_binding {
            return Err(Self::unsupported(
                Op::Linear,
                format!(
                    "weight `{}`: one row of {padded_row} bytes exceeds the binding limit of {} bytes",
                    w.name, self.max_binding
                ),
            ));
        }
        let mut per_chunk = ((self.max_binding / padded_row.max(1)) as usize).max(1);
        if per_chunk >= 64 {
            per_chunk -= per_chunk % 64; // whole output tiles per chunk
        }
        let mut chunks = Vec::new();
        let mut row0 = 0;
        while row0 < w.rows || (w.rows == 0 && chunks.is_empty()) {
            let rows = per_chunk.min(w.rows - row0);
            let src = &w.bytes[row0 * row_bytes..(row0 + rows) * row_bytes];
            let bytes = Self::weight_alloc_bytes(w.format, rows, w.cols);
            let (buf, offset) = self.alloc_weight(bytes);
            self.shared.counters.matrix.fetch_add(bytes, Ordering::Relaxed);
            self.write_rows(&buf, offset, src, row_bytes, padded_row as usize)?;
            chunks.push(WeightChunk { buf, offset, bytes, row0, rows });
            row0 += rows;
            if w.rows == 0 {
                break;
            }
        }
        Ok(WgpuWeight {
            name: w.name.clone(),
            format: w.format,
            rows: w.rows,
            cols: w.cols,
            stride_words,
            chunks,
            exact: false,
            shared: self.shared.clone(),
        })
    }

    /// Both weights in one binding, b's rows from row `rows::PairSpan::b_row` (a's rows rounded
    /// up to an offset the storage alignment allows), so that `linear_pair`'s small-row path
    /// takes them in one dispatch ([`rows::PairSpan`]): where they share a format and a width,
    /// a has an even number of rows (a workgroup's column pair never straddles the two) and the
    /// span fits one binding; else one `upload_weight` each.
    fn upload_weight_pair(&self, a: &HostWeight<'_>, b: &HostWeight<'_>) -> Result<(WgpuWeight, WgpuWeight)> {
        a.validate()?;
        b.validate()?;
        let (format, cols) = (a.format, a.cols);
        let stride_words = formats::stride_words(format, cols);
        let padded_row = stride_words as u64 * 4;
        let b_row = (a.rows as u64).next_multiple_of(self.aligned_rows_unit(padded_row));
        let span = (b_row + b.rows as u64).saturating_mul(padded_row);
        let together = (b.format, b.cols) == (format, cols)
            && a.rows > 0
            && b.rows > 0
            && a.rows.is_multiple_of(2)
            && padded_row > 0
            && span <= self.max_binding
            && span <= self.limits.max_buffer_size;
        if !together {
            return Ok((self.upload_weight(a)?, self.upload_weight(b)?));
        }
        let (buf, offset) = self.alloc_weight(span);
        Ok((self.weight_at(&buf, offset, a)?, self.weight_at(&buf, offset + b_row * padded_row, b)?))
    }

    /// Each projection's experts in one buffer, equally spaced at offsets the storage alignment
    /// allows, when they fit one binding ([`rows::ExpertSpan`]); else (or for an expert whose
    /// format or shape differs from the first's) one `upload_weight` each.
    fn upload_experts<'s>(
        &self,
        count: usize,
        expert: &mut dyn FnMut(usize) -> Result<HostWeight<'s>>,
    ) -> Result<Vec<WgpuWeight>> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let first = expert(0)?;
        self.upload_experts_from(count, first, expert)
    }

    /// The gate's and the up's experts in one buffer, the up's after the gate's as if they were
    /// experts `count..2·count` of one projection, where both are alike (format and shape) and
    /// together fit one binding: one token's gate and up then take one dispatch
    /// (`moe_gate_up_q8x`, linear.rs). Else each projection as `upload_experts` places it.
    fn upload_expert_pair<'s>(
        &self,
        count: usize,
        gate: &mut dyn FnMut(usize) -> Result<HostWeight<'s>>,
        up: &mut dyn FnMut(usize) -> Result<HostWeight<'s>>,
    ) -> Result<(Vec<WgpuWeight>, Vec<WgpuWeight>)> {
        if count == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let (g0, u0) = (gate(0)?, up(0)?);
        let shape = |w: &HostWeight<'_>| (w.format, w.rows, w.cols);
        if shape(&g0) != shape(&u0) || self.experts_layout(g0.format, g0.rows, g0.cols, 2 * count).is_none() {
            return Ok((self.upload_experts_from(count, g0, gate)?, self.upload_experts_from(count, u0, up)?));
        }
        let mut u0 = Some(u0);
        let mut both = |j: usize| match (j.checked_sub(count), u0.take_if(|_| j == count)) {
            (None, _) => gate(j),
            (Some(_), Some(w)) => Ok(w),
            (Some(i), None) => up(i),
        };
        let mut all = self.upload_experts_from(2 * count, g0, &mut both)?;
        let ups = all.split_off(count);
        Ok((all, ups))
    }

    fn upload_weight_exact(&self, w: &HostWeight<'_>) -> Result<WgpuWeight> {
        let mut weight = self.upload_weight(w)?;
        weight.exact = true;
        Ok(weight)
    }

    fn precision(&self) -> Precision {
        self.opts.precision
    }

    /// Every row padded to the 4-byte stride the shaders address (`formats::stride_words`).
    fn weight_alloc_bytes(format: WeightFormat, rows: usize, cols: usize) -> u64 {
        rows as u64 * formats::stride_words(format, cols) as u64 * 4
    }

    fn download(&self, t: &WgpuTensor) -> Result<HostTensor> {
        let raw = self.read_back(t, 0, t.bytes)?;
        self.check_guards(t)?;
        self.shared.order_free_list();
        match t.dtype {
            DType::F32 => HostTensor::f32(t.shape.clone(), bytemuck::pod_collect_to_vec(&raw)),
            DType::I32 => HostTensor::i32(t.shape.clone(), bytemuck::pod_collect_to_vec(&raw)),
        }
    }

    fn sync(&self) -> Result<()> {
        WgpuBackend::sync(self)
    }

    // ==== ops: each hands over to the method of its name in its shader family's file =========

    // ---- linear.rs ---------------------------------------------------------------------------
    fn linear(&self, x: &WgpuTensor, w: &WgpuWeight, bias: Option<&WgpuTensor>) -> Result<WgpuTensor> {
        self.linear(x, w, bias)
    }
    fn linear_pair(&self, x: &WgpuTensor, wa: &WgpuWeight, wb: &WgpuWeight) -> Result<(WgpuTensor, WgpuTensor)> {
        self.linear_pair(x, wa, wb)
    }
    fn grouped_linear(&self, x: &WgpuTensor, w: &WgpuWeight, groups: usize) -> Result<WgpuTensor> {
        self.grouped_linear(x, w, groups)
    }
    fn moe_experts(
        &self,
        x: &WgpuTensor,
        ids: &WgpuTensor,
        weights: &WgpuTensor,
        w1: &[WgpuWeight],
        w3: &[WgpuWeight],
        w2: &[WgpuWeight],
        limit: f32,
    ) -> Result<WgpuTensor> {
        self.moe_experts(x, ids, weights, w1, w3, w2, limit)
    }

    // ---- elementwise.rs ----------------------------------------------------------------------
    fn add(&self, a: &WgpuTensor, b: &WgpuTensor) -> Result<WgpuTensor> {
        self.add(a, b)
    }
    fn swiglu(&self, x: &WgpuTensor) -> Result<WgpuTensor> {
        self.swiglu(x)
    }
    fn gelu_erf(&self, x: &WgpuTensor) -> Result<WgpuTensor> {
        self.gelu_erf(x)
    }

    // ---- copy.rs -----------------------------------------------------------------------------
    fn slice_cols(&self, x: &WgpuTensor, start: usize, len: usize) -> Result<WgpuTensor> {
        self.slice_cols(x, start, len)
    }
    fn concat_rows(&self, a: &WgpuTensor, b: &WgpuTensor) -> Result<WgpuTensor> {
        self.concat_rows(a, b)
    }
    fn gather_rows(&self, src: &WgpuTensor, idx: &WgpuTensor) -> Result<WgpuTensor> {
        self.gather_rows(src, idx)
    }
    fn unfold(&self, x: &WgpuTensor, h: usize, w: usize, r: usize) -> Result<WgpuTensor> {
        self.unfold(x, h, w, r)
    }

    // ---- norm.rs -----------------------------------------------------------------------------
    fn rms_norm(&self, x: &WgpuTensor, weight: &WgpuTensor, eps: f32) -> Result<WgpuTensor> {
        self.rms_norm(x, weight, eps)
    }

    // ---- rope.rs -----------------------------------------------------------------------------
    fn rope_2d(&self, x: &WgpuTensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<WgpuTensor> {
        self.rope_2d(x, n_heads, grid_w, theta)
    }

    // ---- attention.rs ------------------------------------------------------------------------
    fn attention(&self, q: &WgpuTensor, k: &WgpuTensor, v: &WgpuTensor, n_heads: usize) -> Result<WgpuTensor> {
        self.attention(q, k, v, n_heads)
    }

    // ---- lm.rs -------------------------------------------------------------------------------
    fn embed_rows(&self, table: &WgpuWeight, ids: &WgpuTensor) -> Result<WgpuTensor> {
        self.embed_rows(table, ids)
    }
    fn hc_expand(&self, x: &WgpuTensor, hc: usize) -> Result<WgpuTensor> {
        self.hc_expand(x, hc)
    }
    fn rms_norm_heads(&self, x: &WgpuTensor, n_heads: usize, eps: f32) -> Result<WgpuTensor> {
        self.rms_norm_heads(x, n_heads, eps)
    }
    fn hc_pre(&self, x: &WgpuTensor, w: &WgpuTensor, hc: usize) -> Result<WgpuTensor> {
        self.hc_pre(x, w, hc)
    }
    fn hc_pre_norm(
        &self,
        x: &WgpuTensor,
        w: &WgpuTensor,
        hc: usize,
        weight: &WgpuTensor,
        eps: f32,
    ) -> Result<WgpuTensor> {
        self.hc_pre_norm(x, w, hc, weight, eps)
    }
    fn hc_post(&self, x: &WgpuTensor, f: &WgpuTensor, split: &WgpuTensor) -> Result<WgpuTensor> {
        self.hc_post(x, f, split)
    }
    fn hc_head_weights(&self, mix: &WgpuTensor, scale: &WgpuTensor, base: &WgpuTensor, eps: f32) -> Result<WgpuTensor> {
        self.hc_head_weights(mix, scale, base, eps)
    }
    fn sqrt_softplus(&self, x: &WgpuTensor) -> Result<WgpuTensor> {
        self.sqrt_softplus(x)
    }
    fn hash_route(&self, table: &WgpuTensor, ids: &WgpuTensor, fallback: &WgpuTensor) -> Result<WgpuTensor> {
        self.hash_route(table, ids, fallback)
    }
    fn route_weights(&self, scores: &WgpuTensor, ids: &WgpuTensor, scale: f32) -> Result<WgpuTensor> {
        self.route_weights(scores, ids, scale)
    }
    fn route_experts(
        &self,
        logits: &WgpuTensor,
        bias: &WgpuTensor,
        kind: &WgpuTensor,
        hash: Option<(&WgpuTensor, &WgpuTensor)>,
        k: usize,
        scale: f32,
    ) -> Result<(WgpuTensor, WgpuTensor)> {
        self.route_experts(logits, bias, kind, hash, k, scale)
    }
    fn swiglu_clamp(&self, g: &WgpuTensor, u: &WgpuTensor, limit: f32) -> Result<WgpuTensor> {
        self.swiglu_clamp(g, u, limit)
    }
    fn shared_expert(
        &self,
        x: &WgpuTensor,
        w1: &WgpuWeight,
        w3: &WgpuWeight,
        w2: &WgpuWeight,
        limit: f32,
        routed: &WgpuTensor,
    ) -> Result<WgpuTensor> {
        self.shared_expert(x, w1, w3, w2, limit, routed)
    }
    fn rope_tail(
        &self,
        x: &WgpuTensor,
        n_heads: usize,
        inv_freq: &WgpuTensor,
        pos0: usize,
        stride: usize,
        inverse: bool,
    ) -> Result<WgpuTensor> {
        self.rope_tail(x, n_heads, inv_freq, pos0, stride, inverse)
    }
    fn rope_tail_at(
        &self,
        x: &WgpuTensor,
        n_heads: usize,
        inv_freq: &WgpuTensor,
        positions: &WgpuTensor,
        inverse: bool,
    ) -> Result<WgpuTensor> {
        self.rope_tail_at(x, n_heads, inv_freq, positions, inverse)
    }
    fn rms_norm_rope(
        &self,
        x: &WgpuTensor,
        weight: Option<&WgpuTensor>,
        n_heads: usize,
        eps: f32,
        inv_freq: &WgpuTensor,
        positions: &WgpuTensor,
    ) -> Result<WgpuTensor> {
        self.rms_norm_rope(x, weight, n_heads, eps, inv_freq, positions)
    }
    fn hc_split(
        &self,
        mix: &WgpuTensor,
        scale: &WgpuTensor,
        base: &WgpuTensor,
        hc: usize,
        iters: usize,
        eps: f32,
    ) -> Result<WgpuTensor> {
        self.hc_split(mix, scale, base, hc, iters, eps)
    }
    fn hc_mix_split(
        &self,
        x: &WgpuTensor,
        mix: &WgpuWeight,
        scale: &WgpuTensor,
        base: &WgpuTensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
    ) -> Result<WgpuTensor> {
        self.hc_mix_split(x, mix, scale, base, hc, iters, eps, norm_eps)
    }
    fn hc_mix_split_pre_norm(
        &self,
        x: &WgpuTensor,
        mix: &WgpuWeight,
        scale: &WgpuTensor,
        base: &WgpuTensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
        weight: &WgpuTensor,
    ) -> Result<(WgpuTensor, WgpuTensor)> {
        self.hc_mix_split_pre_norm(x, mix, scale, base, hc, iters, eps, norm_eps, weight)
    }
    fn compress_pool(
        &self,
        kv: &WgpuTensor,
        gate: &WgpuTensor,
        ape: &WgpuTensor,
        ratio: usize,
        overlap: bool,
    ) -> Result<WgpuTensor> {
        self.compress_pool(kv, gate, ape, ratio, overlap)
    }
    fn indexer_scores(
        &self,
        q: &WgpuTensor,
        k: &WgpuTensor,
        w: &WgpuTensor,
        n_heads: usize,
        scale: f32,
        pos0: usize,
        ratio: usize,
    ) -> Result<WgpuTensor> {
        self.indexer_scores(q, k, w, n_heads, scale, pos0, ratio)
    }
    fn topk_rows(&self, x: &WgpuTensor, k: usize) -> Result<WgpuTensor> {
        self.topk_rows(x, k)
    }
    fn sink_attention(
        &self,
        q: &WgpuTensor,
        kv: &WgpuTensor,
        window: &WgpuTensor,
        comp: Option<(&WgpuTensor, &WgpuTensor)>,
        sinks: &WgpuTensor,
        n_heads: usize,
    ) -> Result<WgpuTensor> {
        self.sink_attention(q, kv, window, comp, sinks, n_heads)
    }
    fn sink_attention_rope(
        &self,
        q: &WgpuTensor,
        kv: &WgpuTensor,
        window: &WgpuTensor,
        comp: Option<(&WgpuTensor, &WgpuTensor)>,
        sinks: &WgpuTensor,
        n_heads: usize,
        inv_freq: &WgpuTensor,
        positions: &WgpuTensor,
    ) -> Result<WgpuTensor> {
        self.sink_attention_rope(q, kv, window, comp, sinks, n_heads, inv_freq, positions)
    }
}
