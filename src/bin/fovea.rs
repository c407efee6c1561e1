//! The `fovea` command line. It parses arguments and calls `fovea::pipeline`; no tensor code here.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use fovea::pipeline::{self, LaneChoice, VisionDumpRequest};

#[derive(Parser)]
#[command(name = "fovea", version, about = "Run DeepSeek-V4-Flash-Vision on the CPU or any GPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the vision path on one image and write every stage to a safetensors file.
    Dump {
        /// Checkpoint directory (config.json + model.safetensors or shards with an index).
        #[arg(long)]
        model: PathBuf,
        /// Image file (PNG, JPEG, WebP).
        #[arg(long)]
        image: PathBuf,
        /// Output safetensors file.
        #[arg(long)]
        out: PathBuf,
        /// Lane: auto, cpu or wgpu (default: $FOVEA_BACKEND, else auto). $FOVEA_ADAPTER picks a
        /// wgpu adapter by name.
        #[arg(long)]
        backend: Option<String>,
        /// Position of the image placeholder in the token stream (sets the lead pads).
        #[arg(long, default_value_t = 0)]
        start_pos: usize,
    },
    /// Print a checkpoint's config, tensor accounting, dtypes and bytes.
    Inspect {
        #[arg(long)]
        model: PathBuf,
    },
}

fn run(cli: Cli) -> fovea::Result<()> {
    match cli.command {
        Command::Dump { model, image, out, backend, start_pos } => {
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
