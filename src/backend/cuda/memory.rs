//! The CUDA lane's device memory: activations (`CudaTensor`) and weights (`CudaWeight`), one
//! plain device allocation each, the pool that recycles dropped activations' buffers
//! (`BufferPool`), and the byte counters behind `Backend::memory`.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaSlice;

use crate::backend::checks::NamedWeight;
use crate::backend::{DType, DeviceTensor, DeviceWeight, HostClock, WeightFormat};

/// Device buffers of dropped tensors, kept by byte length for the next tensor of that length.
/// A decode step allocates and drops some fifty activations a layer, each a
/// `cuMemAllocAsync` / `cuMemFreeAsync` pair on the host; the step was bound by the host (an
/// H200, the full q2 model: issued in 19.5 of its 20.2 ms, 2 176 launches). Reuse is safe without
/// events: the lane issues all work on one stream, so a kernel that writes a reused buffer runs
/// after every kernel that read it before. At most `POOL_BYTES` are held; a larger free is
/// returned to the driver.
#[derive(Default)]
pub(super) struct BufferPool {
    pub(super) free: Mutex<HashMap<usize, Vec<CudaSlice<u8>>>>,
    pub(super) held: AtomicU64,
}

/// What the pool keeps: far above a decode step's activations (a few MiB a layer), small beside
/// a long prefill's (which return theirs to the driver).
pub(super) const POOL_BYTES: u64 = 256 << 20;

impl BufferPool {
    pub(super) fn take(&self, len: usize) -> Option<CudaSlice<u8>> {
        let buf = self.free.lock().unwrap_or_else(|e| e.into_inner()).get_mut(&len)?.pop()?;
        self.held.fetch_sub(len as u64, Ordering::Relaxed);
        Some(buf)
    }

    /// Keep `buf`, or free it when the pool is full.
    pub(super) fn give(&self, buf: CudaSlice<u8>) {
        let len = buf.len();
        if self.held.load(Ordering::Relaxed) + len as u64 > POOL_BYTES {
            return;
        }
        self.held.fetch_add(len as u64, Ordering::Relaxed);
        self.free.lock().unwrap_or_else(|e| e.into_inner()).entry(len).or_default().push(buf);
    }

    /// Return every kept buffer to the driver.
    pub(super) fn drain(&self) {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).clear();
        self.held.store(0, Ordering::Relaxed);
    }
}

#[derive(Default)]
pub(super) struct Counters {
    /// `Backend::host_profile`'s counts and times.
    pub(super) clock: HostClock,
    pub(super) weight: AtomicU64,
    /// The part of `weight` held by weight matrices.
    pub(super) matrix: AtomicU64,
    pub(super) activation: AtomicU64,
    pub(super) peak: AtomicU64,
    /// Kernel launches issued (`Backend::launches`).
    pub(super) launches: AtomicU64,
}

impl Counters {
    pub(super) fn add_activation(&self, bytes: u64) {
        let now = self.activation.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Counted as activation memory while alive.
    Activation,
    /// A model parameter or a constant table, counted as weight memory while alive.
    Weight,
}

/// A device tensor: one allocation plus shape and dtype. Uncounted when dropped.
pub struct CudaTensor {
    /// Taken back into `pool` when the tensor drops (the only place that takes it).
    pub(super) buf: ManuallyDrop<CudaSlice<u8>>,
    pub(super) pool: Arc<BufferPool>,
    /// Bytes of the elements (numel · 4).
    pub(super) bytes: usize,
    /// Guard words after the elements (activations only).
    pub(super) guard_words: u32,
    /// Bytes counted in the memory report.
    pub(super) counted: u64,
    pub(super) role: Role,
    pub(super) shape: Vec<usize>,
    pub(super) dtype: DType,
    pub(super) producer: &'static str,
    pub(super) counters: Arc<Counters>,
}

impl CudaTensor {
    pub(super) fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The op that wrote this tensor ("upload", "linear", ...).
    pub fn producer(&self) -> &'static str {
        self.producer
    }
}

impl Drop for CudaTensor {
    fn drop(&mut self) {
        let c = match self.role {
            Role::Activation => &self.counters.activation,
            Role::Weight => &self.counters.weight,
        };
        c.fetch_sub(self.counted, Ordering::Relaxed);
        // SAFETY: `buf` is not used again: this is the tensor's drop.
        self.pool.give(unsafe { ManuallyDrop::take(&mut self.buf) });
    }
}

impl std::fmt::Debug for CudaTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CudaTensor({} {:?} from {})", self.dtype, self.shape, self.producer)
    }
}

impl DeviceTensor for CudaTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        self.dtype
    }
}

/// A weight matrix `[rows, cols]` in its storage format, one allocation, rows packed.
pub struct CudaWeight {
    pub(super) name: String,
    pub(super) format: WeightFormat,
    pub(super) rows: usize,
    pub(super) cols: usize,
    pub(super) buf: CudaSlice<u8>,
    pub(super) counted: u64,
    pub(super) counters: Arc<Counters>,
    /// Uploaded by `upload_weight_exact`: its products stay f32 in fast mode.
    pub(super) exact: bool,
    /// The matrix as the f16 operand cuBLASLt reads, made by the first GEMM there that takes it
    /// and kept for the next (`CudaBackend::kept_weight_f16`): BF16 and F32 matrices (whose copy
    /// is no larger than the matrix) where the device has room. Counted in `Counters::weight`, not
    /// `matrix` (the file's footprint).
    pub(super) f16: OnceLock<CudaSlice<u8>>,
}

impl CudaWeight {
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Device bytes of the matrix.
    pub fn device_bytes(&self) -> u64 {
        self.counted
    }
}

impl Drop for CudaWeight {
    fn drop(&mut self) {
        self.counters.weight.fetch_sub(self.counted, Ordering::Relaxed);
        self.counters.matrix.fetch_sub(self.counted, Ordering::Relaxed);
        if let Some(copy) = self.f16.get() {
            self.counters.weight.fetch_sub(copy.len() as u64, Ordering::Relaxed);
        }
    }
}

impl DeviceWeight for CudaWeight {
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

impl NamedWeight for CudaWeight {
    fn name(&self) -> &str {
        &self.name
    }
}
