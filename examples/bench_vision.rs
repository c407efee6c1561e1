//! Benchmark: the vision tower + aligner with random bf16 weights on one image.
//!
//! ```text
//! cargo run --release --example bench_vision -- --backend wgpu            # full size, 1920x1080
//! cargo run --release --example bench_vision -- --backend cpu --layers 2 --width 392 --height 392
//! cargo run --release --example bench_vision -- --backend cuda           # $FOVEA_CUDA_DEVICE, else 0
//! ```
//!
//! Prints the lane, the grid, the time per encode (after one warm-up that compiles the
//! pipelines), achieved TFLOP/s, and the device memory split into weights (vs their bf16 file
//! bytes; with the bytes of the matrices themselves) and activations. With `FOVEA_GPU_TIMES=1` on a
//! lane that times its kernels, each kernel's device time an encode.

#[path = "bench_common/mod.rs"]
mod bench_common;

use std::borrow::Cow;
use std::time::Instant;

use clap::Parser;
use fovea::backend::{Backend, HostTensor, HostWeight, WeightFormat};
use fovea::config::VisionConfig;
use fovea::model::ParamSource;
use fovea::model::vision::VisionModel;
use fovea::pipeline::{LaneJob, preprocess_config, run_on_lane};
use fovea::processor;
use fovea::weights::vision_manifest;
use rand::{Rng, SeedableRng};

#[derive(Parser)]
struct Args {
    /// cpu, wgpu or cuda
    #[arg(long, default_value = "wgpu")]
    backend: String,
    /// exact (f32 products) or fast (f16 GEMM operands; cuda and wgpu); default $FOVEA_PRECISION,
    /// else fast on cuda and on a wgpu GPU with f16 shaders.
    #[arg(long)]
    precision: Option<fovea::backend::Precision>,
    #[arg(long, default_value_t = 1920)]
    width: u32,
    #[arg(long, default_value_t = 1080)]
    height: u32,
    /// ViT depth (32 at full size)
    #[arg(long, default_value_t = 32)]
    layers: usize,
    /// Timed encodes after the warm-up
    #[arg(long, default_value_t = 5)]
    iters: usize,
}

/// Random weights in the official names: matrices bf16 (uniform ±√(3/fan_in)), vectors f32.
struct RandomParams {
    cfg: VisionConfig,
}

impl RandomParams {
    fn shape(&self, name: &str) -> (usize, usize) {
        let c = &self.cfg;
        let (d, h) = (c.dim, c.hidden_size);
        let last = name.rsplit('.').nth(1).unwrap_or("");
        match last {
            "proj" => (d, c.patch_dim()),
            "wqkv" => (3 * d, d),
            "wo" => (d, d),
            "w1" if name.starts_with("vision") => (2 * c.inter_dim, d),
            "w2" if name.starts_with("vision") => (d, c.inter_dim),
            "w1" => (h, c.aligner_in_dim()),
            _ => (h, h), // aligner.w2
        }
    }
    fn seed(name: &str) -> u64 {
        name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
    }
}

impl ParamSource for RandomParams {
    fn matrix(&self, name: &str) -> fovea::Result<HostWeight<'_>> {
        let (rows, cols) = self.shape(name);
        let mut rng = rand::rngs::StdRng::seed_from_u64(Self::seed(name));
        let a = (3.0 / cols as f32).sqrt();
        let bytes: Vec<u8> =
            (0..rows * cols).flat_map(|_| half::bf16::from_f32(rng.random_range(-a..a)).to_le_bytes()).collect();
        Ok(HostWeight { name: name.to_string(), format: WeightFormat::BF16, rows, cols, bytes: Cow::Owned(bytes) })
    }
    fn vector(&self, name: &str) -> fovea::Result<Vec<f32>> {
        let c = &self.cfg;
        let mut rng = rand::rngs::StdRng::seed_from_u64(Self::seed(name));
        let len = if name.starts_with("image_") || name.starts_with("aligner") {
            c.hidden_size
        } else if name.ends_with("wqkv.bias") {
            3 * c.dim
        } else {
            c.dim
        };
        let around = if name.contains("norm") { 1.0 } else { 0.0 };
        Ok((0..len).map(|_| around + rng.random_range(-0.05f32..0.05)).collect())
    }
}

