//! The HTTP side: axum routes, the request path of a chat completion (parse → queue slot →
//! images and tokens → worker) and the two answer forms (one JSON object, or server-sent events
//! in OpenAI's chunk format ending with `data: [DONE]`).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::ServeOptions;
use super::api::{self, ApiError, ChatRequest, Part, Role};
use super::engine::{Engine, Event, Finish, Job, Slot};
use super::images;
use crate::model::lm::generate::Sampling;
use crate::pipeline::{check_token_ids, prompt_len};
use crate::tokenizer::{self, ChatTokenizer, Conversation, Turn};

/// What every handler shares.
pub struct Shared {
    pub engine: Engine,
    pub tokenizer: Arc<ChatTokenizer>,
    pub opts: ServeOptions,
    pub model_name: String,
    /// Unix time the server started: `created` of the model entry.
    pub started: u64,
    pub next_id: AtomicU64,
}

type AppState = Arc<Shared>;

/// Text besides the images a request body may carry (messages, options).
const TEXT_BODY_BYTES: usize = 8 << 20;

/// The largest request body: every image a request may hold (`--max-images`) at the byte limit,
/// base64-encoded (4 characters per 3 bytes), plus the text.
pub fn body_limit(opts: &ServeOptions) -> usize {
    let l = &opts.limits;
    l.max_image_bytes.div_ceil(3).saturating_mul(4).saturating_mul(l.max_images).saturating_add(TEXT_BODY_BYTES)
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        // the same without the /v1 prefix, for clients whose base URL omits it
        .route("/chat/completions", post(chat))
        .route("/models", get(models))
        .route("/health", get(health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::bad_request(format!("no route for {method} {}", uri.path()))
        .with_status(StatusCode::NOT_FOUND)
        .with_code("not_found")
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::bad_request(format!("{method} is not allowed on {}", uri.path()))
        .with_status(StatusCode::METHOD_NOT_ALLOWED)
        .with_code("method_not_allowed")
}

async fn models(State(st): State<AppState>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{"id": st.model_name, "object": "model", "created": st.started, "owned_by": "fovea"}],
    }))
    .into_response()
}

async fn health(State(st): State<AppState>) -> Response {
    let s = &st.engine.stats;
    // the queue closes only when the worker thread has ended
    let up = !st.engine.queue.is_closed();
    let body = json!({
        "status": if up { "ok" } else { "error" },
        "model": st.model_name,
        "lane": st.engine.info.lane,
        "device": st.engine.info.device,
        "queued": s.waiting.load(Ordering::Relaxed),
        "active": s.active.load(Ordering::Relaxed),
        "completed": s.completed.load(Ordering::Relaxed),
        "cancelled": s.cancelled.load(Ordering::Relaxed),
        "failed": s.failed.load(Ordering::Relaxed),
    });
    let status = if up { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, axum::Json(body)).into_response()
}

async fn chat(State(st): State<AppState>, body: Body) -> Response {
    let arrived = Instant::now();
    let id = format!("chatcmpl-{}-{}", st.started, st.next_id.fetch_add(1, Ordering::Relaxed));
    match submit(&st, body, arrived).await {
        Ok((req, events, slot)) if req.stream => stream(st, id, events, slot, req.include_usage),
        // the slot is held until the answer is built (or the client leaves, dropping this future)
        Ok((_, events, _slot)) => complete(&st, id, events).await,
        Err(e) => e.into_response(),
    }
}

/// How much of a body over the limit is still read, and dropped, before the 413 goes out: a
/// connection closed with unread data is reset, and the reset can cost the client the answer.
const DRAIN_BYTES: usize = 64 << 20;

/// The request body, at most [`body_limit`] bytes (413 beyond, naming the limits).
async fn read_body(st: &AppState, body: Body) -> Result<Bytes, ApiError> {
    let limit = body_limit(&st.opts);
    let mut chunks = body.into_data_stream();
    let (mut kept, mut total) = (Vec::new(), 0usize);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
        total = total.saturating_add(chunk.len());
        if total <= limit {
            kept.extend_from_slice(&chunk);
        } else if total > limit.saturating_add(DRAIN_BYTES) {
            break;
        }
    }
    if total > limit {
        return Err(ApiError::bad_request(format!(
            "the request body is larger than {limit} bytes (at most --max-images {} image(s) of --max-image-bytes {} \
             bytes, base64-encoded, plus {TEXT_BODY_BYTES} bytes of text)",
            st.opts.limits.max_images, st.opts.limits.max_image_bytes
        ))
        .with_status(StatusCode::PAYLOAD_TOO_LARGE)
        .with_code("request_too_large"));
    }
    Ok(Bytes::from(kept))
}

