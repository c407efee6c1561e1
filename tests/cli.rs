//! The `fovea` binary as a user runs it: `dump` writes every stage, `inspect` prints the
//! accounting, and bad input is a one-line error with exit code 2 (never a panic).

mod common;

use std::process::Command;

use safetensors::SafeTensors;

fn fovea() -> Command {
    common::ensure_runtime_dir();
    Command::new(env!("CARGO_BIN_EXE_fovea"))
}

#[test]
fn dump_writes_every_stage_with_grid_metadata() {
    let out = tempfile::tempdir().unwrap();
    let path = out.path().join("stages.safetensors");
    let status = fovea()
        .args(["dump", "--backend", "cpu", "--start-pos", "2", "--model"])
        .arg(common::model_dir("vit-b"))
        .arg("--image")
        .arg(common::image_path("odd.png"))
        .arg("--out")
        .arg(&path)
        .status()
        .unwrap();
    assert!(status.success());
    let bytes = std::fs::read(&path).unwrap();
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let m = meta.metadata().as_ref().unwrap();
    let (h, w) = (m["n_llm_h"].parse::<usize>().unwrap(), m["n_llm_w"].parse::<usize>().unwrap());
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let n_vit = m["n_vit_h"].parse::<usize>().unwrap() * m["n_vit_w"].parse::<usize>().unwrap();
    assert_eq!(st.tensor("patches").unwrap().shape(), [n_vit, 3 * 8 * 8]);
    assert_eq!(st.tensor("vit").unwrap().shape(), [n_vit, 96]);
    assert_eq!(st.tensor("aligner").unwrap().shape(), [h * w, 80]);
    let types = st.tensor("block_types").unwrap();
    assert_eq!(types.dtype(), safetensors::Dtype::I64);
    let block_len = types.shape()[0];
    assert_eq!(st.tensor("block").unwrap().shape(), [block_len, 80]);
    assert_eq!(st.tensor("perm").unwrap().shape(), [h * w]);
    // start_pos 2 → one lead pad, then START.
    let t = common::st_i64(&st, "block_types");
    assert_eq!(&t[..2], &[1, 0]);
}

#[test]
fn inspect_prints_config_and_accounting() {
    let out = fovea().args(["inspect", "--model"]).arg(common::model_dir("vit-c")).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for needle in ["2 layers, dim 48", "model-00002-of-00002.safetensors", "vision accounting: OK, 27 tensors"] {
        assert!(text.contains(needle), "`{needle}` missing from:\n{text}");
    }
}

#[test]
fn bad_inputs_are_one_line_errors_with_exit_code_2() {
    let tmp = tempfile::tempdir().unwrap();
    let garbage = tmp.path().join("garbage.png");
    std::fs::write(&garbage, b"not an image").unwrap();
    let cases: Vec<(Vec<std::ffi::OsString>, &str)> = vec![
        (
            vec![
                "--model".into(),
                tmp.path().join("nope").into(),
                "--image".into(),
                common::image_path("odd.png").into(),
            ],
            "nope",
        ),
        (
            vec![
                "--model".into(),
                common::model_dir("vit-b").into(),
                "--image".into(),
                tmp.path().join("missing.png").into(),
            ],
            "missing.png",
        ),
        (
            vec!["--model".into(), common::model_dir("vit-b").into(), "--image".into(), garbage.clone().into()],
            "garbage.png",
        ),
    ];
    for (args, needle) in cases {
        let out = fovea()
            .arg("dump")
            .args(&args)
            .args(["--backend", "cpu", "--out"])
            .arg(tmp.path().join("o.st"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(needle) && !err.contains("panicked"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
