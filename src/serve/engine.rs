//! The model's worker thread. The lanes are synchronous (and the GPU lanes own their device), so
//! one dedicated thread holds the model and runs every forward; HTTP handlers hand it [`Job`]s
//! and read [`Event`]s back.
//!
//! Admission: a request holds a [`Slot`] from before its images are decoded until its client has
//! its answer or has gone; at most `parallel + queue_size` slots exist, so one more request is
//! refused (429). A slot is freed the moment its client leaves, even while its job still waits:
//! the worker drops such jobs the next time it looks at its waiting list (every step).
//!
//! Scheduling: up to `parallel` sequences are active at once, each with its own cache. Each
//! round, every active sequence takes one step: a new one runs the vision tower and the merge,
//! one in its prompt runs a prefill chunk, and all that are decoding take their decode step
//! together, as one forward with a row per sequence ([`Generator::step_batch`]: the weights are
//! read once for all of them). So a long prompt or answer does not hold the others up, a new
//! request starts while others decode, and decoding sequences share each forward.
//!
//! Between two steps of a sequence the worker checks whether its client is still there (the
//! handler drops its event receiver when the connection closes); a gone client's sequence is
//! dropped, and its cache with it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::stop::StopFilter;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::model::lm::generate::{Generator, Sampling, Step, StopReason};
use crate::pipeline::Progress;
use crate::pipeline::{LaneChoice, LaneJob, LmSource, LoadedLm, PromptToken, run_on_lane};
use crate::processor::{PreparedImage, PreprocessConfig};
use crate::progress::Bars;
use crate::tokenizer::{ChatTokenizer, TextStream};

/// One request, checked and tokenized, its images decoded and preprocessed.
pub struct Job {
    pub tokens: Vec<PromptToken>,
    /// One per [`PromptToken::Image`], in order.
    pub images: Vec<PreparedImage>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub stop: Vec<String>,
    /// Run to `max_tokens` through end-of-sentence tokens.
    pub ignore_eos: bool,
    /// Where the completion goes; closed when the client has gone.
    pub events: mpsc::UnboundedSender<Event>,
    /// When the request arrived (queue time and time to first token count from here).
    pub arrived: Instant,
}

/// What the worker sends back for a [`Job`]: text pieces, then `Done` or `Failed`.
#[derive(Debug)]
pub enum Event {
    Text(String),
    Done(Finish),
    /// The model failed on this request (a device error, say); the message says how.
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// End of sentence, or a `stop` sequence.
    Stop,
    /// `max_tokens` reached.
    Length,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// How a completion ended, and what it cost.
#[derive(Debug)]
pub struct Finish {
    pub reason: FinishReason,
    /// Positions fed to the model: the prompt's tokens with each image's block expanded.
    pub prompt_tokens: usize,
    /// Generated tokens (the end-of-sentence token included when it ended the answer).
    pub completion_tokens: usize,
    pub timings: Timings,
}

/// Where a request's time went. `prefill` and `decode` are this sequence's own steps; with
/// several active sequences, the wall time also holds the others' steps in between.
#[derive(Clone, Debug)]
pub struct Timings {
    /// From arrival until the worker took the request (decoding its images, tokenizing and
    /// waiting in the queue).
    pub queue: Duration,
    /// The vision tower and the merge (image prompts).
    pub vision: Option<Duration>,
    pub prefill: Duration,
    pub decode: Duration,
    /// From arrival to the first generated token.
    pub first_token: Duration,
}

/// What the handlers need to know about the loaded model.
#[derive(Clone, Debug)]
pub struct ModelInfo {
    pub lane: &'static str,
    pub device: String,
    pub vocab_size: usize,
    /// The vision tower's preprocessing; `None` when the model takes no images.
    pub preprocess: Option<PreprocessConfig>,
}

/// Counters for `/health` (and the tests: a cancelled sequence shows up here).
#[derive(Debug, Default)]
pub struct Stats {
    /// Slots taken: requests being prepared, waiting or running.
    pub slots: AtomicUsize,
    /// Jobs the worker holds but has not started.
    pub waiting: AtomicUsize,
    pub active: AtomicUsize,
    pub completed: AtomicU64,
    pub cancelled: AtomicU64,
    pub failed: AtomicU64,
}

/// Where the model comes from and how the worker schedules.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub model: std::path::PathBuf,
    pub mmproj: Option<std::path::PathBuf>,
    pub image_max_tokens: Option<usize>,
    pub lane: LaneChoice,
    /// `--precision` / `FOVEA_PRECISION`; `None`: the lane's default.
    pub precision: Option<crate::backend::Precision>,
    /// Requests that may wait beyond the active ones; one more is refused (429).
    pub queue_size: usize,
    /// Sequences the worker interleaves at once.
    pub parallel: usize,
}

