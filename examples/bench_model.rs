//! Benchmark: the whole DeepSeek-V4-Flash-Vision at real scale — ViT + aligner and the 43-layer
//! language model — from random weights generated in memory (no file), in a chosen weight mix.
//!
//! ```text
//! cargo run --release --example bench_model -- --backend cuda                    # Q2 mix, 43 layers
//! cargo run --release --example bench_model -- --backend cuda --mix mxfp4 --layers 8 --compare-layers 4
//! cargo run --release --example bench_model -- --backend cpu --layers 2 --experts 8 --vocab 4096 \
//!     --prefill 48 --chunk 32 --decode-at 48,4096 --image 392x392 --vit-layers 1 --decode-steps 3 --image-iters 1
//! ```
//!
//! **Geometry** (language.md §1, vision.md): hidden 4096, 64 heads × 512 (RoPE 64), q-LoRA 1024,
//! grouped output 8 × 1024, window 128, 256 routed experts top-6 of width 2048 + 1 shared, hc 4
//! with 20 Sinkhorn rounds, hash routing on layers 0–2, the released `compress_ratios` (layers 0–1
//! window only, then CSA ratio 4 with its 64 × 128 top-512 indexer on even layers and HCA ratio
//! 128 on odd ones), vocabulary 129 280, `bias_vl` on every layer; the ViT 32 × 1024 (16 heads,
//! inter 2816) and the aligner into 4096. `--layers`, `--experts`, `--vocab` and `--vit-layers`
//! shrink it for small machines; `--layers N` keeps the first N layers of the released list.
//!
//! **Mixes** (`--mix`, the storage format of every matrix; vectors are f32 on every lane):
//! - `bf16`: every matrix BF16 (the official checkpoint's dense precision).
//! - `q2`: antirez's ~81 GiB "Q2" recipe (formats.md §2, language.md §5.2): routed gate/up
//!   IQ2_XXS, down Q2_K; the five attention projections, the shared expert and the head Q8_0;
//!   the embedding, router, hyper-connection mixes, compressors and the whole indexer F16.
//! - `mxfp4`: what llama.cpp's converter makes of the official checkpoint (ggml-org's MXFP4_MOE):
//!   routed experts MXFP4, every matrix the official file holds in FP8 (attention, shared
//!   expert, indexer `wq_b`) Q8_0, the BF16 ones BF16 (embedding, head, router, compressors,
//!   indexer `weights_proj`), the hyper-connection mixes F32.
//!
//! The vision tower is BF16 in every mix (the official Vision-Exp tower, unsloth's mmproj-BF16).
//! With it, the released model's weights take 81.6 GiB (q2), 146.5 GiB (mxfp4) and 530.5 GiB
//! (bf16) on the CPU and CUDA lanes (printed at the start of every run, for its lane).
//!
//! **Weights** are generated on the host and streamed tensor by tensor into
//! `Backend::upload_weight`; the host never holds the model (the CPU lane's own copy aside).
//! Each (format, fan-in)
//! has one pool of random bytes (≤ 64 MiB, generated in parallel): valid blocks with random
//! codes and one finite scale per pool chosen so the decoded values have the RMS of uniform
//! ±√(3/fan_in) (calibrated by decoding the pool's first blocks with the CPU reference decoder),
//! so the 43-layer residual stays finite. A matrix is a window of its pool at an offset hashed
//! from its name (the pool repeated for the embedding and head, which are larger). Every layer
//! gets its own device copy; equal bytes at different addresses cost the same to read, and a
//! layer's weights are far larger than any cache. The router and `tid2eid` are random, so
//! tokens spread over the experts. Generating on the device would save the host → device copy
//! (the load time printed is the windows' copies and the upload), but needs a kernel per format
//! per lane.
//!
//! **Memory.** Before anything is uploaded the bench sizes what the run needs: the weights as
//! this lane allocates them (`Backend::weight_alloc_bytes`, the sizing `fovea inspect` uses, plus
//! the f32 vectors), the cache at the longest context, and an estimate of the prefill's
//! activations; past the device's free memory (`Backend::capacity`) it stops with the mix, the
//! bytes and the most layers that fit. The MXFP4 mix at 43 layers does not fit one H200 (about
//! 139 GiB) and bf16 fits nowhere: run `--layers 8 --compare-layers 4`, which measures the
//! language model again at 4 layers and reports the per-layer cost (the difference of the two
//! depths: with the released ratios, layers 4–7 are two CSA + HCA pairs of non-hash layers, what
//! layers 3–42 are made of) and a 43-layer estimate (`T(L) + (43 − L) · per layer`), as the
//! llama.cpp peer (`../shared/bench/llamacpp`) does.
//!
//! **Measurements**, after a warm-up prefill of one chunk + 1 token and decode steps for a second
//! (the first compile the kernels, the rest raise an idle GPU's clocks):
//! - `--image WxH`: random pixels through the processor (its host time printed apart), then the
//!   ViT + aligner on the device: median of `--image-iters` encodes after a warm-up, TFLOP/s;
//!   with `FOVEA_GPU_TIMES=1` on a lane that times its kernels, each kernel's device time an encode.
//! - `--prefill T,…`: the model's chunked prefill from position 0 as `fovea generate` runs it
//!   (`start_prefill` / `prefill_step` in `--chunk`-token chunks, by default the lane's as the CLI
//!   takes it: 2048 on CUDA, else 512; each waited for; the last chunk's logits downloaded),
//!   tokens/s and TFLOP/s (matrix products, attention, the
//!   indexer's scores). Then decode steps on that real cache (a cross-check of the synthetic
//!   ones below at the same context).
//! - `--decode-at N,…`: the median of `--decode-steps` decode steps at context N, on a
//!   **synthetic cache**: the cache a prefill of N tokens leaves (the last 127 raw keys per layer,
//!   ⌊N/4⌋ entries and indexer keys on CSA layers, ⌊N/128⌋ on HCA layers, the open blocks' rows)
//!   holding random values (`LmModel::synthetic_cache`), so 128K costs an upload, not a
//!   minutes-long prefill. A decode step's cost depends on those counts, not on the values. Like
//!   real decoding, it includes the model appending each emitted entry by copying a
//!   compressor's entries (every 4th step on a CSA layer, every 128th on an HCA layer).
//!   GB/s counts the weights one token reads (every matrix but the embedding's other rows and the
//!   routed experts, plus 6 experts per layer, as this lane stores them) and the cache it reads
//!   (raw keys, the indexer's keys, the picked or all compressed entries; f32).
//!
//! Ends with the device memory (weights, of which matrices, and the activation peak; the CPU lane
//! counts no activations) and a summary block to paste into the README's table.

