//! wgpu lane: the model graph on WGSL compute shaders (Vulkan, Metal, DX12, or Mesa lavapipe).
//!
//! - Ops encode compute passes into one pending command encoder; only `download` (and the
//!   diagnostics) submit and wait. The encoder is also submitted, without waiting, every
//!   `FLUSH_EVERY` dispatches so command buffers stay small.
//! - Pipelines are created lazily, once per (shader, entry point, weight format), and cached.
//! - Weights keep their checkpoint format on the device (f32, f16, bf16, and every block format,
//!   decoded inside the kernels: see formats.rs and `shaders/dequant/`) and are sub-allocated
//!   from pool buffers at offsets aligned to `min_storage_buffer_offset_alignment`. Rows of 16-bit
//!   formats are padded to an even element count (one zero element for odd `cols`), and rows of
//!   block formats to a multiple of 4 bytes, so every row starts on a 32-bit word; the pad is
//!   counted in the memory report. A matrix larger than the
//!   binding limit is split into row chunks, each bound on its own and written into its own
//!   output columns by `linear`.
//! - Activations are buffers of their own (recycled through a free list by exact size); an
//!   activation larger than the binding limit is an `Error::Device` naming the op.
//! - Guard bands (`Options::guard_words`): every activation output gets extra words filled with
//!   `GUARD_SENTINEL` before the op; `check_guards` / `download` report a write past the end.
//! - F16 weights: `shaders/linear_f16.wgsl` (`array<vec2<f16>>`) when the device has SHADER_F16,
//!   else `linear.wgsl` with an exact integer half→f32 decode (not `unpack2x16float`, which needs
//!   naga's SHADER_FLOAT16_IN_FLOAT32 capability and may flush subnormals). BF16: `u << 16`.
//! - Precision (`Options::precision`): every GEMM kernel (linear, grouped_linear, the experts'
//!   gate/up/down; float and block formats) is built twice, with `shaders/operands_exact.wgsl`
//!   (f32 operands) and with `shaders/operands_fast.wgsl` (each operand rounded to the nearest
//!   f16, f16 tiles, f32 accumulation), which needs SHADER_F16. A weight uploaded with
//!   `upload_weight_exact` (router, hyper-connection mixes) always takes the exact build; norms,
//!   softmax, attention, routing and the residual stream have one (f32) build.
//! - `gather_rows` bounds-checks every index in the shader: an index outside `0..m` yields a row
//!   of NaN (loud downstream) and never reads out of bounds.
//! - `rope_2d` takes its cos/sin table from the host (f32, the reference's recipe), cached per
//!   grid and counted as weight memory while cached.
//! - Threads: the backend is `Sync`; submissions keep encoding order across threads and blocking
//!   waits are serialised. Validation errors surface at the next `download`/`sync`/`flush` of any
//!   thread. On the NVIDIA driver, creating a second device while another thread works on a first
//!   one was seen to deadlock, so device creation is serialised here and tests that open extra
//!   devices run alone.

use std::borrow::Cow;
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use wgpu::util::DeviceExt;

pub mod formats;
use formats::BlockKernel;

use crate::backend::checks::{self, NamedWeight};
use crate::backend::{
    Backend, Capacity, DType, DeviceTensor, DeviceWeight, HostData, HostTensor, HostWeight, MemoryReport, Op,
    Precision, WeightFormat,
};
use crate::error::{Error, Result};

const LANE: &str = "wgpu";
/// Bit pattern written into guard bands (a quiet NaN with a recognisable payload).
pub const GUARD_SENTINEL: u32 = 0x7FC0_DEAD;
/// Submit the pending encoder (without waiting) after this many dispatches.
const FLUSH_EVERY: u32 = 128;
/// Bytes of the uniform parameter block every dispatch gets.
const PARAM_BYTES: usize = 64;
/// Workgroup memory the attention kernel needs (see shaders/attention.wgsl).
const ATTENTION_SHARED_BYTES: u32 = (2048 + 4096 + 512) * 4;
const ATTENTION_MAX_HD: usize = 128;

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
    /// How the GEMM kernels round their operands ([`Precision`]; `Exact` by default here, the CLI
    /// picks the adapter's default, [`default_precision`]). `Fast` needs SHADER_F16.
    pub precision: Precision,
    /// Size of one weight pool buffer; matrices (or chunks) over half of it get their own buffer.
    /// Small (4 MiB) so the unused tail of the last pool stays a negligible share of the weights.
    pub weight_pool_bytes: u64,
    /// Recycle freed activation buffers of the same size.
    pub reuse_buffers: bool,
    /// How long `download`/`sync` wait for the device before reporting an error.
    pub wait_timeout: std::time::Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            adapter_name: None,
            max_binding_bytes: None,
            guard_words: 0,
            force_f16_fallback: false,
            precision: Precision::Exact,
            weight_pool_bytes: 4 << 20,
            reuse_buffers: true,
            wait_timeout: std::time::Duration::from_secs(600),
        }
    }
}

#[derive(Default)]
struct Counters {
    weight: AtomicU64,
    /// Bytes of the weight matrices inside the pools (the part of `weight` they fill).
    matrix: AtomicU64,
    activation: AtomicU64,
    peak: AtomicU64,
    cached: AtomicU64,
}

impl Counters {
    fn add_activation(&self, bytes: u64) {
        let now = self.activation.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
}

/// State shared between the backend and its tensors (so a dropped tensor can give its buffer
/// back and be uncounted).
struct Shared {
    counters: Counters,
    free: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
    reuse: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Own buffer, counted as activation memory, returned to the free list on drop.
    Activation,
    /// Sub-allocated from a weight pool (params); the pool is counted as weight memory.
    Pooled,
    /// Own buffer holding a constant table (rope cos/sin); counted as weight memory until dropped.
    Table,
}

/// A device tensor: a buffer range plus shape and dtype. Activations are freed (recycled) on drop.
pub struct WgpuTensor {
    buf: wgpu::Buffer,
    offset: u64,
    /// Bytes of the elements (numel · 4).
    bytes: u64,
    /// Guard words after the elements (activations only).
    guard_words: u32,
    /// Bytes counted in the memory report for this tensor (activations: the buffer size).
    counted: u64,
    role: Role,
    shape: Vec<usize>,
    dtype: DType,
    /// Op that produced this tensor (for guard-band messages).
    producer: &'static str,
    shared: Arc<Shared>,
}

impl WgpuTensor {
    fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The op that wrote this tensor ("upload", "linear", ...).
    pub fn producer(&self) -> &'static str {
        self.producer
    }
    /// Bytes the binding of this tensor covers (elements plus guard band).
    fn bind_bytes(&self) -> u64 {
        (self.bytes + self.guard_words as u64 * 4).max(4)
    }
    fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buf,
            offset: self.offset,
            size: NonZeroU64::new(self.bind_bytes()),
        })
    }
}

impl Drop for WgpuTensor {
    fn drop(&mut self) {
        let c = &self.shared.counters;
        match self.role {
            Role::Pooled => return,
            Role::Table => {
                c.weight.fetch_sub(self.counted, Ordering::Relaxed);
                return;
            }
            Role::Activation => {}
        }
        c.activation.fetch_sub(self.counted, Ordering::Relaxed);
        if self.shared.reuse {
            c.cached.fetch_add(self.buf.size(), Ordering::Relaxed);
            let mut free = self.shared.free.lock().unwrap();
            free.entry(self.buf.size()).or_default().push(self.buf.clone());
        }
    }
}

impl std::fmt::Debug for WgpuTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuTensor({} {:?} from {})", self.dtype, self.shape, self.producer)
    }
}

impl DeviceTensor for WgpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

/// One row chunk of a weight matrix: rows `row0..row0+rows` at `offset` in `buf`.
struct WeightChunk {
    buf: wgpu::Buffer,
    offset: u64,
    bytes: u64,
    row0: usize,
    rows: usize,
}

/// A weight matrix `[rows, cols]` in its storage format, possibly split into row chunks.
pub struct WgpuWeight {
    name: String,
    format: WeightFormat,
    rows: usize,
    cols: usize,
    /// 32-bit words per (padded) row.
    stride_words: usize,
    chunks: Vec<WeightChunk>,
    /// Uploaded by `upload_weight_exact`: its products stay f32 in fast precision.
    exact: bool,
}

