//! Image preprocessing for DeepSeek-V4-Flash-Vision (vision.md §2): decode to RGB8, solve the
//! target size, Pillow-exact resize/pad, cut normalised patches, and build the N-layout token
//! block. Pure CPU; mirrors the reference `inference/image_processor.py` (`load_image`,
//! `build_image_block`) as known through its public ports (see `solver.rs`, `layout.rs`).

mod decode;
mod layout;
mod resample;
mod solver;

use std::path::Path;

use image::{DynamicImage, RgbImage};

use crate::error::{Error, Result};

pub use layout::{block_len, build_image_block};
pub use resample::{pad as pillow_pad, resize_bicubic as pillow_resize};
pub use solver::{COMPRESS_PAD_TO, Plan, plan};

/// Token types of the image block (`IMAGE_START, IMAGE_PAD, IMAGE, IMAGE_NEW_LINE, IMAGE_END =
/// range(5)` in the reference); the stream id of a block position is `vocab_size + type`.
pub const IMAGE_START: u8 = 0;
pub const IMAGE_PAD: u8 = 1;
pub const IMAGE: u8 = 2;
pub const IMAGE_NEW_LINE: u8 = 3;
pub const IMAGE_END: u8 = 4;

/// Letterbox fill of `ImageOps.pad(..., color=(127, 127, 127))`.
pub const PAD_FILL: [u8; 3] = [127, 127, 127];

/// The `vision_*` settings the preprocessing depends on (config.json: `vision_patch_size`,
/// `vision_downsample_ratio`, `vision_max_n_token`, `vision_min_pixels`, `vision_max_wh_ratio`).
#[derive(Debug, Clone, PartialEq)]
pub struct PreprocessConfig {
    pub patch_size: usize,
    pub downsample_ratio: usize,
    pub max_n_token: usize,
    pub min_pixels: u64,
    pub max_wh_ratio: Option<f64>,
}

impl PreprocessConfig {
    /// The released checkpoint's values (vision.md §1.1).
    pub fn released() -> Self {
        PreprocessConfig {
            patch_size: 14,
            downsample_ratio: 3,
            max_n_token: 384,
            min_pixels: 147_456,
            max_wh_ratio: Some(8.0),
        }
    }
}

/// One image ready for the ViT.
#[derive(Debug, Clone)]
pub struct PreparedImage {
    /// `[n_vit_h*n_vit_w, 3*p*p]`, order `[c, dy, dx]` inside a patch, patches row-major over
    /// the grid; values `((u8/255) - 0.5) / 0.5` in f32 (the reference then casts to bf16).
    pub patches: Vec<f32>,
    pub n_vit_h: usize,
    pub n_vit_w: usize,
    pub n_llm_h: usize,
    pub n_llm_w: usize,
    /// The `bw × bh` image the patches were cut from (after pad or stretch).
    pub resized: RgbImage,
}

/// One image's token block (vision.md §2.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageBlock {
    /// Per block position: 0=START 1=PAD 2=IMAGE 3=NEWLINE 4=END (lead pads included).
    pub types: Vec<u8>,
    /// `perm[k]` = row-major aligner row feeding the k-th IMAGE slot.
    pub perm: Vec<u32>,
    /// Per block position, the row of `[aligner rows (n_llm_h*n_llm_w); start, pad, pad,
    /// newline, end]`: IMAGE slot k → `perm[k]`, a slot of type t → `n_llm_h*n_llm_w + t`.
    pub rows: Vec<u32>,
}

/// Decodes PNG/JPEG/WebP and converts to RGB8 like Pillow's `Image.open(p).convert("RGB")`:
/// alpha dropped (not composited), grey replicated, 16-bit RGB(A)/grey+alpha PNG reduced to
/// the high byte, 16-bit grey clamped to 255 (Pillow opens it as `I;16`; `I16_RGB` clips).
/// EXIF orientation is not applied (Pillow does not either). JPEG (detected by its `FF D8 FF`
/// magic, not the extension) goes through libjpeg-turbo with Pillow's settings and is
/// bit-exact with Pillow (`decode.rs`); everything else through the `image` crate.
pub fn load_rgb(path: &Path) -> Result<RgbImage> {
    let err = |msg: String| Error::Image { path: path.to_path_buf(), msg };
    let bytes = std::fs::read(path).map_err(|e| err(format!("cannot open: {e}")))?;
    decode_rgb(&bytes).map_err(err)
}

/// The container formats the processor decodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageKind {
    Png,
    Jpeg,
    WebP,
}

/// What an image file's header says, read without decoding any pixel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageHeader {
    pub kind: ImageKind,
    pub width: u32,
    pub height: u32,
}

