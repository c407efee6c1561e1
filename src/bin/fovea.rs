//! The `fovea` command line. It parses arguments and calls `fovea::pipeline`; no tensor code here.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fovea::model::lm::generate::{Sampling, StopReason};
use fovea::pipeline::{self, GenerateOptions, LaneChoice, LmRequest, VisionDumpRequest};

#[derive(Parser)]
#[command(name = "fovea", version, about = "Run DeepSeek-V4-Flash-Vision on the CPU or any GPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Vision checkpoint + --image: write every stage of the vision path. With --token-ids: run
    /// the language model over the ids (one prefill) and write `input_ids` and `logits`.
    Dump {
        /// Checkpoint directory (config.json + model.safetensors or shards with an index).
        #[arg(long)]
        model: PathBuf,
        /// Image file (PNG, JPEG, WebP). With --token-ids it fills the IMG placeholder.
        #[arg(long)]
        image: Option<PathBuf>,
        /// Language model: comma-separated token ids, used verbatim (no BOS is added); `IMG`
        /// marks where the --image block goes.
        #[arg(long)]
        token_ids: Option<String>,
        /// Output safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Lane: auto, cpu or wgpu (default: $FOVEA_BACKEND, else auto). $FOVEA_ADAPTER picks a
        /// wgpu adapter by name.
        #[arg(long)]
        backend: Option<String>,
        /// Position of the image placeholder in the token stream (sets the lead pads; vision
        /// dump only, --token-ids takes it from where IMG stands).
        #[arg(long, default_value_t = 0)]
        start_pos: usize,
    },
    /// Language model: prefill the token ids, then generate token by token (ids only until the
    /// tokenizer lands; prints the generated ids with --print-ids).
    Generate {
        /// LM checkpoint directory (config.json + model.safetensors or shards with an index).
        #[arg(long)]
        model: PathBuf,
        /// Comma-separated prompt token ids, used verbatim (no BOS is added); `IMG` marks where
        /// the --image block goes.
        #[arg(long)]
        token_ids: String,
        /// Image file for the IMG placeholder (needs a checkpoint with vision and LM tensors).
        #[arg(long)]
        image: Option<PathBuf>,
        /// Stop after this many generated tokens (or at config.json's eos_token_id).
        #[arg(long, default_value_t = 64)]
        max_tokens: usize,
        /// 0 = greedy; otherwise softmax(logits / T) sampling.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        /// Sample among the K most likely tokens only (0 = all).
        #[arg(long, default_value_t = 0)]
        top_k: usize,
        /// Sample from the smallest set of tokens whose probability reaches P (1 = all).
        #[arg(long, default_value_t = 1.0)]
        top_p: f32,
        /// RNG seed for sampling (same seed, same ids).
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Print the generated ids, space-separated on one line, as they are produced. Required
        /// for now: there is no tokenizer yet, so there is no text output.
        #[arg(long)]
        print_ids: bool,
        /// Lane: auto, cpu or wgpu (default: $FOVEA_BACKEND, else auto). The language model runs
        /// on the CPU lane only so far; auto picks it.
        #[arg(long)]
        backend: Option<String>,
    },
    /// Print a checkpoint's config, tensor accounting, dtypes and bytes.
    Inspect {
        #[arg(long)]
        model: PathBuf,
    },
}

fn run(cli: Cli) -> fovea::Result<()> {
    match cli.command {
        Command::Dump { model, image, token_ids: Some(ids), out, backend, start_pos: _ } => {
            let lane = LaneChoice::resolve(backend.as_deref().map(str::parse).transpose()?)?;
            let tokens = pipeline::parse_token_ids(&ids)?;
            let dump = pipeline::dump_lm(&LmRequest { model_dir: model, tokens, image, lane })?;
            dump.write_safetensors(&out)?;
            eprintln!(
                "fovea: {} lane: {} tokens, logits [{}, {}] -> {}",
                dump.lane,
                dump.input_ids.len(),
                dump.input_ids.len(),
                dump.vocab_size,
                out.display()
            );
        }
        Command::Dump { model, image: None, token_ids: None, .. } => {
            return Err(fovea::Error::Invalid(format!(
                "dump needs --image (vision path) or --token-ids (language model) for {}",
                model.display()
            )));
        }
        Command::Dump { model, image: Some(image), token_ids: None, out, backend, start_pos } => {
            let lane = LaneChoice::resolve(backend.as_deref().map(str::parse).transpose()?)?;
            let dump = pipeline::dump_vision(&VisionDumpRequest { model_dir: model, image, lane, start_pos })?;
            dump.write_safetensors(&out)?;
            eprintln!(
                "fovea: {} lane ({}): ViT grid {}x{}, LLM grid {}x{}, block of {} tokens -> {}",
                dump.lane,
                dump.device,
                dump.n_vit_h,
                dump.n_vit_w,
                dump.n_llm_h,
                dump.n_llm_w,
                dump.block_types.len(),
                out.display()
            );
        }
        Command::Generate {
            model,
            token_ids,
            image,
            max_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            print_ids,
            backend,
        } => {
            if !print_ids {
                return Err(fovea::Error::Invalid(
                    "generate: pass --print-ids (no tokenizer yet, so generated tokens can only be printed as ids)"
                        .into(),
                ));
            }
            let lane = LaneChoice::resolve(backend.as_deref().map(str::parse).transpose()?)?;
            let tokens = pipeline::parse_token_ids(&token_ids)?;
            let opts = GenerateOptions { max_tokens, sampling: Sampling { temperature, top_k, top_p, seed } };
            let mut stdout = std::io::stdout().lock();
            let mut first = true;
            let mut emit = |id: i32| -> fovea::Result<()> {
                let sep = if std::mem::take(&mut first) { "" } else { " " };
                write!(stdout, "{sep}{id}")
                    .and_then(|_| stdout.flush())
                    .map_err(|e| fovea::Error::Invalid(format!("stdout: {e}")))
            };
            let g = pipeline::generate_lm(&LmRequest { model_dir: model, tokens, image, lane }, &opts, &mut emit)?;
            writeln!(stdout).map_err(|e| fovea::Error::Invalid(format!("stdout: {e}")))?;
            let why = match g.stop {
                StopReason::Eos => "eos",
                StopReason::MaxTokens => "max tokens",
            };
            eprintln!("fovea: {} lane: {}-token prompt, {} generated ({why})", g.lane, g.prompt_len, g.ids.len());
        }
        Command::Inspect { model } => print!("{}", pipeline::inspect(&model)?),
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fovea: error: {e}");
            ExitCode::from(2)
        }
    }
}
