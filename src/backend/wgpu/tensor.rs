//! The lane's device memory: activation tensors (recycled by size when dropped), weights (in
//! pool sub-allocations, split into chunks that each fit one binding), the counters the memory
//! report and `Backend::host_profile` read, and the lane's allocation (binding-limit checks,
//! guard bands, weight rows written padded into their pool).

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{formats, size_class};
use crate::backend::checks::NamedWeight;
use crate::backend::{Backend, DType, DeviceTensor, DeviceWeight, HostClock, HostWeight, WeightFormat};
use crate::error::{Error, Result};

#[derive(Default)]
pub(super) struct Counters {
    pub(super) weight: AtomicU64,
    /// Bytes of the weight matrices inside the pools (the part of `weight` they fill).
    pub(super) matrix: AtomicU64,
    pub(super) activation: AtomicU64,
    /// Bytes written by `Queue::write_buffer` since the lane last submitted and waited for them.
    pub(super) staged: AtomicU64,
    pub(super) peak: AtomicU64,
    pub(super) cached: AtomicU64,
    /// Commands encoded: compute dispatches and buffer copies (`Backend::launches`).
    pub(super) commands: AtomicU64,
    /// `Backend::host_profile`'s counts and times.
    pub(super) clock: HostClock,
}

impl Counters {
    pub(super) fn add_activation(&self, bytes: u64) {
        let now = self.activation.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
}

/// Freed activation buffers by size class ([`super::size_class`]), for reuse. Past the bound
/// (`Options::free_list_bytes`) the classes least recently used go first: emptying the whole list
/// instead made a prefill whose buffers passed the bound allocate them again (a 4 096-token
/// prefill of 4 layers on an H100: 327 allocations, 281 ms of host time).
#[derive(Default)]
pub(super) struct FreeList {
    classes: HashMap<u64, FreeClass>,
    /// Counts takes and returns: a class's `used` is the count at its latest.
    clock: u64,
}

#[derive(Default)]
struct FreeClass {
    buffers: Vec<wgpu::Buffer>,
    used: u64,
}

impl FreeList {
    /// A free buffer of `size` bytes, if any.
    pub(super) fn take(&mut self, size: u64) -> Option<wgpu::Buffer> {
        self.clock += 1;
        let class = self.classes.get_mut(&size)?;
        class.used = self.clock;
        class.buffers.pop()
    }

    /// Keep `buf` of `size` bytes.
    fn put(&mut self, size: u64, buf: wgpu::Buffer) {
        self.clock += 1;
        let class = self.classes.entry(size).or_default();
        class.used = self.clock;
        class.buffers.push(buf);
    }

    /// Let the least recently used class holding buffers go; their bytes (None with no buffer
    /// left).
    fn evict_oldest(&mut self) -> Option<u64> {
        self.classes.retain(|_, c| !c.buffers.is_empty());
        let size = self.classes.iter().min_by_key(|(_, c)| c.used).map(|(s, _)| *s)?;
        self.classes.remove(&size).map(|c| size * c.buffers.len() as u64)
    }
}

/// State shared between the backend and its tensors (so a dropped tensor can give its buffer
/// back and be uncounted).
pub(super) struct Shared {
    pub(super) counters: Counters,
    pub(super) free: Mutex<FreeList>,
    pub(super) reuse: bool,
    /// `Options::free_list_bytes`.
    pub(super) free_cap: u64,
    /// Buffers let go of for good so far (a weight or table dropped, an activation dropped
    /// without reuse or larger than the free list's bound, the free list trimmed, a size class
    /// let go at its bound): the bind-group cache, whose groups keep their buffers alive, empties
    /// itself when this moves (bind_groups.rs).
    pub(super) released: AtomicU64,
}

impl Shared {
    pub(super) fn release(&self) {
        self.released.fetch_add(1, Ordering::Release);
    }

    /// Put each size's free buffers in one order, the buffers' own. A download ends a decode
    /// step: the next step then takes its buffers in an order set by which buffers are free,
    /// not by the order the last step dropped them in (which shifts from step to step with what
    /// a step keeps: the caches, the logits), so it binds the buffers an earlier step with the
    /// same free buffers bound and finds their bind groups cached (bind_groups.rs).
    pub(super) fn order_free_list(&self) {
        for class in self.free.lock().unwrap().classes.values_mut() {
            class.buffers.sort_unstable();
        }
    }

