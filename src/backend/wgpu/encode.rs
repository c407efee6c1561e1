//! Encoding and submission: the pending command encoder and the compute pass its dispatches
//! share, pipelines (created once per shader, entry point and weight format), dispatch (and
//! `per_element`, the path of the ops that run a thread per output element), and the hand-over to
//! the submit thread (submit.rs) with the waits behind `flush`, `sync` and `download`.

use std::sync::atomic::Ordering;

use super::{Input, Output, PARAM_BYTES, Pending, Shader, WgpuBackend, WgpuTensor, formats, grid};
use crate::error::{Error, Result};

impl WgpuBackend {
    // ---- errors, submission ---------------------------------------------------------------

    pub(super) fn take_errors(&self) -> Result<()> {
        let mut errs = self.errors.lock().unwrap();
        if errs.is_empty() {
            return Ok(());
        }
        let msg = errs.join("; ");
        errs.clear();
        Err(Error::Device(format!("wgpu reported: {msg}")))
    }

    /// Submit the pending encoder, and return once it and every encoder before it reached the
    /// queue. The lock is held while the encoder is handed to the submitter so that submissions
    /// from several threads reach the queue in the order their commands were encoded.
    pub(super) fn submit_pending(&self) {
        self.submit_locked(&mut self.pending.lock().unwrap());
        // the host waits here for the submit thread's backlog: timed as a wait
        self.shared.counters.clock.wait(|| self.submitter.drain());
    }

    /// [`Self::submit_pending`] with the pending lock already held: a command that fills the
    /// encoder submits it before the lock is let go, so no other thread's command lands in an
    /// encoder already full (the timer's queries hold `flush_every` commands).
    pub(super) fn submit_locked(&self, p: &mut Pending) {
        p.dispatches = 0;
        p.pass = None;
        if let Some(mut enc) = p.encoder.take() {
            if let Some(timer) = &self.timer {
                timer.close(&self.device, &mut enc);
            }
            self.submitter.submit(enc);
        }
    }

    /// Poll in bounded waits until `done` says so or `Options::wait_timeout` passes. Callers hold
    /// `sync_lock`, so one thread at a time blocks on the device.
    pub(super) fn wait_until(&self, what: &str, mut done: impl FnMut() -> bool) -> Result<()> {
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

    /// Submit pending work without waiting for the device (it returns once the submit thread has
    /// submitted everything handed to it).
    pub fn flush(&self) -> Result<()> {
        self.submit_pending();
        self.take_errors()
    }

    /// Submit pending work and wait for the device to finish it.
    pub fn sync(&self) -> Result<()> {
        let _one = self.sync_lock.lock().unwrap();
        self.submit_pending();
        self.wait_for_submitted("sync")
    }

    /// Wait until the device has finished everything submitted so far (the caller holds
    /// `sync_lock`).
    pub(super) fn wait_for_submitted(&self, what: &str) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.queue.on_submitted_work_done(move || {
            let _ = tx.send(());
        });
        self.shared.counters.clock.wait(|| self.wait_until(what, || rx.try_recv().is_ok()))
    }

    pub(super) fn with_encoder(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut p = self.pending.lock().unwrap();
        if self.encode(&mut p, f) {
            self.submit_locked(&mut p);
        }
    }

    /// Encode one command into the pending encoder; whether it is full (`flush_every` commands),
    /// so the caller submits it under the same lock.
    pub(super) fn encode(&self, p: &mut Pending, f: impl FnOnce(&mut wgpu::CommandEncoder)) -> bool {
        p.pass = None;
        let enc = p.encoder.get_or_insert_with(|| self.new_encoder());
        f(enc);
        self.count_command(p)
    }

