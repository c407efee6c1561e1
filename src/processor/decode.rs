//! Pillow-exact JPEG decode: `Image.open(f).convert("RGB")` as Pillow 13 (bundled libjpeg-turbo)
//! computes it, bit for bit.
//!
//! The decoder is libjpeg-turbo's, as vendored by `mozjpeg-sys` (MozJPEG 4 = libjpeg-turbo plus
//! encoder-side changes) and built from C with `cc`, SIMD off. libjpeg-turbo's C and SIMD paths
//! for the ISLOW IDCT, fancy (triangle) upsampling and YCbCr→RGB are bit-identical, so this
//! matches Pillow's SIMD build; `tests/jpeg_exact.rs` checks it against Pillow's output.
//!
//! Parameters follow Pillow's `JpegDecode.c` with no draft/scale: libjpeg defaults after
//! `jpeg_read_header` (ISLOW DCT, fancy upsampling on, block smoothing on — which only acts on
//! incomplete progressive coefficients, and a truncated file is an error anyway), the colour
//! space libjpeg infers from JFIF/Adobe markers, and `out_color_space` by component count as
//! `JpegImagePlugin` picks the mode: 1 → `L` (grey, replicated by `convert("RGB")`), 3 → `RGB`,
//! 4 → `CMYK` read as `CMYK;I` (Adobe inverted) then Pillow's `cmyk2rgb`. Other component counts
//! and non-8-bit precision are errors, as in Pillow.
//!
//! Errors: libjpeg's `error_exit` unwinds (the C is built with `-fexceptions` through the
//! `unwinding` feature) and is caught here, so a corrupt file gives `Err`, never an abort.
//! Premature end of data (libjpeg's "Premature end of JPEG file" warning, after which it would
//! pad with a fake EOI) is an error too, as in Pillow (`image file is truncated`) unless
//! `LOAD_TRUNCATED_IMAGES`; other libjpeg warnings are ignored, as Pillow ignores them.
//! Requires `panic = "unwind"` (the default).

use std::os::raw::{c_int, c_ulong};
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};

use image::RgbImage;
use mozjpeg_sys as ffi;

/// `jpeg_read_header` return value for a tables-only datastream (jpeglib.h).
const JPEG_HEADER_TABLES_ONLY: c_int = 2;

/// True when `bytes` starts like a JPEG file (SOI followed by a marker).
pub(crate) fn is_jpeg(bytes: &[u8]) -> bool {
    bytes.starts_with(&[0xFF, 0xD8, 0xFF])
}

/// The message an error unwinds with.
struct JpegFailure(String);

