//! describe_image: one image in, its description out, streamed token by token.
//!
//! ```sh
//! cargo run --release --example describe_image -- [IMAGE] [--model DIR] [--backend auto|cpu|wgpu]
//!     [--prompt TEXT] [--max-tokens N] [--temperature T] [--seed S]
//! ```
//!
//! Without IMAGE it describes the bundled sample (`fixtures/images/scene.png`); without `--model`
//! it runs the model shipped in this repository (`fixtures/models/vl-scenes`, a tiny
//! DeepSeek-V4-Vision trained on synthetic scenes: see its model card). Both are compiled into the
//! binary (5 MB), so it runs wherever it is copied: on first use they are unpacked into the user's
//! cache (`$XDG_CACHE_HOME/fovea`, else `~/.cache/fovea`). stdout carries only the
//! description; stderr a progress bar while the weights of a large checkpoint load (≥ 256 MiB)
//! or a prompt of several chunks prefills, and one timing line. Any error (a missing or unreadable image among them) is
//! one line on stderr and exit code 2.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use fovea::backend::Precision;
use fovea::model::lm::generate::Sampling;
use fovea::pipeline::{self, GenerateOptions, LaneChoice, LmRequest};
use fovea::progress::Bars;
use fovea::tokenizer::{ChatPrompt, ChatTokenizer};

/// The shipped model's files (fixtures/models/vl-scenes), compiled in.
const EMBEDDED_MODEL: [(&str, &[u8]); 3] = [
    ("config.json", include_bytes!("../fixtures/models/vl-scenes/config.json")),
    ("tokenizer.json", include_bytes!("../fixtures/models/vl-scenes/tokenizer.json")),
    ("model.safetensors", include_bytes!("../fixtures/models/vl-scenes/model.safetensors")),
];
/// The bundled sample (fixtures/images/scene.png), compiled in.
const SAMPLE_IMAGE: (&str, &[u8]) = ("scene.png", include_bytes!("../fixtures/images/scene.png"));

/// The embedded files on disk (the loader memory-maps files): `(model dir, sample image)`.
/// They go once into a folder named by their content hash, so a rebuilt binary with another
/// model never meets stale files; each file is written under a temporary name and renamed into
/// place, so concurrent first runs never read half a file.
fn unpack_embedded() -> fovea::Result<(PathBuf, PathBuf)> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    // FNV-1a over every embedded byte: cheap (5 MB) and stable across builds and platforms
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for (_, bytes) in EMBEDDED_MODEL.iter().chain([&SAMPLE_IMAGE]) {
        for &byte in *bytes {
            hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    let root = cache.join("fovea").join(format!("describe_image-{hash:016x}"));
    let model = root.join("vl-scenes");
    std::fs::create_dir_all(&model).map_err(|e| fovea::Error::file(&model, format!("cannot create: {e}")))?;
    let place = |path: PathBuf, bytes: &[u8]| -> fovea::Result<PathBuf> {
        if std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64) {
            return Ok(path);
        }
        let tmp = path.with_extension(format!("part{}", std::process::id()));
        std::fs::write(&tmp, bytes)
            .and_then(|_| std::fs::rename(&tmp, &path))
            .map_err(|e| fovea::Error::file(&path, format!("cannot unpack the embedded file: {e}")))?;
        Ok(path)
    };
    for (name, bytes) in EMBEDDED_MODEL {
        place(model.join(name), bytes)?;
    }
    let sample = place(root.join(SAMPLE_IMAGE.0), SAMPLE_IMAGE.1)?;
    Ok((model, sample))
}

#[derive(Parser)]
#[command(about = "Describe an image with a DeepSeek-V4-Vision checkpoint")]
struct Args {
    /// Image file (PNG, JPEG, WebP); default: the bundled sample.
    image: Option<PathBuf>,
    /// Checkpoint directory (config.json, tokenizer.json, safetensors), or a text GGUF with
    /// --mmproj; default: the embedded model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// The vision GGUF (llama.cpp's `clip` mmproj) that goes with a GGUF --model.
    #[arg(long)]
    mmproj: Option<PathBuf>,
    /// Image token budget with --mmproj (the file cannot store it; default: llama.cpp's 384;
    /// the shipped model was trained with 64).
    #[arg(long)]
    image_max_tokens: Option<usize>,
    /// Lane: auto, cpu, wgpu or cuda (default: $FOVEA_BACKEND, else auto). auto never picks
    /// cuda (name it).
    #[arg(long)]
    backend: Option<String>,
    /// exact (f32) or fast (f16 operands, f32 accumulation; cuda, and wgpu with f16 shaders).
    /// Default: $FOVEA_PRECISION, else fast on cuda and on a wgpu GPU with f16, exact elsewhere.
    #[arg(long)]
    precision: Option<Precision>,
    /// The question asked about the image.
    #[arg(long, default_value = "Describe this image.")]
    prompt: String,
    /// Stop after this many tokens (or at the end-of-sentence token).
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// 0 = greedy; otherwise softmax(logits / T) sampling.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed of the sampler (same seed, same text).
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn run(args: Args) -> fovea::Result<()> {
    let (model, image) = match (args.model, args.image) {
        (Some(model), Some(image)) => (model, image),
        (model, image) => {
            let (embedded_model, sample) = unpack_embedded()?;
            (model.unwrap_or(embedded_model), image.unwrap_or(sample))
        }
    };
    if !image.is_file() {
        return Err(fovea::Error::file(&image, "no such image file"));
    }
    let lane = LaneChoice::resolve(args.backend.as_deref().map(str::parse).transpose()?)?;
    let tokenizer = ChatTokenizer::for_model(&model)?;
    let tokens = tokenizer.encode_chat(&ChatPrompt { system: "", question: &args.prompt, n_images: 1 })?;
    let req = LmRequest {
        model_dir: model,
        mmproj: args.mmproj,
        image_max_tokens: args.image_max_tokens,
        tokens,
        images: vec![image],
        lane,
        precision: args.precision,
    };
    let sampling = Sampling { temperature: args.temperature, seed: args.seed, ..Sampling::default() };
    let opts = GenerateOptions { max_tokens: args.max_tokens, sampling };
    let mut stdout = std::io::stdout().lock();
    let stdout_error = |e: std::io::Error| fovea::Error::Invalid(format!("cannot write to stdout: {e}"));
    let mut bars = Bars::new();
    let g = pipeline::generate_text(&req, &opts, &tokenizer, &mut |p| bars.update(p), &mut |piece: &str| {
        write!(stdout, "{piece}").and_then(|_| stdout.flush()).map_err(stdout_error)
    })?;
    writeln!(stdout).and_then(|_| stdout.flush()).map_err(stdout_error)?;
    eprintln!("describe_image: {} lane · {}", g.lane, g.timings.summary(g.prompt_len, g.ids.len()));
    Ok(())
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("describe_image: error: {e}");
            ExitCode::from(2)
        }
    }
}
