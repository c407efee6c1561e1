//! The `fovea` command line. It parses arguments and calls `fovea::pipeline`; no tensor code here.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use fovea::backend::Precision;
use fovea::model::lm::generate::{Sampling, StopReason};
use fovea::pipeline::{self, GenerateOptions, LaneChoice, LmRequest, PromptToken, VisionDumpRequest};
use fovea::progress::Bars;
use fovea::serve::{self, Limits, ServeOptions};
use fovea::tokenizer::{ChatPrompt, ChatTokenizer};

#[derive(Parser)]
#[command(name = "fovea", version, about = "Run DeepSeek-V4-Flash-Vision on the CPU or any GPU")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Vision checkpoint + --image: write every stage of the vision path. With --prompt or
    /// --token-ids: run the language model over the prompt (one prefill) and write `input_ids`
    /// and `logits`.
    Dump {
        /// Checkpoint directory (config.json + model.safetensors or shards with an index), or a
        /// text GGUF (its only file or first shard; language model with --token-ids).
        #[arg(long)]
        model: PathBuf,
        #[command(flatten)]
        mmproj: MmprojArgs,
        /// Image file (PNG, JPEG, WebP). With --prompt or --token-ids: repeatable, one per image
        /// placeholder, in order.
        #[arg(long)]
        image: Vec<PathBuf>,
        #[command(flatten)]
        prompt: PromptArgs,
        /// Output safetensors file.
        #[arg(long)]
        out: PathBuf,
        #[command(flatten)]
        lane: LaneArgs,
        /// Position of the image placeholder in the token stream (sets the lead pads; vision
        /// dump only, the language model takes it from where the placeholder stands).
        #[arg(long, default_value_t = 0)]
        start_pos: usize,
    },
    /// Language model: prefill the prompt, then generate token by token, printing the text as
    /// it is produced (or the ids, with --print-ids).
    Generate {
        /// LM checkpoint directory (config.json + model.safetensors or shards with an index;
        /// tokenizer.json for --prompt and for text output), or a text GGUF (its only file or
        /// first shard; with --token-ids and --print-ids).
        #[arg(long)]
        model: PathBuf,
        #[command(flatten)]
        mmproj: MmprojArgs,
        #[command(flatten)]
        prompt: PromptArgs,
        /// Image file, repeatable: one per image placeholder, in order (needs a checkpoint with
        /// vision and LM tensors).
        #[arg(long)]
        image: Vec<PathBuf>,
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
        /// Print the generated ids (EOS included), space-separated on one line, instead of the
        /// text. Needs no tokenizer.json with --token-ids.
        #[arg(long)]
        print_ids: bool,
        #[command(flatten)]
        lane: LaneArgs,
    },
    /// Serve the model over HTTP with OpenAI's chat-completions API (streaming, images as data:
    /// URLs), until Ctrl-C.
    Serve(ServeArgs),
    /// Print a checkpoint's (or a text or mmproj GGUF's) config, tensor accounting, dtypes and
    /// bytes.
    Inspect {
        #[arg(long)]
        model: PathBuf,
    },
}

/// The vision GGUF that goes with a text GGUF, and its image budget (dump, generate, serve).
#[derive(Args)]
struct MmprojArgs {
    /// The vision GGUF (llama.cpp's `clip` mmproj) that goes with a GGUF --model.
    #[arg(long)]
    mmproj: Option<PathBuf>,
    /// Image token budget with --mmproj (the file cannot store it; default: llama.cpp's 384).
    #[arg(long)]
    image_max_tokens: Option<usize>,
}

/// Where the model runs, and the precision of its matrix products (dump, generate, serve).
#[derive(Args)]
struct LaneArgs {
    /// Lane: auto, cpu, wgpu or cuda (default: $FOVEA_BACKEND, else auto). $FOVEA_ADAPTER picks a
    /// wgpu adapter by name, $FOVEA_CUDA_DEVICE a CUDA device. auto never picks cuda (name it).
    #[arg(long)]
    backend: Option<String>,
    /// Precision of the matrix products: exact (f32, the conformance mode) or fast (f16
    /// operands, f32 accumulation; cuda, and wgpu on adapters with f16 shaders). Default:
    /// $FOVEA_PRECISION, else fast on cuda and on a wgpu GPU with f16, exact elsewhere
    /// (cpu, software adapters such as lavapipe).
    #[arg(long)]
    precision: Option<Precision>,
}

impl LaneArgs {
    fn lane(&self) -> fovea::Result<LaneChoice> {
        LaneChoice::resolve(self.backend.as_deref().map(str::parse).transpose()?)
    }
}