/// The format and size an image's header claims. Nothing is allocated from the claimed size, so
/// a caller can refuse an image too large to decode before decoding it (a PNG header may claim
/// 100 000 × 100 000 pixels in 33 bytes). The `Err` string says what is wrong.
pub fn read_header(bytes: &[u8]) -> std::result::Result<ImageHeader, String> {
    const PNG_MAGIC: &[u8] = b"\x89PNG\r\n\x1a\n";
    let (kind, (width, height)) = if decode::is_jpeg(bytes) {
        (ImageKind::Jpeg, decode::jpeg_dimensions(bytes)?)
    } else if bytes.starts_with(PNG_MAGIC) {
        // the PNG spec puts IHDR first: length (4), "IHDR", width and height (big-endian u32)
        let ihdr = bytes.get(8..24).filter(|h| &h[4..8] == b"IHDR").ok_or("PNG without an IHDR header chunk")?;
        let be = |at: usize| u32::from_be_bytes(ihdr[at..at + 4].try_into().expect("4 bytes"));
        (ImageKind::Png, (be(8), be(12)))
    } else if image::guess_format(bytes).ok() == Some(image::ImageFormat::WebP) {
        let reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), image::ImageFormat::WebP);
        (ImageKind::WebP, reader.into_dimensions().map_err(|e| format!("cannot read the WebP header: {e}"))?)
    } else {
        return Err(match image::guess_format(bytes) {
            Ok(f) => format!("{f:?} images are not supported (PNG, JPEG or WebP)"),
            Err(_) => "not a PNG, JPEG or WebP image".into(),
        });
    };
    if width == 0 || height == 0 {
        return Err(format!("the header claims an empty {width} × {height} image"));
    }
    Ok(ImageHeader { kind, width, height })
}

/// [`load_rgb`] of an image held in memory; the `Err` string says what is wrong.
pub fn decode_rgb(bytes: &[u8]) -> std::result::Result<RgbImage, String> {
    let format = match read_header(bytes)?.kind {
        ImageKind::Jpeg => return decode::decode_jpeg(bytes).map_err(|m| format!("cannot decode JPEG: {m}")),
        ImageKind::Png => image::ImageFormat::Png,
        ImageKind::WebP => image::ImageFormat::WebP,
    };
    let reader = image::ImageReader::with_format(std::io::Cursor::new(bytes), format);
    let img = reader.decode().map_err(|e| format!("cannot decode: {e}"))?;
    Ok(match img {
        DynamicImage::ImageRgb8(i) => i,
        DynamicImage::ImageRgba8(i) => map_px(i.width(), i.height(), i.pixels().map(|p| [p[0], p[1], p[2]])),
        DynamicImage::ImageLuma8(i) => map_px(i.width(), i.height(), i.pixels().map(|p| [p[0]; 3])),
        DynamicImage::ImageLumaA8(i) => map_px(i.width(), i.height(), i.pixels().map(|p| [p[0]; 3])),
        DynamicImage::ImageRgb16(i) => map_px(i.width(), i.height(), i.pixels().map(|p| p.0.map(|v| (v >> 8) as u8))),
        DynamicImage::ImageRgba16(i) => {
            map_px(i.width(), i.height(), i.pixels().map(|p| [(p[0] >> 8) as u8, (p[1] >> 8) as u8, (p[2] >> 8) as u8]))
        }
        DynamicImage::ImageLuma16(i) => map_px(i.width(), i.height(), i.pixels().map(|p| [p[0].min(255) as u8; 3])),
        DynamicImage::ImageLumaA16(i) => map_px(i.width(), i.height(), i.pixels().map(|p| [(p[0] >> 8) as u8; 3])),
        other => other.to_rgb8(), // float images: not produced by the PNG/JPEG/WebP decoders
    })
}

/// Collects an iterator of RGB triples into a `w × h` image.
fn map_px(w: u32, h: u32, px: impl Iterator<Item = [u8; 3]>) -> RgbImage {
    let raw: Vec<u8> = px.flat_map(|p| p.into_iter()).collect();
    RgbImage::from_raw(w, h, raw).expect("one triple per pixel")
}

/// `((v / 255) - 0.5) / 0.5` in f32, one op at a time as torch evaluates
/// `x / 255` then `(x - 0.5) / 0.5` on a float32 tensor; a 256-entry table.
fn norm_lut() -> [f32; 256] {
    let mut lut = [0f32; 256];
    for (v, o) in lut.iter_mut().enumerate() {
        let x = v as f32 / 255.0f32;
        *o = (x - 0.5f32) / 0.5f32;
    }
    lut
}

/// `load_image` minus the decode: solve the size, stretch (original `w >= max_wh_ratio*h`) or
/// letterbox-pad to `bw × bh`, then cut `[n_vit_h*n_vit_w, 3*p*p]` normalised patches.
pub fn prepare(img: &RgbImage, cfg: &PreprocessConfig) -> Result<PreparedImage> {
    let (w, h) = (img.width(), img.height());
    let pl = plan(w, h, cfg)?;
    let p = cfg.patch_size;
    let (bw, bh) = (pl.bw, pl.bh);
    let stretch = cfg.max_wh_ratio.is_some_and(|r| w as f64 >= r * h as f64);
    let resized = if stretch { resample::resize_bicubic(img, bw, bh) } else { resample::pad(img, bw, bh, PAD_FILL) };
    let (n_vit_h, n_vit_w) = (bh / p, bw / p);
    let lut = norm_lut();
    let raw = resized.as_raw();
    let mut patches = vec![0f32; n_vit_h * n_vit_w * 3 * p * p];
    // x.reshape(3, n_vit_h, p, n_vit_w, p).permute(1, 3, 0, 2, 4): [gy, gx, c, dy, dx]
    for gy in 0..n_vit_h {
        for gx in 0..n_vit_w {
            let base = (gy * n_vit_w + gx) * 3 * p * p;
            for c in 0..3 {
                for dy in 0..p {
                    let row = (gy * p + dy) * bw;
                    let dst = base + (c * p + dy) * p;
                    for dx in 0..p {
                        patches[dst + dx] = lut[raw[(row + gx * p + dx) * 3 + c] as usize];
                    }
                }
            }
        }
    }
    Ok(PreparedImage { patches, n_vit_h, n_vit_w, n_llm_h: pl.n_llm_h, n_llm_w: pl.n_llm_w, resized })
}
