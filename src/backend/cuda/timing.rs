//! Per-kernel device times, a diagnostic (`FOVEA_GPU_TIMES=1`): two timing events around every
//! launch on the lane's one stream, read and summed by kernel when
//! [`Backend::kernel_times`](crate::backend::Backend::kernel_times) asks, so a step's kernels can
//! be compared with its wall time (the gaps between 1 800 launches are the difference) without a
//! profiler run. The events are commands in the stream, so a timed step is a little slower than an
//! untimed one; each kernel's own time is what they measure.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError, LaunchConfig};

use crate::backend::KernelTime;

pub(super) struct KernelTimer {
    on: bool,
    /// Sum by kernel and grid rather than by kernel.
    by_grid: bool,
    state: Mutex<TimerState>,
}

#[derive(Default)]
struct TimerState {
    /// Launches since the last read, in issue order: kernel, its start and end events.
    pending: Vec<(String, CudaEvent, CudaEvent)>,
    /// Events already read, for the next launches (making one is a driver call).
    spare: Vec<CudaEvent>,
}

impl KernelTimer {
    /// On when asked (`Options::kernel_times`, `Options::kernel_times_by_grid`) or when the
    /// environment asks for it (`FOVEA_GPU_TIMES=1` or `=grid`, as on the wgpu lane).
    pub(super) fn new(asked: bool, by_grid: bool) -> Self {
        let env = std::env::var("FOVEA_GPU_TIMES").unwrap_or_default();
        let by_grid = by_grid || env == "grid";
        KernelTimer { on: asked || by_grid || env == "1", by_grid, state: Mutex::default() }
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
        let start = self.event(ctx)?;
        start.record(stream)?;
        let r = launch(cfg)?;
        let end = self.event(ctx)?;
        end.record(stream)?;
        let name = match self.by_grid {
            true => format!("{kernel} {}x{}x{}", cfg.grid_dim.0, cfg.grid_dim.1, cfg.grid_dim.2),
            false => kernel.to_owned(),
        };
        self.state.lock().unwrap_or_else(|e| e.into_inner()).pending.push((name, start, end));
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
        let pending = std::mem::take(&mut state.pending);
        let mut totals: HashMap<String, (u64, f64)> = HashMap::new();
        for (kernel, start, end) in pending {
            let ms = start.elapsed_ms(&end)?;
            let t = totals.entry(kernel).or_default();
            t.0 += 1;
            t.1 += ms as f64 * 1e-3;
            state.spare.extend([start, end]);
        }
        let mut times: Vec<KernelTime> =
            totals.into_iter().map(|(name, (count, seconds))| KernelTime { name, count, seconds }).collect();
        times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds).then_with(|| a.name.cmp(&b.name)));
        Ok(Some(times))
    }
}