    /// Encode one dispatch: into the open compute pass (opened here if there is none), or, with
    /// the timer or `pass_per_dispatch`, into a pass of its own. Whether the encoder is full.
    pub(super) fn encode_dispatch(
        &self,
        p: &mut Pending,
        label: &'static str,
        pipeline: &wgpu::ComputePipeline,
        params: &[u8; PARAM_BYTES],
        bind_group: &wgpu::BindGroup,
        groups: (u32, u32, u32),
    ) -> bool {
        let record = |pass: &mut wgpu::ComputePass<'_>| {
            pass.set_pipeline(pipeline);
            pass.set_immediates(0, params);
            pass.set_bind_group(0, bind_group, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, groups.2);
        };
        if self.timer.is_some() || self.opts.pass_per_dispatch {
            return self.encode(p, |enc| {
                let timestamp_writes = self.timer.as_ref().and_then(|t| t.next_pass(label, groups));
                record(
                    &mut enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some(label), timestamp_writes }),
                );
            });
        }
        // One pass for a run of dispatches: wgpu still puts a barrier between two dispatches
        // that share a buffer written by one of them (each dispatch is a usage scope of its
        // own), and a pass a dispatch cost the NVIDIA driver ~µs of device time each.
        let enc = p.encoder.get_or_insert_with(|| self.new_encoder());
        let pass = p.pass.get_or_insert_with(|| {
            enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("fovea ops"), timestamp_writes: None })
                .forget_lifetime()
        });
        record(pass);
        self.count_command(p)
    }

    pub(super) fn new_encoder(&self) -> wgpu::CommandEncoder {
        self.device.create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("fovea ops") })
    }

    pub(super) fn count_command(&self, p: &mut Pending) -> bool {
        p.dispatches += 1;
        self.shared.counters.commands.fetch_add(1, Ordering::Relaxed);
        p.dispatches >= self.opts.flush_every
    }

    // ---- pipelines, dispatch -----------------------------------------------------------------

    pub(super) fn pipeline(&self, shader: Shader, entry: &'static str, fmt: u32) -> Result<wgpu::ComputePipeline> {
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
                    let desc =
                        wgpu::ShaderModuleDescriptor { label: Some(&file), source: wgpu::ShaderSource::Wgsl(src) };
                    if self.opts.checked_shaders {
                        return self.device.create_shader_module(desc);
                    }
                    // SAFETY: wgpu's runtime checks are for untrusted shaders; ours are this
                    // crate's own WGSL. Every loop is bounded by its parameters (no infinite
                    // loop for the driver to assume away), and every kernel's indices stay in
                    // its bindings: each op runs in the op harness (tests/ops.rs) with guard
                    // words after every output, which a write past the end overwrites, on
                    // every lane build. Vulkan's robust buffer access, where the device has it,
                    // still bounds what a faulty read or write reaches. The checks cost: naga
                    // clamps every storage index and adds a counter to every loop, which keeps
                    // drivers from unrolling fixed-count loops and holding their arrays in
                    // registers.
                    unsafe { self.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
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
        // a thread that built the same pipeline meanwhile got there first: share its pipeline, so
        // one key has one pipeline (and one derived layout its cached bind groups match)
        Ok(self.pipelines.lock().unwrap().entry(key).or_insert(pipeline).clone())
    }

    /// Encode one dispatch of `shader::entry` with its parameter block pushed as immediate data.
    pub(super) fn dispatch(
        &self,
        shader: Shader,
        entry: &'static str,
        fmt: u32,
        params: &[u32],
        bindings: &[(u32, wgpu::BindingResource<'_>)],
        groups: (u32, u32, u32),
    ) -> Result<()> {
        self.dispatch_as(entry, shader, entry, fmt, params, bindings, groups)
    }

    /// [`Self::dispatch`] under `label` (the pass's label and its name in `kernel_times`), for an
    /// entry point several ops share (linear's tiles: `linear_tiles`, `grouped_tiles`,
    /// `expert_tiles`).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dispatch_as(
        &self,
        label: &'static str,
        shader: Shader,
        entry: &'static str,
        fmt: u32,
        params: &[u32],
        bindings: &[(u32, wgpu::BindingResource<'_>)],
        groups: (u32, u32, u32),
    ) -> Result<()> {
        // the host profile times the whole encoding as the launch
        self.shared.counters.clock.launch(|| {
            let pipeline = self.pipeline(shader, entry, fmt)?;
            let mut block = [0u32; PARAM_BYTES / 4];
            block[..params.len()].copy_from_slice(params);
            let tables = [(formats::TABLES_BINDING, self.lut.as_entire_binding())];
            let tables: &[_] = match shader {
                Shader::Block(_, format, _) if formats::uses_tables(format) => &tables,
                _ => &[],
            };
            let bindings: Vec<_> = bindings.iter().chain(tables).cloned().collect();
            let released = self.shared.released.load(Ordering::Acquire);
            let bg = self.bind_groups.lock().unwrap().get(&pipeline, &bindings, released, |entries| {
                self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(label),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries,
                })
            });
            let mut pending = self.pending.lock().unwrap();
            if self.encode_dispatch(&mut pending, label, &pipeline, bytemuck::cast_ref(&block), &bg, groups) {
                self.submit_locked(&mut pending);
            }
            Ok(())
        })
    }

    /// One dispatch of `shader::entry` over `total` threads of 256-wide workgroups (no-op when 0).
    pub(super) fn dispatch_1d(
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
        self.dispatch(shader, entry, 0, params, bindings, grid(total.div_ceil(256)))
    }

    /// The path of every op that runs one thread per output element: check that each input fits
    /// one binding, allocate the output, and dispatch `shader::op` (the entry point is named after
    /// the op) with the output's element count as parameter 0, then `params`. Nothing is
    /// dispatched for an empty output.
    pub(super) fn per_element(
        &self,
        shader: Shader,
        op: &'static str,
        inputs: &[Input<'_>],
        out: Output,
        params: &[u32],
    ) -> Result<WgpuTensor> {
        self.check_inputs(op, inputs.iter().map(|&(name, _, t)| (name, t)))?;
        let y = self.alloc(op, out.shape, out.dtype)?;
        let total = y.numel();
        let params: Vec<u32> = std::iter::once(total as u32).chain(params.iter().copied()).collect();
        let mut bindings: Vec<_> = inputs.iter().map(|&(_, binding, t)| (binding, t.binding())).collect();
        bindings.push((out.binding, y.binding()));
        self.dispatch_1d(shader, op, total, &params, &bindings)?;
        Ok(y)
    }
}