#[path = "bench_common/mod.rs"]
mod bench_common;

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use clap::Parser;
use fovea::backend::{
    Backend, HostProfile, HostTensor, HostWeight, KernelTime, MemoryReport, WeightFormat, decode_row,
};
use fovea::config::{LmConfig, VisionConfig};
use fovea::model::ParamSource;
use fovea::model::lm::{LmCache, LmInput, LmModel};
use fovea::model::vision::VisionModel;
use fovea::pipeline::{LaneJob, preprocess_config, run_on_lane};
use fovea::processor;
use fovea::weights::lm::{ExpectedLm, ValueKind, lm_manifest};
use fovea::weights::vision_manifest;
use rand::rngs::SmallRng;
use rand::{Rng, RngCore, SeedableRng};

/// Layers of the released model.
const FULL_LAYERS: usize = 43;
/// The released config's `max_position_embeddings`: the longest context a flag may ask for.
const MAX_POSITIONS: usize = 1 << 20;
/// The largest image side `--image` takes (the processor resizes far below it).
const MAX_IMAGE_SIDE: u32 = 16384;
const GIB: f64 = (1u64 << 30) as f64;
/// Decode warm-up before any timing ([`warm_up_decode`]): at least this long…
const WARM_UP: Duration = Duration::from_secs(1);
/// …in at most this many steps (on the warm-up's own cache, a prefill of one chunk + 1 token).
const WARM_UP_STEPS: usize = 512;

#[derive(Parser, Clone)]
#[command(about = "The whole DeepSeek-V4-Flash-Vision from random weights: image, prefill, decode, memory")]
struct Args {
    /// cpu, wgpu or cuda
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// exact (f32 products) or fast (f16 GEMM operands; cuda and wgpu); default $FOVEA_PRECISION,
    /// else fast on cuda and on a wgpu GPU with f16 shaders.
    #[arg(long)]
    precision: Option<fovea::backend::Precision>,
    /// Weight mix: bf16, q2 (IQ2_XXS/Q2_K experts + Q8_0 + F16) or mxfp4 (MXFP4 experts + Q8_0)
    #[arg(long, value_enum, default_value = "q2")]
    mix: Mix,
    /// Language-model layers, the first N of the released 43
    #[arg(long, default_value_t = FULL_LAYERS)]
    layers: usize,
    /// Also measure the language model at this depth (< --layers) and report per-layer costs
    /// and a 43-layer estimate from the difference
    #[arg(long)]
    compare_layers: Option<usize>,
    /// Routed experts per layer (256 at full size)
    #[arg(long, default_value_t = 256)]
    experts: usize,
    /// Vocabulary (129 280 at full size; smaller for software adapters with small heaps)
    #[arg(long, default_value_t = 129_280)]
    vocab: usize,
    /// Prefill lengths in tokens, comma-separated, or `off`
    #[arg(long, default_value = "4096,32768")]
    prefill: Lengths,
    /// Decode contexts in tokens (synthetic caches), comma-separated, or `off`
    #[arg(long, default_value = "4096,32768,131072")]
    decode_at: Lengths,
    /// Image size WxH, or `off`
    #[arg(long, default_value = "1920x1080")]
    image: ImageSize,
    /// ViT depth (32 at full size)
    #[arg(long, default_value_t = 32)]
    vit_layers: usize,
    /// Prefill chunk in tokens [default: the lane's, as the CLI takes it: 2048 on CUDA, else 512]
    #[arg(long = "chunk", value_name = "CHUNK")]
    chunk_arg: Option<usize>,
    /// The chunk this run takes (`--chunk`, else the lane's)
    #[arg(skip)]
    chunk: usize,
    /// Timed decode steps per context (the median is reported)
    #[arg(long, default_value_t = 16)]
    decode_steps: usize,
    /// Timed image encodes after the warm-up (the median is reported)
    #[arg(long, default_value_t = 3)]
    image_iters: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Mix {
    Bf16,
    Q2,
    Mxfp4,
}

impl Mix {
    fn name(self) -> &'static str {
        match self {
            Mix::Bf16 => "bf16",
            Mix::Q2 => "q2",
            Mix::Mxfp4 => "mxfp4",
        }
    }

    /// The storage format of a language-model matrix in this mix (see the module doc).
    fn format(self, e: &ExpectedLm) -> WeightFormat {
        use WeightFormat::*;
        let n = e.name.as_str();
        let hc_mix = n.ends_with("_fn");
        match self {
            Mix::Bf16 => BF16,
            Mix::Q2 => match e.kind {
                ValueKind::Expert if n.ends_with("w2.weight") => Q2_K,
                ValueKind::Expert => IQ2_XXS,
                _ if n.contains(".indexer.") => F16,
                ValueKind::Fp8 => Q8_0,
                _ if n == "head.weight" => Q8_0,
                _ => F16,
            },
            Mix::Mxfp4 => match e.kind {
                ValueKind::Expert => MXFP4,
                ValueKind::Fp8 => Q8_0,
                _ if hc_mix => F32,
                _ => BF16,
            },
        }
    }
}

/// Token counts from the command line (`4096,32768`), or none (`off`).
#[derive(Clone, Debug)]
struct Lengths(Vec<usize>);

impl std::str::FromStr for Lengths {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("off") || s.is_empty() {
            return Ok(Lengths(Vec::new()));
        }
        s.split(',')
            .map(|t| match t.trim().parse::<usize>() {
                Ok(n) if n > 0 => Ok(n),
                _ => Err(format!("`{t}` is not a positive token count (expected e.g. 4096,32768 or off)")),
            })
            .collect::<Result<_, _>>()
            .map(Lengths)
    }
}

/// `WxH`, or `off`.
#[derive(Clone, Copy, Debug)]
struct ImageSize(Option<(u32, u32)>);

impl std::str::FromStr for ImageSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("off") {
            return Ok(ImageSize(None));
        }
        let bad = || format!("`{s}` is not WIDTHxHEIGHT (e.g. 1920x1080) or off");
        let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
        match (w.trim().parse::<u32>(), h.trim().parse::<u32>()) {
            (Ok(w), Ok(h)) if w > 0 && h > 0 => Ok(ImageSize(Some((w, h)))),
            _ => Err(bad()),
        }
    }
}

/// The released `compress_ratios` (language.md §1): layers 0–1 window only, then ratio 4 on
/// even and 128 on odd layers through 42, and the MTP slot (0).
fn released_ratios() -> Vec<usize> {
    (0..=FULL_LAYERS)
        .map(|l| match l {
            0 | 1 | FULL_LAYERS => 0,
            l if l % 2 == 0 => 4,
            _ => 128,
        })
        .collect()
}

