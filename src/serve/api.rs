//! The OpenAI chat-completions request, checked field by field into [`ChatRequest`], and the
//! error object every failure is answered with. Requests are read from a `serde_json::Value`
//! rather than derived structs so each error names the exact field (`messages[1].content[0].type`)
//! and says what it holds instead of what was expected.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::Limits;

/// OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`, with its status.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's `type`: `invalid_request_error`, `rate_limit_error`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    /// 400 for a field of the request.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
        }
    }

    /// 400 about the request as a whole (no single field).
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: None,
            code: None,
        }
    }

    /// 500: the model failed on a request that was valid.
    pub fn server(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            kind: "server_error",
            param: None,
            code: None,
        }
    }

    pub fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The JSON body (also sent as an SSE event when a stream fails after it started).
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `system`, or `developer` (OpenAI's newer name for it).
    System,
    User,
    Assistant,
}

/// One part of a message's content.
#[derive(Clone, Debug, PartialEq)]
pub enum Part {
    Text(String),
    /// `image_url.url` of an `image_url` part, with the field's path for errors.
    Image {
        url: String,
        param: String,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    pub role: Role,
    pub parts: Vec<Part>,
}

/// A checked chat-completions request.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// `max_completion_tokens`, else `max_tokens`, else the server's limit.
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stream: bool,
    /// `stream_options.include_usage`: a last chunk with `usage` before `[DONE]`.
    pub include_usage: bool,
    /// llama.cpp's `ignore_eos`: generate `max_tokens` tokens whatever comes (benchmarks and
    /// tests need answers of a known length).
    pub ignore_eos: bool,
}

/// OpenAI's limit on `stop` sequences.
const MAX_STOP: usize = 4;

/// What a JSON value is, for "must be X (got Y)" messages.
fn describe(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn wrong_type(param: &str, want: &str, got: &Value) -> ApiError {
    ApiError::invalid(param, format!("`{param}` must be {want} (got {})", describe(got)))
}

/// A field that may be absent or null (OpenAI clients send `null` for unset options).
fn field<'v>(obj: &'v Map<String, Value>, key: &str) -> Option<&'v Value> {
    obj.get(key).filter(|v| !v.is_null())
}

fn as_str<'v>(v: &'v Value, param: &str) -> Result<&'v str, ApiError> {
    v.as_str().ok_or_else(|| wrong_type(param, "a string", v))
}

fn as_f32(v: &Value, param: &str) -> Result<f32, ApiError> {
    v.as_f64().map(|x| x as f32).ok_or_else(|| wrong_type(param, "a number", v))
}

fn as_count(v: &Value, param: &str) -> Result<u64, ApiError> {
    v.as_u64().ok_or_else(|| match v.as_i64() {
        Some(x) => ApiError::invalid(param, format!("`{param}` must be >= 0 (got {x})")),
        None => wrong_type(param, "an integer", v),
    })
}

/// Parse and check a request body against the server's limits.
pub fn parse_chat(body: &[u8], limits: &Limits) -> Result<ChatRequest, ApiError> {
    let root: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))?;
    let obj = root.as_object().ok_or_else(|| {
        ApiError::bad_request(format!("the request body must be a JSON object (got {})", describe(&root)))
    })?;
    if let Some(v) = field(obj, "model") {
        as_str(v, "model")?;
    }
    unsupported(obj)?;

    let messages = match obj.get("messages") {
        None | Some(Value::Null) => return Err(ApiError::invalid("messages", "`messages` is required")),
        Some(Value::Array(a)) if a.is_empty() => {
            return Err(ApiError::invalid("messages", "`messages` must hold at least one message"));
        }
        Some(Value::Array(a)) => a.iter().enumerate().map(|(i, m)| parse_message(i, m)).collect::<Result<_, _>>()?,
        Some(v) => return Err(wrong_type("messages", "an array of messages", v)),
    };

    let max_tokens = match (field(obj, "max_completion_tokens"), field(obj, "max_tokens")) {
        (Some(v), _) => Some(("max_completion_tokens", as_count(v, "max_completion_tokens")?)),
        (None, Some(v)) => Some(("max_tokens", as_count(v, "max_tokens")?)),
        (None, None) => None,
    };
    let max_tokens = match max_tokens {
        None => limits.max_tokens,
        Some((param, 0)) => return Err(ApiError::invalid(param, format!("`{param}` must be at least 1"))),
        Some((param, n)) if n > limits.max_tokens as u64 => {
            return Err(ApiError::invalid(
                param,
                format!("`{param}` is {n}; this server allows at most {} (--max-tokens)", limits.max_tokens),
            ));
        }
        Some((_, n)) => n as usize,
    };

    let temperature = field(obj, "temperature").map(|v| as_f32(v, "temperature")).transpose()?.unwrap_or(0.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::invalid("temperature", format!("`temperature` must be >= 0 (got {temperature})")));
    }
    let top_p = field(obj, "top_p").map(|v| as_f32(v, "top_p")).transpose()?.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p", format!("`top_p` must be in (0, 1] (got {top_p})")));
    }
    let top_k = field(obj, "top_k").map(|v| as_count(v, "top_k")).transpose()?.unwrap_or(0);
    // any 64-bit integer: a negative seed is taken as its two's-complement bits
    let seed = match field(obj, "seed") {
        None => None,
        Some(v) => Some(
            v.as_u64().or_else(|| v.as_i64().map(|x| x as u64)).ok_or_else(|| wrong_type("seed", "an integer", v))?,
        ),
    };

    let stop = match field(obj, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(i, v)| as_str(v, &format!("stop[{i}]")).map(str::to_string))
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => return Err(wrong_type("stop", "a string or an array of strings", v)),
    };
    if stop.len() > MAX_STOP {
        return Err(ApiError::invalid("stop", format!("at most {MAX_STOP} stop sequences (got {})", stop.len())));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "a stop sequence must not be empty"));
    }

    let stream = match field(obj, "stream") {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| wrong_type("stream", "a boolean", v))?,
    };
    let ignore_eos = match field(obj, "ignore_eos") {
        None => false,
        Some(v) => v.as_bool().ok_or_else(|| wrong_type("ignore_eos", "a boolean", v))?,
    };
    let include_usage = match field(obj, "stream_options") {
        None => false,
        Some(Value::Object(o)) => match field(o, "include_usage") {
            None => false,
            Some(v) => v.as_bool().ok_or_else(|| wrong_type("stream_options.include_usage", "a boolean", v))?,
        },
        Some(v) => return Err(wrong_type("stream_options", "an object", v)),
    };

    Ok(ChatRequest {
        messages,
        max_tokens,
        temperature,
        top_p,
        top_k: top_k as usize,
        seed,
        stop,
        stream,
        include_usage,
        ignore_eos,
    })
}