/// `fovea serve`: where the model comes from, where to listen, and the limits.
#[derive(Args)]
struct ServeArgs {
    /// Checkpoint directory with vision and LM tensors and tokenizer.json, or a text GGUF (with
    /// --mmproj for images).
    #[arg(long)]
    model: PathBuf,
    #[command(flatten)]
    mmproj: MmprojArgs,
    #[command(flatten)]
    lane: LaneArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the address is printed on stderr).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The model id the API reports (default: the model's file or directory name).
    #[arg(long)]
    model_name: Option<String>,
    /// Accept absolute paths and file:// URLs as image_url (they read this machine's files).
    #[arg(long)]
    allow_local_files: bool,
    /// Requests the model serves at once (their decode steps run together, one forward with a row
    /// per sequence; a new request's prefill interleaves in chunks).
    #[arg(long, default_value_t = serve::DEFAULT_PARALLEL)]
    parallel: usize,
    /// Requests that may wait beyond the running ones; one more is answered 429.
    #[arg(long, default_value_t = serve::DEFAULT_QUEUE_SIZE)]
    queue_size: usize,
    /// Most prompt tokens per request, image blocks included.
    #[arg(long, default_value_t = Limits::default().max_prompt_tokens)]
    max_prompt_tokens: usize,
    /// Most generated tokens a request may ask for (and what it gets when it names none).
    #[arg(long, default_value_t = Limits::default().max_tokens)]
    max_tokens: usize,
    /// Most bytes of one image file.
    #[arg(long, default_value_t = Limits::default().max_image_bytes)]
    max_image_bytes: usize,
    /// Most pixels (width × height) of one image, checked from its header before decoding.
    #[arg(long, default_value_t = Limits::default().max_image_pixels)]
    max_image_pixels: u64,
    /// Most images in one request, over all its messages.
    #[arg(long, default_value_t = Limits::default().max_images)]
    max_images: usize,
}

impl ServeArgs {
    fn options(self) -> fovea::Result<(ServeOptions, String, u16)> {
        let mut opts = ServeOptions::new(self.model, self.lane.lane()?);
        opts.engine.mmproj = self.mmproj.mmproj;
        opts.engine.image_max_tokens = self.mmproj.image_max_tokens;
        opts.engine.precision = self.lane.precision;
        opts.engine.parallel = self.parallel;
        opts.engine.queue_size = self.queue_size;
        opts.model_name = self.model_name;
        opts.allow_local_files = self.allow_local_files;
        opts.limits = Limits {
            max_prompt_tokens: self.max_prompt_tokens,
            max_tokens: self.max_tokens,
            max_image_bytes: self.max_image_bytes,
            max_image_pixels: self.max_image_pixels,
            max_images: self.max_images,
        };
        Ok((opts, self.host, self.port))
    }
}

/// The language-model prompt: chat text or raw ids (exactly one).
#[derive(Args)]
struct PromptArgs {
    /// User text, rendered with the chat format (vision.md §2.4) and encoded with the
    /// checkpoint's tokenizer.json; one image placeholder per --image goes before it.
    #[arg(long)]
    prompt: Option<String>,
    /// System text for --prompt (placed between BOS and the user turn; default empty).
    #[arg(long)]
    system: Option<String>,
    /// Comma-separated token ids, used verbatim (no BOS is added, no tokenizer needed); `IMG`
    /// marks where an --image block goes.
    #[arg(long)]
    token_ids: Option<String>,
}

/// A checked [`PromptArgs`].
enum Prompt<'a> {
    Chat(ChatPrompt<'a>),
    Ids(&'a str),
}

impl PromptArgs {
    fn is_empty(&self) -> bool {
        self.prompt.is_none() && self.token_ids.is_none() && self.system.is_none()
    }

    /// Check the combination before anything is loaded.
    fn resolve(&self, n_images: usize) -> fovea::Result<Prompt<'_>> {
        match (&self.prompt, &self.token_ids, &self.system) {
            (Some(question), None, system) => {
                Ok(Prompt::Chat(ChatPrompt { system: system.as_deref().unwrap_or(""), question, n_images }))
            }
            (None, Some(ids), None) => Ok(Prompt::Ids(ids)),
            (Some(_), Some(_), _) => Err(fovea::Error::Invalid("give either --prompt or --token-ids, not both".into())),
            (None, Some(_), Some(_)) => {
                Err(fovea::Error::Invalid("--system goes with --prompt, not --token-ids".into()))
            }
            (None, None, _) => {
                Err(fovea::Error::Invalid("the language model needs a prompt: --prompt TEXT or --token-ids IDS".into()))
            }
        }
    }
}

