//! `fovea serve`: an OpenAI-compatible chat-completions server (axum on tokio).
//!
//! - `POST /v1/chat/completions`: messages with text and `image_url` parts (`data:` URLs; local
//!   files only with `--allow-local-files`), sampling options, `stop`, `stream` (server-sent
//!   events ending with `data: [DONE]`), `usage` and fovea's `timings`.
//! - `GET /v1/models`, `GET /health`.
//! - Every failure is OpenAI's error object with a 4xx (the request) or 5xx (the server) status.
//!
//! The model runs on one worker thread ([`engine`]); at most `--parallel` + `--queue-size`
//! requests are in the server at once (429 beyond), and each reaches the worker only after its
//! images are decoded under the [`Limits`] and its prompt is tokenized, so a bad request is
//! answered before it takes the model's time.

mod api;
mod engine;
mod http;
mod images;
mod stop;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::error::{Error, Result};
use crate::pipeline::LaneChoice;
use crate::tokenizer::ChatTokenizer;

pub use engine::EngineOptions;

/// Sequences the worker interleaves by default (`--parallel`).
pub const DEFAULT_PARALLEL: usize = 4;
/// Requests that may wait by default beyond the running ones (`--queue-size`).
pub const DEFAULT_QUEUE_SIZE: usize = 16;

/// Per-request limits (each has a flag of `fovea serve`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Positions of the prompt with each image's block expanded (`--max-prompt-tokens`).
    pub max_prompt_tokens: usize,
    /// The most `max_tokens` a request may ask for, and what it gets when it names none
    /// (`--max-tokens`).
    pub max_tokens: usize,
    /// Bytes of one image file, before decoding (`--max-image-bytes`).
    pub max_image_bytes: usize,
    /// Width × height of one image, read from its header before decoding (`--max-image-pixels`).
    pub max_image_pixels: u64,
    /// Images in one request, over all its messages (`--max-images`).
    pub max_images: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_prompt_tokens: 8192,
            max_tokens: 1024,
            // OpenAI's own limit per image
            max_image_bytes: 20 << 20,
            // 32 Mpx: 96 MiB decoded (RGB8), more than any camera; the tower resizes to its token
            // budget anyway
            max_image_pixels: 32 << 20,
            // a block holds at most 384 image tokens plus its newlines, pads and sentinels, so 4
            // take well under half the default prompt limit; the body limit grows with it (4
            // images at --max-image-bytes, base64-encoded)
            max_images: 4,
        }
    }
}

/// Everything `fovea serve` is started with.
#[derive(Clone, Debug)]
pub struct ServeOptions {
    pub engine: EngineOptions,
    /// The `model` id the API reports; default: the model's file or directory name.
    pub model_name: Option<String>,
    /// Accept absolute paths and `file://` URLs as `image_url` (they read the server's files).
    pub allow_local_files: bool,
    pub limits: Limits,
}

impl ServeOptions {
    /// The defaults for a model on a lane.
    pub fn new(model: PathBuf, lane: LaneChoice) -> Self {
        ServeOptions {
            engine: EngineOptions {
                model,
                mmproj: None,
                image_max_tokens: None,
                lane,
                precision: None,
                queue_size: DEFAULT_QUEUE_SIZE,
                parallel: DEFAULT_PARALLEL,
            },
            model_name: None,
            allow_local_files: false,
            limits: Limits::default(),
        }
    }
}

/// A loaded model behind its HTTP routes, ready to serve.
pub struct App {
    shared: Arc<http::Shared>,
}

impl App {
    /// Load the tokenizer and the model (on the worker thread, waiting until it is resident).
    pub fn load(opts: ServeOptions) -> Result<App> {
        let l = &opts.limits;
        if l.max_prompt_tokens == 0
            || l.max_tokens == 0
            || l.max_image_bytes == 0
            || l.max_image_pixels == 0
            || l.max_images == 0
        {
            return Err(Error::Invalid(format!(
                "every limit must be at least 1: --max-prompt-tokens {}, --max-tokens {}, --max-image-bytes {}, \
                 --max-image-pixels {}, --max-images {}",
                l.max_prompt_tokens, l.max_tokens, l.max_image_bytes, l.max_image_pixels, l.max_images
            )));
        }
        let tokenizer = Arc::new(ChatTokenizer::for_model(&opts.engine.model)?);
        let engine = engine::Engine::start(&opts.engine, tokenizer.clone())?;
        let model_name = match &opts.model_name {
            Some(n) => n.clone(),
            None => {
                let m = &opts.engine.model;
                let name = if crate::pipeline::is_gguf(m) { m.file_stem() } else { m.file_name() };
                name.map_or_else(|| m.display().to_string(), |n| n.to_string_lossy().into_owned())
            }
        };
        let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Ok(App {
            shared: Arc::new(http::Shared { engine, tokenizer, opts, model_name, started, next_id: AtomicU64::new(0) }),
        })
    }

    /// The `model` id of the API.
    pub fn model_name(&self) -> &str {
        &self.shared.model_name
    }

    /// The lane the model runs on, and its device.
    pub fn lane(&self) -> (&'static str, &str) {
        (self.shared.engine.info.lane, &self.shared.engine.info.device)
    }
}

/// Serve `app` on `listener` until `shutdown` completes (then finish the open requests).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: App,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, http::router(app.shared)).with_graceful_shutdown(shutdown).await
}

/// `fovea serve`: load, listen on `host:port` (0 = any free port), serve until Ctrl-C. The
/// address is printed on stderr once the model is loaded.
pub fn run(opts: ServeOptions, host: &str, port: u16) -> Result<()> {
    let queue = opts.engine.queue_size;
    let app = App::load(opts)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Device(format!("cannot start the async runtime: {e}")))?;
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind((host, port))
            .await
            .map_err(|e| Error::Invalid(format!("cannot listen on {host}:{port}: {e}")))?;
        let addr = listener.local_addr().map_err(|e| Error::Invalid(format!("listening socket: {e}")))?;
        let (lane, device) = app.lane();
        eprintln!(
            "fovea: serving {} on http://{addr} ({lane} lane, {device}; queue {queue}); POST /v1/chat/completions",
            app.model_name()
        );
        serve(listener, app, async {
            // no signal handler (rare): serve until killed
            if tokio::signal::ctrl_c().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
        .await
        .map_err(|e| Error::Device(format!("server: {e}")))
    })
}
