//! Benchmark: one full-size DeepSeek-V4-Flash language layer with random bf16 weights — a
//! prefill of `--tokens` tokens, then decode steps at that context.
//!
//! ```text
//! cargo run --release --example bench_lm_layer -- --backend cuda             # CSA layer, 4096 tokens
//! cargo run --release --example bench_lm_layer -- --backend wgpu --ratio 128 # an HCA layer
//! cargo run --release --example bench_lm_layer -- --backend cpu --tokens 256 --experts 16
//! ```
//!
//! The layer is the released config's (language.md §1): hidden 4096, 64 heads × 512 (RoPE 64),
//! q-LoRA 1024, grouped output 8 × 1024, window 128, 256 routed experts (top-6, width 2048) + one
//! shared, hc 4 with 20 Sinkhorn rounds; `--ratio 4` (default) is a CSA layer with its indexer
//! (64 × 128, top-512), `128` an HCA layer, `0` sliding window only. No hash routing (layers 3+).
//! The model around it is one layer deep with a 1024-token vocabulary, so the embedding and the
//! head are small next to the layer (they are included in the times).
//!
//! Prints the lane, the load time, the prefill time (one chunk of `--tokens`) with its FLOPs,
//! the median decode step with the weight bytes one token reads (attention, indexer,
//! compressors, router, shared expert and 6 routed experts; the KV cache is small beside them),
//! the median step of `--batch` sequences decoding together (continuous batching), and the
//! device memory: weights (vs their bf16 file bytes; with the matrices themselves) and
//! activations.

#[path = "bench_common/mod.rs"]
mod bench_common;

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Instant;

use clap::Parser;
use fovea::backend::{Backend, HostWeight, WeightFormat};
use fovea::config::LmConfig;
use fovea::model::ParamSource;
use fovea::model::lm::{LmInput, LmModel};
use fovea::pipeline::{LaneJob, run_on_lane};
use fovea::weights::lm::lm_manifest;
use rand::{Rng, SeedableRng};

#[derive(Parser)]
struct Args {
    /// cpu, wgpu or cuda
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// exact (f32 products) or fast (f16 GEMM operands; cuda and wgpu); default $FOVEA_PRECISION,
    /// else fast on cuda and on a wgpu GPU with f16 shaders.
    #[arg(long)]
    precision: Option<fovea::backend::Precision>,
    /// Prompt tokens (one prefill chunk); decode runs at this context
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Compression ratio of the layer: 4 (CSA + indexer), 128 (HCA) or 0 (window only)
    #[arg(long, default_value_t = 4)]
    ratio: usize,
    /// Routed experts (256 at full size; fewer for a quick run on small machines)
    #[arg(long, default_value_t = 256)]
    experts: usize,
    /// Timed prefills after the warm-up
    #[arg(long, default_value_t = 3)]
    iters: usize,
    /// Timed decode steps
    #[arg(long, default_value_t = 16)]
    decode_steps: usize,
    /// Also time decode steps of this many sequences in one forward (a server's continuous
    /// batching, `LmModel::decode_batch`), each with its own cache at the same context
    #[arg(long, default_value_t = 8)]
    batch: usize,
}

fn full_size_config(args: &Args) -> fovea::Result<LmConfig> {
    LmConfig::from_value(&serde_json::json!({
        "vocab_size": 1024, "hidden_size": 4096, "num_hidden_layers": 1,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
        "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8,
        "n_routed_experts": args.experts, "num_experts_per_tok": 6, "n_shared_experts": 1,
        "moe_intermediate_size": 2048, "num_hash_layers": 0, "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0, "sliding_window": 128, "compress_ratios": [args.ratio, 0],
        "compress_rope_theta": 160000.0, "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576,
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6
    }))
}

/// Random parameters shaped by the loader's own manifest. Matrices are bf16 windows into one
/// pool of uniform values per fan-in (±√(3/fan_in)), at an offset hashed from the name, so 13 GB
/// of distinct-looking experts cost one 64 MiB pool per fan-in to generate; vectors are f32
/// (norms around 1, everything else small).
struct RandomParams {
    shapes: HashMap<String, Vec<usize>>,
    pools: HashMap<usize, Vec<u8>>,
}

const POOL_BYTES: usize = 64 << 20;