/// Formats libjpeg's current message (code + parameters) into a `String`.
unsafe fn message(cinfo: &mut ffi::jpeg_common_struct) -> String {
    unsafe {
        let err = &*cinfo.err;
        let Some(fmt) = err.format_message else {
            return format!("libjpeg message code {}", err.msg_code);
        };
        // format_message writes up to JMSG_LENGTH_MAX (200) bytes incl. NUL; the binding
        // declares a shared `&[u8; 80]`, so call it through a pointer-typed signature.
        let mut buf = [0u8; 200];
        let f: unsafe extern "C-unwind" fn(*mut ffi::jpeg_common_struct, *mut u8) = std::mem::transmute(fmt);
        f(cinfo, buf.as_mut_ptr());
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}

/// libjpeg fatal error: unwind back to `decode_jpeg` (no panic hook, no abort).
extern "C-unwind" fn error_exit(cinfo: &mut ffi::jpeg_common_struct) {
    let msg = unsafe { message(cinfo) };
    resume_unwind(Box::new(JpegFailure(msg)));
}

/// libjpeg warnings/trace: ignored like Pillow's `output` no-op, except running out of data.
extern "C-unwind" fn emit_message(cinfo: &mut ffi::jpeg_common_struct, level: c_int) {
    let code = unsafe { (*cinfo.err).msg_code };
    if level < 0 && code == ffi::JWRN_JPEG_EOF as c_int {
        resume_unwind(Box::new(JpegFailure("premature end of JPEG data (file is truncated)".into())));
    }
}

extern "C-unwind" fn output_message(_cinfo: &mut ffi::jpeg_common_struct) {}

/// Decodes a JPEG held in memory to RGB8 exactly as Pillow's `Image.open(f).convert("RGB")`.
/// The `Err` string says what is wrong; the caller adds the path.
pub(crate) fn decode_jpeg(data: &[u8]) -> Result<RgbImage, String> {
    let (w, h, comps, px) = decode_raw(data)?;
    let n = w as usize * h as usize;
    let rgb: Vec<u8> = match comps {
        3 => px,
        1 => px.iter().flat_map(|&v| [v; 3]).collect(),
        4 => px
            .chunks_exact(4)
            .flat_map(|p| {
                // Pillow unpacks libjpeg's CMYK as "CMYK;I" (inverted, Adobe convention),
                // then `cmyk2rgb`: nk = 255 - K; out = CLIP8(nk - MULDIV255(c, nk)).
                let [c, m, y, k] = [255 - p[0], 255 - p[1], 255 - p[2], 255 - p[3]];
                let nk = 255 - k as i32;
                [c, m, y].map(|v| {
                    let t = v as i32 * nk + 128;
                    (nk - (((t >> 8) + t) >> 8)).clamp(0, 255) as u8
                })
            })
            .collect(),
        _ => unreachable!("decode_raw returns 1, 3 or 4 components"),
    };
    debug_assert_eq!(rgb.len(), n * 3);
    RgbImage::from_raw(w, h, rgb).ok_or_else(|| "decoded buffer has the wrong size".into())
}

/// The `(width, height)` of a JPEG's frame header: libjpeg reads the markers up to the first
/// scan and allocates nothing from the claimed size.
pub(crate) fn jpeg_dimensions(data: &[u8]) -> Result<(u32, u32), String> {
    with_header(data, |cinfo| Ok((cinfo.image_width, cinfo.image_height)))
}

/// Run `f` on a decompressor whose header has been read from `data`, with libjpeg's errors (and
/// running out of data) caught as `Err`; the decompressor is destroyed afterwards.
fn with_header<T>(
    data: &[u8],
    f: impl FnOnce(&mut ffi::jpeg_decompress_struct) -> Result<T, String>,
) -> Result<T, String> {
    unsafe {
        let mut err: ffi::jpeg_error_mgr = std::mem::zeroed();
        ffi::jpeg_std_error(&mut err);
        err.error_exit = Some(error_exit);
        err.emit_message = Some(emit_message);
        err.output_message = Some(output_message);
        let mut cinfo: ffi::jpeg_decompress_struct = std::mem::zeroed();
        cinfo.common.err = &mut err;

        let res = catch_unwind(AssertUnwindSafe(|| -> Result<T, String> {
            ffi::jpeg_create_decompress(&mut cinfo);
            ffi::jpeg_mem_src(&mut cinfo, data.as_ptr(), data.len() as c_ulong);
            // As Pillow: skip tables-only datastreams; the memory source never suspends.
            while ffi::jpeg_read_header(&mut cinfo, 0) == JPEG_HEADER_TABLES_ONLY {}
            f(&mut cinfo)
        }));
        ffi::jpeg_destroy_decompress(&mut cinfo);
        match res {
            Ok(r) => r,
            Err(payload) => Err(match payload.downcast::<JpegFailure>() {
                Ok(f) => f.0,
                Err(p) => resume_unwind(p), // a bug on the Rust side: keep it a panic
            }),
        }
    }
}

/// libjpeg decode with Pillow's settings: `(width, height, components, interleaved samples)`.
fn decode_raw(data: &[u8]) -> Result<(u32, u32, usize, Vec<u8>), String> {
    with_header(data, |cinfo| unsafe {
        let comps = cinfo.num_components;
        cinfo.out_color_space = match comps {
            1 => ffi::J_COLOR_SPACE::JCS_GRAYSCALE,
            3 => ffi::J_COLOR_SPACE::JCS_RGB,
            4 => ffi::J_COLOR_SPACE::JCS_CMYK,
            n => return Err(format!("cannot handle {n}-layer JPEG images")),
        };
        // libjpeg defaults, stated explicitly: Pillow changes none of them (no draft()).
        cinfo.scale_num = 1;
        cinfo.scale_denom = 1;
        cinfo.dct_method = ffi::J_DCT_METHOD::JDCT_ISLOW;
        cinfo.do_fancy_upsampling = 1;
        cinfo.do_block_smoothing = 1;
        cinfo.buffered_image = 0;
        cinfo.raw_data_out = 0;
        cinfo.quantize_colors = 0;

        ffi::jpeg_start_decompress(cinfo);
        let (w, h) = (cinfo.output_width, cinfo.output_height);
        let oc = cinfo.output_components as usize;
        if oc != comps as usize {
            return Err(format!("libjpeg gives {oc} output components for {comps}"));
        }
        let stride = w as usize * oc;
        let mut px = vec![0u8; stride * h as usize];
        let mut rows: Vec<*mut u8> = px.chunks_exact_mut(stride).map(|r| r.as_mut_ptr()).collect();
        while cinfo.output_scanline < h {
            let y = cinfo.output_scanline;
            let got = ffi::jpeg_read_scanlines(cinfo, rows[y as usize..].as_mut_ptr(), h - y);
            if got == 0 {
                return Err("libjpeg returned no scanlines".into());
            }
        }
        // No jpeg_finish_decompress: like Pillow, nothing after the last scanline (EOI,
        // trailing bytes) can make a fully decoded image fail.
        Ok((w, h, oc, px))
    })
}
