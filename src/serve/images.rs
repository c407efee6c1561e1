//! `image_url` parts to preprocessed images, under the server's limits. Every limit is checked
//! before the work it bounds: the encoded length before base64 decoding, the file size before
//! reading, the header's pixel count before decoding pixels (a PNG header can claim
//! 100 000 × 100 000 pixels in a few dozen bytes).

use std::path::Path;

use axum::http::StatusCode;
use base64::Engine;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};

use super::Limits;
use super::api::ApiError;
use crate::processor::{self, PreparedImage, PreprocessConfig};

/// Standard base64; clients differ on padding, so it is optional.
const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The media types a `data:` URL may declare (any other is refused by name).
const MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/jpg", "image/webp"];

fn too_large(param: &str, message: String) -> ApiError {
    ApiError::invalid(param, message).with_code("image_too_large")
}

fn invalid_image(param: &str, message: String) -> ApiError {
    ApiError::invalid(param, message).with_code("invalid_image")
}

/// The bytes an `image_url.url` names: a `data:` URL with base64 content, or (only with
/// `allow_local`) an absolute path or `file://` URL on the server's machine.
pub fn fetch(url: &str, param: &str, limits: &Limits, allow_local: bool) -> Result<Vec<u8>, ApiError> {
    let max = limits.max_image_bytes;
    if let Some(rest) = url.strip_prefix("data:") {
        let (meta, payload) = rest
            .split_once(',')
            .ok_or_else(|| invalid_image(param, "a data: URL needs a comma before its content".into()))?;
        let mut meta = meta.split(';');
        let media = meta.next().unwrap_or_default().trim().to_ascii_lowercase();
        if !media.is_empty() && !MEDIA_TYPES.contains(&media.as_str()) {
            return Err(invalid_image(param, format!("unsupported image type `{media}` (PNG, JPEG or WebP)")));
        }
        if !meta.any(|m| m.trim().eq_ignore_ascii_case("base64")) {
            return Err(invalid_image(param, "the data: URL must be base64 (`data:image/png;base64,...`)".into()));
        }
        // 4 base64 characters carry 3 bytes: refuse before decoding anything
        if payload.len() / 4 * 3 > max.saturating_add(3) {
            return Err(too_large(
                param,
                format!(
                    "the image is about {} bytes; the limit is {max} bytes (--max-image-bytes)",
                    payload.len() / 4 * 3
                ),
            ));
        }
        let bytes = BASE64
            .decode(payload)
            .map_err(|e| invalid_image(param, format!("the data: URL's content is not valid base64: {e}")))?;
        if bytes.len() > max {
            return Err(too_large(
                param,
                format!("the image is {} bytes; the limit is {max} bytes (--max-image-bytes)", bytes.len()),
            ));
        }
        return Ok(bytes);
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        return Err(ApiError::invalid(
            param,
            "remote image URLs are not fetched by this server: send the image inline as a data: URL \
             (data:image/png;base64,...)",
        ));
    }
    let path = Path::new(url.strip_prefix("file://").unwrap_or(url));
    if !path.is_absolute() {
        return Err(ApiError::invalid(
            param,
            "`image_url.url` must be a data: URL (data:image/png;base64,...), or with --allow-local-files an \
             absolute path or file:// URL",
        ));
    }
    if !allow_local {
        return Err(ApiError::invalid(
            param,
            "local image files are refused: start the server with --allow-local-files",
        )
        .with_status(StatusCode::FORBIDDEN));
    }
    let unreadable = |e: std::io::Error| invalid_image(param, format!("cannot read {}: {e}", path.display()));
    let len = std::fs::metadata(path).map_err(unreadable)?.len();
    if len > max as u64 {
        return Err(too_large(
            param,
            format!("{} is {len} bytes; the limit is {max} bytes (--max-image-bytes)", path.display()),
        ));
    }
    std::fs::read(path).map_err(unreadable)
}

/// Check the header's size against the pixel limit, then decode and preprocess (CPU work: the
/// caller runs it off the async threads).
pub fn prepare(bytes: &[u8], param: &str, limits: &Limits, cfg: &PreprocessConfig) -> Result<PreparedImage, ApiError> {
    let header = processor::read_header(bytes).map_err(|m| invalid_image(param, m))?;
    let pixels = u64::from(header.width) * u64::from(header.height);
    if pixels > limits.max_image_pixels {
        return Err(too_large(
            param,
            format!(
                "the image is {} × {} = {pixels} pixels; the limit is {} pixels (--max-image-pixels)",
                header.width, header.height, limits.max_image_pixels
            ),
        ));
    }
    let img = processor::decode_rgb(bytes).map_err(|m| invalid_image(param, m))?;
    processor::prepare(&img, cfg).map_err(|e| invalid_image(param, format!("cannot preprocess the image: {e}")))
}