impl RandomParams {
    fn new(cfg: &LmConfig) -> fovea::Result<Self> {
        let shapes: HashMap<_, _> = lm_manifest(cfg)?.into_iter().map(|e| (e.name, e.shape)).collect();
        let mut pools = HashMap::new();
        for shape in shapes.values().filter(|s| s.len() == 2) {
            let fan_in = shape[1];
            pools.entry(fan_in).or_insert_with(|| {
                let mut rng = rand::rngs::StdRng::seed_from_u64(fan_in as u64);
                let a = (3.0 / fan_in as f32).sqrt();
                (0..POOL_BYTES / 2).flat_map(|_| half::bf16::from_f32(rng.random_range(-a..a)).to_le_bytes()).collect()
            });
        }
        Ok(Self { shapes, pools })
    }
    fn shape(&self, name: &str) -> fovea::Result<&[usize]> {
        self.shapes.get(name).map(Vec::as_slice).ok_or_else(|| fovea::Error::tensor(name, "not in the manifest"))
    }
    fn seed(name: &str) -> u64 {
        name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
    }
}

impl ParamSource for RandomParams {
    fn matrix(&self, name: &str) -> fovea::Result<HostWeight<'_>> {
        let &[rows, cols] = self.shape(name)? else {
            return Err(fovea::Error::tensor(name, "not a matrix"));
        };
        let (pool, len) = (&self.pools[&cols], rows * cols * 2);
        let bytes = if len <= pool.len() {
            let off = (Self::seed(name) as usize % (pool.len() - len + 1)) & !1;
            Cow::Borrowed(&pool[off..off + len])
        } else {
            Cow::Owned(pool.iter().cycle().take(len).copied().collect())
        };
        Ok(HostWeight { name: name.to_string(), format: WeightFormat::BF16, rows, cols, bytes })
    }
    fn vector(&self, name: &str) -> fovea::Result<Vec<f32>> {
        let len = self.shape(name)?.iter().product();
        let mut rng = rand::rngs::StdRng::seed_from_u64(Self::seed(name));
        let around = if name.contains("norm") { 1.0 } else { 0.0 };
        Ok((0..len).map(|_| around + rng.random_range(-0.05f32..0.05)).collect())
    }
    fn has(&self, name: &str) -> bool {
        self.shapes.contains_key(name)
    }
}

/// Bytes of weights one decode token reads: every matrix of the layer except the routed
/// experts, plus `num_experts_per_tok` of those (bf16), plus the f32 parameters.
fn decode_weight_bytes(c: &LmConfig, shapes: &HashMap<String, Vec<usize>>) -> f64 {
    let mut bytes = 0.0;
    let mut expert = 0.0;
    for (name, s) in shapes {
        let elems: usize = s.iter().product();
        let b = if s.len() == 2 { 2.0 } else { 4.0 } * elems as f64;
        if name.contains(".experts.") {
            if name.contains(".experts.0.") {
                expert += b;
            }
        } else if !name.starts_with("embed") && !name.starts_with("head") {
            bytes += b;
        }
    }
    bytes + expert * c.num_experts_per_tok as f64
}