/// The released language model's config at `layers` layers (hash routing on the first three of
/// them), with `experts` routed experts and a vocabulary of `vocab`.
fn lm_config(layers: usize, experts: usize, vocab: usize) -> fovea::Result<LmConfig> {
    LmConfig::from_value(&serde_json::json!({
        "vocab_size": vocab, "hidden_size": 4096, "num_hidden_layers": layers,
        "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
        "q_lora_rank": 1024, "o_lora_rank": 1024, "o_groups": 8,
        "n_routed_experts": experts, "num_experts_per_tok": 6, "n_shared_experts": 1,
        "moe_intermediate_size": 2048, "num_hash_layers": layers.min(3), "scoring_func": "sqrtsoftplus",
        "topk_method": "noaux_tc", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
        "swiglu_limit": 10.0, "sliding_window": 128, "compress_ratios": released_ratios(),
        "compress_rope_theta": 160000.0, "rope_theta": 10000.0,
        "rope_scaling": {"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
        "max_position_embeddings": 1048576,
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
        "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6, "rms_norm_eps": 1e-6
    }))
}

/// The released vision tower at `layers` ViT layers.
fn vision_config(layers: usize) -> fovea::Result<VisionConfig> {
    VisionConfig::from_value(serde_json::json!({
        "vision_n_layers": layers, "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816,
        "vision_patch_size": 14, "vision_rope_theta": 10000, "vision_downsample_ratio": 3,
        "vision_max_n_token": 384, "vision_min_pixels": 147456, "vision_max_wh_ratio": 8,
        "hidden_size": 4096
    }))
}

/// One parameter of the model as the bench hands it out.
#[derive(Clone, Debug)]
enum Param {
    Matrix {
        format: WeightFormat,
        rows: usize,
        cols: usize,
    },
    Vector {
        len: usize,
    },
    /// `tid2eid` `[vocab, k]`
    ExpertIds {
        rows: usize,
        k: usize,
    },
}

/// Every parameter of the language model (of `cfg`) and, with `vision`, of the vision tower.
fn model_params(cfg: &LmConfig, vision: Option<&VisionConfig>, mix: Mix) -> fovea::Result<Vec<(String, Param)>> {
    let mut out = Vec::new();
    for e in lm_manifest(cfg)? {
        let p = match (&e.kind, e.matrix, e.shape.as_slice()) {
            (ValueKind::Index, _, &[rows, k]) => Param::ExpertIds { rows, k },
            (_, true, &[rows, cols]) => Param::Matrix { format: mix.format(&e), rows, cols },
            (_, false, s) => Param::Vector { len: s.iter().product() },
            _ => return Err(fovea::Error::tensor(&e.name, "a matrix that is not 2-D")),
        };
        out.push((e.name, p));
    }
    if let Some(vc) = vision {
        for e in vision_manifest(vc) {
            let p = match e.shape.as_slice() {
                &[rows, cols] => Param::Matrix { format: WeightFormat::BF16, rows, cols },
                s => Param::Vector { len: s.iter().product() },
            };
            out.push((e.name, p));
        }
    }
    Ok(out)
}

/// Device bytes of a parameter on lane `B`: a matrix as the lane allocates it, vectors f32,
/// expert ids i32.
fn device_bytes<B: Backend>(p: &Param) -> u64 {
    match *p {
        Param::Matrix { format, rows, cols } => B::weight_alloc_bytes(format, rows, cols),
        Param::Vector { len } => 4 * len as u64,
        Param::ExpertIds { rows, k } => 4 * (rows * k) as u64,
    }
}

fn param_bytes<B: Backend>(params: &[(String, Param)]) -> u64 {
    params.iter().map(|(_, p)| device_bytes::<B>(p)).sum()
}

const POOL_BYTES: usize = 64 << 20;

/// Random parameters (module doc, **Weights**): one pool of valid random blocks per (format,
/// fan-in), matrices windowed out of it, vectors and expert ids drawn per name.
struct RandomWeights {
    params: HashMap<String, Param>,
    pools: HashMap<(WeightFormat, usize), Vec<u8>>,
    experts: usize,
}

impl RandomWeights {
    fn new(params: Vec<(String, Param)>, experts: usize) -> fovea::Result<Self> {
        let mut want: HashMap<(WeightFormat, usize), usize> = HashMap::new();
        for (_, p) in &params {
            if let Param::Matrix { format, rows, cols } = *p {
                let bytes = rows * format.row_bytes(cols);
                let w = want.entry((format, cols)).or_default();
                *w = (*w).max(bytes.min(POOL_BYTES));
            }
        }
        let mut pools = HashMap::new();
        for ((format, cols), bytes) in want {
            pools.insert((format, cols), random_pool(format, cols, bytes, seed_of(&format!("{format}/{cols}")))?);
        }
        Ok(RandomWeights { params: params.into_iter().collect(), pools, experts })
    }

    fn param(&self, name: &str) -> fovea::Result<&Param> {
        self.params.get(name).ok_or_else(|| fovea::Error::tensor(name, "not a parameter of the benchmarked model"))
    }
}

/// FNV-1a of a name: the seed (and pool offset) of a parameter.
fn seed_of(name: &str) -> u64 {
    name.bytes().fold(0xcbf29ce484222325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100000001b3))
}

impl ParamSource for RandomWeights {
    fn matrix(&self, name: &str) -> fovea::Result<HostWeight<'_>> {
        let Param::Matrix { format, rows, cols } = *self.param(name)? else {
            return Err(fovea::Error::tensor(name, "not a matrix"));
        };
        let pool = &self.pools[&(format, cols)];
        let (len, block) = (rows * format.row_bytes(cols), format.block_bytes());
        let bytes = if len <= pool.len() {
            // a whole number of blocks in, so every block keeps its layout
            let off = (seed_of(name) as usize % ((pool.len() - len) / block + 1)) * block;
            Cow::Borrowed(&pool[off..off + len])
        } else {
            // pools are whole blocks, so the repeats stay aligned
            Cow::Owned(pool.iter().cycle().take(len).copied().collect())
        };
        Ok(HostWeight { name: name.to_string(), format, rows, cols, bytes })
    }

    fn vector(&self, name: &str) -> fovea::Result<Vec<f32>> {
        let Param::Vector { len } = *self.param(name)? else {
            return Err(fovea::Error::tensor(name, "not a vector"));
        };
        let mut rng = SmallRng::seed_from_u64(seed_of(name));
        let around = if name.contains("norm") { 1.0 } else { 0.0 };
        Ok((0..len).map(|_| around + rng.random_range(-0.05f32..0.05)).collect())
    }

    fn integers(&self, name: &str) -> fovea::Result<(Vec<usize>, Vec<i64>)> {
        let Param::ExpertIds { rows, k } = *self.param(name)? else {
            return Err(fovea::Error::tensor(name, "not an integer tensor"));
        };
        // each token's k distinct experts, uniform over the experts
        let mut rng = SmallRng::seed_from_u64(seed_of(name));
        let mut ids = Vec::with_capacity(rows * k);
        for _ in 0..rows {
            let start = ids.len();
            while ids.len() < start + k {
                let e = rng.random_range(0..self.experts as i64);
                if !ids[start..].contains(&e) {
                    ids.push(e);
                }
            }
        }
        Ok((vec![rows, k], ids))
    }

    fn has(&self, name: &str) -> bool {
        self.params.contains_key(name)
    }
}