/// Check the request, take a slot, prepare the images and the tokens, and hand the job to the
/// worker; its events come back on the receiver. The slot is the request's until its answer is
/// sent or its client has gone (the caller drops it then).
async fn submit(
    st: &AppState,
    body: Body,
    arrived: Instant,
) -> Result<(ChatRequest, mpsc::UnboundedReceiver<Event>, Slot), ApiError> {
    let body = read_body(st, body).await?;
    let req = api::parse_chat(&body, &st.opts.limits)?;
    let images: Vec<(String, String)> = req
        .messages
        .iter()
        .flat_map(|m| &m.parts)
        .filter_map(|p| match p {
            Part::Image { url, param } => Some((url.clone(), param.clone())),
            Part::Text(_) => None,
        })
        .collect();
    let max_images = st.opts.limits.max_images;
    if let Some((_, param)) = images.get(max_images) {
        return Err(ApiError::invalid(
            param.clone(),
            format!(
                "this request has {} images; this server takes at most {max_images} per request, over all its \
                 messages (--max-images)",
                images.len()
            ),
        ));
    }
    let preprocess = match (&st.engine.info.preprocess, images.first()) {
        (None, Some((_, param))) => {
            return Err(ApiError::invalid(param.clone(), "this model has no vision tower: it takes no images"));
        }
        (cfg, _) => cfg.clone(),
    };
    if st.engine.queue.is_closed() {
        return Err(worker_gone());
    }
    // a slot before the expensive work, so a full server refuses at once
    let slot = st.engine.admit().ok_or_else(|| ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        message: format!(
            "the server is busy: {} requests run at once (--parallel) and {} more may wait (--queue-size), \
             all taken; retry later",
            st.opts.engine.parallel, st.opts.engine.queue_size
        ),
        kind: "rate_limit_error",
        param: None,
        code: Some("queue_full"),
    })?;
    let shared = st.clone();
    let req2 = req.clone();
    let (tokens, prepared) = tokio::task::spawn_blocking(move || {
        let st = &shared;
        let prepared = match &preprocess {
            Some(cfg) => images
                .iter()
                .map(|(url, param)| {
                    let bytes = images::fetch(url, param, &st.opts.limits, st.opts.allow_local_files)?;
                    images::prepare(&bytes, param, &st.opts.limits, cfg)
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => Vec::new(),
        };
        let tokens = encode(&st.tokenizer, &req2)?;
        check_token_ids(&tokens, st.engine.info.vocab_size).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
        let n = prompt_len(&tokens, &prepared);
        let max = st.opts.limits.max_prompt_tokens;
        if n > max {
            return Err(ApiError::invalid(
                "messages",
                format!("the prompt is {n} tokens (image blocks included); this server allows at most {max} (--max-prompt-tokens)"),
            )
            .with_code("context_length_exceeded"));
        }
        Ok((tokens, prepared))
    })
    .await
    .map_err(|e| ApiError::server(format!("preparing the request failed: {e}")))??;
    let seed = req.seed.unwrap_or_else(random_seed);
    let sampling = Sampling { temperature: req.temperature, top_k: req.top_k, top_p: req.top_p, seed };
    let (events, receiver) = mpsc::unbounded_channel();
    let job = Job {
        tokens,
        images: prepared,
        max_tokens: req.max_tokens,
        sampling,
        stop: req.stop.clone(),
        ignore_eos: req.ignore_eos,
        events,
        arrived,
    };
    st.engine.queue.send(job).map_err(|_| worker_gone())?;
    Ok((req, receiver, slot))
}

/// A seed for a request that gave none: std's per-instance random hasher keys, so no RNG crate
/// is needed outside sampling.
fn random_seed() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(Instant::now())
}

fn worker_gone() -> ApiError {
    ApiError::server("the model worker has stopped; restart the server").with_status(StatusCode::SERVICE_UNAVAILABLE)
}

/// The chat prompt of the messages: system messages' text (all of it, in order, joined with
/// blank lines) before the first turn, then the user and assistant turns.
fn encode(tok: &ChatTokenizer, req: &ChatRequest) -> Result<Vec<crate::pipeline::PromptToken>, ApiError> {
    fn texts(parts: &[Part]) -> Vec<&str> {
        parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                Part::Image { .. } => None,
            })
            .collect()
    }
    let system =
        req.messages.iter().filter(|m| m.role == Role::System).flat_map(|m| texts(&m.parts)).collect::<Vec<_>>();
    let system = system.join("\n\n");
    let answers: Vec<String> =
        req.messages.iter().filter(|m| m.role == Role::Assistant).map(|m| texts(&m.parts).join("\n\n")).collect();
    let mut answers = answers.iter();
    let turns = req
        .messages
        .iter()
        .filter_map(|m| match m.role {
            Role::System => None,
            Role::User => Some(Turn::User(
                m.parts
                    .iter()
                    .map(|p| match p {
                        Part::Text(t) => tokenizer::Part::Text(t),
                        Part::Image { .. } => tokenizer::Part::Image,
                    })
                    .collect(),
            )),
            Role::Assistant => answers.next().map(|a| Turn::Assistant(a.as_str())),
        })
        .collect();
    tok.encode_conversation(&Conversation { system: &system, turns })
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

