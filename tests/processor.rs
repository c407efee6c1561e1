//! Bit-exact checks of `fovea::processor` against Pillow 13.0.0 and a transcription of the
//! reference `load_image`; goldens from `fixtures/gen/resize_cases.py`.

use std::path::{Path, PathBuf};

use fovea::processor::{
    ImageKind, PreprocessConfig, build_image_block, decode_rgb, load_rgb, plan, prepare, read_header,
};
use safetensors::{Dtype, SafeTensors};

fn goldens() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/goldens/resize")
}

/// A tensor as (shape, raw little-endian bytes), checked for dtype.
fn get<'a>(st: &'a SafeTensors, name: &str, dtype: Dtype) -> (Vec<usize>, &'a [u8]) {
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(t.dtype(), dtype, "{name}");
    (t.shape().to_vec(), t.data())
}

fn ints(st: &SafeTensors, name: &str) -> Vec<i64> {
    let t = st.tensor(name).unwrap();
    match t.dtype() {
        Dtype::I32 => t.data().chunks(4).map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64).collect(),
        Dtype::I64 => t.data().chunks(8).map(|b| i64::from_le_bytes(b.try_into().unwrap())).collect(),
        d => panic!("{name}: dtype {d:?}"),
    }
}

fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    let (_, d) = get(st, name, Dtype::F32);
    d.chunks(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect()
}

fn image(st: &SafeTensors, name: &str) -> image::RgbImage {
    let (shape, d) = get(st, name, Dtype::U8);
    assert_eq!(shape.len(), 3);
    assert_eq!(shape[2], 3);
    image::RgbImage::from_raw(shape[1] as u32, shape[0] as u32, d.to_vec()).unwrap()
}

fn cfg_from(v: &[i64]) -> PreprocessConfig {
    PreprocessConfig {
        patch_size: v[0] as usize,
        downsample_ratio: v[1] as usize,
        max_n_token: v[2] as usize,
        min_pixels: v[3] as u64,
        max_wh_ratio: Some(v[4] as f64),
    }
}

