//! JPEG decode through `fovea::processor::load_rgb` is bit-exact with Pillow 13.0.0's
//! `np.asarray(Image.open(f).convert("RGB"))`; goldens from `fixtures/gen/jpeg_cases.py`.
//! Corrupt or truncated JPEGs give `Error::Image` naming the file, never a panic or abort.

use std::path::{Path, PathBuf};

use fovea::error::Error;
use fovea::processor::load_rgb;
use safetensors::{Dtype, SafeTensors};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")
}

/// `(file relative to fixtures/, Pillow's RGB image)` for every case.
fn cases() -> Vec<(String, image::RgbImage)> {
    let bytes = std::fs::read(fixtures().join("goldens/jpeg/cases.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let files = meta.metadata().as_ref().unwrap().get("files").unwrap().clone();
    files
        .split(',')
        .map(|f| {
            let stem = Path::new(f).file_stem().unwrap().to_str().unwrap();
            let t = st.tensor(stem).unwrap_or_else(|e| panic!("{stem}: {e}"));
            assert_eq!(t.dtype(), Dtype::U8, "{stem}");
            let s = t.shape();
            assert!(s.len() == 3 && s[2] == 3, "{stem}: shape {s:?}");
            let img = image::RgbImage::from_raw(s[1] as u32, s[0] as u32, t.data().to_vec());
            (f.to_string(), img.unwrap())
        })
        .collect()
}

/// `(values that differ, max abs difference)`.
fn diff(a: &image::RgbImage, b: &image::RgbImage) -> (usize, i32) {
    let d = a.as_raw().iter().zip(b.as_raw()).map(|(&x, &y)| (x as i32 - y as i32).abs());
    d.fold((0, 0), |(n, m), v| (n + (v != 0) as usize, m.max(v)))
}

#[test]
fn every_case_bit_exact_with_pillow() {
    let cases = cases();
    assert!(cases.len() >= 16, "expected the generated cases plus photo.jpg and five.jpg");
    let mut bad = Vec::new();
    for (f, want) in &cases {
        let got = load_rgb(&fixtures().join(f)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(got.dimensions(), want.dimensions(), "{f}");
        let (n, max) = diff(&got, want);
        eprintln!("{f}: {n}/{} values differ, max {max}", want.as_raw().len());
        if n != 0 {
            bad.push(format!("{f}: {n} values differ (max {max})"));
        }
    }
    assert!(bad.is_empty(), "not bit-exact with Pillow:\n{}", bad.join("\n"));
}

/// JPEG is recognised by its magic bytes, not the extension.
#[test]
fn jpeg_detected_by_magic_not_extension() {
    let (f, want) = cases().into_iter().find(|(f, _)| f.contains("s101x67_420_q75")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("actually_a_jpeg.png");
    std::fs::copy(fixtures().join(&f), &p).unwrap();
    let got = load_rgb(&p).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(diff(&got, &want), (0, 0));
}

fn expect_image_error(p: &Path) -> String {
    match load_rgb(p) {
        Err(e @ Error::Image { .. }) => {
            let Error::Image { path, .. } = &e else { unreachable!() };
            assert_eq!(path, p);
            let s = e.to_string();
            assert!(s.contains(&p.display().to_string()), "message must name the file: {s}");
            s
        }
        Err(e) => panic!("{}: wrong error kind: {e}", p.display()),
        Ok(_) => panic!("{}: corrupt JPEG decoded without error", p.display()),
    }
}

#[test]
fn truncated_jpeg_is_a_clear_error() {
    let data = std::fs::read(fixtures().join("goldens/jpeg/s320x240_420_q75.jpg")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut.jpg");
    std::fs::write(&p, &data[..data.len() / 2]).unwrap();
    let msg = expect_image_error(&p);
    eprintln!("{msg}");
    assert!(msg.contains("truncated"), "{msg}");
}

/// Prefixes of a few files (headers, entropy data, progressive scans, restart intervals,
/// CMYK): accepted exactly when Pillow accepts it (then equal to the full decode), otherwise
/// `Error::Image` naming the file; never a panic or abort. Plus junk after the magic.
#[test]
fn prefixes_accepted_exactly_when_pillow_accepts_them() {
    let bytes = std::fs::read(fixtures().join("goldens/jpeg/cases.safetensors")).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let cuts = meta.metadata().as_ref().unwrap().get("cuts_ok").unwrap().clone();
    let all = cases();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.jpg");
    let mut n_files = 0;
    for entry in cuts.split(',') {
        let (stem, ok) = entry.split_once(':').unwrap();
        let ok: Vec<usize> = ok.split(' ').map(|n| n.parse().unwrap()).collect();
        let f = format!("goldens/jpeg/{stem}.jpg");
        let want = &all.iter().find(|(g, _)| *g == f).unwrap().1;
        let data = std::fs::read(fixtures().join(&f)).unwrap();
        let mut accepted = Vec::new();
        // All prefixes in the headers and near the end, every 7th in between (keeps it fast).
        let tried: Vec<usize> = (1..=data.len()).filter(|&n| n < 400 || n + 64 > data.len() || n % 7 == 0).collect();
        for &n in &tried {
            std::fs::write(&p, &data[..n]).unwrap();
            if data[..n].starts_with(&[0xFF, 0xD8, 0xFF]) {
                match load_rgb(&p) {
                    Ok(got) => {
                        assert_eq!(diff(&got, want), (0, 0), "{f} cut at {n}");
                        accepted.push(n);
                    }
                    Err(_) => {
                        expect_image_error(&p);
                    }
                }
            } else {
                // Not recognised as JPEG: goes to the `image` crate, which must fail too.
                assert!(load_rgb(&p).is_err(), "{f} cut at {n}");
            }
        }
        let ok: Vec<usize> = ok.into_iter().filter(|n| tried.contains(n)).collect();
        assert_eq!(accepted, ok, "{f}: prefix lengths accepted (left) vs Pillow's (right)");
        n_files += 1;
    }
    assert!(n_files >= 4);
    // SOI + an APP0 marker followed by junk.
    let mut junk = vec![0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x10];
    junk.extend((0u32..500).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
    std::fs::write(&p, &junk).unwrap();
    eprintln!("{}", expect_image_error(&p));
    std::fs::write(&p, [0xFF, 0xD8, 0xFF]).unwrap();
    eprintln!("{}", expect_image_error(&p));
}