fn full_size_config(layers: usize) -> fovea::Result<VisionConfig> {
    VisionConfig::from_value(serde_json::json!({
        "vision_n_layers": layers, "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816,
        "vision_patch_size": 14, "vision_rope_theta": 10000, "vision_downsample_ratio": 3,
        "vision_max_n_token": 384, "vision_min_pixels": 147456, "vision_max_wh_ratio": 8,
        "hidden_size": 4096
    }))
}

fn run<B: Backend>(b: &B, args: &Args) -> fovea::Result<()> {
    let cfg = full_size_config(args.layers)?;
    let src = RandomParams { cfg: cfg.clone() };
    let t = Instant::now();
    let model = VisionModel::load(b, &src, &cfg)?;
    let load_s = t.elapsed().as_secs_f64();

    // A smooth synthetic photo-sized image through the real processor.
    let img = image::RgbImage::from_fn(args.width, args.height, |x, y| {
        image::Rgb([(x * 255 / args.width) as u8, (y * 255 / args.height) as u8, ((x + y) % 256) as u8])
    });
    let prep = processor::prepare(&img, &preprocess_config(&cfg))?;
    let n = prep.n_vit_h * prep.n_vit_w;
    let patches = b.upload(&HostTensor::f32([n, cfg.patch_dim()], prep.patches.clone())?)?;

    let encode = || -> fovea::Result<f64> {
        let t = Instant::now();
        let stages = model.encode(b, &patches, prep.n_vit_h, prep.n_vit_w)?;
        b.download(&stages.aligner)?; // waits for the device
        Ok(t.elapsed().as_secs_f64())
    };
    let warm = encode()?;
    b.kernel_times()?; // from here on
    let mut times: Vec<f64> = (0..args.iters).map(|_| encode()).collect::<fovea::Result<_>>()?;
    let kernels = b.kernel_times()?;
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(warm);

    let flops = bench_common::vit_encode_flops(&cfg, n, prep.n_llm_h * prep.n_llm_w);

    let mem = b.memory();
    let file_bytes = file_bytes(&cfg);
    println!("lane: {} ({}), {} precision", b.lane(), b.device_name(), b.precision());
    println!(
        "image {}x{} -> ViT grid {}x{} ({} patches), LLM grid {}x{}; {} layers x {}",
        args.width, args.height, prep.n_vit_h, prep.n_vit_w, n, prep.n_llm_h, prep.n_llm_w, args.layers, cfg.dim
    );
    println!("load (random weights + upload): {load_s:.2} s; first encode (compiles pipelines): {:.1} ms", warm * 1e3);
    println!(
        "encode: median {:.2} ms over {} runs, {:.3} TFLOP -> {:.2} TFLOP/s",
        median * 1e3,
        times.len(),
        flops / 1e12,
        flops / median / 1e12
    );
    bench_common::print_kernel_times(kernels.as_deref(), "an encode", times.len(), 16);
    println!(
        "device memory: weights {:.1} MiB ({:.3} x the {:.1} MiB bf16 file; the matrices themselves {:.1} MiB), \
         activations peak {:.1} MiB",
        mem.weight_bytes as f64 / 1048576.0,
        mem.weight_bytes as f64 / file_bytes as f64,
        file_bytes as f64 / 1048576.0,
        mem.matrix_bytes as f64 / 1048576.0,
        mem.peak_activation_bytes as f64 / 1048576.0
    );
    Ok(())
}

/// Bytes the same tensors occupy in a checkpoint with bf16 matrices and f32 vectors (every 2-D
/// entry of the loader's manifest is a matrix).
fn file_bytes(cfg: &VisionConfig) -> u64 {
    vision_manifest(cfg).iter().map(|e| e.numel() as u64 * if e.shape.len() == 2 { 2 } else { 4 }).sum()
}

/// The benchmark, on whichever lane `--backend` opens (as the CLI opens it).
impl LaneJob for &Args {
    type Output = ();
    const LANGUAGE_MODEL: bool = false;
    fn run<B: Backend>(self, b: &B, _note: Option<&str>) -> fovea::Result<()> {
        run(b, self)
    }
}

fn main() {
    let args = Args::parse();
    let result = args.backend.parse().and_then(|lane| run_on_lane(lane, args.precision, &args));
    if let Err(e) = result {
        eprintln!("bench_vision: error: {e}");
        std::process::exit(2);
    }
}