    /// Let every buffer of the free list (`free`, its lock held) go.
    pub(super) fn empty_free_list(&self, free: &mut FreeList) {
        free.classes.clear();
        self.counters.cached.store(0, Ordering::Relaxed);
        self.release();
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Role {
    /// Own buffer, counted as activation memory, returned to the free list on drop.
    Activation,
    /// Sub-allocated from a weight pool (params); the pool is counted as weight memory.
    Pooled,
    /// Own buffer holding a constant table (rope cos/sin); counted as weight memory until dropped.
    Table,
}

/// A device tensor: a buffer range plus shape and dtype. Activations are freed (recycled) on drop.
pub struct WgpuTensor {
    pub(super) buf: wgpu::Buffer,
    pub(super) offset: u64,
    /// Bytes of the elements (numel · 4).
    pub(super) bytes: u64,
    /// Guard words after the elements (activations only).
    pub(super) guard_words: u32,
    /// Bytes counted in the memory report for this tensor (activations: the buffer size).
    pub(super) counted: u64,
    pub(super) role: Role,
    pub(super) shape: Vec<usize>,
    pub(super) dtype: DType,
    /// Op that produced this tensor (for guard-band messages).
    pub(super) producer: &'static str,
    pub(super) shared: Arc<Shared>,
}

impl WgpuTensor {
    pub(super) fn numel(&self) -> usize {
        self.shape.iter().product()
    }
    /// The op that wrote this tensor ("upload", "linear", ...).
    pub fn producer(&self) -> &'static str {
        self.producer
    }
    /// Bytes the binding of this tensor covers (elements plus guard band).
    pub(super) fn bind_bytes(&self) -> u64 {
        (self.bytes + self.guard_words as u64 * 4).max(4)
    }
    pub(super) fn binding(&self) -> wgpu::BindingResource<'_> {
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
                self.shared.release();
                return;
            }
            Role::Activation => {}
        }
        c.activation.fetch_sub(self.counted, Ordering::Relaxed);
        if !self.shared.reuse {
            self.shared.release();
            return;
        }
        let size = self.buf.size();
        if size > self.shared.free_cap {
            self.shared.release();
            return;
        }
        let mut free = self.shared.free.lock().unwrap();
        if c.cached.load(Ordering::Relaxed) + size > self.shared.free_cap {
            // full: the least recently used classes go rather than the newest buffer (the stale
            // sizes are the old ones)
            while c.cached.load(Ordering::Relaxed) + size > self.shared.free_cap {
                let Some(bytes) = free.evict_oldest() else { break };
                c.cached.fetch_sub(bytes, Ordering::Relaxed);
            }
            self.shared.release();
        }
        c.cached.fetch_add(size, Ordering::Relaxed);
        free.put(size, self.buf.clone());
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
pub(super) struct WeightChunk {
    pub(super) buf: wgpu::Buffer,
    pub(super) offset: u64,
    pub(super) bytes: u64,
    pub(super) row0: usize,
    pub(super) rows: usize,
}

impl WeightChunk {
    pub(super) fn binding(&self) -> wgpu::BindingResource<'_> {
        wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: &self.buf,
            offset: self.offset,
            size: NonZeroU64::new(self.bytes.max(4)),
        })
    }
}

/// A weight matrix `[rows, cols]` in its storage format, possibly split into row chunks.
pub struct WgpuWeight {
    pub(super) name: String,
    pub(super) format: WeightFormat,
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// 32-bit words per (padded) row.
    pub(super) stride_words: usize,
    pub(super) chunks: Vec<WeightChunk>,
    /// Uploaded by `upload_weight_exact`: its products stay f32 in fast precision.
    pub(super) exact: bool,
    pub(super) shared: Arc<Shared>,
}

impl Drop for WgpuWeight {
    fn drop(&mut self) {
        self.shared.release();
    }
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

pub(super) struct Pool {
    pub(super) buf: wgpu::Buffer,
    pub(super) used: u64,
}

impl super::WgpuBackend {
    // ---- allocation ----------------------------------------------------------------------------