/// `bytes` (rounded up to whole blocks) of random `format` rows with `cols` values each: values
/// of the RMS of uniform ±√(3/cols), generated on every core.
fn random_pool(format: WeightFormat, cols: usize, bytes: usize, seed: u64) -> fovea::Result<Vec<u8>> {
    if format.is_block() && !SCALED_BLOCKS.contains(&format) {
        return Err(fovea::Error::Invalid(format!("no random {format} blocks: the mixes use {SCALED_BLOCKS:?}")));
    }
    let block = format.block_bytes();
    let mut pool = vec![0u8; bytes.div_ceil(block).max(1) * block];
    let target_rms = 1.0 / (cols as f64).sqrt();
    let scale = if format.is_block() {
        let unit = unit_scale_rms(format, seed)?;
        (target_rms / unit) as f32
    } else {
        (3.0f64.sqrt() * target_rms) as f32 // the half-width of the uniform
    };
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = pool.len().div_ceil(block).div_ceil(threads) * block;
    std::thread::scope(|s| {
        for (i, part) in pool.chunks_mut(per).enumerate() {
            s.spawn(move || fill_random(format, part, scale, seed ^ (i as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15)));
        }
    });
    Ok(pool)
}

/// Fill whole blocks of `format` with random codes under scale `scale` (block formats), or with
/// uniform values in ±`scale` (F32, F16, BF16).
fn fill_random(format: WeightFormat, part: &mut [u8], scale: f32, seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    match format {
        WeightFormat::F32 => part.chunks_exact_mut(4).for_each(|c| {
            c.copy_from_slice(&rng.random_range(-scale..scale).to_le_bytes());
        }),
        WeightFormat::F16 => part.chunks_exact_mut(2).for_each(|c| {
            c.copy_from_slice(&half::f16::from_f32(rng.random_range(-scale..scale)).to_le_bytes());
        }),
        WeightFormat::BF16 => part.chunks_exact_mut(2).for_each(|c| {
            c.copy_from_slice(&half::bf16::from_f32(rng.random_range(-scale..scale)).to_le_bytes());
        }),
        _ => {
            rng.fill_bytes(part);
            part.chunks_exact_mut(format.block_bytes()).for_each(|b| set_block_scale(format, b, scale));
        }
    }
}

/// The block formats [`set_block_scale`] knows the scale fields of.
const SCALED_BLOCKS: [WeightFormat; 4] =
    [WeightFormat::Q8_0, WeightFormat::Q2_K, WeightFormat::IQ2_XXS, WeightFormat::MXFP4];

/// Write a block's scale fields for a value scale `s` (s = 1 is the unit the pools are
/// calibrated with); the codes around them are any bytes, all valid in these formats.
fn set_block_scale(format: WeightFormat, b: &mut [u8], s: f32) {
    let f16 = |x: f32| half::f16::from_f32(x).to_le_bytes();
    match format {
        WeightFormat::Q8_0 | WeightFormat::IQ2_XXS => b[0..2].copy_from_slice(&f16(s)),
        WeightFormat::Q2_K => {
            // value = d·(sc & 15)·q − dmin·(sc >> 4): dmin = 1.5·d centres random codes on 0
            b[80..82].copy_from_slice(&f16(s));
            b[82..84].copy_from_slice(&f16(1.5 * s));
        }
        // E8M0: 2^(e − 127)
        WeightFormat::MXFP4 => b[0] = (127.0 + s.log2().round()).clamp(1.0, 254.0) as u8,
        other => unreachable!("random_pool refuses {other}: not in SCALED_BLOCKS"),
    }
}

/// RMS of the values of random `format` blocks at unit scale (decoded by the CPU reference).
fn unit_scale_rms(format: WeightFormat, seed: u64) -> fovea::Result<f64> {
    let blocks = 64;
    let mut bytes = vec![0u8; blocks * format.block_bytes()];
    fill_random(format, &mut bytes, 1.0, seed);
    let mut values = vec![0f32; blocks * format.block_elems()];
    decode_row(format, &bytes, &mut values);
    let rms = (values.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / values.len() as f64).sqrt();
    if !rms.is_finite() || rms == 0.0 {
        return Err(fovea::Error::Invalid(format!("random {format} blocks decode to RMS {rms}")));
    }
    Ok(rms)
}

/// FLOPs of a prefill of `t` tokens from position 0: every layer's
/// (`bench_common::lm_layer_prefill_flops`) and the head on the last token.
fn prefill_flops(c: &LmConfig, t: usize) -> f64 {
    let layers: f64 = (0..c.num_hidden_layers).map(|l| bench_common::lm_layer_prefill_flops(c, l, t)).sum();
    layers + 2.0 * c.hidden_size as f64 * c.vocab_size as f64
}

/// Device bytes of the weights one decode token reads on lane `B` (`params`: the language
/// model's): every matrix but the embedding (one row) and the routed experts
/// (`num_experts_per_tok` of each layer's), and every vector but `tid2eid` (one row).
fn decode_weight_bytes<B: Backend>(c: &LmConfig, params: &[(String, Param)]) -> f64 {
    let share = c.num_experts_per_tok as f64 / c.n_routed_experts as f64;
    let mut bytes = 0.0;
    for (name, p) in params {
        let all = device_bytes::<B>(p) as f64;
        bytes += match *p {
            Param::Matrix { format, cols, .. } if name == "embed.weight" => format.row_bytes(cols) as f64,
            Param::Matrix { .. } if name.contains(".experts.") => all * share,
            Param::ExpertIds { k, .. } => 4.0 * k as f64,
            _ => all,
        };
    }
    bytes
}

/// What the cache holds at context `n` (bytes, f32) and what one decode token reads of it:
/// raw keys, and per CSA layer every indexer key plus the top-k picked entries, per HCA layer
/// every entry.
fn cache_bytes(c: &LmConfig, n: usize) -> (f64, f64) {
    // bytes of one row of a raw key / compressed entry, and of an indexer key
    let (hd, ihd) = (c.head_dim as f64 * 4.0, c.index_head_dim as f64 * 4.0);
    let keys = (c.sliding_window - 1).min(n) as f64;
    let (mut held, mut read) = (0.0, 0.0);
    for l in 0..c.num_hidden_layers {
        held += keys * hd;
        read += (keys + 1.0) * hd;
        match c.ratio(l) {
            0 => {}
            4 => {
                let e = (n / 4) as f64;
                // the open rows (kv and gate, twice as wide with overlap) since the start of the
                // last complete block, in both compressors
                let open = (n - (n / 4).saturating_sub(1) * 4) as f64;
                held += e * (hd + ihd) + open * 2.0 * 2.0 * (hd + ihd);
                read += e * ihd + (n / 4).min(c.index_topk) as f64 * hd;
            }
            r => {
                let e = (n / r) as f64;
                held += e * hd + (n % r) as f64 * 2.0 * hd;
                read += e * hd;
            }
        }
    }
    (held, read)
}