/// The running worker: its queue, counters and model.
pub struct Engine {
    /// Unbounded: [`Slot`]s bound what is in it.
    pub queue: mpsc::UnboundedSender<Job>,
    pub stats: Arc<Stats>,
    pub info: ModelInfo,
    /// `parallel + queue_size`: the most slots at once.
    capacity: usize,
}

/// A request's place in the server (see the module doc); freed when dropped.
pub struct Slot(Arc<Stats>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.slots.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Engine {
    /// Start the worker thread and wait until the model is loaded (a load error is returned
    /// here, so the server never listens without a model).
    pub fn start(opts: &EngineOptions, tokenizer: Arc<ChatTokenizer>) -> Result<Engine> {
        if opts.queue_size == 0 || opts.parallel == 0 {
            return Err(Error::Invalid(format!(
                "--queue-size ({}) and --parallel ({}) must be at least 1",
                opts.queue_size, opts.parallel
            )));
        }
        let (queue, jobs) = mpsc::unbounded_channel();
        let (ready, loaded) = std::sync::mpsc::channel();
        let stats = Arc::new(Stats::default());
        let worker = Worker { opts: opts.clone(), jobs, ready, tokenizer, stats: stats.clone() };
        let (lane, precision) = (opts.lane, opts.precision);
        let thread = std::thread::Builder::new()
            .name("fovea-model".into())
            .spawn(move || run_on_lane(lane, precision, worker))
            .map_err(|e| Error::Device(format!("cannot start the model thread: {e}")))?;
        match loaded.recv() {
            Ok(info) => Ok(Engine { queue, stats, info, capacity: opts.parallel.saturating_add(opts.queue_size) }),
            // the worker ended before reporting: its result says why
            Err(_) => match thread.join() {
                Ok(Err(e)) => Err(e),
                Ok(Ok(())) => Err(Error::Device("the model thread ended before loading the model".into())),
                Err(_) => Err(Error::Device("the model thread panicked while loading the model".into())),
            },
        }
    }

    /// A slot for a new request, or `None` when every slot is taken.
    pub fn admit(&self) -> Option<Slot> {
        let slots = &self.stats.slots;
        slots.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| (n < self.capacity).then_some(n + 1)).ok()?;
        Some(Slot(self.stats.clone()))
    }
}

struct Worker {
    opts: EngineOptions,
    jobs: mpsc::UnboundedReceiver<Job>,
    ready: std::sync::mpsc::Sender<ModelInfo>,
    tokenizer: Arc<ChatTokenizer>,
    stats: Arc<Stats>,
}

impl LaneJob for Worker {
    type Output = ();
    fn run<B: Backend>(self, b: &B, note: Option<&str>) -> Result<()> {
        let o = &self.opts;
        let src = LmSource::open(&o.model, o.mmproj.as_deref(), o.image_max_tokens)?;
        let mut bars = Bars::new();
        let lm = src.load(b, src.has_vision(), &mut |p| bars.update(Progress::Load(p)))?;
        if let Some(n) = note {
            eprintln!("fovea: {n}");
        }
        let info = ModelInfo {
            lane: b.lane(),
            device: b.device_name(),
            vocab_size: lm.cfg.vocab_size,
            preprocess: lm.preprocess_config(),
        };
        if self.ready.send(info).is_err() {
            return Ok(()); // nobody is waiting for the model any more
        }
        schedule(&lm, &self.tokenizer, self.jobs, o.parallel, &self.stats);
        Ok(())
    }
}