impl WgpuWeight {
    /// Number of separately bound row chunks (1 unless the matrix exceeds the binding limit).
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }
    /// Device bytes of the (row-padded) matrix.
    pub fn device_bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.bytes).sum()
    }
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl DeviceWeight for WgpuWeight {
    fn format(&self) -> WeightFormat {
        self.format
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

impl NamedWeight for WgpuWeight {
    fn name(&self) -> &str {
        &self.name
    }
}

struct Pool {
    buf: wgpu::Buffer,
    used: u64,
}

/// A shader module. The GEMM kernels carry the precision of their operands (operands file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Shader {
    Linear(Precision),
    LinearF16(Precision),
    Elementwise,
    Copy,
    Norm,
    Rope,
    Attention,
    Debug,
    /// lm.wgsl: its GEMM ops run from the build of their weight's precision, every other entry
    /// point from the exact build.
    Lm(Precision),
    /// A kernel over block-format weights, built for one format (formats.rs).
    Block(BlockKernel, WeightFormat, Precision),
}

/// The operands file of a GEMM build: its label and WGSL (see `shaders/operands_exact.wgsl`).
fn operands_part(precision: Precision) -> (&'static str, &'static str) {
    match precision {
        Precision::Exact => ("operands_exact.wgsl", include_str!("../../../shaders/operands_exact.wgsl")),
        Precision::Fast => ("operands_fast.wgsl", include_str!("../../../shaders/operands_fast.wgsl")),
    }
}

/// The directives a build starts with: `enable f16;` when any of its parts uses f16 (WGSL wants
/// every directive before the first declaration, so the parts themselves carry none).
fn directives(uses_f16: bool) -> &'static str {
    if uses_f16 { "enable f16;\n" } else { "" }
}

impl Shader {
    /// A label naming the shader's files, and its WGSL.
    fn source(self) -> Result<(String, Cow<'static, str>)> {
        let fixed = |label: &str, src: &'static str| Ok((label.to_owned(), Cow::Borrowed(src)));
        // A GEMM build: its directives, the weight-format part (if any), the operands file of
        // the precision, then the body; (file, WGSL) pairs.
        let gemm = |format_uses_f16: bool, format: Option<(&str, &str)>, body: (&str, &str), precision: Precision| {
            let parts: Vec<(&str, &str)> = format.into_iter().chain([operands_part(precision), body]).collect();
            let label = parts.iter().map(|(file, _)| *file).collect::<Vec<_>>().join(" + ");
            let mut src = directives(format_uses_f16 || precision == Precision::Fast).to_owned();
            parts.iter().for_each(|(_, text)| src += text);
            Ok((label, Cow::Owned(src)))
        };
        const TILE: (&str, &str) = ("linear_tile.wgsl", include_str!("../../../shaders/linear_tile.wgsl"));
        const PACKED: (&str, &str) = ("linear_packed.wgsl", include_str!("../../../shaders/linear_packed.wgsl"));
        const F16: (&str, &str) = ("linear_f16.wgsl", include_str!("../../../shaders/linear_f16.wgsl"));
        const LM: (&str, &str) = ("lm.wgsl", include_str!("../../../shaders/lm.wgsl"));
        match self {
            Shader::Linear(precision) => gemm(false, Some(PACKED), TILE, precision),
            Shader::LinearF16(precision) => gemm(true, Some(F16), TILE, precision),
            Shader::Elementwise => fixed("elementwise.wgsl", include_str!("../../../shaders/elementwise.wgsl")),
            Shader::Copy => fixed("copy.wgsl", include_str!("../../../shaders/copy.wgsl")),
            Shader::Norm => fixed("norm.wgsl", include_str!("../../../shaders/norm.wgsl")),
            Shader::Rope => fixed("rope.wgsl", include_str!("../../../shaders/rope.wgsl")),
            Shader::Attention => fixed("attention.wgsl", include_str!("../../../shaders/attention.wgsl")),
            Shader::Debug => fixed("debug.wgsl", include_str!("../../../shaders/debug.wgsl")),
            Shader::Lm(precision) => gemm(false, None, LM, precision),
            Shader::Block(kernel, format, precision) => match formats::block_shader_source(format, kernel, precision) {
                Some((label, src)) => Ok((label, Cow::Owned(src))),
                None => Err(Error::Device(format!("{}: {format} is not a block format", kernel.file()))),
            },
        }
    }
}

impl Shader {
    /// The pipeline-override constants of a pipeline of this shader created with `fmt`: `FMT`
    /// for `linear_packed.wgsl` (f32, bf16, f16 fallback); the others read `fmt`, if at all,
    /// from their parameter block.
    fn constants(self, fmt: u32) -> Vec<(&'static str, f64)> {
        match self {
            Shader::Linear(_) => vec![("FMT", f64::from(fmt))],
            _ => Vec::new(),
        }
    }

    /// The shaders no weight format chooses: one module each, created with `fmt` 0.
    const FIXED: [Shader; 6] =
        [Shader::Elementwise, Shader::Copy, Shader::Norm, Shader::Rope, Shader::Attention, Shader::Debug];

    /// Exhaustive on purpose: a new shader fails to compile here until it is in [`Self::FIXED`]
    /// or chosen by [`linear_shader`] / [`lm_weight_shader`], so [`shader_builds`] lists it.
    #[allow(dead_code)]
    fn listed(self) {
        match self {
            Shader::Elementwise | Shader::Copy | Shader::Norm | Shader::Rope | Shader::Attention | Shader::Debug => {}
            Shader::Linear(_) | Shader::LinearF16(_) | Shader::Lm(_) | Shader::Block(..) => {}
        }
    }

    /// Every (shader, `fmt`) the lane creates pipelines from, and whether it is built only with
    /// SHADER_F16 (`native_f16`): the weight kernels come from the same choices the ops make
    /// ([`linear_shader`], [`lm_weight_shader`]) for every weight format, in both precisions with
    /// SHADER_F16 and in exact precision without it (fast needs it); pairs that build the same
    /// module and constants are listed once.
    fn every_build() -> Vec<(Shader, u32, bool)> {
        let mut with = Vec::new();
        let mut without = Vec::new();
        for (native_f16, precisions, list) in
            [(true, &[Precision::Exact, Precision::Fast][..], &mut with), (false, &[Precision::Exact], &mut without)]
        {
            for &precision in precisions {
                for f in WeightFormat::ALL {
                    list.push(linear_shader(f, native_f16, precision));
                    list.push(lm_weight_shader(f, precision));
                }
            }
            list.extend(Shader::FIXED.map(|s| (s, 0)));
        }
        let mut builds: Vec<(Shader, u32, bool)> = Vec::new();
        for &(s, fmt) in with.iter().chain(&without) {
            if !builds.iter().any(|&(b, bf, _)| b == s && b.constants(bf) == s.constants(fmt)) {
                let f16_only = !without.iter().any(|&(b, bf)| b == s && b.constants(bf) == s.constants(fmt));
                builds.push((s, fmt, f16_only));
            }
        }
        builds
    }
}

/// One shader module the lane builds, with the override constants of one pipeline
/// specialisation of it (see [`shader_builds`]).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct ShaderBuild {
    /// The files it is built from, and the constants (`... [FMT=2]`) when it has any.
    pub label: String,
    /// The WGSL exactly as the lane passes it to `create_shader_module`.
    pub source: Cow<'static, str>,
    /// The pipeline-override constants exactly as the lane passes them to the pipeline.
    pub constants: Vec<(&'static str, f64)>,
    /// Built only on a device with SHADER_F16 when `force_f16_fallback` is off; every other build
    /// is also what a device without SHADER_F16 builds.
    pub needs_f16: bool,
}