#[test]
fn pillow_resize_and_pad_bit_exact() {
    let bytes = std::fs::read(goldens().join("cases.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let cases = ints(&st, "cases");
    let n = cases.len() / 3;
    assert!(n > 90, "only {n} cases");
    let mut bad = Vec::new();
    for i in 0..n {
        let (si, w, h) = (cases[3 * i], cases[3 * i + 1] as usize, cases[3 * i + 2] as usize);
        let src = image(&st, &format!("src_{si}"));
        let want_pad = image(&st, &format!("pad_{i}"));
        let want_resize = image(&st, &format!("resize_{i}"));
        let got_pad = fovea::processor::pillow_pad(&src, w, h, [127, 127, 127]);
        let got_resize = fovea::processor::pillow_resize(&src, w, h);
        let sz = (src.width(), src.height());
        if got_pad != want_pad {
            bad.push(format!("pad {sz:?} -> {w}x{h}"));
        }
        if got_resize != want_resize {
            bad.push(format!("resize {sz:?} -> {w}x{h}"));
        }
    }
    assert!(bad.is_empty(), "{} of {} mismatches: {bad:?}", bad.len(), 2 * n);
}

#[test]
fn solver_table_matches_python() {
    let bytes = std::fs::read(goldens().join("cases.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let rows = ints(&st, "solver");
    let cfg = PreprocessConfig::released();
    assert!(rows.len() / 6 > 5000);
    for r in rows.chunks(6) {
        let pl = plan(r[0] as u32, r[1] as u32, &cfg).unwrap();
        assert_eq!(
            [pl.bw, pl.bh, pl.n_llm_h, pl.n_llm_w].map(|v| v as i64),
            [r[2], r[3], r[4], r[5]],
            "{}x{}",
            r[0],
            r[1]
        );
    }
}

#[test]
fn normalisation_matches_torch() {
    let bytes = std::fs::read(goldens().join("cases.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let lut = f32s(&st, "norm_lut");
    // 392x392 needs no resize under the released config (plan = 392x392, contain = copy), so
    // the patches are exactly the normalised pixels; put every u8 value in it.
    let img = image::RgbImage::from_fn(392, 392, |x, y| {
        let v = ((y * 392 + x) % 256) as u8;
        image::Rgb([v, 255 - v, v.wrapping_mul(7)])
    });
    let got = prepare(&img, &PreprocessConfig::released()).unwrap();
    assert_eq!((got.n_vit_h, got.n_vit_w), (28, 28));
    assert!(got.resized == img);
    let p = 14;
    for (k, &v) in got.patches.iter().enumerate() {
        let (patch, e) = (k / (3 * p * p), k % (3 * p * p));
        let (c, dy, dx) = (e / (p * p), (e / p) % p, e % p);
        let (y, x) = ((patch / 28) * p + dy, (patch % 28) * p + dx);
        let px = img.get_pixel(x as u32, y as u32)[c];
        assert_eq!(v.to_bits(), lut[px as usize].to_bits(), "value {px}");
    }
}

#[test]
fn pipeline_png_matches_reference_load_image() {
    let dir = goldens();
    let bytes = std::fs::read(dir.join("pipeline.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let files = meta.metadata().as_ref().unwrap().get("files").unwrap().clone();
    let torch_lut = {
        let b = std::fs::read(dir.join("cases.safetensors")).unwrap();
        f32s(&SafeTensors::deserialize(&b).unwrap(), "norm_lut")
    };
    for (i, name) in files.split(',').enumerate() {
        let cfg = cfg_from(&ints(&st, &format!("cfg_{i}")));
        let img = load_rgb(&dir.join(name)).unwrap();
        let got = prepare(&img, &cfg).unwrap();
        let grid = ints(&st, &format!("grid_{i}"));
        assert_eq!(
            [got.n_vit_h, got.n_vit_w, got.n_llm_h, got.n_llm_w].map(|v| v as i64),
            [grid[0], grid[1], grid[2], grid[3]],
            "{name}"
        );
        let want_img = image(&st, &format!("resized_{i}"));
        assert!(got.resized == want_img, "{name}: resized image differs");
        let p = cfg.patch_size;
        assert_eq!(got.patches.len(), got.n_vit_h * got.n_vit_w * 3 * p * p);
        if st.names().iter().any(|n| *n == format!("patches_{i}")) {
            let want = f32s(&st, &format!("patches_{i}"));
            assert_eq!(want.len(), got.patches.len(), "{name}");
            let nbad = want.iter().zip(&got.patches).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!(nbad, 0, "{name}: {nbad} patch values differ");
        } else {
            // Patches too large to store: rebuild them from the golden resized image and torch's
            // per-value table, in the reference's reshape/permute order.
            let (bw, nw) = (want_img.width() as usize, got.n_vit_w);
            let raw = want_img.as_raw();
            for (k, &v) in got.patches.iter().enumerate() {
                let (patch, e) = (k / (3 * p * p), k % (3 * p * p));
                let (c, dy, dx) = (e / (p * p), (e / p) % p, e % p);
                let (y, x) = ((patch / nw) * p + dy, (patch % nw) * p + dx);
                let want = torch_lut[raw[(y * bw + x) * 3 + c] as usize];
                assert_eq!(v.to_bits(), want.to_bits(), "{name}: patch value {k}");
            }
        }
    }
}

#[test]
fn block_of_a_prepared_image() {
    let img = image::RgbImage::from_pixel(800, 600, image::Rgb([1, 2, 3]));
    let got = prepare(&img, &PreprocessConfig::released()).unwrap();
    let b = build_image_block(got.n_llm_h, got.n_llm_w, 3);
    assert_eq!(b.types.len(), 338); // spec §2.1 table: 800x600 -> 338 tokens at start_pos ≡ 3
    assert!(got.patches.iter().all(|v| v.is_finite() && (-1.0..=1.0).contains(v)));
}

#[test]
fn load_errors_name_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.png");
    let e = load_rgb(&missing).unwrap_err().to_string();
    assert!(e.contains("nope.png"), "{e}");
    let junk = dir.path().join("junk.png");
    std::fs::write(&junk, b"not an image").unwrap();
    let e = load_rgb(&junk).unwrap_err().to_string();
    assert!(e.contains("junk.png"), "{e}");
}

/// `pattern()` of the generator: sawtooth + hashed noise, u64 wrapping arithmetic.
fn pattern(w: u32, h: u32) -> image::RgbImage {
    image::RgbImage::from_fn(w, h, |x, y| {
        let (x, y) = (x as u64, y as u64);
        image::Rgb(std::array::from_fn(|c| {
            let c = c as u64;
            let hsh = x.wrapping_mul(73856093) ^ y.wrapping_mul(19349663) ^ c.wrapping_mul(83492791);
            let noise = (hsh.wrapping_mul(2654435761) >> 13) & 31;
            let smooth = (x * 3 + y * 2 + c * 50) % 256;
            ((smooth + noise) & 255) as u8
        }))
    })
}

/// FNV-1a 64.
fn fnv1a64(b: &[u8]) -> u64 {
    b.iter().fold(0xCBF29CE484222325u64, |h, &v| (h ^ v as u64).wrapping_mul(0x100000001B3))
}

#[test]
fn real_size_images_match_reference_load_image() {
    let bytes = std::fs::read(goldens().join("pipeline.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let sizes = ints(&st, "big_sizes");
    let exp = ints(&st, "big_expect");
    let cfg = PreprocessConfig::released();
    for (wh, e) in sizes.chunks(2).zip(exp.chunks(7)) {
        let img = pattern(wh[0] as u32, wh[1] as u32);
        let got = prepare(&img, &cfg).unwrap();
        let r = &got.resized;
        assert_eq!(
            [r.width() as i64, r.height() as i64, got.n_vit_h as i64, got.n_vit_w as i64],
            [e[0], e[1], e[2], e[3]],
            "{wh:?}"
        );
        assert_eq!([got.n_llm_h as i64, got.n_llm_w as i64], [e[4], e[5]], "{wh:?}");
        assert_eq!(fnv1a64(r.as_raw()), e[6] as u64, "{wh:?}: resized image differs from Pillow");
    }
}

/// `load_rgb` against Pillow's `Image.open(f).convert("RGB")` over PNG modes (L, LA, RGBA,
/// 1-bit, P, P+tRNS, I;16, 16-bit RGB/RGBA/LA) and lossless WebP: exact. Lossy WebP and JPEG
/// use different decoders (image-webp / zune-jpeg vs libwebp / libjpeg-turbo): only bounded.
#[test]
fn load_rgb_matches_pillow_convert_rgb() {
    let dir = goldens();
    let bytes = std::fs::read(dir.join("decode.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let files = meta.metadata().as_ref().unwrap().get("files").unwrap().clone();
    let mut report = Vec::new();
    for (i, entry) in files.split(',').enumerate() {
        let (name, exact) = entry.split_once(':').unwrap();
        let want = image(&st, &format!("dec_{i}"));
        let got = load_rgb(&dir.join(name)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.dimensions(), want.dimensions(), "{name}");
        let diffs: Vec<i32> =
            got.as_raw().iter().zip(want.as_raw()).map(|(&a, &b)| (a as i32 - b as i32).abs()).collect();
        let (nbad, max) = (diffs.iter().filter(|&&d| d != 0).count(), diffs.iter().copied().max().unwrap());
        report.push(format!("{name}: {nbad}/{} differ, max {max}", diffs.len()));
        if exact == "1" {
            assert_eq!(nbad, 0, "{name}: {nbad} values differ from Pillow (max {max})");
        } else {
            assert!(max <= 3, "{name}: decoder difference too large (max {max})");
        }
    }
    eprintln!("{}", report.join("\n"));
}

/// `read_header` gives the size a decode would give, for every format, from the header alone:
/// a PNG that is only a header claiming 100 000 × 100 000 pixels reads as such (the server
/// refuses it by this size before decoding), and a decode of it fails without allocating.
#[test]
fn read_header_gives_the_size_before_decoding() {
    let dir = goldens();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "png" || e == "jpg" || e == "webp"))
        .collect();
    files.sort();
    assert!(files.iter().any(|f| f.extension().unwrap() == "webp"), "{files:?}");
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let h = read_header(&bytes).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let kind = match f.extension().unwrap().to_str().unwrap() {
            "png" => ImageKind::Png,
            "jpg" => ImageKind::Jpeg,
            _ => ImageKind::WebP,
        };
        assert_eq!(h.kind, kind, "{}", f.display());
        assert_eq!((h.width, h.height), load_rgb(f).unwrap().dimensions(), "{}", f.display());
    }

    let mut huge = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    huge.extend(100_000u32.to_be_bytes());
    huge.extend(100_000u32.to_be_bytes());
    huge.extend([8, 2, 0, 0, 0, 0, 0, 0, 0]);
    let h = read_header(&huge).unwrap();
    assert_eq!((h.kind, h.width, h.height), (ImageKind::Png, 100_000, 100_000));
    assert!(decode_rgb(&huge).is_err());

    // a cut header, another format, a JPEG without a frame header, no image at all
    for (bytes, msg) in [
        (&huge[..12], "IHDR"),
        (&b"GIF89a\x01\0\x01\0"[..], "Gif images are not supported"),
        (&b"\xff\xd8\xff"[..], ""),
        (&b"hello"[..], "not a PNG, JPEG or WebP image"),
    ] {
        let e = read_header(bytes).expect_err(msg);
        assert!(!e.is_empty() && e.contains(msg), "{e}");
    }
}