/// Activation bytes the prefill of `t` tokens in `chunk`-token chunks needs beside the weights,
/// estimated: ~1 MiB per chunk token (the 4-stream residual, q and the attention output at
/// 64 × 512, the experts' rows; `bench_lm_layer` peaks at 0.65 MiB per token of a 4096-token
/// chunk), the indexer's `[chunk, t/4]` scores, and the cache of `t` tokens.
fn prefill_activation_bytes(c: &LmConfig, t: usize, chunk: usize) -> f64 {
    let chunk = chunk.min(t) as f64;
    chunk * 1048576.0 + chunk * (t / 4) as f64 * 4.0 + cache_bytes(c, t).0
}

/// A rate with three significant digits (at least the units): 0.0421, 3.17, 52.4, 1534.
fn sig3(x: f64) -> String {
    let digits = if x.abs() >= 100.0 || x == 0.0 { 0 } else { (2.0 - x.abs().log10().floor()) as usize };
    format!("{x:.digits$}")
}

/// Median of `times` (seconds).
fn median(mut times: Vec<f64>) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Prompt ids spread over the vocabulary.
fn prompt(t: usize, vocab: usize) -> Vec<i32> {
    (0..t).map(|i| ((i * 7919 + 1) % vocab) as i32).collect()
}

/// The chunked prefill of `t` tokens from position 0 as `fovea generate` runs it: chunks of
/// `chunk` tokens (`start_prefill` / `prefill_step`), each waited for (as for the CLI's progress
/// bar), the last chunk's logits downloaded. Returns its time and the cache; a long one reports
/// its progress on stderr every 10 s.
fn prefill<B: Backend>(b: &B, model: &LmModel<B>, t: usize, chunk: usize) -> fovea::Result<(f64, LmCache<B>)> {
    let input = LmInput { ids: prompt(t, model.config().vocab_size), window: None };
    let start = Instant::now();
    let mut reported = start;
    let mut p = model.start_prefill(b, &input, None, chunk)?;
    let mut last = None;
    while let Some(hidden) = model.prefill_step(b, &mut p, None)? {
        b.sync()?;
        last = Some(hidden);
        let done = p.progress().done_tokens;
        if done < t && reported.elapsed().as_secs() >= 10 {
            reported = Instant::now();
            eprintln!("  prefill {t}: {done} tokens in {:.0} s", start.elapsed().as_secs_f64());
        }
    }
    let hidden = last.ok_or_else(|| fovea::Error::Invalid("prefill of an empty prompt".into()))?;
    let logits = b.download(&model.last_logits(b, &hidden)?)?.into_f32("logits")?;
    let secs = start.elapsed().as_secs_f64();
    if logits.iter().any(|x| !x.is_finite()) {
        return Err(fovea::Error::Invalid(format!("prefill of {t} tokens: the logits are not finite")));
    }
    Ok((secs, p.cache))
}

/// Decode steps on one cache: medians in seconds, and the lane's launches a step.
struct DecodeTiming {
    /// a step, until its logits are on the host
    step: f64,
    /// until `decode` returns: the host's time to issue the step's work (on a GPU lane the device
    /// runs behind it, so a step whose issue time is close to `step` is bound by the host)
    issue: f64,
    /// `Backend::launches` a step; `None` on the CPU lane
    launches: Option<f64>,
    /// the host's time over all steps, when the lane collects it (`FOVEA_HOST_PROFILE=1`)
    host: Option<HostProfile>,
    /// each kernel's device time over all steps, when the lane collects it (`FOVEA_GPU_TIMES=1`)
    kernels: Option<Vec<KernelTime>>,
}

/// Untimed decode steps on `cache`: the first two compile the kernels; then more, for at least
/// [`WARM_UP`] in all (at most [`WARM_UP_STEPS`]), so a GPU's clocks are up before anything is
/// timed. An idle H100 runs its SMs at 345 MHz and takes a while to raise them under decode's
/// small kernels: 16 steps of 4 layers straight after two warm-up steps took 9.73 ms each, 200
/// steps 2.95 ms, 16 steps after a prefill 2.83 ms (2026-12-06, one session).
fn warm_up_decode<B: Backend>(b: &B, model: &LmModel<B>, cache: &mut LmCache<B>) -> fovea::Result<()> {
    let start = Instant::now();
    decode_median(b, model, cache, 2)?;
    let mut steps = 2;
    while start.elapsed() < WARM_UP && steps < WARM_UP_STEPS {
        decode_median(b, model, cache, 8)?;
        steps += 8;
    }
    Ok(())
}

/// The medians of `steps` decode steps on `cache`.
fn decode_median<B: Backend>(
    b: &B,
    model: &LmModel<B>,
    cache: &mut LmCache<B>,
    steps: usize,
) -> fovea::Result<DecodeTiming> {
    let vocab = model.config().vocab_size;
    let mut times = Vec::with_capacity(steps);
    let mut issue = Vec::with_capacity(steps);
    b.kernel_times()?; // from here on
    let launches_before = b.launches();
    let host_before = b.host_profile();
    for i in 0..steps.max(1) {
        let start = Instant::now();
        let logits = model.decode(b, cache, ((i * 7919 + 13) % vocab) as i32)?;
        issue.push(start.elapsed().as_secs_f64());
        let logits = b.download(&logits)?.into_f32("logits")?;
        times.push(start.elapsed().as_secs_f64());
        if logits.iter().any(|x| !x.is_finite()) {
            return Err(fovea::Error::Invalid(format!("decode at {}: the logits are not finite", cache.pos)));
        }
    }
    let launches = match (launches_before, b.launches()) {
        (Some(a), Some(z)) => Some((z - a) as f64 / steps.max(1) as f64),
        _ => None,
    };
    let host = match (host_before, b.host_profile()) {
        (Some(a), Some(z)) => Some(z.since(&a)),
        _ => None,
    };
    let kernels = b.kernel_times()?;
    Ok(DecodeTiming { step: median(times), issue: median(issue), launches, host, kernels })
}

/// ", issued in X ms, N launches a step" for a lane that counts launches, else nothing; with a
/// host profile, the issue time's parts a step (means over the steps).
fn launches_note(t: &DecodeTiming, steps: usize) -> String {
    let mut note =
        t.launches.map_or(String::new(), |n| format!(", issued in {:.2} ms, {n:.0} launches a step", t.issue * 1e3));
    if let Some(h) = t.host {
        note += &format!(" (host a step: {})", host_parts(&h, steps));
    }
    note
}