    pub(super) fn check_binding(&self, op: &'static str, what: &str, bytes: u64) -> Result<()> {
        if bytes > self.max_binding {
            return Err(Error::Device(format!(
                "op `{op}`: {what} of {bytes} bytes exceeds the storage binding limit of {} bytes on {}",
                self.max_binding, self.info.name
            )));
        }
        Ok(())
    }

    /// Each input fits one storage binding of this device (its shapes are `checks`' to judge).
    pub(super) fn check_inputs<'a>(
        &self,
        op: &'static str,
        inputs: impl IntoIterator<Item = (&'a str, &'a WgpuTensor)>,
    ) -> Result<()> {
        inputs.into_iter().try_for_each(|(what, t)| self.check_binding(op, what, t.bytes))
    }

    pub(super) fn make_tensor(
        &self,
        buf: wgpu::Buffer,
        shape: Vec<usize>,
        dtype: DType,
        producer: &'static str,
    ) -> WgpuTensor {
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
    pub(super) fn alloc(&self, op: &'static str, shape: Vec<usize>, dtype: DType) -> Result<WgpuTensor> {
        let bytes = shape.iter().product::<usize>() as u64 * 4;
        self.check_binding(op, "output", bytes)?;
        let guard = self.opts.guard_words as u64 * 4;
        let exact = (bytes + guard).max(4);
        let size = size_class(exact).min(self.limits.max_buffer_size).max(exact);
        let reused = if self.shared.reuse {
            // uncounted under the lock, so a `trim` between the two cannot make the count wrap
            let mut free = self.shared.free.lock().unwrap();
            let b = free.take(size);
            if b.is_some() {
                self.shared.counters.cached.fetch_sub(size, Ordering::Relaxed);
            }
            b
        } else {
            None
        };
        let buf = match reused {
            Some(b) => b,
            None => self.shared.counters.clock.allocation(|| {
                self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(op),
                    size,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                })
            }),
        };
        if let Some(s) = &self.sentinel {
            self.with_encoder(|enc| enc.copy_buffer_to_buffer(s, 0, &buf, bytes, guard));
        }
        Ok(self.make_tensor(buf, shape, dtype, op))
    }

    /// Write `src`, rows of `row_bytes`, into `buf` at `offset` as rows of `padded_row` bytes
    /// (the pad zero). By `Queue::write_buffer`, which runs before any encoder the submit thread
    /// has not yet submitted: fine for a weight's own fresh region, which no earlier command
    /// reads; a write into a buffer earlier work may still use would need `submitter.drain()`
    /// first (activations are filled by encoded copies instead: `upload`).
    pub(super) fn write_rows(
        &self,
        buf: &wgpu::Buffer,
        offset: u64,
        src: &[u8],
        row_bytes: usize,
        padded_row: usize,
    ) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        if padded_row == row_bytes {
            return self.write_staged(buf, offset, src);
        }
        let mut data = vec![0u8; src.len() / row_bytes.max(1) * padded_row];
        for (dst, s) in data.chunks_exact_mut(padded_row).zip(src.chunks_exact(row_bytes)) {
            dst[..row_bytes].copy_from_slice(s);
        }
        self.write_staged(buf, offset, &data)
    }

    /// `Queue::write_buffer`, and once `Options::staging_flush_bytes` have been written so, a
    /// submit and a wait for it, so that wgpu frees the writes' staging buffers (device memory on
    /// most GPUs: `STAGING_FLUSH_BYTES`) while a model loads rather than after its first forward.
    pub(super) fn write_staged(&self, buf: &wgpu::Buffer, offset: u64, data: &[u8]) -> Result<()> {
        self.queue.write_buffer(buf, offset, data);
        let len = data.len() as u64;
        let staged = self.shared.counters.staged.fetch_add(len, Ordering::Relaxed) + len;
        if staged < self.opts.staging_flush_bytes {
            return Ok(());
        }
        let _one = self.sync_lock.lock().unwrap();
        // taken before the submit, which carries every write counted so far (0: another thread's
        // flush took them while this one waited for the lock)
        if self.shared.counters.staged.swap(0, Ordering::Relaxed) == 0 {
            return Ok(());
        }
        self.submit_pending();
        // an empty submit carries the queue's pending writes
        self.queue.submit([]);
        self.wait_for_submitted("uploading weights")
    }

    /// Sub-allocate `bytes` of weight memory: from a pool (first fit), or a buffer of its own when
    /// larger than half a pool. Returns the buffer and the aligned offset.
    /// The fewest rows of `padded_row` bytes whose multiples are offsets the storage alignment
    /// allows: weights placed that many rows apart in one buffer (`upload_experts`,
    /// `upload_weight_pair`) are each bindable alone and whole rows apart for the kernels.
    pub(super) fn aligned_rows_unit(&self, padded_row: u64) -> u64 {
        let align = self.limits.min_storage_buffer_offset_alignment as u64;
        align / align.min(1 << padded_row.trailing_zeros().min(63))
    }

    /// Where `count` experts of `format` `[rows, cols]` lie in one buffer: the bytes from one
    /// expert's first row to the next's (whole rows, each offset aligned) and the bytes of them
    /// all; `None` when they do not fit one binding (or one buffer).
    pub(super) fn experts_layout(
        &self,
        format: WeightFormat,
        rows: usize,
        cols: usize,
        count: usize,
    ) -> Option<(u64, u64)> {
        let padded_row = formats::stride_words(format, cols) as u64 * 4;
        let step = (rows as u64).next_multiple_of(self.aligned_rows_unit(padded_row)).saturating_mul(padded_row);
        let last = <Self as Backend>::weight_alloc_bytes(format, rows, cols);
        let span = step.saturating_mul(count.saturating_sub(1) as u64).saturating_add(last);
        let fits = rows > 0 && padded_row > 0 && span <= self.max_binding && span <= self.limits.max_buffer_size;
        fits.then_some((step, span))
    }

    /// `count` experts, `first` then `expert(j)` for `1 ≤ j < count`, in one buffer where
    /// [`Self::experts_layout`] places them (an expert whose format or shape differs from the
    /// first's uploaded alone); else one `upload_weight` each.
    pub(super) fn upload_experts_from<'s>(
        &self,
        count: usize,
        first: HostWeight<'s>,
        expert: &mut dyn FnMut(usize) -> Result<HostWeight<'s>>,
    ) -> Result<Vec<WgpuWeight>> {
        first.validate()?;
        let (format, rows, cols) = (first.format, first.rows, first.cols);
        let Some((step, span)) = self.experts_layout(format, rows, cols, count) else {
            let mut all = vec![self.upload_weight(&first)?];
            for j in 1..count {
                all.push(self.upload_weight(&expert(j)?)?);
            }
            return Ok(all);
        };
        let size = span.next_multiple_of(4);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("experts"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        self.shared.counters.weight.fetch_add(size, Ordering::Relaxed);
        let mut all = Vec::with_capacity(count);
        let mut next = Some(first);
        for j in 0..count {
            let w = match next.take() {
                Some(w) => w,
                None => expert(j)?,
            };
            if (w.format, w.rows, w.cols) != (format, rows, cols) {
                all.push(self.upload_weight(&w)?);
                continue;
            }
            w.validate()?;
            all.push(self.weight_at(&buf, step * j as u64, &w)?);
        }
        Ok(all)
    }

    /// `w` (validated) written at `offset` of `buf`, a region the caller allocated: one chunk.
    pub(super) fn weight_at(&self, buf: &wgpu::Buffer, offset: u64, w: &HostWeight<'_>) -> Result<WgpuWeight> {
        let stride_words = formats::stride_words(w.format, w.cols);
        let bytes = <Self as Backend>::weight_alloc_bytes(w.format, w.rows, w.cols);
        self.shared.counters.matrix.fetch_add(bytes, Ordering::Relaxed);
        self.write_rows(buf, offset, &w.bytes, w.format.row_bytes(w.cols), stride_words * 4)?;
        Ok(WgpuWeight {
            name: w.name.clone(),
            format: w.format,
            rows: w.rows,
            cols: w.cols,
            stride_words,
            chunks: vec![WeightChunk { buf: buf.clone(), offset, bytes, row0: 0, rows: w.rows }],
            exact: false,
            shared: self.shared.clone(),
        })
    }

    pub(super) fn alloc_weight(&self, bytes: u64) -> (wgpu::Buffer, u64) {
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

    pub(super) fn pooled_tensor(
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
            self.write_staged(&buf, offset, host_bytes)?;
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
}