/// The worker's loop: take new jobs, drop those whose client has gone, start waiting jobs
/// while fewer than `parallel` run, then a round: one step of each active sequence, the decode
/// steps of all that are decoding as one batched forward. Returns when
/// every sender is gone and nothing is left to run.
fn schedule<B: Backend>(
    lm: &LoadedLm<'_, B>,
    tokenizer: &ChatTokenizer,
    mut jobs: mpsc::UnboundedReceiver<Job>,
    parallel: usize,
    stats: &Stats,
) {
    let mut waiting: VecDeque<Job> = VecDeque::new();
    let mut active: Vec<Seq<'_, B>> = Vec::new();
    loop {
        if active.is_empty() && waiting.is_empty() {
            // idle: sleep until a request comes, or the server is gone
            match jobs.blocking_recv() {
                Some(job) => waiting.push_back(job),
                None => return,
            }
        }
        while let Ok(job) = jobs.try_recv() {
            waiting.push_back(job);
        }
        let before = waiting.len();
        waiting.retain(|job| !job.events.is_closed());
        stats.cancelled.fetch_add((before - waiting.len()) as u64, Ordering::Relaxed);
        while active.len() < parallel {
            let Some(job) = waiting.pop_front() else { break };
            active.push(Seq::new(job, tokenizer));
        }
        stats.waiting.store(waiting.len(), Ordering::Relaxed);
        stats.active.store(active.len(), Ordering::Relaxed);
        // sequences that are new this round set up their generator (vision, merge); those
        // that have one take a step together: their decode steps as one batched forward
        let stepping: Vec<bool> = active.iter().map(|s| s.generator.is_some()).collect();
        let mut outcomes: Vec<Result<Outcome>> = Vec::with_capacity(active.len());
        let mut gens = Vec::new();
        for (seq, &stepping) in active.iter_mut().zip(&stepping) {
            if seq.job.events.is_closed() {
                outcomes.push(Ok(Outcome::Gone));
            } else if stepping {
                outcomes.push(Ok(Outcome::Running)); // replaced by the step's outcome below
                gens.push(seq.generator.as_mut().expect("a stepping sequence has a generator"));
            } else {
                outcomes.push(seq.start(lm).map(|()| Outcome::Running));
            }
        }
        let mut steps = Generator::step_batch(&mut gens, &lm.model, lm.backend()).into_iter();
        for (i, seq) in active.iter_mut().enumerate() {
            if stepping[i] && matches!(outcomes[i], Ok(Outcome::Running)) {
                let step = steps.next().expect("one step per stepping sequence");
                outcomes[i] = step.and_then(|step| seq.took(step));
            }
        }
        // the counters move before the last event goes out: a client that reads `/health`
        // right after its answer sees its sequence gone
        for (i, outcome) in outcomes.into_iter().enumerate().rev() {
            match outcome {
                Ok(Outcome::Running) => {}
                Ok(Outcome::Gone) => {
                    active.remove(i);
                    stats.active.store(active.len(), Ordering::Relaxed);
                    stats.cancelled.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Outcome::Finished { reason, flush }) => {
                    let (events, last) = active.remove(i).finish(reason, flush);
                    stats.active.store(active.len(), Ordering::Relaxed);
                    let counter = match last {
                        Event::Failed(_) => &stats.failed,
                        _ => &stats.completed,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    let _ = events.send(last);
                }
                Err(e) => {
                    let events = active.remove(i).job.events;
                    stats.active.store(active.len(), Ordering::Relaxed);
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    let _ = events.send(Event::Failed(e.to_string()));
                }
            }
        }
        stats.active.store(active.len(), Ordering::Relaxed);
    }
}

/// What one step left a sequence in.
enum Outcome {
    Running,
    /// The client has gone: drop the sequence.
    Gone,
    /// `flush`: text held back by the detokenizer and the stop filter still has to go out
    /// (false when a stop sequence ended the answer: nothing after it is sent).
    Finished {
        reason: FinishReason,
        flush: bool,
    },
}

/// One active request.
struct Seq<'t, B: Backend> {
    job: Job,
    /// Set by the first step (vision + merge); then each step is a chunk or a token.
    generator: Option<Generator<B>>,
    text: TextStream<'t>,
    stop: StopFilter,
    prompt_tokens: usize,
    queue: Duration,
    vision: Option<Duration>,
    first_token: Option<Duration>,
}