/// Options that would change what the client gets back and that this server does not implement:
/// refused by name rather than silently ignored. Other unknown keys are ignored, as OpenAI's own
/// clients send defaults for many options.
fn unsupported(obj: &Map<String, Value>) -> Result<(), ApiError> {
    if let Some(v) = field(obj, "n")
        && as_count(v, "n")? != 1
    {
        return Err(ApiError::invalid("n", "only `n` = 1 is supported (one choice per request)"));
    }
    if let Some(v) = field(obj, "tools")
        && v.as_array().is_none_or(|a| !a.is_empty())
    {
        return Err(ApiError::invalid("tools", "tools (function calling) are not supported"));
    }
    if field(obj, "logprobs").is_some_and(|v| v != &Value::Bool(false)) {
        return Err(ApiError::invalid("logprobs", "logprobs are not supported"));
    }
    if let Some(v) = field(obj, "response_format") {
        let kind = v.get("type").and_then(Value::as_str);
        if kind != Some("text") {
            return Err(ApiError::invalid(
                "response_format",
                "only `response_format` {\"type\": \"text\"} is supported (no JSON mode)",
            ));
        }
    }
    Ok(())
}

fn parse_message(i: usize, m: &Value) -> Result<Message, ApiError> {
    let at = format!("messages[{i}]");
    let obj = m.as_object().ok_or_else(|| wrong_type(&at, "an object", m))?;
    let role_param = format!("{at}.role");
    let role = match obj.get("role") {
        None | Some(Value::Null) => return Err(ApiError::invalid(role_param, format!("`{at}.role` is required"))),
        Some(v) => match as_str(v, &role_param)? {
            "system" | "developer" => Role::System,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            r @ ("tool" | "function") => {
                return Err(ApiError::invalid(role_param, format!("role `{r}` is not supported (no tool calling)")));
            }
            r => {
                return Err(ApiError::invalid(
                    role_param,
                    format!("unknown role `{r}` (expected system, developer, user or assistant)"),
                ));
            }
        },
    };
    let content_param = format!("{at}.content");
    let parts = match obj.get("content") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(content_param, format!("`{at}.content` is required")));
        }
        Some(Value::String(s)) => vec![Part::Text(s.clone())],
        Some(Value::Array(a)) => a
            .iter()
            .enumerate()
            .map(|(j, p)| parse_part(&format!("{content_param}[{j}]"), p))
            .collect::<Result<Vec<_>, _>>()?,
        Some(v) => return Err(wrong_type(&content_param, "a string or an array of content parts", v)),
    };
    if role != Role::User
        && let Some(Part::Image { param, .. }) = parts.iter().find(|p| matches!(p, Part::Image { .. }))
    {
        return Err(ApiError::invalid(param.clone(), "images are accepted in user messages only"));
    }
    Ok(Message { role, parts })
}

