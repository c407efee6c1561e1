//! Per-kernel GPU times, a diagnostic (`Options::kernel_times`, `FOVEA_GPU_TIMES=1`, on an
//! adapter with `TIMESTAMP_QUERY`): every dispatch's compute pass writes a timestamp at its start
//! and its end; each encoder resolves its passes' timestamps into a buffer of its own as it is
//! handed to the submit thread, and
//! [`Backend::kernel_times`](crate::backend::Backend::kernel_times) reads them back and sums them
//! by entry point (or, `Options::kernel_times_by_grid`, by entry point and grid size). The device
//! time of each kernel is then known without a profiler (Nsight cannot see a Vulkan queue on the
//! machines this was written for).

use std::sync::Mutex;

use super::{MAX_SUBMIT, WgpuBackend};
use crate::backend::{KernelTime, KernelTotals};
use crate::error::{Error, Result};

/// Two timestamps a pass; a submission holds at most `MAX_SUBMIT` commands.
const QUERIES: u32 = 2 * MAX_SUBMIT;

pub(super) struct PassTimer {
    set: wgpu::QuerySet,
    /// Where a submission's timestamps are resolved before they are copied out.
    resolve: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period: f64,
    /// The passes in the encoder being recorded, in order: entry point, workgroups.
    open: Mutex<Vec<(&'static str, u64)>>,
    /// Submitted: each submission's mappable copy of its timestamps, and its passes.
    done: Mutex<Vec<(wgpu::Buffer, Vec<(&'static str, u64)>)>>,
    /// Sum by entry point and grid size rather than by entry point.
    by_grid: bool,
}

impl PassTimer {
    /// A timer when the device has the feature.
    pub(super) fn new(device: &wgpu::Device, queue: &wgpu::Queue, by_grid: bool) -> Option<PassTimer> {
        if !device.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
            return None;
        }
        let set = device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("pass times"),
            ty: wgpu::QueryType::Timestamp,
            count: QUERIES,
        });
        let resolve = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("pass times"),
            size: QUERIES as u64 * 8,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Some(PassTimer {
            set,
            resolve,
            period: queue.get_timestamp_period() as f64,
            open: Mutex::default(),
            done: Mutex::default(),
            by_grid,
        })
    }

    /// The timestamp writes of the next pass of the encoder being recorded (`entry` runs in it,
    /// over a grid of `groups`).
    pub(super) fn next_pass(
        &self,
        entry: &'static str,
        groups: (u32, u32, u32),
    ) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let mut open = self.open.lock().unwrap();
        let i = open.len() as u32;
        if 2 * i + 2 > QUERIES {
            return None;
        }
        open.push((entry, u64::from(groups.0) * u64::from(groups.1) * u64::from(groups.2)));
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.set,
            beginning_of_pass_write_index: Some(2 * i),
            end_of_pass_write_index: Some(2 * i + 1),
        })
    }

    /// Before the encoder is finished: resolve its passes' timestamps and copy them out.
    pub(super) fn close(&self, device: &wgpu::Device, enc: &mut wgpu::CommandEncoder) {
        let passes = std::mem::take(&mut *self.open.lock().unwrap());
        if passes.is_empty() {
            return;
        }
        let bytes = passes.len() as u64 * 16;
        let copy = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("pass times"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        enc.resolve_query_set(&self.set, 0..2 * passes.len() as u32, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &copy, 0, bytes);
        self.done.lock().unwrap().push((copy, passes));
    }
}

impl WgpuBackend {
    /// Every submitted pass's device time since the last call, summed by entry point, or by entry
    /// point and workgroups (`"linear_rows ×64640"`) with `kernel_times_by_grid` (longest first);
    /// `None` without a timer.
    pub(super) fn pass_times(&self) -> Result<Option<Vec<KernelTime>>> {
        let Some(timer) = &self.timer else { return Ok(None) };
        // the read-back buffers of every encoder handed over so far, taken under the pending
        // lock with the open encoder handed over too, so none is of an encoder another thread
        // hands over after the sync below has drained the submit thread (mapping a buffer that
        // an unsubmitted encoder copies into fails that encoder's submit)
        let done = {
            let mut pending = self.pending.lock().unwrap();
            self.submit_locked(&mut pending);
            std::mem::take(&mut *timer.done.lock().unwrap())
        };
        self.sync()?;
        let mut totals = KernelTotals::default();
        for (copy, passes) in done {
            let (tx, rx) = std::sync::mpsc::channel();
            copy.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
            let mut mapped = None;
            self.wait_until("kernel times", || {
                mapped = rx.try_recv().ok();
                mapped.is_some()
            })?;
            mapped.unwrap().map_err(|e| Error::Device(format!("mapping the pass times failed: {e}")))?;
            let ticks: Vec<u64> = bytemuck::pod_collect_to_vec(&copy.get_mapped_range(..).map_err(super::device_err)?);
            copy.unmap();
            for (pass, &(entry, groups)) in passes.iter().enumerate() {
                let (start, end) = (ticks[2 * pass], ticks[2 * pass + 1]);
                let name = if timer.by_grid { format!("{entry} ×{groups}") } else { entry.to_string() };
                totals.add(name, end.saturating_sub(start) as f64 * timer.period * 1e-9);
            }
        }
        Ok(Some(totals.into_sorted()))
    }
}
