//! The `Backend` contract: every op the model graph uses, grouped in sections that mirror the
//! model (tensors & transfer, linear & elementwise, vision). A lane (CPU, wgpu, CUDA)
//! implements it; the graph in `crate::model` is written once against it.
//!
//! Conventions shared by every lane:
//! - Activations are row-major 2-D tensors `[rows, cols]` of f32 (index tensors are i32).
//! - Tensors live on the lane's device; `upload`/`download` are the only host crossings, and a
//!   forward pass never calls `download` between ops.
//! - The matrix operand of `linear` is a separate `Weight` handle that keeps the checkpoint's
//!   storage format (`WeightFormat`): a bf16 weight stays bf16 in device memory and is converted
//!   inside the kernel; so are the block formats (GGUF K/IQ quants, MXFP4, FP8; `crate::formats`).
//! - A lane that lacks an op or a format returns `Error::Unsupported` naming the op; it never
//!   falls back to another lane silently.

mod checks;
pub mod cpu;
pub mod cuda;
pub mod wgpu;

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Element type of an activation tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    I32,
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DType::F32 => "f32",
            DType::I32 => "i32",
        })
    }
}

pub use crate::formats::{WeightFormat, decode_row};

/// How a lane rounds the operands of its matrix products (`--precision`, `FOVEA_PRECISION`).
///
/// - `Exact`: f32 products throughout, the conformance mode every golden is held to at f32
///   tolerances (the CUDA lane's tensor-core tiles split each f32 operand into exact bf16 terms).
/// - `Fast`: the GEMM tiles round activations and weights to f16 once (one tensor-core product
///   per tile, f32 accumulation). The residual stream, norms, softmax, attention and every
///   weight uploaded with [`Backend::upload_weight_exact`] (routing scores, hyper-connection
///   mixes) stay f32. Fast mode has its own derived tolerances (`tests/common/mod.rs`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Precision {
    #[default]
    Exact,
    Fast,
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Precision::Exact => "exact",
            Precision::Fast => "fast",
        })
    }
}

impl std::str::FromStr for Precision {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "exact" => Ok(Precision::Exact),
            "fast" => Ok(Precision::Fast),
            other => Err(Error::Invalid(format!("unknown precision `{other}` (expected exact or fast)"))),
        }
    }
}

impl Precision {
    /// The command-line choice if given, else `FOVEA_PRECISION`, else `None` (the lane's default).
    pub fn from_cli_or_env(cli: Option<Precision>) -> Result<Option<Precision>> {
        match cli {
            Some(p) => Ok(Some(p)),
            None => match std::env::var("FOVEA_PRECISION") {
                Ok(v) if !v.is_empty() => {
                    v.parse().map(Some).map_err(|e: Error| Error::Invalid(format!("FOVEA_PRECISION: {e}")))
                }
                _ => Ok(None),
            },
        }
    }
}

/// Host-side data of an activation tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum HostData {
    F32(Vec<f32>),
    I32(Vec<i32>),
}

/// A host tensor: what `upload` takes and `download` returns.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl HostTensor {
    pub fn f32(shape: impl Into<Vec<usize>>, data: Vec<f32>) -> Result<Self> {
        let shape = shape.into();
        check_len("upload", &shape, data.len())?;
        Ok(Self { shape, data: HostData::F32(data) })
    }
    pub fn i32(shape: impl Into<Vec<usize>>, data: Vec<i32>) -> Result<Self> {
        let shape = shape.into();
        check_len("upload", &shape, data.len())?;
        Ok(Self { shape, data: HostData::I32(data) })
    }
    pub fn dtype(&self) -> DType {
        match self.data {
            HostData::F32(_) => DType::F32,
            HostData::I32(_) => DType::I32,
        }
    }
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The f32 values, or an error naming `what` if this is an index tensor.
    pub fn into_f32(self, what: &str) -> Result<Vec<f32>> {
        match self.data {
            HostData::F32(v) => Ok(v),
            HostData::I32(_) => Err(Error::Invalid(format!("{what}: expected f32 data, found i32"))),
        }
    }
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            HostData::F32(v) => Some(v),
            HostData::I32(_) => None,
        }
    }
}

fn check_len(op: &'static str, shape: &[usize], len: usize) -> Result<()> {
    let numel: usize = shape.iter().product();
    if numel != len {
        return Err(Error::shape(op, format!("shape {shape:?} holds {numel} elements, data has {len}")));
    }
    Ok(())
}

/// A weight matrix `[rows = out_features, cols = in_features]` in its storage format, borrowed
/// from the memory-mapped checkpoint where possible.
#[derive(Clone, Debug)]
pub struct HostWeight<'a> {
    pub name: String,
    pub format: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    /// Little-endian elements, row-major, exactly `rows * format.row_bytes(cols)` bytes.
    pub bytes: Cow<'a, [u8]>,
}

impl HostWeight<'_> {
    /// Checks that the bytes are exactly `rows` rows of `cols` elements in `format`: `cols` a
    /// whole number of blocks (block formats pack 32, 128 or 256 values per block), and the
    /// byte count `rows · row_bytes(cols)` without overflow (shapes may come from a file header).
    pub fn validate(&self) -> Result<()> {
        self.format.check_cols(self.cols).map_err(|msg| Error::tensor(&self.name, msg))?;
        let want = self.rows.checked_mul(self.format.row_bytes(self.cols));
        if want != Some(self.bytes.len()) {
            let want = want.map_or("more than fits in memory".to_string(), |n| n.to_string());
            return Err(Error::tensor(
                &self.name,
                format!(
                    "{} bytes for a {}x{} {} matrix, expected {want}",
                    self.bytes.len(),
                    self.rows,
                    self.cols,
                    self.format
                ),
            ));
        }
        Ok(())
    }

    /// Row `r` decoded to f32 into `out` (`cols` values); for tests and tools. Errors name the
    /// weight when `r` is not a row of a valid matrix or `out` is not one row long.
    pub fn row_f32(&self, r: usize, out: &mut [f32]) -> Result<()> {
        self.validate()?;
        if r >= self.rows || out.len() != self.cols {
            return Err(Error::tensor(
                &self.name,
                format!("row {r} into {} values: the matrix is {}x{}", out.len(), self.rows, self.cols),
            ));
        }
        let row_bytes = self.format.row_bytes(self.cols);
        decode_row(self.format, &self.bytes[r * row_bytes..][..row_bytes], out);
        Ok(())
    }
}

/// The ops of the contract, named for error messages and for `Backend::supports`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Linear,
    LinearAdd,
    RmsNormLinear,
    SwigluLinearAdd,
    RmsNorm,
    Add,
    SliceCols,
    ConcatRows,
    GatherRows,
    Swiglu,
    GeluErf,
    Rope2d,
    Attention,
    AttentionRope2d,
    Unfold,
    UnfoldLinearGelu,
    // language model (see the trait's language-model sections)
    EmbedRows,
    HcExpand,
    RmsNormHeads,
    HcSplit,
    HcMixSplit,
    HcPre,
    HcPreNorm,
    HcPost,
    HcHeadWeights,
    RopeTail,
    RopeTailAt,
    RmsNormRope,
    SinkAttention,
    GroupedLinear,
    CompressPool,
    IndexerScores,
    TopkRows,
    SqrtSoftplus,
    HashRoute,
    RouteWeights,
    RouteExperts,
    SwigluClamp,
    MoeExperts,
}

