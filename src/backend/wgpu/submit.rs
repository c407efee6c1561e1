//! Submission off the encoding thread.
//!
//! Finishing a command encoder and submitting it (wgpu-core validates the recorded passes,
//! tracks every buffer they bind and records the driver's commands; then the driver's submit and
//! a poll to retire finished work) cost the host more than encoding the dispatches did: on an
//! H200 under Vulkan a decode step's 155 submits took 13.9 ms of the 22.3 ms it took to issue.
//! A thread of its own does them, in the order the encoders were handed over, while the caller
//! encodes the next ones.

use std::sync::Arc;
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::tensor::Shared;

enum Job {
    Submit(wgpu::CommandEncoder),
    /// Answered once every encoder handed over before it is submitted.
    Drained(mpsc::Sender<()>),
}

pub(super) struct Submitter {
    device: wgpu::Device,
    queue: wgpu::Queue,
    shared: Arc<Shared>,
    /// `None` when submitting on the caller's thread (`Options::submit_thread` off).
    jobs: Option<mpsc::Sender<Job>>,
    worker: Option<JoinHandle<()>>,
}

impl Submitter {
    /// A submitter with its own thread, or one that submits on the caller's thread.
    pub(super) fn new(device: &wgpu::Device, queue: &wgpu::Queue, shared: &Arc<Shared>, thread: bool) -> Self {
        let mut s = Submitter {
            device: device.clone(),
            queue: queue.clone(),
            shared: shared.clone(),
            jobs: None,
            worker: None,
        };
        if thread {
            let (tx, rx) = mpsc::channel::<Job>();
            let (device, queue, shared) = (device.clone(), queue.clone(), shared.clone());
            // a thread that cannot start leaves `jobs` empty: submissions then run inline
            if let Ok(worker) = std::thread::Builder::new().name("fovea-wgpu-submit".into()).spawn(move || {
                for job in rx {
                    match job {
                        Job::Submit(enc) => submit_now(&device, &queue, &shared, enc),
                        Job::Drained(done) => {
                            let _ = done.send(());
                        }
                    }
                }
            }) {
                s.jobs = Some(tx);
                s.worker = Some(worker);
            }
        }
        s
    }

    /// Submit `enc` after every encoder handed over before it, without waiting for it.
    pub(super) fn submit(&self, enc: wgpu::CommandEncoder) {
        let enc = match &self.jobs {
            Some(jobs) => match jobs.send(Job::Submit(enc)) {
                Ok(()) => return,
                // the worker is gone (it panicked): submit here
                Err(mpsc::SendError(Job::Submit(enc))) => enc,
                Err(_) => unreachable!("the job sent was a submit"),
            },
            None => enc,
        };
        submit_now(&self.device, &self.queue, &self.shared, enc);
    }

    /// Return once every encoder handed over so far is submitted (before a wait on the device or
    /// a read-back, which must come after them).
    pub(super) fn drain(&self) {
        if let Some(jobs) = &self.jobs {
            let (tx, rx) = mpsc::channel();
            if jobs.send(Job::Drained(tx)).is_ok() {
                let _ = rx.recv();
            }
        }
    }
}

fn submit_now(device: &wgpu::Device, queue: &wgpu::Queue, shared: &Shared, enc: wgpu::CommandEncoder) {
    shared.counters.clock.submit(|| {
        queue.submit([enc.finish()]);
        // let finished work retire (buffers the submitted commands held, mapping callbacks)
        let _ = device.poll(wgpu::PollType::Poll);
    });
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
