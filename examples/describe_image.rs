//! describe_image: one image in, its description out, streamed token by token.
//!
//! ```sh
//! cargo run --release --example describe_image -- [IMAGE] [--model DIR] [--backend auto|cpu|wgpu]
//!     [--prompt TEXT] [--max-tokens N] [--temperature T] [--seed S]
//! ```
//!
//! Without IMAGE it describes the bundled sample (`fixtures/images/scene.png`); without `--model`
//! it runs the model shipped in this repository (`fixtures/models/vl-scenes`, a tiny
//! DeepSeek-V4-Vision trained on synthetic scenes: see its model card). stdout carries only the
//! description; stderr a progress bar while the weights of a large checkpoint load (≥ 256 MiB)
//! and one timing line. Any error (a missing or unreadable image among them) is
//! one line on stderr and exit code 2.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use fovea::model::lm::generate::Sampling;
use fovea::pipeline::{self, GenerateOptions, LaneChoice, LmRequest};
use fovea::progress::LoadBar;
use fovea::tokenizer::{ChatPrompt, ChatTokenizer};

/// The model and the sample that ship with the repository.
const SHIPPED_MODEL: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/models/vl-scenes");
const SAMPLE_IMAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/images/scene.png");

#[derive(Parser)]
#[command(about = "Describe an image with a DeepSeek-V4-Vision checkpoint")]
struct Args {
    /// Image file (PNG, JPEG, WebP); default: the bundled sample.
    image: Option<PathBuf>,
    /// Checkpoint directory (config.json, tokenizer.json, safetensors); default: the shipped model.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Lane: auto, cpu or wgpu (default: $FOVEA_BACKEND, else auto). cuda (in progress) lacks the
    /// language-model ops and refuses this job.
    #[arg(long)]
    backend: Option<String>,
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
    let model = args.model.unwrap_or_else(|| PathBuf::from(SHIPPED_MODEL));
    let image = args.image.unwrap_or_else(|| PathBuf::from(SAMPLE_IMAGE));
    if !image.is_file() {
        return Err(fovea::Error::file(&image, "no such image file"));
    }
    let lane = LaneChoice::resolve(args.backend.as_deref().map(str::parse).transpose()?)?;
    let tokenizer = ChatTokenizer::load(&model)?;
    let tokens = tokenizer.encode_chat(&ChatPrompt { system: "", question: &args.prompt, n_images: 1 })?;
    let req = LmRequest { model_dir: model, tokens, images: vec![image], lane };
    let sampling = Sampling { temperature: args.temperature, seed: args.seed, ..Sampling::default() };
    let opts = GenerateOptions { max_tokens: args.max_tokens, sampling };
    let mut stdout = std::io::stdout().lock();
    let stdout_error = |e: std::io::Error| fovea::Error::Invalid(format!("cannot write to stdout: {e}"));
    let mut bar = LoadBar::new();
    let g = pipeline::generate_text(&req, &opts, &tokenizer, &mut |p| bar.update(p), &mut |piece: &str| {
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