impl Op {
    /// The shared and vision ops: every lane implements them, and the op harness
    /// (`tests/ops.rs`) asserts a case for each.
    pub const VISION: [Op; 16] = [
        Op::Linear,
        Op::LinearAdd,
        Op::RmsNormLinear,
        Op::SwigluLinearAdd,
        Op::RmsNorm,
        Op::Add,
        Op::SliceCols,
        Op::ConcatRows,
        Op::GatherRows,
        Op::Swiglu,
        Op::GeluErf,
        Op::Rope2d,
        Op::Attention,
        Op::AttentionRope2d,
        Op::Unfold,
        Op::UnfoldLinearGelu,
    ];
    /// The language-model ops. The CPU lane implements them; a lane without them says so in
    /// `supports` and answers `Error::Unsupported` from the trait's default implementations.
    pub const LM: [Op; 23] = [
        Op::EmbedRows,
        Op::HcExpand,
        Op::RmsNormHeads,
        Op::HcSplit,
        Op::HcMixSplit,
        Op::HcPre,
        Op::HcPreNorm,
        Op::HcPost,
        Op::HcHeadWeights,
        Op::RopeTail,
        Op::RopeTailAt,
        Op::RmsNormRope,
        Op::SinkAttention,
        Op::GroupedLinear,
        Op::CompressPool,
        Op::IndexerScores,
        Op::TopkRows,
        Op::SqrtSoftplus,
        Op::HashRoute,
        Op::RouteWeights,
        Op::RouteExperts,
        Op::SwigluClamp,
        Op::MoeExperts,
    ];
    /// Whether this op belongs to the language-model sections of the contract.
    pub fn is_lm(self) -> bool {
        Op::LM.contains(&self)
    }
    pub fn name(self) -> &'static str {
        match self {
            Op::Linear => "linear",
            Op::LinearAdd => "linear_add",
            Op::RmsNormLinear => "rms_norm_linear",
            Op::SwigluLinearAdd => "swiglu_linear_add",
            Op::RmsNorm => "rms_norm",
            Op::Add => "add",
            Op::SliceCols => "slice_cols",
            Op::ConcatRows => "concat_rows",
            Op::GatherRows => "gather_rows",
            Op::Swiglu => "swiglu",
            Op::GeluErf => "gelu_erf",
            Op::Rope2d => "rope_2d",
            Op::Attention => "attention",
            Op::AttentionRope2d => "attention_rope_2d",
            Op::Unfold => "unfold",
            Op::UnfoldLinearGelu => "unfold_linear_gelu",
            Op::EmbedRows => "embed_rows",
            Op::HcExpand => "hc_expand",
            Op::RmsNormHeads => "rms_norm_heads",
            Op::HcSplit => "hc_split",
            Op::HcMixSplit => "hc_mix_split",
            Op::HcPre => "hc_pre",
            Op::HcPreNorm => "hc_pre_norm",
            Op::HcPost => "hc_post",
            Op::HcHeadWeights => "hc_head_weights",
            Op::RopeTail => "rope_tail",
            Op::RopeTailAt => "rope_tail_at",
            Op::RmsNormRope => "rms_norm_rope",
            Op::SinkAttention => "sink_attention",
            Op::GroupedLinear => "grouped_linear",
            Op::CompressPool => "compress_pool",
            Op::IndexerScores => "indexer_scores",
            Op::TopkRows => "topk_rows",
            Op::SqrtSoftplus => "sqrt_softplus",
            Op::HashRoute => "hash_route",
            Op::RouteWeights => "route_weights",
            Op::RouteExperts => "route_experts",
            Op::SwigluClamp => "swiglu_clamp",
            Op::MoeExperts => "moe_experts",
        }
    }
}

/// Device memory a lane holds, split by role (weights vs activations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Bytes of device memory holding weights (matrices, biases, norms, sentinels; on the wgpu
    /// lane the sub-allocated pools, unused tails included; on the CUDA lane the f16 copies of
    /// BF16 and F32 matrices cuBLASLt has read, kept from their first GEMM).
    pub weight_bytes: u64,
    /// Bytes of the weight matrices themselves (`upload_weight`, each sized by
    /// [`Backend::weight_alloc_bytes`]), a part of `weight_bytes`.
    pub matrix_bytes: u64,
    /// Bytes of device memory currently holding activations.
    pub activation_bytes: u64,
    /// High-water mark of `activation_bytes`.
    pub peak_activation_bytes: u64,
}

/// How much memory the pool a lane allocates from holds (the GPU's own memory, or the host's
/// for the CPU lane), as the device reports it: what a caller checks a large load against before
/// it starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capacity {
    /// Bytes this process may still allocate (the driver's free figure or budget).
    pub free_bytes: u64,
    pub total_bytes: u64,
}

/// Where the host's time went while it issued device work, counted since the lane opened: a
/// diagnostic a GPU lane collects when `FOVEA_HOST_PROFILE=1` (timing every call costs two clock
/// reads). Benchmarks print the difference over a decode step, to tell a step bound by kernel
/// launches from one bound by copies, allocations or the graph's own host work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostProfile {
    /// Kernel launches, and nanoseconds inside the driver's launch call.
    pub launches: u64,
    pub launch_ns: u64,
    /// Host-to-device and device-to-device copies, and nanoseconds inside the copy calls.
    pub copies: u64,
    pub copy_ns: u64,
    /// Device allocations the buffer pool could not serve, and nanoseconds inside them.
    pub allocations: u64,
    pub allocation_ns: u64,
    /// Waits for the device (a read-back, a sync) or for the wgpu lane's submit thread to submit
    /// what it was handed, and nanoseconds inside them.
    pub waits: u64,
    pub wait_ns: u64,
    /// Submissions of queued work without waiting (the wgpu lane submits its encoder every few
    /// commands), and nanoseconds inside them with the poll after: on the lane's submit thread,
    /// or, when it submits inline, on the encoding thread inside the call that filled the
    /// encoder (a launch, mostly) or a wait.
    pub submits: u64,
    pub submit_ns: u64,
    /// Bind groups the wgpu lane made because its cache had none for a launch's bindings (0 on
    /// the other lanes, which have no such objects).
    pub bind_groups: u64,
}

impl HostProfile {
    /// The counts and times from `earlier` to `self`.
    pub fn since(&self, earlier: &HostProfile) -> HostProfile {
        HostProfile {
            launches: self.launches - earlier.launches,
            launch_ns: self.launch_ns - earlier.launch_ns,
            copies: self.copies - earlier.copies,
            copy_ns: self.copy_ns - earlier.copy_ns,
            allocations: self.allocations - earlier.allocations,
            allocation_ns: self.allocation_ns - earlier.allocation_ns,
            waits: self.waits - earlier.waits,
            wait_ns: self.wait_ns - earlier.wait_ns,
            submits: self.submits - earlier.submits,
            submit_ns: self.submit_ns - earlier.submit_ns,
            bind_groups: self.bind_groups - earlier.bind_groups,
        }
    }
}