/// The `usage` object.
fn usage(f: &Finish) -> Value {
    json!({
        "prompt_tokens": f.prompt_tokens,
        "completion_tokens": f.completion_tokens,
        "total_tokens": f.prompt_tokens + f.completion_tokens,
    })
}

/// Where the request's time went (fovea's extension, beside `usage`, as llama.cpp's server
/// sends `timings`). Decode covers the steps after the first token, which the prefill yields.
fn timings(f: &Finish) -> Value {
    let t = &f.timings;
    let ms = |d: Duration| (d.as_secs_f64() * 1e6).round() / 1e3;
    let rate = |n: usize, d: Duration| if d.is_zero() { None } else { Some(n as f64 / d.as_secs_f64()) };
    let decode_steps = f.completion_tokens.saturating_sub(1);
    json!({
        "queue_ms": ms(t.queue),
        "vision_ms": t.vision.map(ms),
        "prefill_ms": ms(t.prefill),
        "prefill_tokens_per_second": rate(f.prompt_tokens, t.prefill),
        "decode_ms": ms(t.decode),
        "decode_tokens_per_second": rate(decode_steps, t.decode),
        "time_to_first_token_ms": ms(t.first_token),
    })
}

fn created() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Wait for the whole answer, then send one `chat.completion` object.
async fn complete(st: &AppState, id: String, mut events: mpsc::UnboundedReceiver<Event>) -> Response {
    let mut text = String::new();
    while let Some(event) = events.recv().await {
        match event {
            Event::Text(piece) => text += &piece,
            Event::Failed(message) => return ApiError::server(message).into_response(),
            Event::Done(f) => {
                return axum::Json(json!({
                    "id": id,
                    "object": "chat.completion",
                    "created": created(),
                    "model": st.model_name,
                    "system_fingerprint": fingerprint(st),
                    "choices": [{
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": null,
                        "finish_reason": f.reason.as_str(),
                    }],
                    "usage": usage(&f),
                    "timings": timings(&f),
                }))
                .into_response();
            }
        }
    }
    worker_gone().into_response()
}

fn fingerprint(st: &Shared) -> String {
    format!("fovea-{}-{}", env!("CARGO_PKG_VERSION"), st.engine.info.lane)
}

/// Where a stream stands.
enum Phase {
    /// The first chunk (the assistant role) is still to go.
    Start,
    /// Text chunks as the worker sends them.
    Text,
    /// The usage chunk (`stream_options.include_usage`), then `[DONE]`.
    Usage(Value),
    Done,
    End,
}

/// Stream the answer as server-sent `chat.completion.chunk` events, then `data: [DONE]`. A
/// failure after the stream started is sent as an event with OpenAI's error object (the status
/// line has gone already).
fn stream(
    st: AppState,
    id: String,
    events: mpsc::UnboundedReceiver<Event>,
    slot: Slot,
    include_usage: bool,
) -> Response {
    let created = created();
    let chunk = move |st: &Shared, delta: Value, finish: Option<&str>| {
        json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": st.model_name,
            "system_fingerprint": fingerprint(st),
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    };
    let data = |v: Value| Some(Ok::<_, Infallible>(SseEvent::default().data(v.to_string())));
    // the slot lives in the stream: freed when the stream ends or the client drops it
    let body = futures_util::stream::unfold((Phase::Start, events, slot), move |(phase, mut events, slot)| {
        let (st, chunk) = (st.clone(), chunk.clone());
        async move {
            let (event, next) = match phase {
                Phase::Start => (data(chunk(&st, json!({"role": "assistant", "content": ""}), None)), Phase::Text),
                Phase::Text => match events.recv().await {
                    Some(Event::Text(piece)) => (data(chunk(&st, json!({"content": piece}), None)), Phase::Text),
                    Some(Event::Done(f)) => {
                        let mut last = chunk(&st, json!({}), Some(f.reason.as_str()));
                        last["timings"] = timings(&f);
                        let next = if include_usage { Phase::Usage(usage(&f)) } else { Phase::Done };
                        (data(last), next)
                    }
                    Some(Event::Failed(message)) => (data(ApiError::server(message).body()), Phase::End),
                    None => (data(worker_gone().body()), Phase::End),
                },
                Phase::Usage(u) => {
                    let mut last = chunk(&st, json!({}), None);
                    last["choices"] = json!([]);
                    last["usage"] = u;
                    (data(last), Phase::Done)
                }
                Phase::Done => (Some(Ok(SseEvent::default().data("[DONE]"))), Phase::End),
                Phase::End => (None, Phase::End),
            };
            event.map(|e| (e, (next, events, slot)))
        }
    });
    Sse::new(body).keep_alive(KeepAlive::default()).into_response()
}