fn parse_part(at: &str, p: &Value) -> Result<Part, ApiError> {
    let obj = p.as_object().ok_or_else(|| wrong_type(at, "an object", p))?;
    let type_param = format!("{at}.type");
    let kind = match obj.get("type") {
        None | Some(Value::Null) => return Err(ApiError::invalid(type_param, format!("`{at}.type` is required"))),
        Some(v) => as_str(v, &type_param)?,
    };
    match kind {
        "text" => {
            let param = format!("{at}.text");
            match obj.get("text") {
                None | Some(Value::Null) => Err(ApiError::invalid(param, format!("`{at}.text` is required"))),
                Some(v) => Ok(Part::Text(as_str(v, &param)?.to_string())),
            }
        }
        "image_url" => {
            let param = format!("{at}.image_url");
            let url_param = format!("{param}.url");
            let url = match obj.get("image_url") {
                None | Some(Value::Null) => {
                    return Err(ApiError::invalid(param, format!("`{at}.image_url` is required")));
                }
                // the bare-string form some clients send
                Some(Value::String(s)) => s,
                Some(Value::Object(o)) => match o.get("url") {
                    None | Some(Value::Null) => {
                        return Err(ApiError::invalid(&url_param, format!("`{url_param}` is required")));
                    }
                    Some(v) => as_str(v, &url_param)?,
                },
                Some(v) => return Err(wrong_type(&param, "an object with a `url`", v)),
            };
            Ok(Part::Image { url: url.to_string(), param: url_param })
        }
        other => Err(ApiError::invalid(
            type_param,
            format!("content part type `{other}` is not supported (expected text or image_url)"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits { max_prompt_tokens: 100, max_tokens: 50, max_image_bytes: 1000, max_image_pixels: 1000, max_images: 2 }
    }

    fn err(body: &str) -> ApiError {
        parse_chat(body.as_bytes(), &limits()).expect_err(body)
    }

    #[test]
    fn parses_text_and_image_parts_with_defaults() {
        let r = parse_chat(
            br#"{"model": "m", "messages": [{"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}},
                                             {"type": "text", "text": "hi"}]}],
                "temperature": null, "stop": "\n"}"#,
            &limits(),
        )
        .unwrap();
        assert_eq!(r.messages[0], Message { role: Role::System, parts: vec![Part::Text("be brief".into())] });
        assert_eq!(
            r.messages[1].parts,
            vec![
                Part::Image { url: "data:x".into(), param: "messages[1].content[0].image_url.url".into() },
                Part::Text("hi".into())
            ]
        );
        assert_eq!((r.max_tokens, r.temperature, r.top_p, r.top_k, r.seed), (50, 0.0, 1.0, 0, None));
        assert_eq!(r.stop, vec!["\n".to_string()]);
        assert!(!r.stream && !r.include_usage && !r.ignore_eos);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#"{"messages": "#, None, "not valid JSON"),
            (r#"[1]"#, None, "must be a JSON object (got an array)"),
            (r#"{}"#, Some("messages"), "is required"),
            (r#"{"messages": [{"role": "robot", "content": "x"}]}"#, Some("messages[0].role"), "unknown role `robot`"),
            (
                r#"{"messages": [{"role": 3, "content": "x"}]}"#,
                Some("messages[0].role"),
                "must be a string (got an integer)",
            ),
            (r#"{"messages": [{"role": "user", "content": 5}]}"#, Some("messages[0].content"), "got an integer"),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "audio"}]}]}"#,
                Some("messages[0].content[0].type"),
                "`audio` is not supported",
            ),
            (
                r#"{"messages": [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "u"}}]}]}"#,
                Some("messages[0].content[0].image_url.url"),
                "user messages only",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": "9"}"#,
                Some("max_tokens"),
                "an integer",
            ),
            (r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 51}"#, Some("max_tokens"), "at most 50"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}"#, Some("max_tokens"), ">= 0"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}"#,
                Some("temperature"),
                "a number",
            ),
            (r#"{"messages": [{"role": "user", "content": "x"}], "top_p": 0}"#, Some("top_p"), "(0, 1]"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "seed": 1.5}"#, Some("seed"), "an integer"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "stop": [1]}"#, Some("stop[0]"), "a string"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}"#, Some("stream"), "a boolean"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "n": 2}"#, Some("n"), "only `n` = 1"),
        ];
        for (body, param, msg) in cases {
            let e = err(body);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{body}");
            assert_eq!(e.param.as_deref(), param, "{body}: {}", e.message);
            assert!(e.message.contains(msg), "{body}: {}", e.message);
        }
    }

    #[test]
    fn max_completion_tokens_wins_and_seeds_take_any_i64() {
        let r = parse_chat(
            br#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 9, "max_completion_tokens": 3, "seed": -1}"#,
            &limits(),
        )
        .unwrap();
        assert_eq!((r.max_tokens, r.seed), (3, Some(u64::MAX)));
    }
}