/// [`Backend::hc_mix_split`] as its three ops: the trait's default, and where a lane's fused
/// kernel does not apply (a block-format mix, say), that lane's fallback.
#[allow(clippy::too_many_arguments)]
pub(crate) fn hc_mix_split_parts<B: Backend + ?Sized>(
    b: &B,
    x: &B::Tensor,
    mix: &B::Weight,
    scale: &B::Tensor,
    base: &B::Tensor,
    hc: usize,
    iters: usize,
    eps: f32,
    norm_eps: f32,
) -> Result<B::Tensor> {
    let mix = b.linear(&b.rms_norm_heads(x, 1, norm_eps)?, mix, None)?;
    b.hc_split(&mix, scale, base, hc, iters, eps)
}

/// [`Backend::attention_rope_2d`] as its six ops: the trait's default, and where a lane's fused
/// kernel does not apply (exact precision on the CUDA lane), that lane's fallback.
pub(crate) fn attention_rope_2d_parts<B: Backend + ?Sized>(
    b: &B,
    qkv: &B::Tensor,
    n_heads: usize,
    grid_w: usize,
    theta: f32,
) -> Result<B::Tensor> {
    let (_, hd) = checks::attention_rope_2d(qkv, n_heads, grid_w)?;
    let dim = n_heads * hd;
    let q = b.rope_2d(&b.slice_cols(qkv, 0, dim)?, n_heads, grid_w, theta)?;
    let k = b.rope_2d(&b.slice_cols(qkv, dim, dim)?, n_heads, grid_w, theta)?;
    b.attention(&q, &k, &b.slice_cols(qkv, 2 * dim, dim)?, n_heads)
}

/// [`Backend::route_experts`] as its five ops: the trait's default, and where a lane's fused
/// kernel does not apply (more experts than it keeps in workgroup memory, say), that lane's
/// fallback.
pub(crate) fn route_experts_parts<B: Backend + ?Sized>(
    b: &B,
    logits: &B::Tensor,
    bias: &B::Tensor,
    kind: &B::Tensor,
    hash: Option<(&B::Tensor, &B::Tensor)>,
    k: usize,
    scale: f32,
) -> Result<(B::Tensor, B::Tensor)> {
    checks::route_experts(logits, bias, kind, hash, k)?;
    let scores = b.sqrt_softplus(logits)?;
    let biased = b.add(&scores, &b.gather_rows(bias, kind)?)?;
    let mut selected = b.topk_rows(&biased, k)?;
    if let Some((table, ids)) = hash {
        selected = b.hash_route(table, ids, &selected)?;
    }
    let weights = b.route_weights(&scores, &selected, scale)?;
    Ok((selected, weights))
}

/// One kernel's device time over some work ([`Backend::kernel_times`]).
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// The kernel's entry point.
    pub name: String,
    /// Dispatches of it.
    pub count: u64,
    pub seconds: f64,
}

/// Device times summed by kernel name as a GPU lane's timer collects them, until
/// [`Backend::kernel_times`] takes them.
#[derive(Default)]
pub(crate) struct KernelTotals(std::collections::HashMap<String, (u64, f64)>);

impl KernelTotals {
    /// One dispatch or launch of `name` that took `seconds`.
    pub(crate) fn add(&mut self, name: String, seconds: f64) {
        let t = self.0.entry(name).or_default();
        t.0 += 1;
        t.1 += seconds;
    }

    /// The sums, longest first (then by name).
    pub(crate) fn into_sorted(self) -> Vec<KernelTime> {
        let mut times: Vec<KernelTime> =
            self.0.into_iter().map(|(name, (count, seconds))| KernelTime { name, count, seconds }).collect();
        times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then_with(|| a.name.cmp(&b.name)));
        times
    }
}

/// The counters behind [`Backend::host_profile`], kept by a GPU lane: every call counted, and
/// timed when `FOVEA_HOST_PROFILE=1`.
#[derive(Default)]
pub(crate) struct HostClock {
    on: bool,
    launches: AtomicU64,
    launch_ns: AtomicU64,
    copies: AtomicU64,
    copy_ns: AtomicU64,
    allocations: AtomicU64,
    allocation_ns: AtomicU64,
    waits: AtomicU64,
    wait_ns: AtomicU64,
    submits: AtomicU64,
    submit_ns: AtomicU64,
}

impl HostClock {
    /// Timing on when the environment asks for it.
    pub(crate) fn from_env() -> Self {
        HostClock { on: std::env::var("FOVEA_HOST_PROFILE").is_ok_and(|v| v == "1"), ..HostClock::default() }
    }

    fn time<T>(&self, count: &AtomicU64, ns: &AtomicU64, f: impl FnOnce() -> T) -> T {
        count.fetch_add(1, Ordering::Relaxed);
        if !self.on {
            return f();
        }
        let start = std::time::Instant::now();
        let r = f();
        ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// `f`, a kernel launch or dispatch.
    pub(crate) fn launch<T>(&self, f: impl FnOnce() -> T) -> T {
        self.time(&self.launches, &self.launch_ns, f)
    }
    /// `f`, a copy to or between device buffers.
    pub(crate) fn copy<T>(&self, f: impl FnOnce() -> T) -> T {
        self.time(&self.copies, &self.copy_ns, f)
    }
    /// `f`, a device allocation.
    pub(crate) fn allocation<T>(&self, f: impl FnOnce() -> T) -> T {
        self.time(&self.allocations, &self.allocation_ns, f)
    }
    /// `f`, a wait for the device.
    pub(crate) fn wait<T>(&self, f: impl FnOnce() -> T) -> T {
        self.time(&self.waits, &self.wait_ns, f)
    }

    /// `f`, a submission that does not wait, with the poll after it (on the wgpu lane's submit
    /// thread, or on the encoding thread when it submits inline).
    pub(crate) fn submit<T>(&self, f: impl FnOnce() -> T) -> T {
        self.time(&self.submits, &self.submit_ns, f)
    }

    /// The totals so far, when timing is on.
    pub(crate) fn profile(&self) -> Option<HostProfile> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        self.on.then(|| HostProfile {
            launches: get(&self.launches),
            launch_ns: get(&self.launch_ns),
            copies: get(&self.copies),
            copy_ns: get(&self.copy_ns),
            allocations: get(&self.allocations),
            allocation_ns: get(&self.allocation_ns),
            waits: get(&self.waits),
            wait_ns: get(&self.wait_ns),
            submits: get(&self.submits),
            submit_ns: get(&self.submit_ns),
            bind_groups: 0,
        })
    }
}

/// A device tensor handle: opaque storage plus dtype and shape.
pub trait DeviceTensor {
    fn shape(&self) -> &[usize];
    fn dtype(&self) -> DType;
    fn rows(&self) -> usize {
        self.shape()[0]
    }
    fn cols(&self) -> usize {
        self.shape()[1..].iter().product()
    }
}

