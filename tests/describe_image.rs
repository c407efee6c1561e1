//! `examples/describe_image` end to end: the bundled sample through the shipped model
//! (fixtures/models/vl-scenes), on the CPU lane and on the wgpu lane, and its error contract.
//!
//! The bundled sample is scene 4 of `python fixtures/gen/scenes.py OUT --count 5 --seed 2027`; its
//! caption comes from the scene grammar, not from a model. The reference modules (transformers +
//! timm + vision_ext) caption it correctly with the shipped weights too. Text and token ids are
//! compared exactly. `cargo test` builds the examples before running this file; with `--test
//! describe_image` alone, build the example first (`cargo build --release --example describe_image`).

mod common;

use std::path::PathBuf;
use std::process::{Command, Output};

const SAMPLE_CAPTION: &str = "a large red triangle at the top and a small yellow square at the bottom";

/// target/<profile>/examples/describe_image (cargo test builds the examples beside the tests).
fn describe_image() -> Command {
    common::ensure_runtime_dir();
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|deps| deps.parent()).unwrap();
    let path: PathBuf = dir.join("examples").join(format!("describe_image{}", std::env::consts::EXE_SUFFIX));
    assert!(path.is_file(), "{} not built (cargo test builds the examples)", path.display());
    Command::new(path)
}

fn run(args: &[&str]) -> Output {
    describe_image().args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).unwrap()
}

#[test]
fn the_bundled_sample_is_described_on_the_cpu_lane() {
    let out = run(&["--backend", "cpu"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{SAMPLE_CAPTION}\n"), "stdout holds only the description");
    let stderr = text(&out.stderr);
    let timing: Vec<&str> = stderr.lines().filter(|l| l.starts_with("describe_image:")).collect();
    assert_eq!(timing.len(), 1, "one timing line: {stderr}");
    for part in ["cpu lane", "load ", "vision encode ", "prefill ", "tok/s", "decode "] {
        assert!(timing[0].contains(part), "timing line lacks `{part}`: {}", timing[0]);
    }
}

#[test]
fn the_wgpu_lane_gives_the_same_description() {
    if !common::wgpu_adapter_or_skip() {
        return;
    }
    let out = run(&["--backend", "wgpu", common::image_path("scene.png").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{SAMPLE_CAPTION}\n"));
    assert!(text(&out.stderr).contains("wgpu lane"), "{}", text(&out.stderr));
}

/// A missing or unreadable image: one line on stderr naming the file, nothing on stdout, exit 2.
#[test]
fn bad_images_are_one_line_errors_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let not_an_image = dir.path().join("notes.png");
    std::fs::write(&not_an_image, "not an image").unwrap();
    let missing = dir.path().join("missing.jpg");
    for path in [&missing, &not_an_image] {
        let out = run(&["--backend", "cpu", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{}", path.display());
        assert!(out.stdout.is_empty(), "stdout: {}", text(&out.stdout));
        let errors: Vec<String> =
            text(&out.stderr).lines().filter(|l| l.starts_with("describe_image:")).map(String::from).collect();
        assert_eq!(errors.len(), 1, "{}", text(&out.stderr));
        assert!(errors[0].contains("error") && errors[0].contains(path.to_str().unwrap()), "{}", errors[0]);
    }
}

/// The wgpu lane writes the same tokens as the CPU lane for 20 scenes (fixtures/images/scenes:
/// `python fixtures/gen/scenes.py fixtures/images/scenes --count 20 --seed 31337`, a seed not used
/// in training). Greedy decoding, so any difference in the lanes' arithmetic that flips an argmax
/// shows. How many captions are right is printed, not asserted: that is the model's accuracy, for
/// the 200-scene test.
#[test]
fn wgpu_and_cpu_lanes_write_identical_captions_for_20_scenes() {
    use fovea::model::lm::generate::Sampling;
    use fovea::pipeline::{GenerateOptions, LaneChoice, LmRequest, generate_lm};
    use fovea::tokenizer::{ChatPrompt, ChatTokenizer};

    if !common::wgpu_adapter_or_skip() {
        return;
    }
    let model = common::root().join("fixtures/models/vl-scenes");
    let scenes = common::image_path("scenes");
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(scenes.join("captions.json")).unwrap()).unwrap();
    let index = index.as_array().unwrap();
    assert_eq!(index.len(), 20);
    let tok = ChatTokenizer::load(&model).unwrap();
    let tokens = tok.encode_chat(&ChatPrompt { system: "", question: "Describe this image.", n_images: 1 }).unwrap();
    let opts = GenerateOptions { max_tokens: 40, sampling: Sampling::default() };
    let mut right = 0;
    for scene in index {
        let image = scenes.join(scene["image"].as_str().unwrap());
        let ids = |lane| {
            let req = LmRequest { model_dir: model.clone(), tokens: tokens.clone(), images: vec![image.clone()], lane };
            generate_lm(&req, &opts, &mut |_| Ok(())).unwrap().ids
        };
        let cpu = ids(LaneChoice::Cpu);
        assert_eq!(ids(LaneChoice::Wgpu), cpu, "{}: the lanes' captions differ", image.display());
        let text: Vec<u32> = cpu.iter().map(|&i| i as u32).collect();
        right += usize::from(tok.decode(&text).unwrap() == scene["caption"].as_str().unwrap());
    }
    // past the harness's capture, so CI logs show it
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "vl-scenes: {right} of 20 scenes captioned exactly (identical on both lanes)");
}
