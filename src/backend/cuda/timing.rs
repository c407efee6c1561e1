//! Per-kernel device times, a diagnostic (`Options::kernel_times`, `FOVEA_GPU_TIMES=1`): two
//! timing events around every launch on the lane's stream, read and summed by kernel (or kernel
//! and grid) when [`Backend::kernel_times`](crate::backend::Backend::kernel_times) asks. The events
//! are commands in the stream: a timed step is slower than an untimed one, and an event's
//! timestamp is taken when the device reaches it, so where the device waited for the host's next
//! launch that wait is inside the kernel's time. The times are exact where the host keeps ahead
//! of the device and upper bounds where it does not (a decode step with the timer on). Backends
//! that launch with programmatic dependent launch (the default on sm_90+) have streams of their
//! own; those without it (older devices, `FOVEA_PDL=0`) share the context's default stream, so
//! two of them timing at once see each other's kernels in their intervals.

use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, LaunchConfig};

use crate::backend::{KernelTime, KernelTotals};

pub(super) struct KernelTimer {
    on: bool,
    /// Sum by kernel and grid rather than by kernel.
    by_grid: bool,
    state: Mutex<TimerState>,
}

#[derive(Default)]
struct TimerState {
    /// Launches since the last read or fold, in issue order: kernel, its start and end events.
    pending: Vec<(String, CudaEvent, CudaEvent)>,
    /// Sums of the launches already folded since the last read.
    totals: KernelTotals,
    /// Events already read, for the next launches (making one is a driver call).
    spare: Vec<CudaEvent>,
}

/// Pending launches past which the finished ones are folded into the sums, so a long run that
/// never reads (`fovea generate` with the variable set) holds a bounded number of events.
const FOLD_AT: usize = 1 << 14;

impl KernelTimer {
    /// On with `on` (`Options::kernel_times`), summing by kernel and grid with `by_grid`.
    pub(super) fn new(on: bool, by_grid: bool) -> Self {
        KernelTimer { on, by_grid, state: Mutex::default() }
    }

    /// `launch`, between a start and an end event when timing is on.
    pub(super) fn time<T>(
        &self,
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        kernel: &str,
        cfg: LaunchConfig,
        launch: impl FnOnce(LaunchConfig) -> Result<T, DriverError>,
    ) -> Result<T, DriverError> {
        if !self.on {
            return launch(cfg);
        }
        // both events at hand before the first is recorded: nothing but the launch between them
        let (start, end) = (self.event(ctx)?, self.event(ctx)?);
        start.record(stream)?;
        let r = launch(cfg)?;
        end.record(stream)?;
        let name = match self.by_grid {
            true => format!("{kernel} {}x{}x{}", cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2),
            false => kernel.to_owned(),
        };
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.pending.push((name, start, end));
        if state.pending.len() >= FOLD_AT {
            state.fold(false)?;
        }
        Ok(r)
    }

    fn event(&self, ctx: &Arc<CudaContext>) -> Result<CudaEvent, DriverError> {
        match self.state.lock().unwrap_or_else(|e| e.into_inner()).spare.pop() {
            Some(e) => Ok(e),
            None => ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)),
        }
    }

    /// Each kernel's summed time since the last read, longest first (waits for the stream);
    /// `None` when timing is off.
    pub(super) fn read(&self, stream: &CudaStream) -> Result<Option<Vec<KernelTime>>, DriverError> {
        if !self.on {
            return Ok(None);
        }
        stream.synchronize()?;
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.fold(true)?;
        Ok(Some(std::mem::take(&mut state.totals).into_sorted()))
    }
}

impl TimerState {
    /// Add the pending launches to the sums and keep their events for reuse: all of them (`all`,
    /// after the stream was synchronised), or those whose end event the device has passed (a
    /// prefix: one stream runs them in order).
    fn fold(&mut self, all: bool) -> Result<(), DriverError> {
        let done = match all {
            true => self.pending.len(),
            false => self.pending.iter().take_while(|(_, _, end)| end.is_complete()).count(),
        };
        for (kernel, start, end) in self.pending.drain(..done) {
            self.totals.add(kernel, start.elapsed_ms(&end)? as f64 * 1e-3);
            self.spare.extend([start, end]);
        }
        Ok(())
    }
}