/// A host profile's parts, means over `times` (steps, or 1 for a whole prefill).
fn host_parts(h: &HostProfile, times: usize) -> String {
    let per = |ns: u64| ns as f64 / 1e6 / times.max(1) as f64;
    let count = |n: u64| n as f64 / times.max(1) as f64;
    format!(
        "{:.0} launches {:.2} ms ({:.0} bind groups made), {:.0} copies {:.2} ms, {:.0} allocations {:.2} ms, {:.0} \
         waits {:.2} ms; the rest is the graph's own host work; {:.0} submits {:.2} ms, on the submit thread, or on \
         this one within the above when inline",
        count(h.launches),
        per(h.launch_ns),
        count(h.bind_groups),
        count(h.copies),
        per(h.copy_ns),
        count(h.allocations),
        per(h.allocation_ns),
        count(h.waits),
        per(h.wait_ns),
        count(h.submits),
        per(h.submit_ns)
    )
}

/// The language model's figures at one depth.
struct LmFigures {
    layers: usize,
    /// (tokens, seconds)
    prefill: Vec<(usize, f64)>,
    /// (context, seconds per step)
    decode: Vec<(usize, f64)>,
    /// Weight bytes the lane counted while loading the language model.
    lm_weight_bytes: u64,
    /// The lane's memory at the end, the model still loaded.
    memory: MemoryReport,
}

/// Load the language model at `layers` and run the prefill and decode measurements, printing a
/// line for each.
fn run_lm<B: Backend>(b: &B, args: &Args, src: &RandomWeights, layers: usize) -> fovea::Result<LmFigures> {
    let cfg = lm_config(layers, args.experts, args.vocab)?;
    let params = model_params(&cfg, None, args.mix)?;
    let (start, before) = (Instant::now(), b.memory().weight_bytes);
    let model = LmModel::load(b, src, &cfg)?;
    b.sync()?;
    let load_s = start.elapsed().as_secs_f64();
    let lm_weight_bytes = b.memory().weight_bytes - before;
    let bytes = param_bytes::<B>(&params) as f64;
    println!(
        "language model at depth {layers}: loaded in {load_s:.1} s ({:.2} GiB copied from the pools and uploaded, \
         {:.2} GB/s)",
        bytes / GIB,
        bytes / load_s / 1e9
    );

    // compile every kernel: a prefill of one chunk + 1 token (the last token is a second chunk,
    // which continues a cache) and two steps; with `--prefill off`, chunks of one token (the
    // prefill's tiles are not timed, and a full chunk of the released geometry took minutes on
    // a software adapter)
    let chunk = if args.prefill.0.is_empty() { 1 } else { args.chunk };
    let (_, mut cache) = prefill(b, &model, chunk + 1, chunk)?;
    warm_up_decode(b, &model, &mut cache)?;
    drop(cache);

    let read = decode_weight_bytes::<B>(&cfg, &params);
    let mut figures =
        LmFigures { layers, prefill: Vec::new(), decode: Vec::new(), lm_weight_bytes, memory: b.memory() };
    for &t in &args.prefill.0 {
        b.kernel_times()?; // from here on
        let host_before = b.host_profile();
        let (secs, mut cache) = prefill(b, &model, t, args.chunk)?;
        let host = host_before.zip(b.host_profile()).map(|(a, z)| z.since(&a));
        let kernels = b.kernel_times()?;
        let flops = prefill_flops(&cfg, t);
        println!(
            "prefill {t} tokens (chunks of ≤ {} tokens: {}): {:.1} ms, {} tokens/s, {:.2} TFLOP -> {} TFLOP/s",
            args.chunk,
            t.div_ceil(args.chunk),
            secs * 1e3,
            sig3(t as f64 / secs),
            flops / 1e12,
            sig3(flops / secs / 1e12)
        );
        bench_common::print_kernel_times(kernels.as_deref(), "of the prefill", 1, 16);
        if let Some(h) = host {
            println!("  host over the prefill (FOVEA_HOST_PROFILE=1): {}", host_parts(&h, 1));
        }
        let step = decode_median(b, &model, &mut cache, args.decode_steps)?.step;
        println!("  decode at {t} on this real cache: median {:.2} ms ({} tokens/s)", step * 1e3, sig3(1.0 / step));
        figures.prefill.push((t, secs));
    }
    let mut rng = SmallRng::seed_from_u64(7);
    for &n in &args.decode_at.0 {
        let start = Instant::now();
        // uniform ±√3: RMS 1, as the normed entries of a real cache
        let mut values = |len: usize| -> Vec<f32> { (0..len).map(|_| rng.random_range(-1.732f32..1.732)).collect() };
        let mut cache = model.synthetic_cache(b, n, &mut values)?;
        b.sync()?;
        let build_s = start.elapsed().as_secs_f64();
        let timing = decode_median(b, &model, &mut cache, args.decode_steps)?;
        let step = timing.step;
        let (held, cache_read) = cache_bytes(&cfg, n);
        println!(
            "decode at {n} (synthetic cache: {} raw keys a layer, {} entries + indexer keys a CSA layer, {} a HCA \
             layer; {:.1} MiB, built in {:.1} s): median of {} steps {:.2} ms, {} tokens/s, {:.3} GB weights + \
             {:.3} GB cache read -> {} GB/s{}",
            (cfg.sliding_window - 1).min(n),
            n / 4,
            n / 128,
            held / 1048576.0,
            build_s,
            args.decode_steps.max(1),
            step * 1e3,
            sig3(1.0 / step),
            read / 1e9,
            cache_read / 1e9,
            sig3((read + cache_read) / step / 1e9),
            launches_note(&timing, args.decode_steps)
        );
        bench_common::print_kernel_times(timing.kernels.as_deref(), "a step", args.decode_steps, 48);
        figures.decode.push((n, step));
    }
    figures.memory = b.memory();
    Ok(figures)
}