impl<'t, B: Backend> Seq<'t, B> {
    fn new(mut job: Job, tokenizer: &'t ChatTokenizer) -> Self {
        let stop = StopFilter::new(std::mem::take(&mut job.stop));
        Seq {
            queue: job.arrived.elapsed(),
            job,
            generator: None,
            text: tokenizer.stream(),
            stop,
            prompt_tokens: 0,
            vision: None,
            first_token: None,
        }
    }

    /// The first step: the images through the vision tower, merged into the prompt, and the
    /// generator that runs it.
    fn start(&mut self, lm: &LoadedLm<'_, B>) -> Result<()> {
        let t = Instant::now();
        let images = std::mem::take(&mut self.job.images);
        let has_images = !images.is_empty();
        let prompt = lm.prompt(&self.job.tokens, images)?;
        self.prompt_tokens = prompt.input.ids.len();
        let j = &self.job;
        let eos: &[i32] = if j.ignore_eos { &[] } else { &lm.eos };
        let g = Generator::new(&lm.model, lm.backend(), &prompt.input, prompt.embeds, j.max_tokens, eos, &j.sampling)?;
        self.generator = Some(g);
        self.vision = has_images.then(|| t.elapsed());
        Ok(())
    }

    /// What the generator's step (a prefill chunk or a token) leaves this request in: the token's
    /// text goes out through the stop filter.
    fn took(&mut self, step: Option<Step>) -> Result<Outcome> {
        let stopped = self.generator.as_ref().and_then(Generator::stopped);
        if let Some(Step::Token(id)) = step {
            self.first_token.get_or_insert_with(|| self.job.arrived.elapsed());
            let id = u32::try_from(id).map_err(|_| Error::Invalid(format!("generated a negative token id {id}")))?;
            if let Some(piece) = self.text.push(id)?
                && release(&mut self.stop, &self.job.events, &piece)
            {
                return Ok(Outcome::Finished { reason: FinishReason::Stop, flush: false });
            }
        }
        Ok(match stopped {
            None => Outcome::Running,
            Some(StopReason::Eos) => Outcome::Finished { reason: FinishReason::Stop, flush: true },
            Some(StopReason::MaxTokens) => Outcome::Finished { reason: FinishReason::Length, flush: true },
        })
    }

    /// Send the held-back text (when `flush`); return the sender with the closing event (`Done`,
    /// or `Failed` when the tail could not be decoded), which the scheduler sends once its
    /// counters are up to date.
    fn finish(self, mut reason: FinishReason, flush: bool) -> (mpsc::UnboundedSender<Event>, Event) {
        let Seq { job, generator, text, mut stop, prompt_tokens, queue, vision, first_token } = self;
        if flush {
            match text.finish() {
                Ok(rest) if release(&mut stop, &job.events, &rest) => reason = FinishReason::Stop,
                Ok(_) => {
                    let held = stop.finish();
                    if !held.is_empty() {
                        let _ = job.events.send(Event::Text(held));
                    }
                }
                Err(e) => return (job.events, Event::Failed(e.to_string())),
            }
        }
        let (prefill, decode) = generator.as_ref().map(Generator::times).unwrap_or_default();
        let finish = Finish {
            reason,
            prompt_tokens,
            completion_tokens: generator.as_ref().map_or(0, |g| g.ids().len()),
            timings: Timings { queue, vision, prefill, decode, first_token: first_token.unwrap_or_default() },
        };
        (job.events, Event::Done(finish))
    }
}

/// Send what the stop filter releases of `piece`; whether a stop sequence ended the answer.
fn release(stop: &mut StopFilter, events: &mpsc::UnboundedSender<Event>, piece: &str) -> bool {
    let (text, stopped) = stop.push(piece);
    if !text.is_empty() {
        // a send error means the client left; the next step notices
        let _ = events.send(Event::Text(text));
    }
    stopped
}