/// A device weight matrix handle `[rows = out, cols = in]` in its storage format.
pub trait DeviceWeight {
    fn format(&self) -> WeightFormat;
    fn rows(&self) -> usize;
    fn cols(&self) -> usize;
}

/// Default prefill chunk (tokens), [`Backend::prefill_chunk`]'s unless a lane says otherwise.
pub const PREFILL_CHUNK: usize = 512;

/// The contract every lane implements. Shapes in the comments: `n` rows (tokens/patches),
/// `d` columns.
pub trait Backend {
    type Tensor: DeviceTensor;
    type Weight: DeviceWeight;

    // ---- identity & capabilities -------------------------------------------------------
    /// Short lane name: "cpu", "wgpu", "cuda".
    fn lane(&self) -> &'static str;
    /// Human-readable device description (adapter name, driver).
    fn device_name(&self) -> String;
    /// Whether `op` is implemented for weights of `format` (for ops without a weight operand the
    /// format is ignored).
    fn supports(&self, op: Op, format: WeightFormat) -> bool;
    fn memory(&self) -> MemoryReport;
    /// The free and total bytes of the memory this lane allocates from, when its device can
    /// tell (`None` otherwise: a wgpu adapter other than Vulkan, a host without /proc/meminfo).
    fn capacity(&self) -> Option<Capacity> {
        None
    }
    /// Tokens one prefill forward takes when the caller does not choose (the CLI, the server,
    /// `describe_image`, `bench_model`): bounds a forward's activations on long prompts. A lane
    /// whose GEMMs gain from more rows a forward takes more (the CUDA lane).
    fn prefill_chunk(&self) -> usize {
        PREFILL_CHUNK
    }
    /// Units of device work issued since the lane opened: kernel launches (CUDA), compute
    /// dispatches and buffer copies encoded (wgpu); `None` on the CPU lane. Benchmarks report the
    /// difference over a decode step (launch and dispatch overhead grow with it).
    fn launches(&self) -> Option<u64> {
        None
    }
    /// The host's time in launches, copies and allocations so far, when `FOVEA_HOST_PROFILE=1`
    /// and the lane collects it (the CUDA lane); `None` otherwise.
    fn host_profile(&self) -> Option<HostProfile> {
        None
    }
    /// Each kernel's device time since the last call, longest first: a diagnostic the GPU lanes
    /// collect with `FOVEA_GPU_TIMES=1` (wgpu: on an adapter with timestamp queries, two
    /// timestamps a dispatch; CUDA: two timing events a launch); `Ok(None)` otherwise.
    fn kernel_times(&self) -> Result<Option<Vec<KernelTime>>> {
        Ok(None)
    }