/// The image measurement: prints its line, returns the median encode (seconds).
fn run_image<B: Backend>(
    b: &B,
    vision: &VisionModel<B>,
    cfg: &VisionConfig,
    (w, h): (u32, u32),
    iters: usize,
) -> fovea::Result<f64> {
    let mut rng = SmallRng::seed_from_u64(3);
    let img = image::RgbImage::from_fn(w, h, |_, _| image::Rgb([rng.random(), rng.random(), rng.random()]));
    let start = Instant::now();
    let prep = processor::prepare(&img, &preprocess_config(cfg))?;
    let prep_ms = start.elapsed().as_secs_f64() * 1e3;
    let n = prep.n_vit_h * prep.n_vit_w;
    let patches = b.upload(&HostTensor::f32([n, cfg.patch_dim()], prep.patches.clone())?)?;
    let encode = || -> fovea::Result<f64> {
        let start = Instant::now();
        let stages = vision.encode(b, &patches, prep.n_vit_h, prep.n_vit_w)?;
        b.download(&stages.aligner)?; // waits for the device
        Ok(start.elapsed().as_secs_f64())
    };
    let first = encode()?;
    b.kernel_times()?; // from here on
    let secs = median((0..iters.max(1)).map(|_| encode()).collect::<fovea::Result<_>>()?);
    let kernels = b.kernel_times()?;
    let flops = bench_common::vit_encode_flops(cfg, n, prep.n_llm_h * prep.n_llm_w);
    println!(
        "image {w}x{h}: processor {prep_ms:.1} ms (host), ViT grid {}x{} ({n} patches, depth {}) -> {}x{} image \
         tokens; ViT + aligner median of {} runs {:.2} ms (first {:.1} ms), {:.3} TFLOP -> {} TFLOP/s",
        prep.n_vit_h,
        prep.n_vit_w,
        cfg.n_layers,
        prep.n_llm_h,
        prep.n_llm_w,
        iters.max(1),
        secs * 1e3,
        first * 1e3,
        flops / 1e12,
        sig3(flops / secs / 1e12)
    );
    bench_common::print_kernel_times(kernels.as_deref(), "an encode", iters.max(1), 16);
    Ok(secs)
}

/// Stop before uploading when the run cannot fit: the weights of `layers` layers (and the
/// vision tower), plus the largest cache/activation need of the measurements, against the
/// lane's free memory.
fn check_memory<B: Backend>(b: &B, args: &Args, vision: Option<&VisionConfig>) -> fovea::Result<()> {
    let need = |layers: usize| -> fovea::Result<(f64, f64)> {
        let cfg = lm_config(layers, args.experts, args.vocab)?;
        let weights = param_bytes::<B>(&model_params(&cfg, vision, args.mix)?) as f64;
        let prefill = args.prefill.0.iter().map(|&t| prefill_activation_bytes(&cfg, t, args.chunk));
        let decode = args.decode_at.0.iter().map(|&n| cache_bytes(&cfg, n + args.decode_steps).0 + 64e6);
        let others = prefill.chain(decode).fold(0.0, f64::max) + 512.0 * 1048576.0;
        Ok((weights, others))
    };
    let released = lm_config(FULL_LAYERS, 256, 129_280)?;
    let released = param_bytes::<B>(&model_params(&released, Some(&vision_config(32)?), args.mix)?) as f64;
    println!(
        "the {} mix of the released model ({FULL_LAYERS} layers, 256 experts, vocabulary 129 280, ViT 32 x 1024) takes \
         {:.2} GiB ({:.1} GB) of weights on the {} lane",
        args.mix.name(),
        released / GIB,
        released / 1e9,
        b.lane()
    );
    let (weights, others) = need(args.layers)?;
    let Some(cap) = b.capacity() else {
        println!("memory check skipped: the {} lane reports no capacity ({})", b.lane(), b.device_name());
        return Ok(());
    };
    let free = cap.free_bytes as f64;
    println!(
        "this run needs {:.2} GiB of weights + ≈ {:.2} GiB of cache and activations; {:.2} GiB free of {:.2} GiB",
        weights / GIB,
        others / GIB,
        free / GIB,
        cap.total_bytes as f64 / GIB
    );
    if weights + others <= free {
        return Ok(());
    }
    let mut fits = 0;
    for layers in (1..args.layers).rev() {
        let (w, o) = need(layers)?;
        if w + o <= free {
            fits = layers;
            break;
        }
    }
    let advice = match fits {
        0 => "not even one layer fits: lower --experts or --vocab, or shorten the contexts".to_string(),
        1..8 => format!("at most --layers {fits} fits"),
        _ => format!(
            "at most --layers {fits} fits; --layers 8 --compare-layers 4 gives per-layer costs and a \
             {FULL_LAYERS}-layer estimate"
        ),
    };
    Err(fovea::Error::Invalid(format!(
        "--mix {} at --layers {} needs {:.2} GiB ({:.2} GiB of weights + ≈ {:.2} GiB of cache and activations), more \
         than the {:.2} GiB free of {:.2} GiB on the {} lane ({}): {advice}",
        args.mix.name(),
        args.layers,
        (weights + others) / GIB,
        weights / GIB,
        others / GIB,
        free / GIB,
        cap.total_bytes as f64 / GIB,
        b.lane(),
        b.device_name()
    )))
}

fn check_args(args: &Args) -> fovea::Result<()> {
    let bad = |flag: &str, why: String| Err(fovea::Error::Invalid(format!("{flag}: {why}")));
    if args.layers == 0 || args.layers > FULL_LAYERS {
        return bad("--layers", format!("{} is not in 1..={FULL_LAYERS} (the released model's depth)", args.layers));
    }
    if let Some(m) = args.compare_layers
        && (m == 0 || m >= args.layers)
    {
        return bad("--compare-layers", format!("{m} must be at least 1 and below --layers {}", args.layers));
    }
    if args.experts < 6 {
        return bad("--experts", format!("{} is below the 6 experts each token picks", args.experts));
    }
    if args.vocab < 2 {
        return bad("--vocab", format!("{} leaves no prompt tokens", args.vocab));
    }
    if args.chunk_arg == Some(0) {
        return bad("--chunk", "a chunk needs at least one token".into());
    }
    if args.image.0.is_some() && args.vit_layers == 0 {
        return bad("--vit-layers", "the ViT needs at least one layer (or --image off)".into());
    }
    // the random image is made on the host before any memory check
    if let Some((w, h)) = args.image.0
        && w.max(h) > MAX_IMAGE_SIDE
    {
        return bad("--image", format!("{w}x{h}: a side is past {MAX_IMAGE_SIDE}"));
    }
    // positions past the released config's max_position_embeddings are outside the model (and a
    // synthetic cache is sized from them, also where the lane cannot report its free memory)
    let longest = args.prefill.0.iter().chain(&args.decode_at.0).copied().max().unwrap_or(0);
    if longest.saturating_add(args.decode_steps) > MAX_POSITIONS {
        return bad(
            "--prefill/--decode-at",
            format!(
                "{longest} tokens plus {} decode steps pass the model's {MAX_POSITIONS} positions",
                args.decode_steps
            ),
        );
    }
    Ok(())
}

