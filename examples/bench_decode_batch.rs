//! Benchmark: continuous batching's decode step on a real checkpoint (default: the shipped
//! model) — one sequence's step against `--batch` sequences stepping in one forward
//! (`LmModel::decode_batch`), in-process, no HTTP.
//!
//! ```text
//! cargo run --release --example bench_decode_batch -- --backend cpu
//! cargo run --release --example bench_decode_batch -- --backend wgpu --batch 8 --steps 40
//! ```
//!
//! The sequences are prefilled to different lengths (`--context` plus 5 per sequence), so they
//! sit at different positions and compressor phases, as a server's do. The two kinds of step
//! alternate, so a machine shared with other work slows both alike. Prints the median step of
//! each, the aggregate tokens/s and its ratio, and the lane's launches (CUDA) or encoded
//! dispatches and copies (wgpu) per step, averaged over the steps (a step where a compressor
//! block completes issues more); with `FOVEA_HOST_PROFILE=1` also the host's waits for the
//! device a step (the logits' download is one) and its time in launches; with
//! `FOVEA_GPU_TIMES=1` on the wgpu lane, after the timed steps, each kernel's device time and
//! dispatches over `--steps` more one-sequence steps (a pass a dispatch: the list of what a
//! step dispatches, its times inflated for small kernels; the timer is on from the start, so
//! the medians above are inflated too).

#[path = "bench_common/mod.rs"]
mod bench_common;

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use fovea::backend::{Backend, HostProfile};
use fovea::config::LmConfig;
use fovea::model::lm::{LmCache, LmInput, LmModel};
use fovea::pipeline::{LaneJob, run_on_lane};
use fovea::weights::Checkpoint;

#[derive(Parser)]
struct Args {
    /// cpu, wgpu or cuda
    #[arg(long, default_value = "cpu")]
    backend: String,
    /// exact or fast (see `--precision` of the CLI)
    #[arg(long)]
    precision: Option<fovea::backend::Precision>,
    /// Model directory (config.json + safetensors)
    #[arg(long, default_value = "fixtures/models/vl-scenes")]
    model: PathBuf,
    /// Sequences stepping together
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Prompt tokens of the first sequence; sequence s has 5·s more
    #[arg(long, default_value_t = 40)]
    context: usize,
    /// Timed steps of each kind (medians are reported)
    #[arg(long, default_value_t = 30)]
    steps: usize,
}

/// A cache prefilled with `len` text tokens.
fn prefilled<B: Backend>(b: &B, model: &LmModel<B>, cfg: &LmConfig, len: usize) -> fovea::Result<LmCache<B>> {
    let ids: Vec<i32> = (0..len).map(|i| (i * 7919 % cfg.vocab_size) as i32).collect();
    Ok(model.prefill_cache(b, &LmInput { ids, window: None }, None, 512, &mut |_| {})?.1)
}

/// One step's seconds, the lane's launches and its host profile (when collected).
struct Step {
    seconds: f64,
    launches: Option<u64>,
    host: Option<HostProfile>,
}

/// Time one decode step of `caches` (downloading the logits waits for the device).
fn step<B: Backend>(b: &B, model: &LmModel<B>, caches: &mut [LmCache<B>], token: i32) -> fovea::Result<Step> {
    let ids = vec![token; caches.len()];
    let mut refs: Vec<_> = caches.iter_mut().collect();
    let (before, host_before) = (b.launches(), b.host_profile());
    let t = Instant::now();
    b.download(&model.decode_batch(b, &mut refs, &ids)?)?;
    let seconds = t.elapsed().as_secs_f64();
    let host = host_before.zip(b.host_profile()).map(|(a, z)| z.since(&a));
    Ok(Step { seconds, launches: before.zip(b.launches()).map(|(a, z)| z - a), host })
}

/// The steps' median seconds.
fn median(steps: &[Step]) -> f64 {
    let mut v: Vec<f64> = steps.iter().map(|s| s.seconds).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Launches a step, and the host's waits and time in launches a step (averaged), where known.
fn counts(steps: &[Step]) -> String {
    let n = steps.len() as f64;
    let mut out = String::new();
    if let Some(l) = steps.iter().map(|s| s.launches).sum::<Option<u64>>() {
        out += &format!(", {:.1} launches a step", l as f64 / n);
    }
    let waits = steps.iter().map(|s| s.host.as_ref().map(|h| h.waits)).sum::<Option<u64>>();
    let launch_ns = steps.iter().map(|s| s.host.as_ref().map(|h| h.launch_ns)).sum::<Option<u64>>();
    if let (Some(w), Some(ns)) = (waits, launch_ns) {
        out += &format!(" (host: {:.1} waits, {:.2} ms in launches a step)", w as f64 / n, ns as f64 / 1e6 / n);
    }
    out
}

fn run<B: Backend>(b: &B, args: &Args) -> fovea::Result<()> {
    if args.batch == 0 || args.steps == 0 {
        return Err(fovea::Error::Invalid("--batch and --steps must be at least 1".into()));
    }
    let cfg = LmConfig::from_file(&args.model.join("config.json"))?;
    let ckpt = Checkpoint::open_without_vision(&args.model)?;
    let model = LmModel::load(b, &ckpt, &cfg)?;
    let mut one = vec![prefilled(b, &model, &cfg, args.context)?];
    let mut many =
        (0..args.batch).map(|s| prefilled(b, &model, &cfg, args.context + 5 * s)).collect::<fovea::Result<Vec<_>>>()?;
    // warm-up: pipelines, allocator pools
    step(b, &model, &mut one, 1)?;
    step(b, &model, &mut many, 1)?;
    let (mut t1, mut tn) = (Vec::new(), Vec::new());
    for i in 0..args.steps {
        let token = (i * 31 % cfg.vocab_size) as i32;
        t1.push(step(b, &model, &mut one, token)?);
        tn.push(step(b, &model, &mut many, token)?);
    }
    let (s1, sn) = (median(&t1), median(&tn));
    println!("lane: {} ({}), {} precision", b.lane(), b.device_name(), b.precision());
    println!(
        "model {}: {} layers, compress ratios {:?}",
        args.model.display(),
        cfg.num_hidden_layers,
        (0..cfg.num_hidden_layers).map(|l| cfg.ratio(l)).collect::<Vec<_>>()
    );
    println!("1 sequence: median step {:.3} ms -> {:.0} tok/s{}", s1 * 1e3, 1.0 / s1, counts(&t1));
    println!(
        "{} sequences: median step {:.3} ms -> {:.0} tok/s ({:.2} x one sequence){}",
        args.batch,
        sn * 1e3,
        args.batch as f64 / sn,
        args.batch as f64 * s1 / sn,
        counts(&tn)
    );
    // the kernel list, where the lane times kernels (`None` elsewhere: no more steps)
    if b.kernel_times()?.is_some() {
        for i in 0..args.steps {
            step(b, &model, &mut one, (i * 17 % cfg.vocab_size) as i32)?;
        }
        bench_common::print_kernel_times(b.kernel_times()?.as_deref(), "a one-sequence step", args.steps, 64);
    }
    Ok(())
}

/// The benchmark, on whichever lane `--backend` opens (as the CLI opens it).
impl LaneJob for &Args {
    type Output = ();
    fn run<B: Backend>(self, b: &B, _note: Option<&str>) -> fovea::Result<()> {
        run(b, self)
    }
}

fn main() {
    let args = Args::parse();
    let result = args.backend.parse().and_then(|lane| run_on_lane(lane, args.precision, &args));
    if let Err(e) = result {
        eprintln!("bench_decode_batch: error: {e}");
        std::process::exit(2);
    }
}