/// Every shader module the lane can build, one entry per set of override constants, from the
/// same source-building code as the lane's pipelines: the fixed shaders, the float weight
/// kernels with and without SHADER_F16 (`force_f16_fallback`), and each block format's builds,
/// the weight kernels in both precisions (fast only with SHADER_F16).
/// For `tests/wgsl.rs`, which translates them with naga to MSL and HLSL.
#[doc(hidden)]
pub fn shader_builds() -> Result<Vec<ShaderBuild>> {
    Shader::every_build()
        .into_iter()
        .map(|(shader, fmt, needs_f16)| {
            let (mut label, source) = shader.source()?;
            let constants = shader.constants(fmt);
            if !constants.is_empty() {
                let c: Vec<String> = constants.iter().map(|(k, v)| format!("{k}={v}")).collect();
                label += &format!(" [{}]", c.join(", "));
            }
            Ok(ShaderBuild { label, source, constants, needs_f16 })
        })
        .collect()
}

type PipelineKey = (Shader, &'static str, u32);

#[derive(Default)]
struct Pending {
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
    modules: Mutex<HashMap<Shader, wgpu::ShaderModule>>,
    pipelines: Mutex<HashMap<PipelineKey, wgpu::ComputePipeline>>,
    pending: Mutex<Pending>,
    /// Held while a thread blocks on the device (download, sync).
    sync_lock: Mutex<()>,
    shared: Arc<Shared>,
    pools: Mutex<Vec<Pool>>,
    errors: Arc<Mutex<Vec<String>>>,
    /// Source of guard-band fills (guard_words sentinels), when guards are on.
    sentinel: Option<wgpu::Buffer>,
    /// Bound in place of an absent bias.
    dummy: wgpu::Buffer,
    /// The IQ/FP4 lookup tables the block decoders read (`formats::table_words`), uploaded once.
    lut: wgpu::Buffer,
    /// cos/sin tables of rope_2d keyed by (n, grid_w, hd, theta bits).
    rope_tables: Mutex<HashMap<(usize, usize, usize, u32), Arc<WgpuTensor>>>,
}

fn device_err(e: impl std::fmt::Display) -> Error {
    Error::Device(e.to_string())
}

fn type_rank(t: wgpu::DeviceType) -> u32 {
    match t {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        _ => 3,
    }
}

fn describe(info: &wgpu::AdapterInfo) -> String {
    format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

/// Names of the adapters wgpu finds on this machine (for error messages and `--list`).
pub fn list_adapters() -> Vec<String> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
        .iter()
        .map(|a| describe(&a.get_info()))
        .collect()
}

/// One device creation at a time in this process (driver creation paths are not all thread-safe
/// against each other).
static DEVICE_CREATION: Mutex<()> = Mutex::new(());

/// The first adapter whose name contains `name` (case-insensitive), else the best one (discrete >
/// integrated > virtual > CPU such as lavapipe).
fn select_adapter(name: Option<&str>) -> Result<wgpu::Adapter> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
    let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
    if adapters.is_empty() {
        return Err(Error::Device(
            "no wgpu adapter found; install a Vulkan driver or Mesa lavapipe (mesa-vulkan-drivers)".into(),
        ));
    }
    match name {
        Some(want) => {
            let w = want.to_lowercase();
            match adapters.iter().find(|a| a.get_info().name.to_lowercase().contains(&w)) {
                Some(a) => Ok(a.clone()),
                None => {
                    let found: Vec<String> = adapters.iter().map(|a| describe(&a.get_info())).collect();
                    Err(Error::Device(format!("no wgpu adapter name contains `{want}`; found: {}", found.join(", "))))
                }
            }
        }
        None => Ok(adapters.iter().min_by_key(|a| type_rank(a.get_info().device_type)).unwrap().clone()),
    }
}

/// The precision the command line runs an adapter in when none is asked for: fast on a GPU with
/// SHADER_F16 (the default for GPU lanes), exact on a software adapter (lavapipe,
/// SwiftShader: the conformance device of CI, where f16 operands buy no speed) and on one
/// without SHADER_F16 (which cannot run fast).
pub fn default_precision(info: &wgpu::AdapterInfo, features: wgpu::Features) -> Precision {
    if info.device_type != wgpu::DeviceType::Cpu && features.contains(wgpu::Features::SHADER_F16) {
        Precision::Fast
    } else {
        Precision::Exact
    }
}