/// The language-model request of `dump` and `generate`.
fn lm_request(
    model: PathBuf,
    mmproj: MmprojArgs,
    lane: LaneArgs,
    tokens: Vec<PromptToken>,
    images: Vec<PathBuf>,
) -> fovea::Result<LmRequest> {
    Ok(LmRequest {
        model_dir: model,
        mmproj: mmproj.mmproj,
        image_max_tokens: mmproj.image_max_tokens,
        tokens,
        images,
        lane: lane.lane()?,
        precision: lane.precision,
    })
}

fn stdout_error(e: std::io::Error) -> fovea::Error {
    fovea::Error::Invalid(format!("stdout: {e}"))
}

fn run(cli: Cli) -> fovea::Result<()> {
    match cli.command {
        Command::Dump { model, mmproj, image, prompt, out, lane, start_pos: _ } if !prompt.is_empty() => {
            let tokens = match prompt.resolve(image.len())? {
                Prompt::Chat(chat) => ChatTokenizer::for_model(&model)?.encode_chat(&chat)?,
                Prompt::Ids(ids) => pipeline::parse_token_ids(ids)?,
            };
            let dump = pipeline::dump_lm(&lm_request(model, mmproj, lane, tokens, image)?)?;
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
        Command::Dump { model, mmproj, image, out, lane, start_pos, .. } => {
            let image = match <[PathBuf; 1]>::try_from(image) {
                Ok([one]) => one,
                Err(images) if images.is_empty() => {
                    return Err(fovea::Error::Invalid(format!(
                        "dump needs --image (vision path), or --prompt / --token-ids (language model) for {}",
                        model.display()
                    )));
                }
                Err(images) => {
                    return Err(fovea::Error::Invalid(format!(
                        "the vision dump takes one --image ({} given); several images need --prompt or --token-ids",
                        images.len()
                    )));
                }
            };
            let dump = pipeline::dump_vision(&VisionDumpRequest {
                model_dir: model,
                mmproj: mmproj.mmproj,
                image_max_tokens: mmproj.image_max_tokens,
                image,
                lane: lane.lane()?,
                precision: lane.precision,
                start_pos,
            })?;
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
            mmproj,
            prompt,
            image,
            max_tokens,
            temperature,
            top_k,
            top_p,
            seed,
            print_ids,
            lane,
        } => {
            let (tokens, tokenizer) = match prompt.resolve(image.len())? {
                Prompt::Chat(chat) => {
                    let tok = ChatTokenizer::for_model(&model)?;
                    (tok.encode_chat(&chat)?, Some(tok))
                }
                Prompt::Ids(ids) => (pipeline::parse_token_ids(ids)?, None),
            };
            let text_out = match (print_ids, tokenizer) {
                (true, _) => None,
                (false, Some(tok)) => Some(tok),
                (false, None) => Some(ChatTokenizer::for_model(&model).map_err(|e| match e {
                    fovea::Error::File { path, msg } => fovea::Error::File {
                        path,
                        msg: format!("{msg}; text output needs it (pass --print-ids to print token ids instead)"),
                    },
                    e => e,
                })?),
            };
            let opts = GenerateOptions { max_tokens, sampling: Sampling { temperature, top_k, top_p, seed } };
            let req = lm_request(model, mmproj, lane, tokens, image)?;
            let mut stdout = std::io::stdout().lock();
            let mut bars = Bars::new();
            let g = match &text_out {
                Some(tok) => pipeline::generate_text(&req, &opts, tok, &mut |p| bars.update(p), &mut |piece: &str| {
                    write!(stdout, "{piece}").and_then(|_| stdout.flush()).map_err(stdout_error)
                })?,
                None => {
                    let mut first = true;
                    pipeline::generate_lm(&req, &opts, &mut |p| bars.update(p), &mut |id: i32| {
                        let sep = if std::mem::take(&mut first) { "" } else { " " };
                        write!(stdout, "{sep}{id}").and_then(|_| stdout.flush()).map_err(stdout_error)
                    })?
                }
            };
            writeln!(stdout).and_then(|_| stdout.flush()).map_err(stdout_error)?;
            let why = match g.stop {
                StopReason::Eos => "eos",
                StopReason::MaxTokens => "max tokens",
            };
            eprintln!("fovea: {} lane: {}-token prompt, {} generated ({why})", g.lane, g.prompt_len, g.ids.len());
            eprintln!("fovea: {}", g.timings.summary(g.prompt_len, g.ids.len()));
        }
        Command::Serve(args) => {
            let (opts, host, port) = args.options()?;
            serve::run(opts, &host, port)?;
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