fn run<B: Backend>(b: &B, args: &Args) -> fovea::Result<()> {
    let cfg = full_size_config(args)?;
    let t = Instant::now();
    let src = RandomParams::new(&cfg)?;
    let model = LmModel::load(b, &src, &cfg)?;
    let load_s = t.elapsed().as_secs_f64();
    let ids: Vec<i32> = (0..args.tokens).map(|i| (i * 7919 % cfg.vocab_size) as i32).collect();
    let input = LmInput { ids, window: None };

    let prefill = || -> fovea::Result<(f64, fovea::model::lm::LmCache<B>)> {
        let t = Instant::now();
        let (hidden, cache) = model.prefill_cache(b, &input, None, args.tokens, &mut |_| {})?;
        b.download(&model.last_logits(b, &hidden)?)?; // waits for the device
        Ok((t.elapsed().as_secs_f64(), cache))
    };
    let (warm, _) = prefill()?;
    let mut times = Vec::new();
    let mut cache = None;
    for _ in 0..args.iters {
        let (s, c) = prefill()?;
        times.push(s);
        cache = Some(c);
    }
    times.sort_by(f64::total_cmp);
    let prefill_s = times.get(times.len() / 2).copied().unwrap_or(warm);
    let mut cache = match cache {
        Some(c) => c,
        None => prefill()?.1,
    };
    let mut steps = Vec::new();
    let launches_before = b.launches();
    for i in 0..args.decode_steps.max(1) {
        let t = Instant::now();
        b.download(&model.decode(b, &mut cache, (i % cfg.vocab_size) as i32)?)?;
        steps.push(t.elapsed().as_secs_f64());
    }
    // the lane's launches (CUDA) or encoded dispatches and copies (wgpu) a step
    let launches = match (launches_before, b.launches()) {
        (Some(a), Some(z)) => format!(", {:.0} launches a step", (z - a) as f64 / steps.len() as f64),
        _ => String::new(),
    };
    steps.sort_by(f64::total_cmp);
    let step_s = steps[steps.len() / 2];
    // the same steps for `batch` sequences at once (their caches prefilled alike)
    let batched_s = if args.batch > 1 {
        let mut caches = (0..args.batch).map(|_| prefill().map(|(_, c)| c)).collect::<fovea::Result<Vec<_>>>()?;
        let mut steps = Vec::new();
        for i in 0..args.decode_steps.max(1) {
            let ids: Vec<i32> = (0..args.batch).map(|s| ((i * args.batch + s) % cfg.vocab_size) as i32).collect();
            let mut refs: Vec<_> = caches.iter_mut().collect();
            let t = Instant::now();
            b.download(&model.decode_batch(b, &mut refs, &ids)?)?;
            steps.push(t.elapsed().as_secs_f64());
        }
        steps.sort_by(f64::total_cmp);
        Some(steps[steps.len() / 2])
    } else {
        None
    };

    let flops = bench_common::lm_layer_prefill_flops(&cfg, 0, args.tokens);
    let bytes = decode_weight_bytes(&cfg, &src.shapes);
    let mem = b.memory();
    println!("lane: {} ({}), {} precision", b.lane(), b.device_name(), b.precision());
    println!(
        "layer: hidden {}, {} heads x {}, ratio {}, {} experts top-{}; load (random weights + upload) {load_s:.1} s",
        cfg.hidden_size,
        cfg.num_attention_heads,
        cfg.head_dim,
        cfg.ratio(0),
        cfg.n_routed_experts,
        cfg.num_experts_per_tok
    );
    println!(
        "prefill {} tokens: median {:.2} ms over {} runs (first {:.1} ms), {:.2} TFLOP -> {:.2} TFLOP/s, {:.0} tok/s",
        args.tokens,
        prefill_s * 1e3,
        times.len(),
        warm * 1e3,
        flops / 1e12,
        flops / prefill_s / 1e12,
        args.tokens as f64 / prefill_s
    );
    println!(
        "decode at context {}: median {:.3} ms over {} steps, {:.3} GB of weights -> {:.0} GB/s{launches}",
        args.tokens,
        step_s * 1e3,
        steps.len(),
        bytes / 1e9,
        bytes / step_s / 1e9
    );
    if let Some(s) = batched_s {
        println!(
            "decode of {} sequences in one step at context {}: median {:.3} ms -> {:.0} tok/s ({:.2} x one sequence's {:.0})",
            args.batch,
            args.tokens,
            s * 1e3,
            args.batch as f64 / s,
            args.batch as f64 * step_s / s,
            1.0 / step_s
        );
    }
    let file = file_bytes(&cfg)?;
    println!(
        "device memory: weights {:.2} GiB ({:.3} x the {:.2} GiB bf16 file; the matrices themselves {:.2} GiB), \
         activations peak {:.2} GiB",
        mem.weight_bytes as f64 / 1073741824.0,
        mem.weight_bytes as f64 / file as f64,
        file as f64 / 1073741824.0,
        mem.matrix_bytes as f64 / 1073741824.0,
        mem.peak_activation_bytes as f64 / 1073741824.0
    );
    Ok(())
}

/// Bytes the same tensors occupy in a checkpoint with bf16 matrices and f32 vectors (what
/// `RandomParams` hands out).
fn file_bytes(cfg: &LmConfig) -> fovea::Result<u64> {
    Ok(lm_manifest(cfg)?.iter().map(|e| e.shape.iter().product::<usize>() as u64 * if e.matrix { 2 } else { 4 }).sum())
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
        eprintln!("bench_lm_layer: error: {e}");
        std::process::exit(2);
    }
}