fn f32_bytes(v: &[f32]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn groups_1d(threads: usize) -> (u32, u32) {
    let g = threads.div_ceil(256).max(1);
    let gx = g.min(32768);
    (gx as u32, g.div_ceil(gx) as u32)
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

    fn on_adapter(adapter: wgpu::Adapter, opts: Options) -> Result<Self> {
        let info = adapter.get_info();
        let limits = adapter.limits();
        let mut features = wgpu::Features::empty();
        let has_f16 = adapter.features().contains(wgpu::Features::SHADER_F16);
        if has_f16 {
            features |= wgpu::Features::SHADER_F16;
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
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
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
        let shared =
            Arc::new(Shared { counters: Counters::default(), free: Mutex::default(), reuse: opts.reuse_buffers });
        Ok(Self {
            device,
            queue,
            info,
            limits,
            max_binding,
            native_f16,
            opts,
            modules: Mutex::default(),
            pipelines: Mutex::default(),
            pending: Mutex::default(),
            sync_lock: Mutex::default(),
            shared,
            pools: Mutex::default(),
            errors,
            sentinel,
            dummy,
            lut,
            rope_tables: Mutex::default(),
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
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.info
    }
    /// Bytes of freed activation buffers kept for reuse (not in `memory().activation_bytes`).
    pub fn cached_bytes(&self) -> u64 {
        self.shared.counters.cached.load(Ordering::Relaxed)
    }
    /// Release the recycled activation buffers.
    pub fn trim(&self) {
        let mut free = self.shared.free.lock().unwrap();
        free.clear();
        self.shared.counters.cached.store(0, Ordering::Relaxed);
    }

    // ---- errors, submission ---------------------------------------------------------------

    fn take_errors(&self) -> Result<()> {
        let mut errs = self.errors.lock().unwrap();
        if errs.is_empty() {
            return Ok(());
        }
        let msg = errs.join("; ");
        errs.clear();
        Err(Error::Device(format!("wgpu reported: {msg}")))
    }

    /// Submit the pending encoder. The lock is held across `submit` so that submissions from
    /// several threads reach the queue in the order their commands were encoded.
    fn submit_pending(&self) {
        let mut p = self.pending.lock().unwrap();
        p.dispatches = 0;
        if let Some(enc) = p.encoder.take() {
            self.queue.submit([enc.finish()]);
        }
    }

    /// Poll in bounded waits until `done` says so or `Options::wait_timeout` passes. Callers hold
    /// `sync_lock`, so one thread at a time blocks on the device.
    fn wait_until(&self, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
        let start = std::time::Instant::now();
        loop {
            match self.device.poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: Some(std::time::Duration::from_millis(500)),
            }) {
                Ok(_) | Err(wgpu::PollError::Timeout) => {}
                Err(e) => return Err(Error::Device(format!("{what}: {e}"))),
            }
            self.take_errors()?;
            if done() {
                return Ok(());
            }
            if start.elapsed() > self.opts.wait_timeout {
                return Err(Error::Device(format!(
                    "{what}: the device did not finish within {:?}",
                    self.opts.wait_timeout
                )));
            }
        }
    }

    /// Submit pending work without waiting.
    pub fn flush(&self) -> Result<()> {
        self.submit_pending();
        self.take_errors()
    }

    /// Submit pending work and wait for the device to finish it.
    pub fn sync(&self) -> Result<()> {
        let _one = self.sync_lock.lock().unwrap();
        self.submit_pending();
        let (tx, rx) = std::sync::mpsc::channel();
        self.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        self.wait_until("sync", || rx.try_recv().is_ok())
    }

    fn with_encoder(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let flush = {
            let mut p = self.pending.lock().unwrap();
            let enc = p.encoder.get_or_insert_with(|| {
                self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("fovea ops") })
            });
            f(enc);
            p.dispatches += 1;
            p.dispatches >= FLUSH_EVERY
        };
        if flush {
            self.submit_pending();
            let _ = self.device.poll(wgpu::PollType::Poll);
        }
    }

    // ---- pipelines ---------------------------------------------------------------------------

    fn pipeline(&self, shader: Shader, entry: &'static str, fmt: u32) -> Result<wgpu::ComputePipeline> {
        let key = (shader, entry, fmt);
        if let Some(p) = self.pipelines.lock().unwrap().get(&key) {
            return Ok(p.clone());
        }
        let (file, src) = shader.source()?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = {
            let mut modules = self.modules.lock().unwrap();
            modules
                .entry(shader)
                .or_insert_with(|| {
                    self.device.create_shader_module(wgpu::ShaderModuleDescriptor {
                        label: Some(&file),
                        source: wgpu::ShaderSource::Wgsl(src),
                    })
                })
                .clone()
        };
        let constants = shader.constants(fmt);
        let pipeline = self.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(entry),
            layout: None,
            module: &module,
            entry_point: Some(entry),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                zero_initialize_workgroup_memory: false,
            },
            cache: None,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Device(format!("{file}:{entry}: pipeline creation failed: {e}")));
        }
        self.pipelines.lock().unwrap().insert(key, pipeline.clone());
        Ok(pipeline)
    }

    /// Encode one dispatch of `shader::entry` with a uniform parameter block at binding 0.
    fn dispatch(
        &self,
        shader: Shader,
        entry: &'static str,
        fmt: u32,
        params: &[u32],
        bindings: &[(u32, wgpu::BindingResource<'_>)],
        groups: (u32, u32, u32),
    ) -> Result<()> {
        let pipeline = self.pipeline(shader, entry, fmt)?;
        let mut block = [0u32; PARAM_BYTES / 4];
        block[..params.len()].copy_from_slice(params);
        let ubuf = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: bytemuck::cast_slice(&block),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let mut entries = vec![wgpu::BindGroupEntry { binding: 0, resource: ubuf.as_entire_binding() }];
        entries.extend(bindings.iter().map(|(b, r)| wgpu::BindGroupEntry { binding: *b, resource: r.clone() }));
        if let Shader::Block(_, format, _) = shader
            && formats::uses_tables(format)
        {
            entries.push(wgpu::BindGroupEntry {
                binding: formats::TABLES_BINDING,
                resource: self.lut.as_entire_binding(),
            });
        }
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(entry),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        self.with_encoder(|enc| {
            let mut pass =
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(entry), timestamp_writes: None });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        });
        Ok(())
    }

    // ---- allocation ----------------------------------------------------------------------------

    fn check_binding(&self, op: &'static str, what: &str, bytes: u64) -> Result<()> {
        if bytes > self.max_binding {
            return Err(Error::Device(format!(
                "op `{op}`: {what} of {bytes} bytes exceeds the storage binding limit of {} bytes on {}",
                self.max_binding, self.info.name
            )));
        }
        Ok(())
    }

    /// Each input fits one storage binding of this device (its shapes are `checks`' to judge).
    fn check_inputs<'a>(
        &self,
        op: &'static str,
        inputs: impl IntoIterator<Item = (&'a str, &'a WgpuTensor)>,
    ) -> Result<()> {
        inputs.into_iter().try_for_each(|(what, t)| self.check_binding(op, what, t.bytes))
    }

    fn make_tensor(&self, buf: wgpu::Buffer, shape: Vec<usize>, dtype: DType, producer: &'static str) -> WgpuTensor {
        let counted = buf.size();
        self.shared.counters.add_activation(counted);
        let bytes = shape.iter().product::<usize>() as u64 * 4;
        WgpuTensor {
            buf,
            offset: 0,
            bytes,
            guard_words: self.opts.guard_words,
            counted,
            role: Role::Activation,
            shape,
            dtype,
            producer,
            shared: self.shared.clone(),
        }
    }

    /// A new activation output of `shape` (contents undefined; guard band filled when on).
    fn alloc(&self, op: &'static str, shape: Vec<usize>, dtype: DType) -> Result<WgpuTensor> {
        let bytes = shape.iter().product::<usize>() as u64 * 4;
        self.check_binding(op, "output", bytes)?;
        let guard = self.opts.guard_words as u64 * 4;
        let size = (bytes + guard).max(4);
        let reused = if self.shared.reuse {
            let mut free = self.shared.free.lock().unwrap();
            free.get_mut(&size).and_then(Vec::pop)
        } else {
            None
        };
        let buf = match reused {
            Some(b) => {
                self.shared.counters.cached.fetch_sub(size, Ordering::Relaxed);
                b
            }
            None => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(op),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        if let Some(s) = &self.sentinel {
            self.with_encoder(|enc| enc.copy_buffer_to_buffer(s, 0, &buf, bytes, guard));
        }
        Ok(self.make_tensor(buf, shape, dtype, op))
    }

    /// Sub-allocate `bytes` of weight memory: from a pool (first fit), or a buffer of its own when
    /// larger than half a pool. Returns the buffer and the aligned offset.
    fn alloc_weight(&self, bytes: u64) -> (wgpu::Buffer, u64) {
        let size = bytes.max(4).next_multiple_of(4);
        let usage = wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC;
        let pool_bytes = self.opts.weight_pool_bytes.min(self.limits.max_buffer_size).max(4);
        let counters = &self.shared.counters;
        if size > pool_bytes / 2 {
            let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("weight"),
                size,
                usage,
                mapped_at_creation: false,
            });
            counters.weight.fetch_add(size, Ordering::Relaxed);
            return (buf, 0);
        }
        let align = self.limits.min_storage_buffer_offset_alignment as u64;
        let mut pools = self.pools.lock().unwrap();
        for pool in pools.iter_mut() {
            let off = pool.used.next_multiple_of(align);
            if off + size <= pool.buf.size() {
                pool.used = off + size;
                return (pool.buf.clone(), off);
            }
        }
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("weight pool"),
            size: pool_bytes.next_multiple_of(4),
            usage,
            mapped_at_creation: false,
        });
        counters.weight.fetch_add(buf.size(), Ordering::Relaxed);
        pools.push(Pool { buf: buf.clone(), used: size });
        (buf, 0)
    }

    fn pooled_tensor(
        &self,
        host_bytes: &[u8],
        shape: Vec<usize>,
        dtype: DType,
        producer: &'static str,
    ) -> Result<WgpuTensor> {
        let bytes = host_bytes.len() as u64;
        self.check_binding(producer, "parameter", bytes)?;
        let (buf, offset) = self.alloc_weight(bytes);
        if !host_bytes.is_empty() {
            self.queue.write_buffer(&buf, offset, host_bytes);
        }
        Ok(WgpuTensor {
            buf,
            offset,
            bytes,
            guard_words: 0,
            counted: 0,
            role: Role::Pooled,
            shape,
            dtype,
            producer,
            shared: self.shared.clone(),
        })
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
        self.wait_until("download", || {
            mapped = rx.try_recv().ok();
            mapped.is_some()
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

    fn rope_table(&self, n: usize, grid_w: usize, hd: usize, theta: f32) -> Result<Arc<WgpuTensor>> {
        let key = (n, grid_w, hd, theta.to_bits());
        if let Some(t) = self.rope_tables.lock().unwrap().get(&key) {
            return Ok(t.clone());
        }
        // Same f32 arithmetic as the reference: inv_freq = 1/θ^(2j/half), angle = pos·inv_freq.
        let half = hd / 2;
        let quarter = hd / 4;
        let inv_freq: Vec<f32> = (0..quarter).map(|j| 1.0 / theta.powf((2 * j) as f32 / half as f32)).collect();
        let mut tab = vec![0f32; 2 * n * half];
        for r in 0..n {
            let (row, col) = ((r / grid_w) as f32, (r % grid_w) as f32);
            for d in 0..half {
                let a = if d < quarter { row * inv_freq[d] } else { col * inv_freq[d - quarter] };
                tab[r * half + d] = a.cos();
                tab[n * half + r * half + d] = a.sin();
            }
        }
        let buf = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("rope table"),
            contents: f32_bytes(&tab),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let counted = buf.size();
        self.shared.counters.weight.fetch_add(counted, Ordering::Relaxed);
        let t = Arc::new(WgpuTensor {
            buf,
            offset: 0,
            bytes: counted,
            guard_words: 0,
            counted,
            role: Role::Table,
            shape: vec![2 * n * half],
            dtype: DType::F32,
            producer: "rope_2d",
            shared: self.shared.clone(),
        });
        let mut tables = self.rope_tables.lock().unwrap();
        if tables.len() >= 8 {
            tables.clear();
        }
        tables.insert(key, t.clone());
        Ok(t)
    }

    /// One elementwise dispatch of `lm.wgsl::entry` over `total` threads (no-op when 0).
    fn lm_1d(
        &self,
        entry: &'static str,
        total: usize,
        params: &[u32],
        bindings: &[(u32, wgpu::BindingResource<'_>)],
    ) -> Result<()> {
        self.dispatch_1d(Shader::Lm(Precision::Exact), entry, total, params, bindings)
    }

    /// One dispatch of `shader::entry` over `total` threads of 256-wide workgroups (no-op when 0).
    fn dispatch_1d(
        &self,
        shader: Shader,
        entry: &'static str,
        total: usize,
        params: &[u32],
        bindings: &[(u32, wgpu::BindingResource<'_>)],
    ) -> Result<()> {
        if total == 0 {
            return Ok(());
        }
        let (gx, gy) = groups_1d(total);
        self.dispatch(shader, entry, 0, params, bindings, (gx, gy, 1))
    }

    fn unsupported(op: Op, what: impl Into<String>) -> Error {
        Error::Unsupported { lane: LANE, op: op.name(), what: what.into() }
    }

    /// The precision of the products with `w`: the lane's, or exact for a weight from
    /// `upload_weight_exact`.
    fn gemm_precision(&self, w: &WgpuWeight) -> Precision {
        if w.exact { Precision::Exact } else { self.opts.precision }
    }
}

/// The kernel of `linear` for `format` in `precision`, with its `FMT` override:
/// `linear_packed.wgsl` for f32 (0), bf16 (1) and f16 without SHADER_F16 (2, integer decode),
/// `linear_f16.wgsl` for f16 with it (`native_f16`), else the format's block build of
/// dequant/linear.wgsl.
fn linear_shader(format: WeightFormat, native_f16: bool, precision: Precision) -> (Shader, u32) {
    match format {
        WeightFormat::F32 => (Shader::Linear(precision), 0),
        WeightFormat::BF16 => (Shader::Linear(precision), 1),
        WeightFormat::F16 if native_f16 => (Shader::LinearF16(precision), 0),
        WeightFormat::F16 => (Shader::Linear(precision), 2),
        f => (Shader::Block(BlockKernel::Linear, f, precision), 0),
    }
}

/// The kernel of lm.wgsl's weight ops for `format` in `precision`, with the `fmt` parameter it
/// reads: lm.wgsl itself for the float formats (0 f32, 1 bf16, 2 f16), else the format's block
/// build of dequant/lm.wgsl (which has no `fmt`). `embed_rows` (a lookup, not a product) always
/// takes the exact build.
fn lm_weight_shader(format: WeightFormat, precision: Precision) -> (Shader, u32) {
    match format {
        WeightFormat::F32 => (Shader::Lm(precision), 0),
        WeightFormat::BF16 => (Shader::Lm(precision), 1),
        WeightFormat::F16 => (Shader::Lm(precision), 2),
        f => (Shader::Block(BlockKernel::Lm, f, precision), 0),
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
        format!("{} ({:?}, {:?}; driver {} {})", i.name, i.backend, i.device_type, i.driver, i.driver_info)
    }

    /// Every weight format is read inside the kernels that take weights (block formats through
    /// their `shaders/dequant/` builds), so only the op matters.
    fn supports(&self, op: Op, _format: WeightFormat) -> bool {
        match op {
            Op::Attention => self.limits.max_compute_workgroup_storage_size >= ATTENTION_SHARED_BYTES,
            // every other op, the language-model ones included (shaders/lm.wgsl; `route_experts`
            // is the trait's composition of them)
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

    /// Any host tensor → a fresh buffer (elements, then the guard band when on).
    fn upload(&self, host: &HostTensor) -> Result<WgpuTensor> {
        let (raw, dtype): (&[u8], DType) = match &host.data {
            HostData::F32(v) => (bytemuck::cast_slice(v), DType::F32),
            HostData::I32(v) => (bytemuck::cast_slice(v), DType::I32),
        };
        if host.shape.is_empty() {
            return Err(Error::shape("upload", "a tensor needs at least one dimension"));
        }
        self.check_binding("upload", "tensor", raw.len() as u64)?;
        let mut contents = raw.to_vec();
        for _ in 0..self.opts.guard_words {
            contents.extend_from_slice(&GUARD_SENTINEL.to_le_bytes());
        }
        if contents.is_empty() {
            contents.extend_from_slice(&[0; 4]);
        }
        let buf = self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("upload"),
            contents: &contents,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        });
        Ok(self.make_tensor(buf, host.shape.clone(), dtype, "upload"))
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
            if bytes > 0 {
                if padded_row as usize == row_bytes {
                    self.queue.write_buffer(&buf, offset, src);
                } else {
                    let mut data = vec![0u8; bytes as usize];
                    for (dst, s) in data.chunks_exact_mut(padded_row as usize).zip(src.chunks_exact(row_bytes)) {
                        dst[..row_bytes].copy_from_slice(s);
                    }
                    self.queue.write_buffer(&buf, offset, &data);
                }
            }
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
        })
    }

    fn upload_weight_exact(&self, w: &HostWeight<'_>) -> Result<WgpuWeight> {
        Ok(WgpuWeight { exact: true, ..self.upload_weight(w)? })
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
        match t.dtype {
            DType::F32 => HostTensor::f32(t.shape.clone(), bytemuck::pod_collect_to_vec(&raw)),
            DType::I32 => HostTensor::i32(t.shape.clone(), bytemuck::pod_collect_to_vec(&raw)),
        }
    }

    fn sync(&self) -> Result<()> {
        WgpuBackend::sync(self)
    }

    /// x `[n, k]` · W `[out, k]`ᵀ + b `[out]` → `[n, out]`, one dispatch per weight chunk.
    fn linear(&self, x: &WgpuTensor, w: &WgpuWeight, bias: Option<&WgpuTensor>) -> Result<WgpuTensor> {
        const OP: &str = "linear";
        let (n, k) = checks::linear(x, w, bias)?;
        self.check_inputs(OP, [("x", x)].into_iter().chain(bias.map(|b| ("bias", b))))?;
        let y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        if n == 0 || w.rows == 0 {
            return Ok(y);
        }
        let gy = n.div_ceil(64);
        if gy > self.limits.max_compute_workgroups_per_dimension as usize {
            return Err(Error::Device(format!("op `linear`: {n} rows exceed the dispatch limit")));
        }
        let (shader, fmt) = linear_shader(w.format, self.native_f16, self.gemm_precision(w));
        let bias_res = match bias {
            Some(b) => b.binding(),
            None => self.dummy.as_entire_binding(),
        };
        for c in &w.chunks {
            let wres = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &c.buf,
                offset: c.offset,
                size: NonZeroU64::new(c.bytes.max(4)),
            });
            let params = [
                n as u32,
                k as u32,
                w.rows as u32,
                c.row0 as u32,
                c.rows as u32,
                w.stride_words as u32,
                bias.is_some() as u32,
            ];
            self.dispatch(
                shader,
                "main",
                fmt,
                &params,
                &[(1, x.binding()), (2, wres), (3, bias_res.clone()), (4, y.binding())],
                (c.rows.div_ceil(64) as u32, gy as u32, 1),
            )?;
        }
        Ok(y)
    }

    /// x `[n, d]`, weight `[d]` → `[n, d]`.
    fn rms_norm(&self, x: &WgpuTensor, weight: &WgpuTensor, eps: f32) -> Result<WgpuTensor> {
        const OP: &str = "rms_norm";
        let (n, d) = checks::rms_norm(x, weight)?;
        self.check_inputs(OP, [("x", x), ("weight", weight)])?;
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        if n == 0 || d == 0 {
            return Ok(y);
        }
        let gx = n.min(32768);
        self.dispatch(
            Shader::Norm,
            OP,
            0,
            &[n as u32, d as u32, eps.to_bits()],
            &[(1, x.binding()), (2, weight.binding()), (3, y.binding())],
            (gx as u32, n.div_ceil(gx) as u32, 1),
        )?;
        Ok(y)
    }

    /// a, b `[n, d]` → `[n, d]`.
    fn add(&self, a: &WgpuTensor, b: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "add";
        checks::add(a, b)?;
        self.check_inputs(OP, [("a", a), ("b", b)])?;
        let y = self.alloc(OP, a.shape.clone(), DType::F32)?;
        let n = a.numel();
        if n > 0 {
            let (gx, gy) = groups_1d(n);
            self.dispatch(
                Shader::Elementwise,
                OP,
                0,
                &[n as u32],
                &[(1, a.binding()), (2, b.binding()), (3, y.binding())],
                (gx, gy, 1),
            )?;
        }
        Ok(y)
    }

    /// x `[n, d]` → `[n, len]`.
    fn slice_cols(&self, x: &WgpuTensor, start: usize, len: usize) -> Result<WgpuTensor> {
        const OP: &str = "slice_cols";
        let (n, d) = checks::slice_cols(x, start, len)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, vec![n, len], DType::F32)?;
        let total = n * len;
        if total > 0 {
            let (gx, gy) = groups_1d(total);
            self.dispatch(
                Shader::Copy,
                OP,
                0,
                &[total as u32, len as u32, d as u32, start as u32],
                &[(1, x.binding()), (3, y.binding())],
                (gx, gy, 1),
            )?;
        }
        Ok(y)
    }

    /// `[n, d]`, `[m, d]` → `[n+m, d]` by two buffer copies.
    fn concat_rows(&self, a: &WgpuTensor, b: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "concat_rows";
        checks::concat_rows(a, b)?;
        self.check_inputs(OP, [("a", a), ("b", b)])?;
        let y = self.alloc(OP, vec![a.rows() + b.rows(), a.cols()], a.dtype)?;
        self.with_encoder(|enc| {
            if a.bytes > 0 {
                enc.copy_buffer_to_buffer(&a.buf, a.offset, &y.buf, 0, a.bytes);
            }
            if b.bytes > 0 {
                enc.copy_buffer_to_buffer(&b.buf, b.offset, &y.buf, a.bytes, b.bytes);
            }
        });
        Ok(y)
    }

    /// src `[m, d]`, idx i32 `[n]` → `[n, d]`; an index outside `0..m` yields a row of NaN.
    fn gather_rows(&self, src: &WgpuTensor, idx: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "gather_rows";
        let (m, d, n) = checks::gather_rows(src, idx)?;
        self.check_inputs(OP, [("src", src), ("idx", idx)])?;
        let y = self.alloc(OP, vec![n, d], DType::F32)?;
        let total = n * d;
        if total > 0 {
            let (gx, gy) = groups_1d(total);
            self.dispatch(
                Shader::Copy,
                OP,
                0,
                &[total as u32, d as u32, m as u32],
                &[(1, src.binding()), (2, idx.binding()), (3, y.binding())],
                (gx, gy, 1),
            )?;
        }
        Ok(y)
    }

    /// x `[n, 2h]` → `[n, h]`, gate = first half.
    fn swiglu(&self, x: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "swiglu";
        let (n, h) = checks::swiglu(x)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, vec![n, h], DType::F32)?;
        let total = n * h;
        if total > 0 {
            let (gx, gy) = groups_1d(total);
            self.dispatch(
                Shader::Elementwise,
                OP,
                0,
                &[total as u32, h as u32],
                &[(1, x.binding()), (3, y.binding())],
                (gx, gy, 1),
            )?;
        }
        Ok(y)
    }

    /// `[n, d]` → `[n, d]`, exact (erf) GELU.
    fn gelu_erf(&self, x: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "gelu_erf";
        checks::gelu_erf(x)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let total = x.numel();
        if total > 0 {
            let (gx, gy) = groups_1d(total);
            self.dispatch(
                Shader::Elementwise,
                OP,
                0,
                &[total as u32],
                &[(1, x.binding()), (3, y.binding())],
                (gx, gy, 1),
            )?;
        }
        Ok(y)
    }

    /// x `[gh·gw, heads·hd]` → same shape; cos/sin table computed on the host in f32 and cached.
    fn rope_2d(&self, x: &WgpuTensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<WgpuTensor> {
        const OP: &str = "rope_2d";
        let (n, hd) = checks::rope_2d(x, n_heads, grid_w)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let total = n * n_heads * hd / 2;
        if total > 0 {
            let tab = self.rope_table(n, grid_w, hd, theta)?;
            let (gx, gy) = groups_1d(total);
            self.dispatch(
                Shader::Rope,
                OP,
                0,
                &[n as u32, n_heads as u32, hd as u32],
                &[(1, x.binding()), (2, tab.binding()), (3, y.binding())],
                (gx, gy, 1),
            )?;
        }
        Ok(y)
    }

    /// q, k, v `[n, heads·hd]` → `[n, heads·hd]`, flash-style (no n×n matrix).
    fn attention(&self, q: &WgpuTensor, k: &WgpuTensor, v: &WgpuTensor, n_heads: usize) -> Result<WgpuTensor> {
        const OP: &str = "attention";
        let (n, hd) = checks::attention(q, k, v, n_heads)?;
        self.check_inputs(OP, [("q", q), ("k", k), ("v", v)])?;
        if hd > ATTENTION_MAX_HD || hd % 4 != 0 {
            return Err(Self::unsupported(
                Op::Attention,
                format!("head dim {hd} (a multiple of 4, at most {ATTENTION_MAX_HD})"),
            ));
        }
        if !self.supports(Op::Attention, WeightFormat::F32) {
            return Err(Self::unsupported(
                Op::Attention,
                format!(
                    "{} bytes of workgroup memory (device has {})",
                    ATTENTION_SHARED_BYTES, self.limits.max_compute_workgroup_storage_size
                ),
            ));
        }
        let y = self.alloc(OP, q.shape.clone(), DType::F32)?;
        if n == 0 || hd == 0 {
            return Ok(y);
        }
        let scale = 1.0 / (hd as f32).sqrt();
        self.dispatch(
            Shader::Attention,
            OP,
            0,
            &[n as u32, n_heads as u32, hd as u32, scale.to_bits()],
            &[(1, q.binding()), (2, k.binding()), (3, v.binding()), (4, y.binding())],
            (n.div_ceil(16) as u32, n_heads as u32, 1),
        )?;
        Ok(y)
    }

    /// x `[h·w, c]` → `[ceil(h/r)·ceil(w/r), c·r²]`.
    fn unfold(&self, x: &WgpuTensor, h: usize, w: usize, r: usize) -> Result<WgpuTensor> {
        const OP: &str = "unfold";
        let c = checks::unfold(x, h, w, r)?;
        self.check_inputs(OP, [("x", x)])?;
        let (gh, gw) = (h.div_ceil(r), w.div_ceil(r));
        let y = self.alloc(OP, vec![gh * gw, c * r * r], DType::F32)?;
        let total = gh * gw * c * r * r;
        if total > 0 {
            let (gx, gy) = groups_1d(total);
            self.dispatch(
                Shader::Copy,
                OP,
                0,
                &[total as u32, c as u32, h as u32, w as u32, r as u32, gw as u32],
                &[(1, x.binding()), (3, y.binding())],
                (gx, gy, 1),
            )?;
        }
        Ok(y)
    }

    // ==== language model (shaders/lm.wgsl) ======================================================

    /// table `[vocab, d]` (any format, possibly row-chunked), ids i32 `[n]` → `[n, d]`; ids ≥ vocab
    /// give a zero row, a negative id a row of NaN.
    fn embed_rows(&self, table: &WgpuWeight, ids: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "embed_rows";
        let (n, d) = checks::embed_rows(table, ids)?;
        self.check_inputs(OP, [("ids", ids)])?;
        let y = self.alloc(OP, vec![n, d], DType::F32)?;
        let (shader, fmt) = lm_weight_shader(table.format, Precision::Exact);
        // block formats: one thread per run of 32 values (d is a whole number of blocks)
        let threads = if table.format.is_block() { n * d / 32 } else { n * d };
        for (ci, c) in table.chunks.iter().enumerate() {
            let wres = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &c.buf,
                offset: c.offset,
                size: NonZeroU64::new(c.bytes.max(4)),
            });
            let params = [
                (n * d) as u32,
                d as u32,
                table.rows as u32,
                c.row0 as u32,
                c.rows as u32,
                fmt,
                table.stride_words as u32,
                (ci == 0) as u32,
            ];
            self.dispatch_1d(shader, OP, threads, &params, &[(4, ids.binding()), (6, y.binding()), (8, wres)])?;
        }
        Ok(y)
    }

    /// x `[n, d]` → `[n, hc·d]`.
    fn hc_expand(&self, x: &WgpuTensor, hc: usize) -> Result<WgpuTensor> {
        const OP: &str = "hc_expand";
        let (n, d) = checks::hc_expand(x)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, vec![n, hc * d], DType::F32)?;
        self.lm_1d(OP, n * hc * d, &[(n * hc * d) as u32, d as u32, hc as u32], &[(1, x.binding()), (6, y.binding())])?;
        Ok(y)
    }

    /// x `[n, heads·hd]` → per-head unweighted RMS norm; one workgroup per (row, head).
    fn rms_norm_heads(&self, x: &WgpuTensor, n_heads: usize, eps: f32) -> Result<WgpuTensor> {
        const OP: &str = "rms_norm_heads";
        let (n, cols) = checks::rms_norm_heads(x, n_heads)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        let segs = n * n_heads;
        if segs > 0 && cols > 0 {
            let gx = segs.min(32768);
            self.dispatch(
                Shader::Lm(Precision::Exact),
                OP,
                0,
                &[segs as u32, (cols / n_heads) as u32, eps.to_bits()],
                &[(1, x.binding()), (6, y.binding())],
                (gx as u32, segs.div_ceil(gx) as u32, 1),
            )?;
        }
        Ok(y)
    }

    /// X `[n, hc·d]`, w `[n, hc]` → `[n, d]`.
    fn hc_pre(&self, x: &WgpuTensor, w: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "hc_pre";
        let (n, d, hc) = checks::hc_pre(x, w)?;
        self.check_inputs(OP, [("x", x), ("w", w)])?;
        let y = self.alloc(OP, vec![n, d], DType::F32)?;
        self.lm_1d(
            OP,
            n * d,
            &[(n * d) as u32, d as u32, hc as u32],
            &[(1, x.binding()), (2, w.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }

    /// X `[n, hc·d]`, f `[n, d]`, post `[n, hc]`, comb `[n, hc·hc]` → X' `[n, hc·d]`.
    fn hc_post(&self, x: &WgpuTensor, f: &WgpuTensor, post: &WgpuTensor, comb: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "hc_post";
        let (n, cols, d, hc) = checks::hc_post(x, f, post, comb)?;
        self.check_inputs(OP, [("x", x), ("f", f), ("post", post), ("comb", comb)])?;
        let y = self.alloc(OP, vec![n, cols], DType::F32)?;
        self.lm_1d(
            OP,
            n * cols,
            &[(n * cols) as u32, d as u32, hc as u32],
            &[(1, x.binding()), (2, f.binding()), (3, post.binding()), (9, comb.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }

    /// mix `[n, hc]`, scale `[1]`, base `[hc]` → `σ(mix·scale + base) + eps`.
    fn hc_head_weights(&self, mix: &WgpuTensor, scale: &WgpuTensor, base: &WgpuTensor, eps: f32) -> Result<WgpuTensor> {
        const OP: &str = "hc_head_weights";
        let (n, hc) = checks::hc_head_weights(mix, scale, base)?;
        self.check_inputs(OP, [("mix", mix), ("scale", scale), ("base", base)])?;
        let y = self.alloc(OP, mix.shape.clone(), DType::F32)?;
        self.lm_1d(
            OP,
            n * hc,
            &[(n * hc) as u32, hc as u32, eps.to_bits()],
            &[(1, mix.binding()), (2, scale.binding()), (3, base.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }

    /// `sqrt(softplus(x))` elementwise.
    fn sqrt_softplus(&self, x: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "sqrt_softplus";
        checks::sqrt_softplus(x)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        self.lm_1d(OP, x.numel(), &[x.numel() as u32], &[(1, x.binding()), (6, y.binding())])?;
        Ok(y)
    }

    /// table i32 `[vocab, k]`, ids i32 `[n]`, fallback i32 `[n, k]` → i32 `[n, k]`.
    fn hash_route(&self, table: &WgpuTensor, ids: &WgpuTensor, fallback: &WgpuTensor) -> Result<WgpuTensor> {
        const OP: &str = "hash_route";
        let (vocab, k, n) = checks::hash_route(table, ids, fallback)?;
        self.check_inputs(OP, [("table", table), ("ids", ids), ("fallback", fallback)])?;
        let y = self.alloc(OP, vec![n, k], DType::I32)?;
        self.lm_1d(
            OP,
            n * k,
            &[(n * k) as u32, k as u32, vocab as u32],
            &[(4, table.binding()), (5, ids.binding()), (10, fallback.binding()), (7, y.binding())],
        )?;
        Ok(y)
    }

    /// scores `[n, e]`, ids i32 `[n, k]` → `[n, k]`; a row with an id outside `0..e` is NaN.
    fn route_weights(&self, scores: &WgpuTensor, ids: &WgpuTensor, scale: f32) -> Result<WgpuTensor> {
        const OP: &str = "route_weights";
        let (n, e, k) = checks::route_weights(scores, ids)?;
        self.check_inputs(OP, [("scores", scores), ("ids", ids)])?;
        let y = self.alloc(OP, vec![n, k], DType::F32)?;
        self.lm_1d(
            OP,
            n * k,
            &[(n * k) as u32, k as u32, e as u32, scale.to_bits()],
            &[(1, scores.binding()), (4, ids.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }

    /// g, u `[n, h]` → `silu(min(g, limit)) · clamp(u, ±limit)` `[n, h]`.
    fn swiglu_clamp(&self, g: &WgpuTensor, u: &WgpuTensor, limit: f32) -> Result<WgpuTensor> {
        const OP: &str = "swiglu_clamp";
        let (n, h) = checks::swiglu_clamp(g, u)?;
        self.check_inputs(OP, [("g", g), ("u", u)])?;
        let y = self.alloc(OP, vec![n, h], DType::F32)?;
        self.lm_1d(
            OP,
            n * h,
            &[(n * h) as u32, limit.to_bits()],
            &[(1, g.binding()), (2, u.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }

    /// Interleaved RoPE on the last `2·inv_freq.len()` dims of every head.
    fn rope_tail(
        &self,
        x: &WgpuTensor,
        n_heads: usize,
        inv_freq: &WgpuTensor,
        pos0: usize,
        stride: usize,
        inverse: bool,
    ) -> Result<WgpuTensor> {
        const OP: &str = "rope_tail";
        let (n, cols, hd, rd) = checks::rope_tail(x, n_heads, inv_freq)?;
        self.check_inputs(OP, [("x", x), ("inv_freq", inv_freq)])?;
        let last = pos0 + n.saturating_sub(1) * stride;
        if last > u32::MAX as usize {
            return Err(Self::unsupported(Op::RopeTail, format!("position {last} beyond u32")));
        }
        let y = self.alloc(OP, x.shape.clone(), DType::F32)?;
        self.lm_1d(
            OP,
            n * cols,
            &[(n * cols) as u32, cols as u32, hd as u32, rd as u32, pos0 as u32, stride as u32, inverse as u32],
            &[(1, x.binding()), (2, inv_freq.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }

    /// mHC split with Sinkhorn; one thread per row.
    fn hc_split(
        &self,
        mix: &WgpuTensor,
        scale: &WgpuTensor,
        base: &WgpuTensor,
        hc: usize,
        iters: usize,
        eps: f32,
    ) -> Result<WgpuTensor> {
        const OP: &str = "hc_split";
        let (n, w) = checks::hc_split(mix, scale, base, hc)?;
        self.check_inputs(OP, [("mix", mix), ("scale", scale), ("base", base)])?;
        let y = self.alloc(OP, vec![n, w], DType::F32)?;
        if n > 0 {
            let g = n.div_ceil(64);
            if g > self.limits.max_compute_workgroups_per_dimension as usize {
                return Err(Error::Device(format!("op `{OP}`: {n} rows exceed the dispatch limit")));
            }
            self.dispatch(
                Shader::Lm(Precision::Exact),
                OP,
                0,
                &[n as u32, hc as u32, iters as u32, eps.to_bits()],
                &[(1, mix.binding()), (2, scale.binding()), (3, base.binding()), (6, y.binding())],
                (g as u32, 1, 1),
            )?;
        }
        Ok(y)
    }

    /// Gated pooling of ratio-r blocks (overlap: w = 2d, 2r rows).
    fn compress_pool(
        &self,
        kv: &WgpuTensor,
        gate: &WgpuTensor,
        ape: &WgpuTensor,
        ratio: usize,
        overlap: bool,
    ) -> Result<WgpuTensor> {
        const OP: &str = "compress_pool";
        let (n, d, w) = checks::compress_pool(kv, gate, ape, ratio, overlap)?;
        self.check_inputs(OP, [("kv", kv), ("gate", gate), ("ape", ape)])?;
        let y = self.alloc(OP, vec![n, d], DType::F32)?;
        self.lm_1d(
            OP,
            n * d,
            &[(n * d) as u32, d as u32, w as u32, ratio as u32, overlap as u32],
            &[(1, kv.binding()), (2, gate.binding()), (3, ape.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }

    /// Lightning-indexer scores `[n, m]`, −inf for entries not yet complete.
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
        const OP: &str = "indexer_scores";
        let (n, m, hd) = checks::indexer_scores(q, k, w, n_heads, ratio)?;
        self.check_inputs(OP, [("q", q), ("k", k), ("w", w)])?;
        let y = self.alloc(OP, vec![n, m], DType::F32)?;
        self.lm_1d(
            OP,
            n * m,
            &[(n * m) as u32, m as u32, n_heads as u32, hd as u32, scale.to_bits(), pos0 as u32, ratio as u32],
            &[(1, q.binding()), (2, k.binding()), (3, w.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }

    /// Top-k columns per row (descending, ties to the lower column, −1 fill); one workgroup per row.
    fn topk_rows(&self, x: &WgpuTensor, k: usize) -> Result<WgpuTensor> {
        const OP: &str = "topk_rows";
        let (n, m) = checks::topk_rows(x)?;
        self.check_inputs(OP, [("x", x)])?;
        let y = self.alloc(OP, vec![n, k], DType::I32)?;
        if n > 0 && k > 0 {
            let gx = n.min(32768);
            self.dispatch(
                Shader::Lm(Precision::Exact),
                OP,
                0,
                &[n as u32, m as u32, k as u32],
                &[(1, x.binding()), (7, y.binding())],
                (gx as u32, n.div_ceil(gx) as u32, 1),
            )?;
        }
        Ok(y)
    }

    /// x `[n, g·k]`, W `[g·r, k]` (any format, possibly row-chunked) → `[n, g·r]`.
    fn grouped_linear(&self, x: &WgpuTensor, w: &WgpuWeight, groups: usize) -> Result<WgpuTensor> {
        const OP: &str = "grouped_linear";
        let (n, k, r) = checks::grouped_linear(x, w, groups)?;
        self.check_inputs(OP, [("x", x)])?;
        let cols = x.cols();
        let y = self.alloc(OP, vec![n, w.rows], DType::F32)?;
        let (shader, fmt) = lm_weight_shader(w.format, self.gemm_precision(w));
        for c in &w.chunks {
            let wres = wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &c.buf,
                offset: c.offset,
                size: NonZeroU64::new(c.bytes.max(4)),
            });
            let params = [
                (n * c.rows) as u32,
                c.rows as u32,
                c.row0 as u32,
                k as u32,
                r as u32,
                cols as u32,
                w.rows as u32,
                fmt,
                w.stride_words as u32,
            ];
            self.dispatch_1d(shader, OP, n * c.rows, &params, &[(1, x.binding()), (6, y.binding()), (8, wres)])?;
        }
        Ok(y)
    }

    /// Joint softmax over window keys ∪ selected compressed entries with a per-head sink; one
    /// thread per (query, head). A window or index out of range gives a NaN head.
    fn sink_attention(
        &self,
        q: &WgpuTensor,
        kv: &WgpuTensor,
        window: &WgpuTensor,
        comp: Option<(&WgpuTensor, &WgpuTensor)>,
        sinks: &WgpuTensor,
        n_heads: usize,
    ) -> Result<WgpuTensor> {
        const OP: &str = "sink_attention";
        let (n, cols, hd, m, c_rows, kk) = checks::sink_attention(q, kv, window, comp, sinks, n_heads)?;
        let comp_inputs = comp.into_iter().flat_map(|(c, idx)| [("comp", c), ("comp_idx", idx)]);
        self.check_inputs(
            OP,
            [("q", q), ("kv", kv), ("window", window), ("sinks", sinks)].into_iter().chain(comp_inputs),
        )?;
        let y = self.alloc(OP, vec![n, cols], DType::F32)?;
        let total = n * n_heads;
        if total > 0 && hd > 0 {
            let (cres, ires) = match comp {
                Some((c, idx)) => (c.binding(), idx.binding()),
                None => (self.dummy.as_entire_binding(), self.dummy.as_entire_binding()),
            };
            let g = total.div_ceil(64);
            let gx = g.min(32768);
            let scale = 1.0 / (hd as f32).sqrt();
            self.dispatch(
                Shader::Lm(Precision::Exact),
                OP,
                0,
                &[total as u32, n_heads as u32, hd as u32, m as u32, kk as u32, c_rows as u32, scale.to_bits()],
                &[
                    (1, q.binding()),
                    (2, kv.binding()),
                    (3, cres),
                    (4, window.binding()),
                    (5, ires),
                    (9, sinks.binding()),
                    (6, y.binding()),
                ],
                (gx as u32, g.div_ceil(gx) as u32, 1),
            )?;
        }
        Ok(y)
    }

    /// Routed experts, one (gate, up, down) dispatch triple per expert over the slots routed to
    /// it, each weight read by its own format's kernel, then a weighted sum over the slots in
    /// order. Each expert matrix must fit one binding.
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
        const OP: &str = "moe_experts";
        let (n, d, k, h) = checks::moe_experts(x, ids, weights, w1, w3, w2)?;
        self.check_inputs(OP, [("x", x), ("ids", ids), ("weights", weights)])?;
        if let Some(w) = w1.iter().chain(w3).chain(w2).find(|w| w.chunks.len() != 1) {
            return Err(Self::unsupported(
                Op::MoeExperts,
                format!("expert `{}` split into row chunks (larger than one binding)", w.name),
            ));
        }

        fn bind(w: &WgpuWeight) -> wgpu::BindingResource<'_> {
            let c = &w.chunks[0];
            wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &c.buf,
                offset: c.offset,
                size: NonZeroU64::new(c.bytes.max(4)),
            })
        }
        let slots = n * k;
        let hid = self.alloc(OP, vec![slots, h], DType::F32)?;
        let ys = self.alloc(OP, vec![slots, d], DType::F32)?;
        for (e, ((g, u), o)) in w1.iter().zip(w3).zip(w2).enumerate() {
            // the gate into hid, then the up with the clamped SwiGLU over hid in place
            for (entry, w) in [("moe_gate", g), ("moe_up", u)] {
                let (shader, fmt) = lm_weight_shader(w.format, self.gemm_precision(w));
                self.dispatch_1d(
                    shader,
                    entry,
                    slots * h,
                    &[
                        (slots * h) as u32,
                        h as u32,
                        d as u32,
                        k as u32,
                        e as u32,
                        fmt,
                        w.stride_words as u32,
                        limit.to_bits(),
                    ],
                    &[(1, x.binding()), (4, ids.binding()), (8, bind(w)), (6, hid.binding())],
                )?;
            }
            let (down, down_fmt) = lm_weight_shader(o.format, self.gemm_precision(o));
            self.dispatch_1d(
                down,
                "moe_down",
                slots * d,
                &[(slots * d) as u32, d as u32, h as u32, 0, e as u32, down_fmt, o.stride_words as u32],
                &[(2, hid.binding()), (4, ids.binding()), (8, bind(o)), (6, ys.binding())],
            )?;
        }
        let y = self.alloc(OP, vec![n, d], DType::F32)?;
        self.lm_1d(
            "moe_sum",
            n * d,
            &[(n * d) as u32, d as u32, k as u32, w1.len() as u32],
            &[(1, ys.binding()), (2, weights.binding()), (4, ids.binding()), (6, y.binding())],
        )?;
        Ok(y)
    }
}
