//! The `Backend` contract: every op the model graph uses, grouped in sections that mirror the
//! model (tensors & transfer, linear & elementwise, vision). A lane (CPU, wgpu, later CUDA)
//! implements it; the graph in `crate::model` is written once against it.
//!
//! Conventions shared by every lane:
//! - Activations are row-major 2-D tensors `[rows, cols]` of f32 (index tensors are i32).
//! - Tensors live on the lane's device; `upload`/`download` are the only host crossings, and a
//!   forward pass never calls `download` between ops.
//! - The matrix operand of `linear` is a separate `Weight` handle that keeps the checkpoint's
//!   storage format (`WeightFormat`): a bf16 weight stays bf16 in device memory and is converted
//!   inside the kernel. Block-quantised formats are added to `WeightFormat` later, the same way.
//! - A lane that lacks an op or a format returns `Error::Unsupported` naming the op; it never
//!   falls back to another lane silently.

pub mod cpu;
pub mod wgpu;

use std::borrow::Cow;
use std::fmt;

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

/// Storage format of a `linear` weight matrix, as it lies in the checkpoint and on the device.
/// Later issues add block formats (GGUF Q8_0, K-quants, IQ1_S/IQ2_XXS, FP8/FP4 with E8M0
/// scales); each is dequantised inside the kernels, never expanded in memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightFormat {
    F32,
    F16,
    BF16,
}

impl WeightFormat {
    /// Bytes one row of `cols` elements occupies in this format.
    pub fn row_bytes(self, cols: usize) -> usize {
        match self {
            WeightFormat::F32 => cols * 4,
            WeightFormat::F16 | WeightFormat::BF16 => cols * 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::F32 => "F32",
            WeightFormat::F16 => "F16",
            WeightFormat::BF16 => "BF16",
        }
    }
}

impl fmt::Display for WeightFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
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
    pub fn validate(&self) -> Result<()> {
        let want = self.rows * self.format.row_bytes(self.cols);
        if self.bytes.len() != want {
            return Err(Error::tensor(
                &self.name,
                format!("{} bytes for a {}x{} {} matrix, expected {want}", self.bytes.len(), self.rows, self.cols, self.format),
            ));
        }
        Ok(())
    }

    /// Row `r` converted to f32 (used by the CPU lane and by tests).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        decode_row(self.format, &self.bytes[r * self.format.row_bytes(self.cols)..][..self.format.row_bytes(self.cols)], out);
    }
}

/// Decode one little-endian row of `format` elements into f32.
pub fn decode_row(format: WeightFormat, bytes: &[u8], out: &mut [f32]) {
    match format {
        WeightFormat::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        WeightFormat::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        WeightFormat::BF16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
    }
}

/// The ops of the contract, named for error messages and for `Backend::supports`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Linear,
    RmsNorm,
    Add,
    SliceCols,
    ConcatRows,
    GatherRows,
    Swiglu,
    GeluErf,
    Rope2d,
    Attention,
    Unfold,
}

impl Op {
    pub const ALL: [Op; 11] = [
        Op::Linear,
        Op::RmsNorm,
        Op::Add,
        Op::SliceCols,
        Op::ConcatRows,
        Op::GatherRows,
        Op::Swiglu,
        Op::GeluErf,
        Op::Rope2d,
        Op::Attention,
        Op::Unfold,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Op::Linear => "linear",
            Op::RmsNorm => "rms_norm",
            Op::Add => "add",
            Op::SliceCols => "slice_cols",
            Op::ConcatRows => "concat_rows",
            Op::GatherRows => "gather_rows",
            Op::Swiglu => "swiglu",
            Op::GeluErf => "gelu_erf",
            Op::Rope2d => "rope_2d",
            Op::Attention => "attention",
            Op::Unfold => "unfold",
        }
    }
}

/// Device memory a lane holds, split by role (weights vs activations).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Bytes of device memory holding weights (matrices, biases, norms, sentinels).
    pub weight_bytes: u64,
    /// Bytes of device memory currently holding activations.
    pub activation_bytes: u64,
    /// High-water mark of `activation_bytes`.
    pub peak_activation_bytes: u64,
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

    // ---- tensors & transfer --------------------------------------------------------------
    /// Copy a host tensor to the device (activation or small f32 parameter).
    fn upload(&self, host: &HostTensor) -> Result<Self::Tensor>;
    /// Copy a host tensor that is a model parameter (bias, norm weight, sentinel) to the device;
    /// counted as weight memory.
    fn upload_param(&self, host: &HostTensor) -> Result<Self::Tensor>;
    /// Copy a weight matrix to the device, keeping its storage format.
    fn upload_weight(&self, weight: &HostWeight<'_>) -> Result<Self::Weight>;
    /// Copy a device tensor back to the host (waits for pending work).
    fn download(&self, t: &Self::Tensor) -> Result<HostTensor>;

    // ---- linear & elementwise (shared by vision and language model) -----------------------
    /// `y = x·Wᵀ + b`: x `[n, in]`, W `[out, in]`, b `[out]` → `[n, out]`.
    fn linear(&self, x: &Self::Tensor, w: &Self::Weight, bias: Option<&Self::Tensor>) -> Result<Self::Tensor>;
    /// `x * rsqrt(mean(x²) + eps) * weight` per row: x `[n, d]`, weight `[d]` → `[n, d]`.
    fn rms_norm(&self, x: &Self::Tensor, weight: &Self::Tensor, eps: f32) -> Result<Self::Tensor>;
    /// `a + b`: both `[n, d]` → `[n, d]`.
    fn add(&self, a: &Self::Tensor, b: &Self::Tensor) -> Result<Self::Tensor>;
    /// Columns `[start, start+len)`: x `[n, d]` → `[n, len]`.
    fn slice_cols(&self, x: &Self::Tensor, start: usize, len: usize) -> Result<Self::Tensor>;
    /// Rows of `a` then rows of `b`: `[n, d]`, `[m, d]` → `[n+m, d]`.
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
    /// Zero-pad the grid x `[h·w, c]` (row-major) bottom/right to multiples of `r`, then unfold
    /// r×r cells: `[ceil(h/r)·ceil(w/r), c·r·r]`, feature index `ch·r² + dy·r + dx`, cells
    /// row-major.
    fn unfold(&self, x: &Self::Tensor, h: usize, w: usize, r: usize) -> Result<Self::Tensor>;
}
