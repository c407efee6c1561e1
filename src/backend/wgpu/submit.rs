//! Submission off the encoding thread.
//!
//! Finishing a command encoder and submitting it (wgpu-core validates the recorded passes,
//! tracks every buffer they bind and records the driver's commands; then the driver's submit and
//! a poll to retire finished work) cost the host more than encoding the dispatches did: on an
//! H200 under Vulkan a decode step's 155 submits took 13.9 ms of the 22.3 ms it took to issue.
//! A thread of its own does them, in the order the encoders were handed over, while the caller
//! encodes the next ones. At most [`BACKLOG`] encoders wait for it: past that, handing one over
//! blocks until the thread catches up, so a long run without a read-back cannot pile up
//! encoders (and the buffers they keep alive).
//!
//! Anything that must come after the work handed over (a wait for the device, a mapping for a
//! read-back, a `Queue::write_buffer` into a buffer that work may still use) drains the thread
//! first ([`Submitter::drain`]).

use std::panic::AssertUnwindSafe;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::tensor::Shared;

/// Encoders that may wait for the submit thread (each `Options::flush_every` commands).
const BACKLOG: usize = 64;

enum Job {
    Submit(wgpu::CommandEncoder),
    /// Answered once every encoder handed over before it is submitted.
    Drained(mpsc::Sender<()>),
}

pub(super) struct Submitter {
    device: wgpu::Device,
    queue: wgpu::Queue,
    shared: Arc<Shared>,
    /// The lane's error list, which the next download, sync or flush reports.
    errors: Arc<Mutex<Vec<String>>>,
    /// `None` when submitting on the caller's thread (`Options::submit_thread` off).
    jobs: Option<mpsc::SyncSender<Job>>,
    worker: Option<JoinHandle<()>>,
}

impl Submitter {
    /// A submitter with its own thread, or one that submits on the caller's thread.
    pub(super) fn new(
        device: &wgpu::Device,
        queue: &wgpu::Queue,
        shared: &Arc<Shared>,
        errors: &Arc<Mutex<Vec<String>>>,
        thread: bool,
    ) -> Self {
        let mut s = Submitter {
            device: device.clone(),
            queue: queue.clone(),
            shared: shared.clone(),
            errors: errors.clone(),
            jobs: None,
            worker: None,
        };
        if thread {
            let (tx, rx) = mpsc::sync_channel::<Job>(BACKLOG);
            let (device, queue, shared, errors) = (device.clone(), queue.clone(), shared.clone(), errors.clone());
            // a thread that cannot start leaves `jobs` empty: submissions then run inline
            let worker = std::thread::Builder::new().name("fovea-wgpu-submit".into()).spawn(move || {
                for job in rx {
                    match job {
                        Job::Submit(enc) => {
                            // a panic inside wgpu loses this encoder's work: reported, and the
                            // thread goes on with the next
                            let submitted = std::panic::catch_unwind(AssertUnwindSafe(|| {
                                submit_now(&device, &queue, &shared, enc)
                            }));
                            if let Err(panic) = submitted {
                                let what = panic_message(panic.as_ref());
                                errors.lock().unwrap().push(format!("submitting queued work panicked: {what}"));
                            }
                        }
                        Job::Drained(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            });
            if let Ok(worker) = worker {
                s.jobs = Some(tx);
                s.worker = Some(worker);
            }
        }
        s
    }

    /// Submit `enc` after every encoder handed over before it, without waiting for it.
    pub(super) fn submit(&self, enc: wgpu::CommandEncoder) {
        let Some(jobs) = &self.jobs else {
            return submit_now(&self.device, &self.queue, &self.shared, enc);
        };
        // the thread is gone: submit here (and say that work handed to it was lost)
        if let Err(mpsc::SendError(Job::Submit(enc))) = jobs.send(Job::Submit(enc)) {
            self.lost();
            submit_now(&self.device, &self.queue, &self.shared, enc);
        }
    }

    /// Return once every encoder handed over so far is submitted (before a wait on the device, a
    /// read-back or a queue write, which must come after them).
    pub(super) fn drain(&self) {
        if let Some(jobs) = &self.jobs {
            let (tx, rx) = mpsc::channel();
            if jobs.send(Job::Drained(tx)).is_err() || rx.recv().is_err() {
                self.lost();
            }
        }
    }

    fn lost(&self) {
        self.errors.lock().unwrap().push("the wgpu submit thread stopped: work handed to it was not submitted".into());
    }
}

fn submit_now(device: &wgpu::Device, queue: &wgpu::Queue, shared: &Shared, enc: wgpu::CommandEncoder) {
    shared.counters.clock.submit(|| {
        queue.submit([enc.finish()]);
        // let finished work retire (buffers the submitted commands held, mapping callbacks)
        let _ = device.poll(wgpu::PollType::Poll);
    });
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    match (panic.downcast_ref::<&str>(), panic.downcast_ref::<String>()) {
        (Some(s), _) => s.to_string(),
        (_, Some(s)) => s.clone(),
        _ => "(no message)".into(),
    }
}

impl Drop for Submitter {
    fn drop(&mut self) {
        // closing the channel ends the worker once it has submitted what it was handed
        self.jobs = None;
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}