fn run<B: Backend>(b: &B, args: &Args) -> fovea::Result<()> {
    check_args(args)?;
    let args = &Args { chunk: args.chunk_arg.unwrap_or_else(|| b.prefill_chunk()), ..args.clone() };
    let vision_cfg = args.image.0.map(|_| vision_config(args.vit_layers)).transpose()?;
    println!(
        "bench_model: {} lane ({}), {} precision; mix {}; layers {} of {FULL_LAYERS}, {} experts, vocabulary {}{}",
        b.lane(),
        b.device_name(),
        b.precision(),
        args.mix.name(),
        args.layers,
        args.experts,
        args.vocab,
        vision_cfg.as_ref().map_or(String::new(), |v| format!(", ViT {} x {}", v.n_layers, v.dim))
    );
    check_memory(b, args, vision_cfg.as_ref())?;

    let start = Instant::now();
    let cfg = lm_config(args.layers, args.experts, args.vocab)?;
    let src = RandomWeights::new(model_params(&cfg, vision_cfg.as_ref(), args.mix)?, args.experts)?;
    println!(
        "weights: random, generated on the host in {:.1} s as {} pools of ≤ {} MiB (one per format and fan-in), \
         each matrix a window of its pool uploaded on its own (layers share the pools' bytes, not device memory)",
        start.elapsed().as_secs_f64(),
        src.pools.len(),
        POOL_BYTES >> 20
    );

    let vision = match &vision_cfg {
        Some(vc) => {
            let start = Instant::now();
            let vision = VisionModel::load(b, &src, vc)?;
            b.sync()?;
            println!("vision tower: loaded in {:.1} s", start.elapsed().as_secs_f64());
            Some(vision)
        }
        None => None,
    };
    let image = match (&vision, &vision_cfg, args.image.0) {
        (Some(v), Some(vc), Some(size)) => Some((size, run_image(b, v, vc, size, args.image_iters)?)),
        _ => None,
    };
    let main = run_lm(b, args, &src, args.layers)?;
    let mem = main.memory;
    println!(
        "device memory: weights {:.2} GiB (the matrices {:.2} GiB{}), activations peak {:.2} GiB{}",
        mem.weight_bytes as f64 / GIB,
        mem.matrix_bytes as f64 / GIB,
        if vision.is_some() { "; the vision tower included" } else { "" },
        mem.peak_activation_bytes as f64 / GIB,
        if b.lane() == "cpu" { " (the cpu lane counts none)" } else { "" }
    );
    drop(vision);
    let compared = match args.compare_layers {
        Some(m) => Some(run_lm(b, args, &src, m)?),
        None => None,
    };
    let full = lm_config(FULL_LAYERS, args.experts, args.vocab)?;
    let full_lm_bytes = param_bytes::<B>(&model_params(&full, None, args.mix)?);
    summary(b, args, image, &main, compared.as_ref(), full_lm_bytes);
    Ok(())
}

/// The block to paste into the README's table: a row per depth measured; with
/// `--compare-layers` the per-layer difference and a 43-layer estimate, whose weights are
/// computed (`full_lm_bytes`: 43 layers at this run's experts and vocabulary). The weights
/// column is the language model's as the lane counted them (the vision tower's are in the
/// device memory line).
fn summary<B: Backend>(
    b: &B,
    args: &Args,
    image: Option<((u32, u32), f64)>,
    main: &LmFigures,
    compared: Option<&LmFigures>,
    full_lm_bytes: u64,
) {
    let mut head = vec!["lane".to_string(), "mix".into(), "layers".into()];
    if let Some(((w, h), _)) = image {
        head.push(format!("image {w}x{h}"));
    }
    head.extend(main.prefill.iter().map(|(t, _)| format!("prefill {t}")));
    head.extend(main.decode.iter().map(|(n, _)| format!("decode @{n}")));
    head.extend(["LM weights".into(), "act. peak".into()]);
    let image_cell = image.map(|(_, s)| format!("{:.1} ms", s * 1e3));
    let gib = |x: u64| format!("{:.2} GiB", x as f64 / GIB);
    // one row: the depth, whether it shows the image, the prefill and decode seconds, the memory
    let row = |layers: String, with_image: bool, prefill: &[f64], decode: &[f64], mem: [String; 2]| {
        let mut cells = vec![format!("{} {}", b.lane(), b.precision()), args.mix.name().to_string(), layers];
        if let Some(c) = &image_cell {
            cells.push(if with_image { c.clone() } else { String::new() });
        }
        cells.extend(prefill.iter().zip(&main.prefill).map(|(s, (t, _))| format!("{} tok/s", sig3(*t as f64 / s))));
        cells.extend(decode.iter().map(|s| format!("{} tok/s ({:.2} ms)", sig3(1.0 / s), s * 1e3)));
        cells.extend(mem);
        println!("| {} |", cells.join(" | "));
    };
    let secs = |f: &LmFigures| -> (Vec<f64>, Vec<f64>) {
        (f.prefill.iter().map(|p| p.1).collect(), f.decode.iter().map(|d| d.1).collect())
    };
    println!("\nsummary ({} experts, vocabulary {}, chunk {}):", args.experts, args.vocab, args.chunk);
    println!("| {} |", head.join(" | "));
    println!("|{}", "---|".repeat(head.len()));
    let (p, d) = secs(main);
    let peak = if b.lane() == "cpu" { "—".into() } else { gib(main.memory.peak_activation_bytes) };
    row(main.layers.to_string(), true, &p, &d, [gib(main.lm_weight_bytes), peak]);
    let Some(m) = compared else {
        if main.layers < FULL_LAYERS {
            println!(
                "({} of {FULL_LAYERS} layers: not the whole model's figures; --compare-layers gives a \
                 {FULL_LAYERS}-layer estimate)",
                main.layers
            );
        }
        return;
    };
    let (mp, md) = secs(m);
    row(m.layers.to_string(), false, &mp, &md, [gib(m.lm_weight_bytes), String::new()]);
    let span = (main.layers - m.layers) as f64;
    let per = |a: &[f64], z: &[f64]| -> Vec<f64> { a.iter().zip(z).map(|(x, y)| (x - y) / span).collect() };
    let (pp, pd) = (per(&p, &mp), per(&d, &md));
    let ms = |v: &[f64]| v.iter().map(|s| format!("{:.2} ms", s * 1e3)).collect::<Vec<_>>().join(", ");
    println!(
        "per layer, ({} − {}) / {}: prefill {}; decode step {}",
        main.layers,
        m.layers,
        main.layers - m.layers,
        ms(&pp),
        ms(&pd)
    );
    let rest = (FULL_LAYERS - main.layers) as f64;
    let estimate = |a: &[f64], per: &[f64]| -> Vec<f64> { a.iter().zip(per).map(|(x, l)| x + rest * l).collect() };
    row(
        format!("{FULL_LAYERS} (estimate)"),
        true,
        &estimate(&p, &pp),
        &estimate(&d, &pd),
        [format!("{} (computed)", gib(full_lm_bytes)), String::new()],
    );
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
        eprintln!("bench_model: error: {e}");
        std::process::exit(2);
    }
}