    // ---- tensors & transfer --------------------------------------------------------------
    /// Copy a host tensor to the device (activation or small f32 parameter).
    fn upload(&self, host: &HostTensor) -> Result<Self::Tensor>;
    /// Copy a host tensor that is a model parameter (bias, norm weight, sentinel) to the device;
    /// counted as weight memory.
    fn upload_param(&self, host: &HostTensor) -> Result<Self::Tensor>;
    /// Copy a weight matrix to the device, keeping its storage format.
    fn upload_weight(&self, weight: &HostWeight<'_>) -> Result<Self::Weight>;
    /// [`Backend::upload_weight`] for a matrix whose products stay f32 in every precision mode:
    /// its outputs pick discrete things (the router's expert scores) or mix the residual streams
    /// (the hyper-connections), where one f16 rounding could flip a choice. Lanes with a single
    /// precision upload it as any weight.
    fn upload_weight_exact(&self, weight: &HostWeight<'_>) -> Result<Self::Weight> {
        self.upload_weight(weight)
    }
    /// Copy the two weights [`Backend::linear_pair`] multiplies with one input (a layer's wq_a
    /// and wkv, a compressor's wkv and wgate, the shared expert's w1 and w3), as
    /// [`Backend::upload_weight`] does each. A lane may place them so that one launch reaches
    /// both (the wgpu lane: back to back in one binding).
    fn upload_weight_pair(&self, a: &HostWeight<'_>, b: &HostWeight<'_>) -> Result<(Self::Weight, Self::Weight)> {
        Ok((self.upload_weight(a)?, self.upload_weight(b)?))
    }
    /// Copy the routed experts of one projection, `expert(j)` for `j < count` (made one at a
    /// time, so a converted source never holds them all), as [`Backend::upload_weight`] does
    /// each. A lane may place them so that [`Backend::moe_experts`] reaches all of them at once
    /// (the wgpu lane: one binding).
    fn upload_experts<'s>(
        &self,
        count: usize,
        expert: &mut dyn FnMut(usize) -> Result<HostWeight<'s>>,
    ) -> Result<Vec<Self::Weight>> {
        (0..count).map(|j| self.upload_weight(&expert(j)?)).collect()
    }
    /// Copy the routed experts of the gate and the up projections (`gate(j)`, `up(j)` for
    /// `j < count`), as [`Backend::upload_experts`] does each. A lane may place them so that one
    /// launch reaches both (the wgpu lane: one binding).
    #[allow(clippy::type_complexity)]
    fn upload_expert_pair<'s>(
        &self,
        count: usize,
        gate: &mut dyn FnMut(usize) -> Result<HostWeight<'s>>,
        up: &mut dyn FnMut(usize) -> Result<HostWeight<'s>>,
    ) -> Result<(Vec<Self::Weight>, Vec<Self::Weight>)> {
        Ok((self.upload_experts(count, gate)?, self.upload_experts(count, up)?))
    }
    /// The precision of this lane's matrix products (see [`Precision`]).
    fn precision(&self) -> Precision {
        Precision::Exact
    }
    /// Device bytes `upload_weight` gives a weight of `format` `[rows, cols]` on this lane: its
    /// rows as stored (the default), or as the lane pads them. Each lane's `upload_weight` sizes
    /// and counts its allocation with this, so `fovea inspect` can report what loading will
    /// take from headers alone, without a device.
    fn weight_alloc_bytes(format: WeightFormat, rows: usize, cols: usize) -> u64
    where
        Self: Sized,
    {
        rows as u64 * format.row_bytes(cols) as u64
    }
    /// Copy a device tensor back to the host (waits for pending work).
    fn download(&self, t: &Self::Tensor) -> Result<HostTensor>;
    /// Wait until the device has finished the work issued so far (ops return once their work
    /// is queued on the GPU lanes; the CPU lane has nothing pending).
    fn sync(&self) -> Result<()>;

    // ---- linear & elementwise (shared by vision and language model) -----------------------
    /// `y = x·Wᵀ + b`: x `[n, in]`, W `[out, in]`, b `[out]` → `[n, out]`.
    fn linear(&self, x: &Self::Tensor, w: &Self::Weight, bias: Option<&Self::Tensor>) -> Result<Self::Tensor>;
    /// Two linears of one input, no bias: `(x·Waᵀ, x·Wbᵀ)`, x `[n, in]`, Wa `[a, in]`, Wb
    /// `[b, in]` → (`[n, a]`, `[n, b]`). The default runs the two; a lane may take both in one
    /// launch (a decode step's wq_a and wkv, a compressor's wkv and wgate, the shared expert's w1
    /// and w3).
    fn linear_pair(
        &self,
        x: &Self::Tensor,
        wa: &Self::Weight,
        wb: &Self::Weight,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        Ok((self.linear(x, wa, None)?, self.linear(x, wb, None)?))
    }
    /// A residual stream's update `residual + linear(x, W, bias)`: x `[n, in]`, W `[out, in]`,
    /// residual `[n, out]` → `[n, out]` (a ViT block's two). The default composes `linear` and
    /// `add`; a lane may fold the sum into its GEMM (the CUDA lane's cuBLASLt path takes the
    /// residual as the matmul's C operand, β = 1, instead of a pass of its own).
    fn linear_add(
        &self,
        x: &Self::Tensor,
        w: &Self::Weight,
        bias: Option<&Self::Tensor>,
        residual: &Self::Tensor,
    ) -> Result<Self::Tensor> {
        self.add(residual, &self.linear(x, w, bias)?)
    }
    /// `linear(rms_norm(x, norm, eps), W, bias)`: x `[n, in]`, norm `[in]`, W `[out, in]`, bias
    /// `[out]` → `[n, out]` (a ViT block's two pre-norm projections). The default composes the
    /// two; a lane may write the normalized rows as its GEMM's operand directly (the CUDA lane's
    /// cuBLASLt path: f16 rows, no f32 rows and no conversion pass between).
    fn rms_norm_linear(
        &self,
        x: &Self::Tensor,
        norm: &Self::Tensor,
        eps: f32,
        w: &Self::Weight,
        bias: Option<&Self::Tensor>,
    ) -> Result<Self::Tensor> {
        self.linear(&self.rms_norm(x, norm, eps)?, w, bias)
    }
    /// A residual stream's MLP update `residual + linear(swiglu(gate_up), W)`: gate_up `[n, 2h]`,
    /// W `[out, h]`, residual `[n, out]` → `[n, out]` (a ViT block's second). The default composes
    /// `swiglu` and `linear_add`; a lane may write the gated rows as its GEMM's operand directly
    /// (the CUDA lane's cuBLASLt path, as `rms_norm_linear`).
    fn swiglu_linear_add(
        &self,
        gate_up: &Self::Tensor,
        w: &Self::Weight,
        residual: &Self::Tensor,
    ) -> Result<Self::Tensor> {
        self.linear_add(&self.swiglu(gate_up)?, w, None, residual)
    }
    /// `x * rsqrt(mean(x²) + eps) * weight` per row: x `[n, d]`, weight `[d]` → `[n, d]`.
    fn rms_norm(&self, x: &Self::Tensor, weight: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;
    /// `a + b`: both `[n, d]` → `[n, d]`.
    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// Columns `[start, start+len)`: x `[n, d]` → `[n, len]`.
    fn slice_cols(&self, x: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor>;
    /// Rows of `a` then rows of `b`: `[n, d]`, `[m, d]` → `[n+m, d]` (f32 or i32, both alike).
    fn concat_rows(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// `out[i] = src[idx[i]]`: src `[m, d]`, idx i32 `[n]` (each in `0..m`) → `[n, d]`.
    fn gather_rows(&self, src: &Self::Tensor, idx: &Self::Tensor) -> Result<Self::Tensor>;
    /// `silu(gate) * up` with gate = first half: x `[n, 2h]` → `[n, h]`.
    fn swiglu(&self, x: &Self::Tensor) -> Result<Self::Tensor>;
    /// Exact GELU `x/2 · (1 + erf(x/√2))`: `[n, d]` → `[n, d]`.
    fn gelu_erf(&self, x: &Self::Tensor) -> Result<Self::Tensor>;

    // ---- vision ------------------------------------------------------------------------
    /// 2-D rotary embedding on every head of x `[grid_h·grid_w, heads·hd]` (rows row-major over
    /// the patch grid). Rotate-half pairs `(d, d + hd/2)`; for `d < hd/4` the angle is
    /// `row · θ^(−4d/hd)`, for `hd/4 ≤ d < hd/2` it is `col · θ^(−4(d−hd/4)/hd)`; f32.
    fn rope_2d(&self, x: &Self::Tensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<Self::Tensor>;
    /// Non-causal multi-head attention, scale 1/√hd: q, k, v `[n, heads·hd]` → `[n, heads·hd]`.
    fn attention(&self, q: &Self::Tensor, k: &Self::Tensor, v: &Self::Tensor, n_heads: usize) -> Result<Self::Tensor>;
    /// A ViT block's attention from its fused projection: qkv `[n, 3·heads·hd]` = q | k | v (n a
    /// whole grid of width `grid_w`) → `attention(rope_2d(q), rope_2d(k), v)` `[n, heads·hd]`.
    /// The default composes exactly those ops ([`attention_rope_2d_parts`]); a lane may fuse the
    /// column slices, the rotations and its own operand conversion (the CUDA lane in fast
    /// precision writes q, and k and v as the tensor cores' f16 operands, straight from qkv).
    fn attention_rope_2d(&self, qkv: &Self::Tensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<Self::Tensor> {
        attention_rope_2d_parts(self, qkv, n_heads, grid_w, theta)
    }
    /// Zero-pad the grid x `[h·w, c]` (row-major) bottom/right to multiples of `r`, then unfold
    /// r×r cells: `[ceil(h/r)·ceil(w/r), c·r·r]`, feature index `ch·r² + dy·r + dx`, cells
    /// row-major.
    fn unfold(&self, x: &Self::Tensor, h: usize, w: usize, r: usize) -> Result<Self::Tensor>;
    /// The aligner's first layer: `gelu_erf(linear(unfold(x, h, w, r), weight, bias))`, x
    /// `[h·w, c]`, weight `[out, c·r²]` → `[ceil(h/r)·ceil(w/r), out]`. The default composes
    /// exactly those ops; a lane may fuse them (the CUDA lane gathers the unfold inside the
    /// GEMM's operand loads, so the `c·r²`-wide cells are never materialised).
    fn unfold_linear_gelu(
        &self,
        x: &Self::Tensor,
        h: usize,
        w: usize,
        r: usize,
        weight: &Self::Weight,
        bias: Option<&Self::Tensor>,
    ) -> Result<Self::Tensor> {
        self.gelu_erf(&self.linear(&self.unfold(x, h, w, r)?, weight, bias)?)
    }

    // ==== language model ===================================================================
    // Sections mirror the model (language.md §2-4, antirez/ds4 `ds4_gpu.h`): embeddings,
    // hyper-connections, attention, compressor & indexer, router & MoE; the head reuses
    // `hc_head_weights`, `hc_pre`, `rms_norm` and `linear`. Shapes: `n` tokens (queries), `d`
    // hidden, `hc` residual streams, `hd` head width. A 4-stream residual `X` is `[n, hc·d]` with
    // stream i at columns `[i·d, (i+1)·d)`. Index tensors are i32. Every default returns
    // `Error::Unsupported`, so a lane that lacks an op refuses it by name, except the fused
    // `route_experts`, whose default composes the router's ops.

    // ---- LM: embeddings --------------------------------------------------------------------
    /// `out[i] = table[ids[i]]` decoded to f32; an id ≥ `table.rows()` (a vision sentinel id,
    /// vision.md §5.1) gives a zero row: table `[vocab, d]`, ids i32 `[n]` → `[n, d]`.
    fn embed_rows(&self, table: &Self::Weight, ids: &Self::Tensor) -> Result<Self::Tensor> {
        let _ = (table, ids);
        Err(self.lm_unsupported(Op::EmbedRows))
    }

    // ---- LM: hyper-connections (mHC, language.md §4.1) ---------------------------------------
    /// Copy every row into `hc` streams: x `[n, d]` → X `[n, hc·d]`.
    fn hc_expand(&self, x: &Self::Tensor, hc: usize) -> Result<Self::Tensor> {
        let _ = (x, hc);
        Err(self.lm_unsupported(Op::HcExpand))
    }
    /// Unweighted RMS norm of each head: x `[n, heads·hd]` → `x_h · rsqrt(mean(x_h²) + eps)`
    /// (`heads = 1` normalises whole rows, e.g. the flattened residual before the HC mix).
    fn rms_norm_heads(&self, x: &Self::Tensor, n_heads: usize, eps: f32) -> Result<Self::Tensor> {
        let _ = (x, n_heads, eps);
        Err(self.lm_unsupported(Op::RmsNormHeads))
    }
    /// mHC split with Sinkhorn: mix `[n, (2+hc)·hc]` (= `fn · rms(vec X)`), scale `[3]`, base
    /// `[(2+hc)·hc]` → `[n, (2+hc)·hc]` laid out `[pre (hc) | post (hc) | comb (hc·hc)]`:
    /// `pre = σ(m·s0 + b) + eps`, `post = 2σ(m·s1 + b)`, `comb[src·hc + dst]` = softmax over dst of
    /// `m·s2 + b`, `+ eps`, divided by its column (src) sum + eps, then `iters − 1` rounds of
    /// {row (dst) normalisation, column (src) normalisation}, each `/ (sum + eps)`.
    fn hc_split(
        &self,
        mix: &Self::Tensor,
        scale: &Self::Tensor,
        base: &Self::Tensor,
        hc: usize,
        iters: usize,
        eps: f32,
    ) -> Result<Self::Tensor> {
        let _ = (mix, scale, base, hc, iters, eps);
        Err(self.lm_unsupported(Op::HcSplit))
    }
    /// A sublayer's split straight from the residual: `hc_split(linear(rms_norm_heads(x, 1,
    /// norm_eps), mix), scale, base, hc, iters, eps)`, X `[n, hc·d]`, mix `[(2+hc)·hc, hc·d]` →
    /// `[n, (2+hc)·hc]`. The default composes the three ops; a lane may fuse them, taking the
    /// norm's factor out of the product (`(x·mixᵀ) · rsqrt(mean(x²) + norm_eps)`, equal up to
    /// rounding): a decode step runs this twice a layer.
    #[allow(clippy::too_many_arguments)]
    fn hc_mix_split(
        &self,
        x: &Self::Tensor,
        mix: &Self::Weight,
        scale: &Self::Tensor,
        base: &Self::Tensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
    ) -> Result<Self::Tensor> {
        hc_mix_split_parts(self, x, mix, scale, base, hc, iters, eps, norm_eps)
    }
    /// A sublayer's split and its input at once: `split = hc_mix_split(x, mix, scale, base, hc,
    /// iters, eps, norm_eps)` and `hc_pre_norm(x, split, hc, weight, norm_eps)`, X `[n, hc·d]`,
    /// weight `[d]` → (split `[n, (2+hc)·hc]`, input `[n, d]`). The default composes the two; a
    /// lane may fuse them (a decode step runs this twice a layer).
    #[allow(clippy::too_many_arguments)]
    fn hc_mix_split_pre_norm(
        &self,
        x: &Self::Tensor,
        mix: &Self::Weight,
        scale: &Self::Tensor,
        base: &Self::Tensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
        weight: &Self::Tensor,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        let split = self.hc_mix_split(x, mix, scale, base, hc, iters, eps, norm_eps)?;
        let y = self.hc_pre_norm(x, &split, hc, weight, norm_eps)?;
        Ok((split, y))
    }
    /// A sublayer's output written back and the next sublayer's split and input at once:
    /// `x' = hc_post(x, f, split)` and `(split', input) = hc_mix_split_pre_norm(x', mix, scale,
    /// base, hc, iters, eps, norm_eps, weight)` → (x' `[n, hc·d]`, split' `[n, (2+hc)·hc]`, input
    /// `[n, d]`). The default composes the two; a lane may fuse the post into the split's reading
    /// of x' (a forward runs this 2L − 1 times for L layers: every post but the last layer's).
    #[allow(clippy::too_many_arguments)]
    fn hc_post_mix_split_pre_norm(
        &self,
        x: &Self::Tensor,
        f: &Self::Tensor,
        split: &Self::Tensor,
        mix: &Self::Weight,
        scale: &Self::Tensor,
        base: &Self::Tensor,
        hc: usize,
        iters: usize,
        eps: f32,
        norm_eps: f32,
        weight: &Self::Tensor,
    ) -> Result<(Self::Tensor, Self::Tensor, Self::Tensor)> {
        let x = self.hc_post(x, f, split)?;
        let (split, y) = self.hc_mix_split_pre_norm(&x, mix, scale, base, hc, iters, eps, norm_eps, weight)?;
        Ok((x, split, y))
    }
    /// Collapse the streams: X `[n, hc·d]`, w `[n, c]` (c ≥ hc; its first hc columns are the
    /// weights: `hc_head_weights`' `[n, hc]`, or `hc_split`'s output whose first hc are `pre`) →
    /// `Σ_i w_i · X_i` `[n, d]`.
    fn hc_pre(&self, x: &Self::Tensor, w: &Self::Tensor, hc: usize) -> Result<Self::Tensor> {
        let _ = (x, w, hc);
        Err(self.lm_unsupported(Op::HcPre))
    }
    /// Write a sublayer output back: X `[n, hc·d]`, f `[n, d]`, split `[n, (2+hc)·hc]`
    /// (`hc_split`'s output: post = columns hc..2hc, comb = columns 2hc.., index `src·hc + dst`)
    /// → X' `[n, hc·d]`, `X'_dst = post_dst · f + Σ_src comb[src, dst] · X_src`. Taking the split
    /// whole saves a GPU lane the three column slices of every sublayer.
    fn hc_post(&self, x: &Self::Tensor, f: &Self::Tensor, split: &Self::Tensor) -> Result<Self::Tensor> {
        let _ = (x, f, split);
        Err(self.lm_unsupported(Op::HcPost))
    }
    /// A sublayer's input: the streams collapsed and normalised, `rms_norm(hc_pre(x, w, hc),
    /// weight, eps)`, X `[n, hc·d]`, w `[n, c ≥ hc]`, weight `[d]` → `[n, d]`. The default composes
    /// the two ops; a lane may fuse them (a decode step runs this twice a layer).
    fn hc_pre_norm(
        &self,
        x: &Self::Tensor,
        w: &Self::Tensor,
        hc: usize,
        weight: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor> {
        self.rms_norm(&self.hc_pre(x, w, hc)?, weight, eps)
    }
    /// Final-head stream weights (no Sinkhorn, §4.2): mix `[n, hc]`, scale `[1]`, base `[hc]` →
    /// `σ(mix · scale + base) + eps` `[n, hc]`.
    fn hc_head_weights(
        &self,
        mix: &Self::Tensor,
        scale: &Self::Tensor,
        base: &Self::Tensor,
        eps: f32,
    ) -> Result<Self::Tensor> {
        let _ = (mix, scale, base, eps);
        Err(self.lm_unsupported(Op::HcHeadWeights))
    }

    // ---- LM: attention (§2.1, §2.4-2.6) --------------------------------------------------------
    /// Interleaved RoPE on the last `rd = 2·inv_freq.len()` dims of every head: x
    /// `[n, heads·hd]`, inv_freq `[rd/2]`; row i sits at position `p = pos0 + i·stride`; pair
    /// `(2j, 2j+1)` of the tail rotates by `a = f32(p) · inv_freq[j]` (f32), or by `−a` when
    /// `inverse` (the output de-rotation) → `[n, heads·hd]`.
    fn rope_tail(
        &self,
        x: &Self::Tensor,
        n_heads: usize,
        inv_freq: &Self::Tensor,
        pos0: usize,
        stride: usize,
        inverse: bool,
    ) -> Result<Self::Tensor> {
        let _ = (x, n_heads, inv_freq, pos0, stride, inverse);
        Err(self.lm_unsupported(Op::RopeTail))
    }
    /// [`Backend::rope_tail`] with every row at its own position (rows of several sequences in
    /// one batch): x `[n, heads·hd]`, inv_freq `[rd/2]`, positions i32 `[n]`, each ≥ 0 (the CPU
    /// lane refuses a negative one; the GPU lanes cannot check without a host round trip) →
    /// `[n, heads·hd]`; row i rotates by `f32(positions[i]) · inv_freq[j]`, bit for bit what
    /// `rope_tail` gives a row at that position.
    fn rope_tail_at(
        &self,
        x: &Self::Tensor,
        n_heads: usize,
        inv_freq: &Self::Tensor,
        positions: &Self::Tensor,
        inverse: bool,
    ) -> Result<Self::Tensor> {
        let _ = (x, n_heads, inv_freq, positions, inverse);
        Err(self.lm_unsupported(Op::RopeTailAt))
    }
    /// The projected queries' and keys' norm and RoPE in one op: x `[n, heads·hd]`, each head
    /// RMS-normalised (`rms_norm_heads`; with `weight` `[hd]`, one head only, `rms_norm`), then
    /// rotated forward at the row's position (`rope_tail_at(·, heads, inv_freq, positions,
    /// false)`) → `[n, heads·hd]`. The default composes the two ops; a lane may fuse them.
    fn rms_norm_rope(
        &self,
        x: &Self::Tensor,
        weight: Option<&Self::Tensor>,
        n_heads: usize,
        eps: f32,
        inv_freq: &Self::Tensor,
        positions: &Self::Tensor,
    ) -> Result<Self::Tensor> {
        let normed = match weight {
            Some(_) if n_heads != 1 => {
                return Err(Error::shape(
                    Op::RmsNormRope.name(),
                    format!("a norm weight needs one head, not {n_heads}"),
                ));
            }
            Some(w) => self.rms_norm(x, w, eps)?,
            None => self.rms_norm_heads(x, n_heads, eps)?,
        };
        self.rope_tail_at(&normed, n_heads, inv_freq, positions, false)
    }
    /// One joint softmax over raw window keys ∪ compressed entries, with a per-head sink logit
    /// (no value) and K = V (one shared latent): q `[n, heads·hd]`, kv `[m, hd]` raw keys,
    /// window i32 `[n, 2]` = inclusive raw-key range `lo..=hi` of each query (`lo > hi`: none),
    /// comp `[c, hd]` compressed entries with comp_idx i32 `[n, k]` (entries each query sees,
    /// −1 = empty slot), sinks `[heads]` → `[n, heads·hd]`. Logits `q·kᵀ / √hd`.
    #[allow(clippy::too_many_arguments)]
    fn sink_attention(
        &self,
        q: &Self::Tensor,
        kv: &Self::Tensor,
        window: &Self::Tensor,
        comp: Option<(&Self::Tensor, &Self::Tensor)>,
        sinks: &Self::Tensor,
        n_heads: usize,
    ) -> Result<Self::Tensor> {
        let _ = (q, kv, window, comp, sinks, n_heads);
        Err(self.lm_unsupported(Op::SinkAttention))
    }
    /// The attention's output de-rotated in one op: [`Backend::sink_attention`], then its heads'
    /// RoPE tails rotated back at each query's position (`rope_tail_at(·, n_heads, inv_freq,
    /// positions, true)`) → `[n, heads·hd]`. The default composes the two ops; a lane may fuse
    /// them.
    #[allow(clippy::too_many_arguments)]
    fn sink_attention_rope(
        &self,
        q: &Self::Tensor,
        kv: &Self::Tensor,
        window: &Self::Tensor,
        comp: Option<(&Self::Tensor, &Self::Tensor)>,
        sinks: &Self::Tensor,
        n_heads: usize,
        inv_freq: &Self::Tensor,
        positions: &Self::Tensor,
    ) -> Result<Self::Tensor> {
        let o = self.sink_attention(q, kv, window, comp, sinks, n_heads)?;
        self.rope_tail_at(&o, n_heads, inv_freq, positions, true)
    }
    /// Grouped low-rank projection (§2.5): x `[n, g·k]`, w `[g·r, k]` → `[n, g·r]`; group j
    /// maps columns `[j·k, (j+1)·k)` of x through rows `[j·r, (j+1)·r)` of w.
    fn grouped_linear(&self, x: &Self::Tensor, w: &Self::Weight, groups: usize) -> Result<Self::Tensor> {
        let _ = (x, w, groups);
        Err(self.lm_unsupported(Op::GroupedLinear))
    }

    // ---- LM: compressor & indexer (§2.2, §2.3) -------------------------------------------------
    /// Gated pooling of ratio-r blocks, rows starting at a block boundary: kv, gate `[T, w]`,
    /// ape `[r, w]` → `[⌊T/r⌋, d]` (a trailing incomplete block emits nothing; decode keeps
    /// those rows in its cache). Without overlap (w = d) entry i is, per
    /// channel, `Σ_t softmax_t(gate_t + ape[t mod r]) · kv_t` over block i. With overlap
    /// (w = 2d, CSA) the softmax runs over 2r rows: the first halves `[0, d)` of block i−1 (none
    /// for i = 0) and the second halves `[d, 2d)` of block i.
    fn compress_pool(
        &self,
        kv: &Self::Tensor,
        gate: &Self::Tensor,
        ape: &Self::Tensor,
        ratio: usize,
        overlap: bool,
    ) -> Result<Self::Tensor> {
        let _ = (kv, gate, ape, ratio, overlap);
        Err(self.lm_unsupported(Op::CompressPool))
    }
    /// Lightning-indexer scores: q `[n, heads·hd]`, k `[m, hd]`, w `[n, heads]` → `[n, m]`,
    /// `score = scale · Σ_h w_h · ReLU(q_h · k)`; entry j of query i is −inf unless
    /// `j < (pos0 + i + 1) / ratio` (only complete blocks are visible).
    #[allow(clippy::too_many_arguments)]
    fn indexer_scores(
        &self,
        q: &Self::Tensor,
        k: &Self::Tensor,
        w: &Self::Tensor,
        n_heads: usize,
        scale: f32,
        pos0: usize,
        ratio: usize,
    ) -> Result<Self::Tensor> {
        let _ = (q, k, w, n_heads, scale, pos0, ratio);
        Err(self.lm_unsupported(Op::IndexerScores))
    }
    /// Top-k per row: x `[n, m]` → i32 `[n, k]`, the columns of the k largest finite values in
    /// descending order (ties: lower column first); −1 fills the slots a row lacks.
    fn topk_rows(&self, x: &Self::Tensor, k: usize) -> Result<Self::Tensor> {
        let _ = (x, k);
        Err(self.lm_unsupported(Op::TopkRows))
    }

    // ---- LM: router & MoE (§3) ----------------------------------------------------------------
    /// `sqrt(softplus(x))` elementwise (router scores): `[n, e]` → `[n, e]`.
    fn sqrt_softplus(&self, x: &Self::Tensor) -> Result<Self::Tensor> {
        let _ = x;
        Err(self.lm_unsupported(Op::SqrtSoftplus))
    }
    /// Hash routing: table i32 `[vocab, k]` (`tid2eid`), ids i32 `[n]`, fallback i32 `[n, k]` →
    /// i32 `[n, k]`: `table[id]` for `id < vocab`, the fallback row otherwise (image tokens).
    fn hash_route(&self, table: &Self::Tensor, ids: &Self::Tensor, fallback: &Self::Tensor) -> Result<Self::Tensor> {
        let _ = (table, ids, fallback);
        Err(self.lm_unsupported(Op::HashRoute))
    }
    /// Routing weights: scores `[n, e]`, ids i32 `[n, k]` → `[n, k]`,
    /// `scale · s[ids] / (Σ_k s[ids] + 1e-20)`.
    fn route_weights(&self, scores: &Self::Tensor, ids: &Self::Tensor, scale: f32) -> Result<Self::Tensor> {
        let _ = (scores, ids, scale);
        Err(self.lm_unsupported(Op::RouteWeights))
    }
    /// The whole router after the gate projection (§3, vision.md §5.2): logits `[n, e]`, bias
    /// `[b, e]` (row 0 text, row 1 image tokens), kind i32 `[n]` (each token's bias row), hash
    /// = (tid2eid i32 `[vocab, k]`, token ids i32 `[n]`) on hash layers, k, scale →
    /// (selected experts i32 `[n, k]`, weights `[n, k]`). Scores `s = sqrt_softplus(logits)`;
    /// the experts are the `topk_rows` of `s + bias[kind]`, replaced by `tid2eid[id]` on hash
    /// layers for text ids (`hash_route`); the weights are `route_weights` of the unbiased `s`.
    /// The default composes exactly those ops; a lane may fuse them, bit for bit in the
    /// selection.
    fn route_experts(
        &self,
        logits: &Self::Tensor,
        bias: &Self::Tensor,
        kind: &Self::Tensor,
        hash: Option<(&Self::Tensor, &Self::Tensor)>,
        k: usize,
        scale: f32,
    ) -> Result<(Self::Tensor, Self::Tensor)> {
        route_experts_parts(self, logits, bias, kind, hash, k, scale)
    }
    /// Clamped SwiGLU: gate g and up u, both `[n, h]` → `silu(min(g, limit)) · clamp(u, ±limit)`
    /// `[n, h]`.
    fn swiglu_clamp(&self, g: &Self::Tensor, u: &Self::Tensor, limit: f32) -> Result<Self::Tensor> {
        let _ = (g, u, limit);
        Err(self.lm_unsupported(Op::SwigluClamp))
    }
    /// The MoE sublayer's output: the routed experts' sum `routed` `[n, d]` plus the shared
    /// expert of x `[n, d]` (gate `w1` and up `w3` `[h, d]`, uploaded as a pair, down `w2`
    /// `[d, h]`): `add(routed, linear(swiglu_clamp(linear_pair(x, w1, w3), limit), w2))`. The
    /// default composes those ops, for one row (a decode step) the down projection and the sum as
    /// `linear_add`, which a lane may fuse (the CUDA lane does; more rows keep `linear` then `add`,
    /// so a prefill's bits stay as they were); a lane may fuse them all (f32 addition commutes: the
    /// sum's operands in either order).
    #[allow(clippy::too_many_arguments)]
    fn shared_expert(
        &self,
        x: &Self::Tensor,
        w1: &Self::Weight,
        w3: &Self::Weight,
        w2: &Self::Weight,
        limit: f32,
        routed: &Self::Tensor,
    ) -> Result<Self::Tensor> {
        let (g, u) = self.linear_pair(x, w1, w3)?;
        let h = self.swiglu_clamp(&g, &u, limit)?;
        match x.rows() {
            1 => self.linear_add(&h, w2, None, routed),
            _ => self.add(routed, &self.linear(&h, w2, None)?),
        }
    }
    /// Routed experts: x `[n, d]`, ids i32 `[n, k]`, weights `[n, k]`, per expert e the gate
    /// `w1[e]` `[h, d]`, the up `w3[e]` `[h, d]` and the down `w2[e]` `[d, h]` → `[n, d]`,
    /// `Σ_k weights_k · w2_e(swiglu_clamp(w1_e · x, w3_e · x))` (weight applied after w2).
    /// The three projections are separate weights, each in its own storage format: GGUF mixes
    /// pick a type per tensor (IQ1_S gate with IQ1_M up), and one stacked gate/up matrix would
    /// have to expand such a pair to a common format.
    #[allow(clippy::too_many_arguments)]
    fn moe_experts(
        &self,
        x: &Self::Tensor,
        ids: &Self::Tensor,
        weights: &Self::Tensor,
        w1: &[Self::Weight],
        w3: &[Self::Weight],
        w2: &[Self::Weight],
        limit: f32,
    ) -> Result<Self::Tensor> {
        let _ = (x, ids, weights, w1, w3, w2, limit);
        Err(self.lm_unsupported(Op::MoeExperts))
    }

    /// The `Unsupported` error of a language-model op this lane does not implement.
    fn lm_unsupported(&self, op: Op) -> Error {
        Error::Unsupported {
            lane: self.lane(),
            op: op.name(),
            what: "any operands (language-model op not implemented on this lane)".into(),
        }
    }
}
