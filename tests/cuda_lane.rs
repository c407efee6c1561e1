//! The CUDA lane's own contract: shape errors name the op (never a panic), the language-model ops
//! are refused by name, memory is accounted like the other lanes, and the CLI either runs the
//! vision dump on CUDA or says in one line why it cannot. The tests that need a device skip,
//! loudly, without a CUDA driver (and fail instead under `FOVEA_REQUIRE_CUDA=1`); the CLI tests
//! run everywhere.

mod common;

use std::borrow::Cow;
use std::process::Command;

use fovea::Error;
use fovea::backend::cuda::{CudaBackend, CudaTensor, CudaWeight};
use fovea::backend::{Backend, DeviceTensor, HostTensor, HostWeight, Op, WeightFormat};

/// The `fovea` binary built with this test, unless `FOVEA_BIN` names another (prebuilt test
/// executables run on another machine).
fn fovea_bin() -> Command {
    common::ensure_runtime_dir();
    match std::env::var_os("FOVEA_BIN") {
        Some(bin) if !bin.is_empty() => Command::new(bin),
        _ => Command::new(env!("CARGO_BIN_EXE_fovea")),
    }
}

fn up(b: &CudaBackend, shape: &[usize]) -> <CudaBackend as Backend>::Tensor {
    let n = shape.iter().product();
    b.upload(&HostTensor::f32(shape.to_vec(), (0..n).map(|i| i as f32 * 0.01).collect()).unwrap()).unwrap()
}

fn shape_err<T: std::fmt::Debug>(r: fovea::Result<T>, op: &str) {
    match r {
        Err(Error::Shape { op: got, msg }) => assert_eq!(got, op, "{msg}"),
        other => panic!("{op}: expected a shape error, got {other:?}"),
    }
}

#[test]
fn cuda_shape_errors_name_the_op() {
    let Some(b) = common::cuda_lane_or_skip() else { return };
    let (a, t) = (up(&b, &[2, 3]), up(&b, &[3, 2]));
    shape_err(b.add(&a, &t), "add");
    shape_err(b.slice_cols(&a, 2, 2), "slice_cols");
    shape_err(b.slice_cols(&a, usize::MAX, 2), "slice_cols");
    shape_err(b.concat_rows(&a, &t), "concat_rows");
    let idx = b.upload(&HostTensor::i32([2], vec![0, 1]).unwrap()).unwrap();
    shape_err(b.concat_rows(&a, &idx), "concat_rows");
    shape_err(b.gather_rows(&a, &a), "gather_rows");
    shape_err(b.swiglu(&a), "swiglu");
    shape_err(b.gelu_erf(&idx), "gelu_erf");
    shape_err(b.rms_norm(&a, &up(&b, &[2]), 1e-6), "rms_norm");
    shape_err(b.rope_2d(&up(&b, &[4, 8]), 3, 2, 100.0), "rope_2d");
    shape_err(b.rope_2d(&up(&b, &[4, 8]), 1, 3, 100.0), "rope_2d");
    shape_err(b.rope_2d(&up(&b, &[4, 6]), 1, 2, 100.0), "rope_2d");
    shape_err(b.attention(&a, &a, &t, 1), "attention");
    shape_err(b.attention(&a, &a, &a, 2), "attention");
    shape_err(b.unfold(&up(&b, &[6, 2]), 2, 2, 2), "unfold");
    shape_err(b.unfold(&up(&b, &[4, 2]), 2, 2, 0), "unfold");
    let w = b
        .upload_weight(&HostWeight {
            name: "w".into(),
            format: WeightFormat::BF16,
            rows: 4,
            cols: 2,
            bytes: Cow::Owned(vec![0; 16]),
        })
        .unwrap();
    shape_err(b.linear(&a, &w, None), "linear");
    shape_err(b.linear(&t, &w, Some(&up(&b, &[3]))), "linear");
    // a malformed weight is refused before anything reaches the device
    let bad =
        HostWeight { name: "bad".into(), format: WeightFormat::F16, rows: 4, cols: 2, bytes: Cow::Owned(vec![0; 15]) };
    assert!(matches!(b.upload_weight(&bad), Err(Error::Tensor { .. })));
    // and the lane still works afterwards
    let y = b.linear(&t, &w, None).unwrap();
    assert_eq!(y.shape(), [3, 4]);
    assert_eq!(b.download(&y).unwrap().into_f32("y").unwrap(), vec![0.0; 12]);
}

/// `Backend::launches` counts kernel launches: an elementwise op is one (a download is a copy,
/// not a launch).
#[test]
fn cuda_launches_count_kernels() {
    let Some(b) = common::cuda_lane_or_skip() else { return };
    let a = up(&b, &[2, 3]);
    let before = b.launches().expect("the CUDA lane counts its launches");
    let y = b.add(&a, &a).unwrap();
    assert_eq!(b.launches(), Some(before + 1));
    b.download(&y).unwrap();
    assert_eq!(b.launches(), Some(before + 1));
}

/// `Options::kernel_times`: each launch since the last read counted once under its kernel's name
/// (the launch counter and the timer both sit in the lane's one launch path), with a positive
/// device time; a read empties the sums; by grid, the names carry the grid.
#[test]
fn cuda_kernel_times_sum_each_kernel() {
    let opts = fovea::backend::cuda::Options { kernel_times: true, kernel_times_by_grid: false, ..Default::default() };
    let Some(b) = common::cuda_lane_with_or_skip(opts) else { return };
    let a = up(&b, &[64, 256]);
    b.kernel_times().unwrap();
    let before = b.launches().unwrap();
    let y = b.add(&a, &a).unwrap();
    let z = b.rms_norm(&y, &up(&b, &[256]), 1e-6).unwrap();
    b.add(&z, &y).unwrap();
    let launched = b.launches().unwrap() - before;
    let times = b.kernel_times().unwrap().expect("kernel_times was asked for");
    assert_eq!(times.iter().map(|k| k.count).sum::<u64>(), launched, "{times:?}");
    assert!(times.iter().all(|k| k.seconds > 0.0 && k.seconds < 1.0), "{times:?}");
    let add = times.iter().find(|k| k.name == "add_f32").unwrap_or_else(|| panic!("no add_f32 in {times:?}"));
    assert_eq!(add.count, 2, "{times:?}");
    assert!(times.windows(2).all(|w| w[0].seconds >= w[1].seconds), "longest first: {times:?}");
    assert_eq!(b.kernel_times().unwrap(), Some(Vec::new()), "a read empties the list");
    // by grid: the kernel's name, then its grid
    let opts = fovea::backend::cuda::Options { kernel_times: true, kernel_times_by_grid: true, ..Default::default() };
    let by_grid = common::cuda_lane_with_or_skip(opts).expect("a second lane on the same device");
    let a = up(&by_grid, &[64, 256]);
    by_grid.add(&a, &a).unwrap();
    let times = by_grid.kernel_times().unwrap().expect("kernel_times_by_grid was asked for");
    assert!(times.len() == 1 && times[0].name.starts_with("add_f32 ") && times[0].name.ends_with("x1x1"), "{times:?}");
    if std::env::var_os("FOVEA_GPU_TIMES").is_none() {
        let Some(untimed) = common::cuda_lane_or_skip() else { return };
        assert_eq!(untimed.kernel_times().unwrap(), None);
    }
}

/// Programmatic dependent launch (on unless `FOVEA_PDL=0`, sm_90+) lets a kernel start before the one
/// before it ends; each kernel's `grid_wait()` must still hold its reads until then. A chain in
/// which every kernel reads what the previous one wrote gives the same bits with and without it.
/// (Below sm_90 both lanes launch alike, and the test only checks the launcher's arguments.)
#[test]
fn cuda_dependent_launch_keeps_the_stream_order() {
    use fovea::backend::cuda::Options;
    let base = Options { kernel_times: false, ..explicit_timed_options() };
    let Some(plain) = common::cuda_lane_with_or_skip(Options { dependent_launch: false, ..base.clone() }) else {
        return;
    };
    let pdl = CudaBackend::with_options(Options { dependent_launch: true, ..base }).unwrap();
    assert!(!plain.dependent_launch());
    assert_eq!(pdl.dependent_launch(), pdl.arch() >= 90, "sm_{}", pdl.arch());
    if !pdl.dependent_launch() {
        eprintln!("NOTE: sm_{} has no programmatic dependent launch; both lanes launch alike", pdl.arch());
    }
    let chain = |b: &CudaBackend| {
        // [512, 4096]: each kernel long enough that a reader let in early would see stale rows
        let (rows, cols) = (512, 4096);
        let n = rows * cols;
        let x0 = HostTensor::f32(vec![rows, cols], (0..n).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect());
        let mut x = b.upload(&x0.unwrap()).unwrap();
        let w = up(b, &[cols]);
        for _ in 0..64 {
            let y = b.add(&x, &x).unwrap();
            x = b.rms_norm(&y, &w, 1e-6).unwrap();
        }
        b.download(&x).unwrap()
    };
    let (a, c) = (chain(&plain), chain(&pdl));
    assert_eq!(a.as_f32().unwrap(), c.as_f32().unwrap(), "the chain's bits differ with dependent launch");
}

#[test]
fn cuda_lane_claims_every_op_of_the_contract() {
    let Some(b) = common::cuda_lane_or_skip() else { return };
    assert_eq!(b.lane(), "cuda");
    assert!(b.device_name().contains("sm_"), "{}", b.device_name());
    for op in Op::VISION {
        for f in WeightFormat::ALL {
            assert!(b.supports(op, f), "{op:?} {f}");
        }
    }
    for op in Op::LM {
        assert!(b.supports(op, WeightFormat::F32), "{op:?}");
    }
}

#[test]
fn cuda_memory_is_accounted_like_the_other_lanes() {
    let Some(b) = common::cuda_lane_or_skip() else { return };
    assert_eq!(b.memory(), Default::default());
    let w = b
        .upload_weight(&HostWeight {
            name: "w".into(),
            format: WeightFormat::BF16,
            rows: 64,
            cols: 128,
            bytes: Cow::Owned(vec![0; 64 * 128 * 2]),
        })
        .unwrap();
    let bias = b.upload_param(&HostTensor::f32([64], vec![0.5; 64]).unwrap()).unwrap();
    assert_eq!(b.memory().weight_bytes, 64 * 128 * 2 + 64 * 4);
    {
        let x = up(&b, &[4, 128]);
        let y = b.linear(&x, &w, Some(&bias)).unwrap();
        assert_eq!(b.download(&y).unwrap().into_f32("y").unwrap(), vec![0.5; 4 * 64]);
        let m = b.memory();
        assert_eq!(m.activation_bytes, 4 * 128 * 4 + 4 * 64 * 4);
    }
    let m = b.memory();
    assert_eq!(m.activation_bytes, 0);
    assert_eq!(m.peak_activation_bytes, 4 * 128 * 4 + 4 * 64 * 4);
    drop((w, bias));
    assert_eq!(b.memory().weight_bytes, 0);
}

/// Guard bands catch a write past the end of an output (so `cuda_ops_match_cpu`'s guard check is
/// not vacuous): `check_guards` and `download` name the op that produced the tensor.
#[test]
fn cuda_guard_bands_catch_a_write_past_the_end() {
    let Some(b) =
        common::cuda_lane_with_or_skip(fovea::backend::cuda::Options { guard_words: 4, ..Default::default() })
    else {
        return;
    };
    let x = up(&b, &[2, 3]);
    let y = b.gelu_erf(&x).unwrap();
    b.check_guards(&y).unwrap();
    b.debug_poke(&y, 5, 0x3f80_0000).unwrap(); // inside the tensor: fine
    b.check_guards(&y).unwrap();
    b.debug_poke(&y, 6 + 2, 0x1234_5678).unwrap(); // third guard word
    let err = b.check_guards(&y).unwrap_err().to_string();
    assert!(err.contains("gelu_erf") && err.contains("[2]") && err.contains("0x12345678"), "{err}");
    assert!(b.download(&y).is_err());
    assert!(b.debug_poke(&y, 6 + 4, 0).is_err(), "poke outside the allocation must be refused");
}

/// Several backends in one process share the compiled PTX (compiled once per architecture) and
/// each loads it into its own context.
#[test]
fn cuda_two_backends_in_one_process() {
    let Some(a) = common::cuda_lane_or_skip() else { return };
    let Some(b) = common::cuda_lane_or_skip() else { return };
    for lane in [&a, &b] {
        let x = up(lane, &[3, 5]);
        let y = lane.add(&x, &x).unwrap();
        let got = lane.download(&y).unwrap().into_f32("y").unwrap();
        assert_eq!(got, (0..15).map(|i| 2.0 * (i as f32 * 0.01)).collect::<Vec<_>>());
    }
}

/// `fovea dump --backend cuda --precision exact` on a vision checkpoint: on a CUDA machine it
/// writes the same stages as the CPU lane (within the f32 golden tolerance); elsewhere it is a
/// one-line error naming what is missing, exit code 2.
#[test]
fn cli_vision_dump_runs_on_cuda_or_says_why_not() {
    let tmp = tempfile::tempdir().unwrap();
    let run = |lane: &str| {
        let path = tmp.path().join(format!("{lane}.safetensors"));
        let out = fovea_bin()
            .args(["dump", "--backend", lane, "--precision", "exact", "--model"])
            .arg(common::model_dir("vit-b"))
            .arg("--image")
            .arg(common::image_path("odd.png"))
            .arg("--out")
            .arg(&path)
            .output()
            .unwrap();
        (out, path)
    };
    let (out, path) = run("cuda");
    let err = String::from_utf8_lossy(&out.stderr);
    if fovea::backend::cuda::probe().is_err() && !common::cuda_required() {
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("CUDA") && !err.contains("panicked"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        return;
    }
    assert!(out.status.success(), "{err}");
    assert!(err.contains("cuda lane"), "{err}");
    let (cpu_out, cpu_path) = run("cpu");
    assert!(cpu_out.status.success(), "{}", String::from_utf8_lossy(&cpu_out.stderr));
    let (ours, theirs) = (std::fs::read(&path).unwrap(), std::fs::read(&cpu_path).unwrap());
    let (ours, theirs) = (
        safetensors::SafeTensors::deserialize(&ours).unwrap(),
        safetensors::SafeTensors::deserialize(&theirs).unwrap(),
    );
    for name in ["vit", "aligner", "block"] {
        let e = common::rel_l2(&common::st_f32(&ours, name), &common::st_f32(&theirs, name));
        assert!(e <= 2e-5, "{name}: cuda vs cpu rel L2 {e:.2e}");
    }
    assert_eq!(common::st_i64(&ours, "perm"), common::st_i64(&theirs, "perm"));
}

/// `fovea generate --backend cuda` on the language model, in each precision: on a CUDA machine
/// the greedy tokens are the CPU lane's; elsewhere a one-line error naming what is missing, exit
/// code 2.
#[test]
fn cli_lm_generate_runs_on_cuda_or_says_why_not() {
    let run = |lane: &str, precision: &str| {
        fovea_bin()
            .args([
                "generate",
                "--backend",
                lane,
                "--precision",
                precision,
                "--print-ids",
                "--max-tokens",
                "16",
                "--token-ids",
                "1,2,3",
                "--model",
            ])
            .arg(common::model_dir("lm-tiny"))
            .output()
            .unwrap()
    };
    let cpu = run("cpu", "exact");
    assert!(cpu.status.success(), "{}", String::from_utf8_lossy(&cpu.stderr));
    for precision in ["exact", "fast"] {
        let out = run("cuda", precision);
        let err = String::from_utf8_lossy(&out.stderr);
        if fovea::backend::cuda::probe().is_err() && !common::cuda_required() {
            assert_eq!(out.status.code(), Some(2), "{err}");
            assert!(err.contains("CUDA") && !err.contains("panicked"), "{err}");
            assert_eq!(err.trim().lines().count(), 1, "{err}");
            return;
        }
        assert!(out.status.success(), "{err}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&cpu.stdout),
            "greedy ids differ ({precision})"
        );
    }
}

/// `--precision fast` where the lane has no fast kernels (the CPU lane, and `auto` when it falls
/// back to the CPU lane: here, where the only adapter is a software one) is a one-line error
/// naming the lane and the way out, not a silent f32 run; exit code 2. So is an unknown precision,
/// from the flag or from FOVEA_PRECISION.
#[test]
fn fast_precision_on_the_cpu_lane_is_a_clear_error() {
    let run = |args: &[&str], env: Option<&str>| {
        let mut c = fovea_bin();
        c.args(["generate", "--print-ids", "--max-tokens", "2", "--token-ids", "1,2,3", "--model"])
            .arg(common::model_dir("lm-tiny"))
            .args(args)
            .env_remove("FOVEA_PRECISION");
        if let Some(v) = env {
            c.env("FOVEA_PRECISION", v);
        }
        c.output().unwrap()
    };
    // `auto` takes a GPU adapter (fast where it has f16 shaders) and falls back to the CPU lane
    // only without one
    common::ensure_runtime_dir();
    let auto_is_cpu = fovea::backend::wgpu::WgpuBackend::new(None).map_or(true, |b| b.is_software());
    for (args, env, needle) in [
        (&["--backend", "cpu", "--precision", "fast"][..], None, "cpu"),
        (&["--backend", "auto", "--precision", "fast"][..], None, "auto"),
        (&["--backend", "cpu"][..], Some("fast"), "cpu"),
        (&["--backend", "cpu", "--precision", "half"][..], None, "half"),
        (&["--backend", "cpu"][..], Some("half"), "FOVEA_PRECISION"),
    ] {
        if args[1] == "auto" && !auto_is_cpu {
            continue;
        }
        let out = run(args, env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(err.contains(needle) && !err.contains("panicked"), "{args:?} {env:?}: {err}");
        if needle != "half" {
            // (clap words a bad flag value itself, with a usage hint)
            assert_eq!(err.trim().lines().count(), 1, "{err}");
        }
    }
    // exact on the CPU lane, asked for in either way, runs
    assert!(run(&["--backend", "cpu", "--precision", "exact"], None).status.success());
    assert!(run(&["--backend", "cpu"], Some("exact")).status.success());
}

#[test]
fn backend_names_parse() {
    use fovea::pipeline::LaneChoice;
    assert_eq!("cuda".parse::<LaneChoice>().unwrap(), LaneChoice::Cuda);
    assert_eq!("CUDA".parse::<LaneChoice>().unwrap(), LaneChoice::Cuda);
    let err = "metal".parse::<LaneChoice>().unwrap_err().to_string();
    assert!(err.contains("cuda"), "{err}");
}

/// Edge cases of the LM ops that the op harness does not reach: a query that sees no key at all
/// (empty window, only −1 slots) gets zeros whatever its sink (the CPU lane's result); operands
/// the CPU lane rejects give NaN heads / rows instead; moe_experts is bitwise reproducible.
#[test]
fn cuda_lm_edge_cases() {
    let Some(b) = common::cuda_lane_or_skip() else { return };
    let f = |shape: &[usize], v: Vec<f32>| b.upload(&HostTensor::f32(shape.to_vec(), v).unwrap()).unwrap();
    let i = |shape: &[usize], v: Vec<i32>| b.upload(&HostTensor::i32(shape.to_vec(), v).unwrap()).unwrap();
    let get = |t: &<CudaBackend as Backend>::Tensor| b.download(t).unwrap().into_f32("t").unwrap();

    // 2 heads of hd 2. Query 0: empty window, every slot −1; query 1: window 0..=1 and comp 0;
    // query 2: a window past the keys (NaN heads).
    let q = f(&[3, 4], vec![0.5; 12]);
    let kv = f(&[2, 2], vec![1.0, 2.0, 3.0, 4.0]);
    let win = i(&[3, 2], vec![1, 0, 0, 1, 0, 2]);
    let comp = f(&[1, 2], vec![5.0, 6.0]);
    let idx = i(&[3, 2], vec![-1, -1, 0, -1, -1, -1]);
    for sinks in [vec![0.3, f32::NEG_INFINITY], vec![f32::NEG_INFINITY, f32::NEG_INFINITY]] {
        let s = f(&[2], sinks);
        let out = get(&b.sink_attention(&q, &kv, &win, Some((&comp, &idx)), &s, 2).unwrap());
        assert_eq!(&out[..4], &[0.0; 4], "a query without keys gives zeros: {out:?}");
        assert!(out[4..8].iter().all(|v| v.is_finite() && *v > 0.0), "{out:?}");
        assert!(out[8..].iter().all(|v| v.is_nan()), "a window past the keys gives NaN heads: {out:?}");
    }

    let (n, d, h, e, k) = (40, 24, 16, 4, 3);
    let x = f(&[n, d], (0..n * d).map(|j| ((j * 37 % 101) as f32 - 50.0) * 0.02).collect());
    let ids = i(&[n, k], (0..n * k).map(|j| (j * 7 % e) as i32).collect());
    let wts = f(&[n, k], (0..n * k).map(|j| 0.1 + (j % 5) as f32 * 0.2).collect());
    let w = |rows: usize, cols: usize, seed: usize| {
        let v: Vec<u8> =
            (0..rows * cols).flat_map(|j| (((j * seed + 3) % 17) as f32 * 0.03 - 0.24).to_le_bytes()).collect();
        let hw = HostWeight { name: "expert".into(), format: WeightFormat::F32, rows, cols, bytes: Cow::Owned(v) };
        b.upload_weight(&hw).unwrap()
    };
    let w1: Vec<_> = (0..e).map(|s| w(h, d, s + 1)).collect();
    let w3: Vec<_> = (0..e).map(|s| w(h, d, s + 9)).collect();
    let w2: Vec<_> = (0..e).map(|s| w(d, h, s + 5)).collect();
    let a = get(&b.moe_experts(&x, &ids, &wts, &w1, &w3, &w2, 0.8).unwrap());
    let c = get(&b.moe_experts(&x, &ids, &wts, &w1, &w3, &w2, 0.8).unwrap());
    assert!(a.iter().zip(&c).all(|(p, q)| p.to_bits() == q.to_bits()), "moe_experts is not reproducible");
    assert!(a.iter().all(|v| v.is_finite()) && a.iter().any(|v| *v != 0.0));
    // an id outside the experts makes its token's row NaN and leaves the others as they were
    let bad = i(&[n, k], (0..n * k).map(|j| if j == k { e as i32 } else { (j * 7 % e) as i32 }).collect());
    let z = get(&b.moe_experts(&x, &bad, &wts, &w1, &w3, &w2, 0.8).unwrap());
    assert!(z[d..2 * d].iter().all(|v| v.is_nan()), "{:?}", &z[d..2 * d]);
    assert!(z[..d] == a[..d] && z[2 * d..] == a[2 * d..]);
}

/// The kernels a lane ran since its last `kernel_times` read, by name (it keeps kernel times).
fn ran_kernels(b: &CudaBackend) -> Vec<String> {
    b.kernel_times().unwrap().expect("the lane keeps kernel times").into_iter().map(|t| t.name).collect()
}

/// The kernels that ran since the lane's kernel times were last read, with how often each ran,
/// by name.
fn ran_kernel_counts(b: &CudaBackend) -> Vec<(String, u64)> {
    let times = b.kernel_times().unwrap().expect("the lane keeps kernel times");
    let mut ran: Vec<(String, u64)> = times.into_iter().map(|k| (k.name, k.count)).collect();
    ran.sort();
    ran
}

/// How many of two equally long outputs' values differ in their bits.
fn bits_apart(a: &[f32], b: &[f32]) -> usize {
    a.iter().zip(b).filter(|(u, v)| u.to_bits() != v.to_bits()).count()
}

/// Options with kernel times by name and every fused launch on, whatever the environment says
/// (`Default` reads FOVEA_GPU_TIMES, FOVEA_PDL and the fused launches' diagnostic switches), and
/// the tensor-core sink attention on.
fn explicit_timed_options() -> fovea::backend::cuda::Options {
    fovea::backend::cuda::Options {
        kernel_times: true,
        kernel_times_by_grid: false,
        dependent_launch: false,
        separate_linear_pair: false,
        separate_hc_split_norm: false,
        separate_hc_post: false,
        separate_linear_add: false,
        separate_rms_norm_linear: false,
        q8x: true,
        sink_tensor_cores: true,
        ..Default::default()
    }
}

/// Two linears of one input in one launch (`linear_pair_*`) write the bits of two `linear`
/// launches (`separate_linear_pair`): the shapes of a decode step's wq_a and wkv (Q8_0) and of a
/// compressor's wkv and wgate (F16), one row and three.
#[test]
fn cuda_linear_pair_matches_two_linears_bit_for_bit() {
    use fovea::backend::cuda::Options;
    use rand::SeedableRng;
    let timed = explicit_timed_options();
    let Some(one) = common::cuda_lane_with_or_skip(timed.clone()) else { return };
    let two = CudaBackend::with_options(Options { separate_linear_pair: true, ..timed }).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(0x9a1e);
    let k = 4096;
    for (format, a, b) in [(WeightFormat::Q8_0, 1024, 512), (WeightFormat::F16, 1024, 1024)] {
        let (ba, bb) =
            (common::blocks::weight_bytes(&mut r, format, a, k), common::blocks::weight_bytes(&mut r, format, b, k));
        for n in [1, 3] {
            let x: Vec<f32> = (0..n * k).map(|j| ((j * 37 % 101) as f32 - 50.0) * 0.02).collect();
            let run = |lane: &CudaBackend| {
                let w = |rows: usize, bytes: &[u8]| {
                    let hw = HostWeight { name: "w".into(), format, rows, cols: k, bytes: Cow::Borrowed(bytes) };
                    lane.upload_weight(&hw).unwrap()
                };
                let (wa, wb) = (w(a, &ba), w(b, &bb));
                let xt = lane.upload(&HostTensor::f32(vec![n, k], x.clone()).unwrap()).unwrap();
                let (ya, yb) = lane.linear_pair(&xt, &wa, &wb).unwrap();
                let get = |t| lane.download(t).unwrap().into_f32("y").unwrap();
                (get(&ya), get(&yb))
            };
            let ((a1, b1), (a2, b2)) = (run(&one), run(&two));
            let pair = format!("linear_pair_{}", format.name().to_lowercase());
            assert!(ran_kernels(&one).contains(&pair), "{format} n {n}: {pair} did not run");
            assert!(!ran_kernels(&two).contains(&pair), "{format} n {n}: {pair} ran where two linears were asked for");
            assert!(a1.iter().chain(&b1).all(|v| v.is_finite()), "{format} n {n}");
            assert_eq!(bits_apart(&a1, &a2) + bits_apart(&b1, &b2), 0, "{format} n {n}: one launch and two differ");
        }
    }
}

/// `linear_add` of one row without a bias in one launch (the residual as the linear's bias)
/// writes the bits of `linear` then `add` (`separate_linear_add`), in fast precision: a decode
/// step's shared expert down projection (Q8_0, 4 096 × 2 048: the small-row path), a q8x-wide one
/// (Q8_0, 8 192 outputs: `linear_q8x_q8_0`) and a narrow F16 one (24 × 16 384: split over k, then
/// `sum_splits_f32`); three rows take the two launches either way.
#[test]
fn cuda_linear_add_of_one_row_is_one_launch_with_the_bits_of_two() {
    use fovea::backend::Precision;
    use fovea::backend::cuda::Options;
    use rand::{Rng, SeedableRng};
    let fast = Options { precision: Precision::Fast, ..explicit_timed_options() };
    let Some(one) = common::cuda_lane_with_or_skip(fast.clone()) else { return };
    let two = CudaBackend::with_options(Options { separate_linear_add: true, ..fast }).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(0x11add);
    let cases = [
        (WeightFormat::Q8_0, 4096, 2048, "linear_q8_0"),
        (WeightFormat::Q8_0, 8192, 1024, "linear_q8x_q8_0"),
        (WeightFormat::F16, 24, 16384, "sum_splits_f32"),
    ];
    for (format, out, k, kernel) in cases {
        let bytes = common::blocks::weight_bytes(&mut r, format, out, k);
        for n in [1, 3] {
            let x: Vec<f32> = (0..n * k).map(|_| r.random_range(-1.0f32..1.0)).collect();
            let res: Vec<f32> = (0..n * out).map(|_| r.random_range(-4.0f32..4.0)).collect();
            let run = |lane: &CudaBackend| {
                let hw = HostWeight { name: "w".into(), format, rows: out, cols: k, bytes: Cow::Borrowed(&bytes) };
                let w = lane.upload_weight(&hw).unwrap();
                let xt = lane.upload(&HostTensor::f32(vec![n, k], x.clone()).unwrap()).unwrap();
                let rt = lane.upload(&HostTensor::f32(vec![n, out], res.clone()).unwrap()).unwrap();
                lane.kernel_times().unwrap(); // from here on
                let y = lane.linear_add(&xt, &w, None, &rt).unwrap();
                let ran = ran_kernel_counts(lane);
                (lane.download(&y).unwrap().into_f32("y").unwrap(), ran)
            };
            let ((y1, ran1), (y2, ran2)) = (run(&one), run(&two));
            let ran = |ran: &[(String, u64)], kernel: &str| ran.iter().any(|(name, _)| name == kernel);
            if n == 1 {
                assert!(
                    ran(&ran1, kernel) && ran(&ran2, kernel),
                    "{format} [{out}, {k}]: no {kernel}: {ran1:?} {ran2:?}"
                );
            }
            let adds = |ran: &[(String, u64)]| ran.iter().filter(|(name, _)| name == "add_f32").count();
            assert_eq!(adds(&ran2), 1, "{format} [{out}, {k}] n {n}: asked for linear then add: {ran2:?}");
            assert_eq!(adds(&ran1), usize::from(n > 1), "{format} [{out}, {k}] n {n}: {ran1:?}");
            assert_eq!(ran1.len() + usize::from(n == 1), ran2.len(), "{format} [{out}, {k}] n {n}: {ran1:?} {ran2:?}");
            assert!(y1.iter().all(|v| v.is_finite()), "{format} [{out}, {k}] n {n}");
            assert_eq!(bits_apart(&y1, &y2), 0, "{format} [{out}, {k}] n {n}: one launch and two differ");
        }
    }
}

/// `rms_norm_linear` of one row on int8 activations (fast precision) in one launch
/// (`linear_q8x_q8_0` norming the row first) writes the bits of `rms_norm_f32` then
/// `linear_q8x_q8_0` (`separate_rms_norm_linear`):
/// a decode step's q_norm and wq_b (Q8_0, k 1 024; 8 192 outputs here for 32 768); at k 4 096
/// (`rms_norm_f32` takes 1 024 threads there, the q8x block 256) and for three rows the two launches.
#[test]
fn cuda_rms_norm_linear_of_one_row_is_one_launch_with_the_bits_of_two() {
    use fovea::backend::Precision;
    use fovea::backend::cuda::Options;
    use rand::{Rng, SeedableRng};
    let fast = Options { precision: Precision::Fast, ..explicit_timed_options() };
    let Some(one) = common::cuda_lane_with_or_skip(fast.clone()) else { return };
    let two = CudaBackend::with_options(Options { separate_rms_norm_linear: true, ..fast }).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(0x4e0b);
    let out = 8192;
    for (k, n) in [(1024, 1), (4096, 1), (1024, 3)] {
        let bytes = common::blocks::weight_bytes(&mut r, WeightFormat::Q8_0, out, k);
        let x: Vec<f32> = (0..n * k).map(|_| r.random_range(-3.0f32..3.0)).collect();
        let norm: Vec<f32> = (0..k).map(|_| r.random_range(0.5f32..1.5)).collect();
        let run = |lane: &CudaBackend| {
            let format = WeightFormat::Q8_0;
            let hw = HostWeight { name: "wq_b".into(), format, rows: out, cols: k, bytes: Cow::Borrowed(&bytes) };
            let w = lane.upload_weight(&hw).unwrap();
            let xt = lane.upload(&HostTensor::f32(vec![n, k], x.clone()).unwrap()).unwrap();
            let nt = lane.upload(&HostTensor::f32(vec![k], norm.clone()).unwrap()).unwrap();
            lane.kernel_times().unwrap(); // from here on
            let y = lane.rms_norm_linear(&xt, &nt, 1e-6, &w, None).unwrap();
            let ran = ran_kernel_counts(lane);
            (lane.download(&y).unwrap().into_f32("y").unwrap(), ran)
        };
        let ((y1, ran1), (y2, ran2)) = (run(&one), run(&two));
        let norms = |ran: &[(String, u64)]| ran.iter().filter(|(name, _)| name == "rms_norm_f32").count();
        assert_eq!(norms(&ran2), 1, "k {k} n {n}: asked for rms_norm then linear: {ran2:?}");
        assert_eq!(norms(&ran1), usize::from(k >= 4096 || n > 1), "k {k} n {n}: {ran1:?}");
        if n == 1 {
            let q8x = ("linear_q8x_q8_0".to_string(), 1);
            assert!(ran1.contains(&q8x) && ran2.contains(&q8x), "k {k}: {ran1:?} {ran2:?}");
            assert_eq!(ran1.len() + usize::from(k < 4096), ran2.len(), "k {k}: {ran1:?} {ran2:?}");
        }
        assert!(y1.iter().all(|v| v.is_finite()), "k {k} n {n}");
        assert_eq!(bits_apart(&y1, &y2), 0, "k {k} n {n}: one launch and two differ");
    }
}

/// A hyper-connection sublayer's inputs for `n` rows of `hc` streams of `d`: its mix (F16 bytes,
/// `[(2+hc)·hc, hc·d]`), scale, base, norm weight and residual, drawn from `r` in that order.
struct HcInputs {
    hc: usize,
    d: usize,
    n: usize,
    mix: Vec<u8>,
    scale: Vec<f32>,
    base: Vec<f32>,
    norm: Vec<f32>,
    x: Vec<f32>,
}

/// The device tensors of [`HcInputs`] on a lane: (mix uploaded exact as the model's, x, scale,
/// base, norm).
type HcDevice = (CudaWeight, CudaTensor, CudaTensor, CudaTensor, CudaTensor);

impl HcInputs {
    fn draw(r: &mut rand::rngs::StdRng, hc: usize, d: usize, n: usize) -> Self {
        use rand::Rng;
        let (w, k) = ((2 + hc) * hc, hc * d);
        let mix = common::blocks::weight_bytes(r, WeightFormat::F16, w, k);
        let scale = (0..3).map(|_| r.random_range(0.5f32..1.5)).collect();
        let base = (0..w).map(|_| r.random_range(-1.0f32..1.0)).collect();
        let norm = (0..d).map(|_| r.random_range(0.5f32..1.5)).collect();
        let x = (0..n * k).map(|_| r.random_range(-2.0f32..2.0)).collect();
        HcInputs { hc, d, n, mix, scale, base, norm, x }
    }

    fn upload(&self, lane: &CudaBackend) -> HcDevice {
        let (w, k) = ((2 + self.hc) * self.hc, self.hc * self.d);
        let hw = HostWeight {
            name: "mix".into(),
            format: WeightFormat::F16,
            rows: w,
            cols: k,
            bytes: Cow::Borrowed(&self.mix),
        };
        let up = |shape: Vec<usize>, v: &[f32]| lane.upload(&HostTensor::f32(shape, v.to_vec()).unwrap()).unwrap();
        (
            lane.upload_weight_exact(&hw).unwrap(),
            up(vec![self.n, k], &self.x),
            up(vec![3], &self.scale),
            up(vec![w], &self.base),
            up(vec![self.d], &self.norm),
        )
    }
}

/// A decode step's `hc_mix_split_pre_norm` in two launches (`hc_mix_partials_f32`, then
/// `hc_mix_split_pre_norm_f32`) writes the bits of the three (`separate_hc_split_norm`: the
/// partials, `hc_mix_split_f32`, `hc_pre_norm_f32`): the released geometry (hc 4, d 4 096: blocks
/// of 1 024 threads, an F16 mix uploaded exact as the model's) on one row and on three, and
/// lm-tiny's width (d 64: blocks of 256) on two; 100 rows (past a block a token) take the three
/// launches either way.
#[test]
fn cuda_hc_mix_split_pre_norm_of_a_decode_row_is_two_launches_with_the_composition_bits() {
    use fovea::backend::cuda::Options;
    use rand::SeedableRng;
    let timed = explicit_timed_options();
    let Some(two) = common::cuda_lane_with_or_skip(timed.clone()) else { return };
    let three = CudaBackend::with_options(Options { separate_hc_split_norm: true, ..timed }).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(0x4c5e);
    let hc = 4;
    for (d, n) in [(4096, 1), (4096, 3), (64, 2), (64, 100)] {
        let inputs = HcInputs::draw(&mut r, hc, d, n);
        let run = |lane: &CudaBackend| {
            let (m, xt, st, bt, nt) = inputs.upload(lane);
            lane.kernel_times().unwrap(); // from here on
            let (split, y) = lane.hc_mix_split_pre_norm(&xt, &m, &st, &bt, hc, 20, 1e-6, 1e-6, &nt).unwrap();
            let ran = ran_kernel_counts(lane);
            let get = |t| lane.download(t).unwrap().into_f32("y").unwrap();
            (get(&split), get(&y), ran)
        };
        let ((s2, y2, ran2), (s3, y3, ran3)) = (run(&two), run(&three));
        let named = |names: &[&str]| names.iter().map(|s| (s.to_string(), 1)).collect::<Vec<_>>();
        let composed = named(&["hc_mix_partials_f32", "hc_mix_split_f32", "hc_pre_norm_f32"]);
        assert_eq!(ran3, composed, "d {d} n {n}: asked for three launches");
        match n <= 64 {
            true => assert_eq!(ran2, named(&["hc_mix_partials_f32", "hc_mix_split_pre_norm_f32"]), "d {d} n {n}"),
            false => assert_eq!(ran2, composed, "d {d} n {n}: past a block a token"),
        }
        assert!(s2.iter().chain(&y2).all(|v| v.is_finite()), "d {d} n {n}");
        assert_eq!(
            (bits_apart(&s2, &s3), bits_apart(&y2, &y3)),
            (0, 0),
            "d {d} n {n}: split, input apart from the three launches"
        );
    }
}

/// A decode step's `hc_post_mix_split_pre_norm` in two launches (`hc_post_mix_partials_f32`, then
/// `hc_mix_split_pre_norm_f32`) writes the bits of the composition (`separate_hc_post`:
/// `hc_post_f32`, then the split and norm's two launches): the released geometry on one row and
/// on three, lm-tiny's width on two; 100 rows take the composition either way.
#[test]
fn cuda_hc_post_mix_split_pre_norm_of_a_decode_row_is_two_launches_with_the_composition_bits() {
    use fovea::backend::cuda::Options;
    use rand::{Rng, SeedableRng};
    let timed = explicit_timed_options();
    let Some(two) = common::cuda_lane_with_or_skip(timed.clone()) else { return };
    let apart = CudaBackend::with_options(Options { separate_hc_post: true, ..timed }).unwrap();
    let mut r = rand::rngs::StdRng::seed_from_u64(0x4c5f);
    let hc = 4;
    for (d, n) in [(4096, 1), (4096, 3), (64, 2), (64, 100)] {
        let w = (2 + hc) * hc;
        let inputs = HcInputs::draw(&mut r, hc, d, n);
        let f: Vec<f32> = (0..n * d).map(|_| r.random_range(-2.0f32..2.0)).collect();
        let split: Vec<f32> = (0..n * w).map(|_| r.random_range(0.0f32..1.0)).collect();
        let run = |lane: &CudaBackend| {
            let (m, xt, st, bt, nt) = inputs.upload(lane);
            let up = |shape: Vec<usize>, v: &[f32]| lane.upload(&HostTensor::f32(shape, v.to_vec()).unwrap()).unwrap();
            let (ft, pt) = (up(vec![n, d], &f), up(vec![n, w], &split));
            lane.kernel_times().unwrap(); // from here on
            let (xp, s, y) =
                lane.hc_post_mix_split_pre_norm(&xt, &ft, &pt, &m, &st, &bt, hc, 20, 1e-6, 1e-6, &nt).unwrap();
            let ran = ran_kernel_counts(lane);
            let get = |t| lane.download(t).unwrap().into_f32("y").unwrap();
            (get(&xp), get(&s), get(&y), ran)
        };
        let ((x2, s2, y2, ran2), (x3, s3, y3, ran3)) = (run(&two), run(&apart));
        let named = |names: &[&str]| names.iter().map(|s| (s.to_string(), 1)).collect::<Vec<_>>();
        let composed = named(&["hc_mix_partials_f32", "hc_mix_split_pre_norm_f32", "hc_post_f32"]);
        match n <= 64 {
            true => {
                assert_eq!(ran3, composed, "d {d} n {n}: asked for the composition");
                assert_eq!(ran2, named(&["hc_mix_split_pre_norm_f32", "hc_post_mix_partials_f32"]), "d {d} n {n}");
            }
            false => {
                let past = named(&["hc_mix_partials_f32", "hc_mix_split_f32", "hc_post_f32", "hc_pre_norm_f32"]);
                assert_eq!((&ran2, &ran3), (&past, &past), "d {d} n {n}: past a block a token");
            }
        }
        assert!(x2.iter().chain(&s2).chain(&y2).all(|v| v.is_finite()), "d {d} n {n}");
        assert_eq!(
            (bits_apart(&x2, &x3), bits_apart(&s2, &s3), bits_apart(&y2, &y3)),
            (0, 0, 0),
            "d {d} n {n}: residual, split, input apart from the composition"
        );
    }
}

/// The fused router against the same ops composed on this lane (`common::route_experts_matches_its_composition`).
#[test]
fn cuda_route_experts_matches_its_composition_bit_for_bit() {
    let Some(b) = common::cuda_lane_or_skip() else { return };
    common::route_experts_matches_its_composition(&b);
}

/// Fast precision's `linear` over many rows on cuBLASLt (`cublaslt_f16`, `Options::blas`) and on
/// the lane's own tiles (blas off): both multiply x and W rounded once to f16 (ties to even) and
/// sum in f32. Each output is held to the worst-case bound of an f32 sum of k products against the
/// exact (f64) sum of those f16 operands: |y − ref| ≤ γ_k · (Σ|x_i·w_i| + |b|), γ_k = k·2⁻²⁴
/// (recursive summation; blocked or tree orders only tighten it), the products of two f16 exact
/// in f32. bf16 operands (2⁻⁹ relative each) or f16 accumulation (2⁻¹¹) exceed it by far at
/// k = 256 (γ = 1.5e-5). Formats: f32, f16, bf16 and Q8_0 weights, with and without a bias.
#[test]
fn cuda_fast_linear_on_cublaslt_multiplies_f16_operands_in_f32() {
    use fovea::backend::Precision;
    use fovea::backend::cuda::Options;
    use rand::{Rng, SeedableRng};
    let Some((lane, tiles, fast)) = fast_lanes_on_cublaslt_and_tiles() else { return };
    // where it must not: 64 rows (the tiles' size, `BLAS_MIN_ROWS`), a weight uploaded exact
    // (its products stay f32-accurate), and an exact backend, which never opens cuBLASLt
    let exact = CudaBackend::with_options(Options { precision: Precision::Exact, blas: true, ..fast.clone() }).unwrap();
    assert!(!exact.blas());
    {
        let mut r = rand::rngs::StdRng::seed_from_u64(7);
        let bytes = common::blocks::weight_bytes(&mut r, WeightFormat::BF16, 64, 256);
        let hw = HostWeight {
            name: "w".into(),
            format: WeightFormat::BF16,
            rows: 64,
            cols: 256,
            bytes: Cow::Borrowed(&bytes),
        };
        let (plain, exact_w) = (lane.upload_weight(&hw).unwrap(), lane.upload_weight_exact(&hw).unwrap());
        for (rows, w, what) in [(64, &plain, "64 rows"), (300, &exact_w, "an exact weight")] {
            let xt = lane.upload(&HostTensor::f32(vec![rows, 256], vec![0.5; rows * 256]).unwrap()).unwrap();
            lane.download(&lane.linear(&xt, w, None).unwrap()).unwrap();
            let ran = ran_kernels(&lane);
            assert!(!ran.iter().any(|k| k == "cublaslt_f16"), "{what} took cuBLASLt: {ran:?}");
        }
    }
    let mut r = rand::rngs::StdRng::seed_from_u64(0xb1a5);
    let (n, k, out) = (300, 256, 200);
    let x: Vec<f32> = (0..n * k).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let bias: Vec<f32> = (0..out).map(|_| r.random_range(-1.0f32..1.0)).collect();
    for format in [WeightFormat::F32, WeightFormat::F16, WeightFormat::BF16, WeightFormat::Q8_0] {
        let bytes = common::blocks::weight_bytes(&mut r, format, out, k);
        let mut w = vec![0f32; out * k];
        fovea::formats::decode_row(format, &bytes, &mut w);
        for with_bias in [false, true] {
            let run = |b: &CudaBackend| {
                let hw = HostWeight { name: "w".into(), format, rows: out, cols: k, bytes: Cow::Borrowed(&bytes) };
                let wt = b.upload_weight(&hw).unwrap();
                let xt = b.upload(&HostTensor::f32(vec![n, k], x.clone()).unwrap()).unwrap();
                let bt = b.upload(&HostTensor::f32(vec![out], bias.clone()).unwrap()).unwrap();
                let y = b.linear(&xt, &wt, with_bias.then_some(&bt)).unwrap();
                let ran = ran_kernels(b);
                (b.download(&y).unwrap().into_f32("y").unwrap(), ran)
            };
            for (lane, name, on_blas) in [(&lane, "cublaslt", true), (&tiles, "tiles", false)] {
                let (y, ran) = run(lane);
                let what = format!("{format}, bias {with_bias}, {name}");
                assert_eq!(ran.iter().any(|k| k == "cublaslt_f16"), on_blas, "{what}: kernels {ran:?}");
                let worst = f16_sum_bound_ratio(&x, &w, with_bias.then_some(&bias[..]), &y, n, k, out, 1);
                assert!(
                    worst <= 1.0,
                    "{what}: an output is {worst:.2}× the f32 sum's bound off the f16 operands' exact sum"
                );
            }
        }
    }
}

/// The largest |y − ref| / bound over y `[n, groups·r]` = x `[n, groups·k]` by w `[groups·r, k]`
/// group by group (+ bias `[r]`): ref the exact sum of the f16-rounded operands' products (+ b),
/// bound k·2⁻²⁴ · (Σ|x_i·w_i| + |b|), an f32 sum's worst case (see the test above).
#[allow(clippy::too_many_arguments)]
fn f16_sum_bound_ratio(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    y: &[f32],
    n: usize,
    k: usize,
    r: usize,
    groups: usize,
) -> f64 {
    f16_sum_plus_bound_ratio(x, w, bias, None, y, (n, k, r, groups))
}

/// [`f16_sum_bound_ratio`] with an addend `[n, groups·r]` in the sum too (one term more: the
/// bound's k + 1 and its magnitude).
fn f16_sum_plus_bound_ratio(
    x: &[f32],
    w: &[f32],
    bias: Option<&[f32]>,
    add: Option<&[f32]>,
    y: &[f32],
    (n, k, r, groups): (usize, usize, usize, usize),
) -> f64 {
    let f16 = |v: f32| half::f16::from_f32(v).to_f32() as f64;
    let terms = k + add.is_some() as usize;
    let mut worst = 0.0f64;
    for i in 0..n {
        for c in 0..groups * r {
            let (g, (mut exact, mut mag)) = (c / r, (0.0f64, 0.0f64));
            for j in 0..k {
                let p = f16(x[i * groups * k + g * k + j]) * f16(w[c * k + j]);
                exact += p;
                mag += p.abs();
            }
            if let Some(b) = bias {
                exact += b[c] as f64;
                mag += (b[c] as f64).abs();
            }
            if let Some(a) = add {
                exact += a[i * groups * r + c] as f64;
                mag += (a[i * groups * r + c] as f64).abs();
            }
            let bound = terms as f64 * 2f64.powi(-24) * mag;
            worst = worst.max((y[i * groups * r + c] as f64 - exact).abs() / bound);
        }
    }
    worst
}

/// A residual update (`linear_add`) in fast precision: on cuBLASLt the residual is the matmul's
/// addend (no `add_f32` launch), on the tiles `linear` then `add`; both held to the f32 sum's
/// bound of `linear`'s test above with the residual as one more term. 300 rows, f16 and bf16
/// weights, with and without a bias.
#[test]
fn cuda_fast_linear_add_takes_the_residual_into_cublaslt() {
    use rand::{Rng, SeedableRng};
    let Some((lane, tiles, _)) = fast_lanes_on_cublaslt_and_tiles() else { return };
    let mut r = rand::rngs::StdRng::seed_from_u64(0xadd);
    let (n, k, out) = (300, 256, 200);
    let x: Vec<f32> = (0..n * k).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let res: Vec<f32> = (0..n * out).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let bias: Vec<f32> = (0..out).map(|_| r.random_range(-1.0f32..1.0)).collect();
    for format in [WeightFormat::F16, WeightFormat::BF16] {
        let bytes = common::blocks::weight_bytes(&mut r, format, out, k);
        let mut w = vec![0f32; out * k];
        fovea::formats::decode_row(format, &bytes, &mut w);
        for with_bias in [false, true] {
            for (b, name, on_blas) in [(&lane, "cublaslt", true), (&tiles, "tiles", false)] {
                let hw = HostWeight { name: "wo".into(), format, rows: out, cols: k, bytes: Cow::Borrowed(&bytes) };
                let wt = b.upload_weight(&hw).unwrap();
                let xt = b.upload(&HostTensor::f32(vec![n, k], x.clone()).unwrap()).unwrap();
                let rt = b.upload(&HostTensor::f32(vec![n, out], res.clone()).unwrap()).unwrap();
                let bt = b.upload(&HostTensor::f32(vec![out], bias.clone()).unwrap()).unwrap();
                let y = b.linear_add(&xt, &wt, with_bias.then_some(&bt), &rt).unwrap();
                let y = b.download(&y).unwrap().into_f32("y").unwrap();
                let ran = ran_kernels(b);
                let what = format!("{format}, bias {with_bias}, {name}");
                assert_eq!(ran.iter().any(|k| k == "cublaslt_f16"), on_blas, "{what}: kernels {ran:?}");
                assert_eq!(ran.iter().any(|k| k == "add_f32"), !on_blas, "{what}: kernels {ran:?}");
                let bias = with_bias.then_some(&bias[..]);
                let worst = f16_sum_plus_bound_ratio(&x, &w, bias, Some(&res), &y, (n, k, out, 1));
                assert!(worst <= 1.0, "{what}: an output is {worst:.2}× the f32 sum's bound off the exact sum");
            }
        }
    }
}

/// On cuBLASLt a ViT block's pre-norm projection (`rms_norm_linear`) and MLP update
/// (`swiglu_linear_add`) write the GEMM's f16 operand in the norm or the gating (no f32 rows,
/// no `f32_to_f16` pass); the tiles run the composition. On cuBLASLt each equals its composition
/// (`rms_norm` + `linear`, `swiglu` + `linear_add`) bit for bit: the same f16 operand, the same
/// matmul. Outputs against the CPU lane at the op harness's fast GEMM bound.
#[test]
fn cuda_fast_norm_and_gating_write_the_gemm_operand() {
    use rand::{Rng, SeedableRng};
    let Some((lane, tiles, _)) = fast_lanes_on_cublaslt_and_tiles() else { return };
    let cpu = fovea::backend::cpu::CpuBackend::new();
    let mut r = rand::rngs::StdRng::seed_from_u64(0x0f16);
    let (n, k, out) = (300, 256, 200);
    let x: Vec<f32> = (0..n * 2 * k).map(|_| r.random_range(-2.0f32..2.0)).collect();
    let norm: Vec<f32> = (0..k).map(|_| r.random_range(0.5f32..1.5)).collect();
    let res: Vec<f32> = (0..n * out).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let bytes = common::blocks::weight_bytes(&mut r, WeightFormat::BF16, out, k);
    let hw =
        HostWeight { name: "w".into(), format: WeightFormat::BF16, rows: out, cols: k, bytes: Cow::Borrowed(&bytes) };
    fn run<B: Backend>(b: &B, hw: &HostWeight, x: &[f32], norm: &[f32], res: &[f32], n: usize) -> [Vec<f32>; 2] {
        let (k, out) = (hw.cols, hw.rows);
        let w = b.upload_weight(hw).unwrap();
        let xt = b.upload(&HostTensor::f32(vec![n, k], x[..n * k].to_vec()).unwrap()).unwrap();
        let gate_up = b.upload(&HostTensor::f32(vec![n, 2 * k], x.to_vec()).unwrap()).unwrap();
        let nt = b.upload(&HostTensor::f32(vec![k], norm.to_vec()).unwrap()).unwrap();
        let rt = b.upload(&HostTensor::f32(vec![n, out], res.to_vec()).unwrap()).unwrap();
        let normed = b.rms_norm_linear(&xt, &nt, 1e-6, &w, None).unwrap();
        let gated = b.swiglu_linear_add(&gate_up, &w, &rt).unwrap();
        [normed, gated].map(|t| b.download(&t).unwrap().into_f32("y").unwrap())
    }
    fn composed<B: Backend>(b: &B, hw: &HostWeight, x: &[f32], norm: &[f32], res: &[f32], n: usize) -> [Vec<f32>; 2] {
        let (k, out) = (hw.cols, hw.rows);
        let w = b.upload_weight(hw).unwrap();
        let xt = b.upload(&HostTensor::f32(vec![n, k], x[..n * k].to_vec()).unwrap()).unwrap();
        let gate_up = b.upload(&HostTensor::f32(vec![n, 2 * k], x.to_vec()).unwrap()).unwrap();
        let nt = b.upload(&HostTensor::f32(vec![k], norm.to_vec()).unwrap()).unwrap();
        let rt = b.upload(&HostTensor::f32(vec![n, out], res.to_vec()).unwrap()).unwrap();
        let normed = b.linear(&b.rms_norm(&xt, &nt, 1e-6).unwrap(), &w, None).unwrap();
        let gated = b.linear_add(&b.swiglu(&gate_up).unwrap(), &w, None, &rt).unwrap();
        [normed, gated].map(|t| b.download(&t).unwrap().into_f32("y").unwrap())
    }
    let want = run(&cpu, &hw, &x, &norm, &res, n);
    let lane_composed = composed(&lane, &hw, &x, &norm, &res, n);
    for (b, name, on_blas) in [(&lane, "cublaslt", true), (&tiles, "tiles", false)] {
        b.kernel_times().unwrap();
        let got = run(b, &hw, &x, &norm, &res, n);
        let ran = ran_kernels(b);
        if on_blas {
            for (op, (g, c)) in ["rms_norm_linear", "swiglu_linear_add"].iter().zip(got.iter().zip(&lane_composed)) {
                let differ = bits_apart(g, c);
                assert_eq!(differ, 0, "{name} {op}: {differ} outputs differ from the composition's");
            }
        }
        for (kernel, fused) in [("rms_norm_f16", true), ("swiglu_f16", true), ("f32_to_f16", false)] {
            let expected = if on_blas { fused } else { false };
            assert_eq!(ran.iter().any(|k| k == kernel), expected, "{name}: {kernel} in {ran:?}");
        }
        for (op, (g, w)) in ["rms_norm_linear", "swiglu_linear_add"].iter().zip(got.iter().zip(&want)) {
            let nmse = common::rel_l2(g, w).powi(2);
            assert!(nmse <= 4.0 * common::FAST_GEMM_NMSE, "{name} {op}: NMSE {nmse:.2e}");
        }
    }
}

/// cuBLASLt reads its weight as f16: a BF16 or F32 matrix is converted by the first GEMM and
/// the copy kept for the next (no `weight_f16_*` launch, the same outputs bit for bit), counted
/// in the weight memory until the weight drops; a block format (Q8_0, whose f16 copy would be
/// larger) is converted for each GEMM and holds no copy.
#[test]
fn cuda_fast_linear_keeps_the_f16_copy_of_bf16_and_f32_weights() {
    use rand::{Rng, SeedableRng};
    let Some((lane, _, _)) = fast_lanes_on_cublaslt_and_tiles() else { return };
    let mut r = rand::rngs::StdRng::seed_from_u64(0xf16c);
    let (n, k, out) = (300, 256, 200);
    let x: Vec<f32> = (0..n * k).map(|_| r.random_range(-1.0f32..1.0)).collect();
    let xt = lane.upload(&HostTensor::f32(vec![n, k], x).unwrap()).unwrap();
    for (format, kept) in [(WeightFormat::BF16, true), (WeightFormat::F32, true), (WeightFormat::Q8_0, false)] {
        let bytes = common::blocks::weight_bytes(&mut r, format, out, k);
        let before_upload = lane.memory().weight_bytes;
        let hw = HostWeight { name: "w1".into(), format, rows: out, cols: k, bytes: Cow::Borrowed(&bytes) };
        let w = lane.upload_weight(&hw).unwrap();
        let uploaded = lane.memory().weight_bytes;
        let mut runs = Vec::new();
        for _ in 0..2 {
            let y = lane.linear(&xt, &w, None).unwrap();
            let y = lane.download(&y).unwrap().into_f32("y").unwrap();
            let ran = ran_kernels(&lane);
            runs.push((y, ran, lane.memory().weight_bytes - uploaded));
        }
        let converts = |ran: &[String]| ran.iter().any(|k| k.starts_with("weight_f16"));
        let (first, second) = (&runs[0], &runs[1]);
        assert!(first.1.iter().any(|k| k == "cublaslt_f16"), "{format}: kernels {:?}", first.1);
        assert!(converts(&first.1), "{format}: the first GEMM converts the weight: {:?}", first.1);
        assert_eq!(converts(&second.1), !kept, "{format}: the second GEMM's kernels {:?}", second.1);
        let copy = if kept { (out * k * 2) as u64 } else { 0 };
        assert_eq!((first.2, second.2), (copy, copy), "{format}: weight bytes past the upload");
        assert!(first.0.iter().zip(&second.0).all(|(a, b)| a.to_bits() == b.to_bits()), "{format}: outputs differ");
        drop(w);
        assert_eq!(lane.memory().weight_bytes, before_upload, "{format}: weight bytes after the drop");
    }
}

/// The grouped output projection (`grouped_linear`) in fast precision on cuBLASLt (a strided
/// batch) and on the lane's tiles, held to the same bound as `linear` above group by group: 4
/// groups of 128 inputs and 64 outputs, Q8_0 and f16 weights, 300 rows.
#[test]
fn cuda_fast_grouped_linear_on_cublaslt_multiplies_f16_operands_in_f32() {
    use rand::{Rng, SeedableRng};
    let Some((lane, tiles, _)) = fast_lanes_on_cublaslt_and_tiles() else { return };
    let mut r = rand::rngs::StdRng::seed_from_u64(0x9b1a);
    let (n, groups, k, out) = (300, 4, 128, 64);
    let x: Vec<f32> = (0..n * groups * k).map(|_| r.random_range(-1.0f32..1.0)).collect();
    for format in [WeightFormat::F16, WeightFormat::Q8_0] {
        let bytes = common::blocks::weight_bytes(&mut r, format, groups * out, k);
        let mut w = vec![0f32; groups * out * k];
        fovea::formats::decode_row(format, &bytes, &mut w);
        for (b, name, on_blas) in [(&lane, "cublaslt", true), (&tiles, "tiles", false)] {
            let hw =
                HostWeight { name: "wo_a".into(), format, rows: groups * out, cols: k, bytes: Cow::Borrowed(&bytes) };
            let wt = b.upload_weight(&hw).unwrap();
            let xt = b.upload(&HostTensor::f32(vec![n, groups * k], x.clone()).unwrap()).unwrap();
            let y = b.download(&b.grouped_linear(&xt, &wt, groups).unwrap()).unwrap().into_f32("y").unwrap();
            let ran = ran_kernels(b);
            assert_eq!(ran.iter().any(|k| k == "cublaslt_f16"), on_blas, "{format}, {name}: kernels {ran:?}");
            let worst = f16_sum_bound_ratio(&x, &w, None, &y, n, k, out, groups);
            assert!(worst <= 1.0, "{format}, {name}: an output is {worst:.2}× the f32 sum's bound off the exact sum");
        }
    }
}

/// Two fast-precision lanes with kernel times, one on cuBLASLt and one on the tiles (`blas` off),
/// and their options; `None` after a skip message where there is no CUDA lane or no cuBLASLt
/// (a failure instead under `FOVEA_REQUIRE_CUBLASLT=1`, which `cuda/gpu_tests.sh run` sets where
/// it finds the library).
fn fast_lanes_on_cublaslt_and_tiles() -> Option<(CudaBackend, CudaBackend, fovea::backend::cuda::Options)> {
    use fovea::backend::Precision;
    use fovea::backend::cuda::Options;
    let fast = Options { precision: Precision::Fast, blas: true, ..explicit_timed_options() };
    let lane = common::cuda_lane_with_or_skip(fast.clone())?;
    if !cublaslt_or_skip(&lane) {
        return None;
    }
    let tiles = CudaBackend::with_options(Options { blas: false, ..fast.clone() }).unwrap();
    assert!(!tiles.blas());
    Some((lane, tiles, fast))
}

/// Whether `lane` runs cuBLASLt; if not, a skip message, or a failure under
/// `FOVEA_REQUIRE_CUBLASLT=1`.
fn cublaslt_or_skip(lane: &CudaBackend) -> bool {
    if lane.blas() {
        return true;
    }
    if std::env::var("FOVEA_REQUIRE_CUBLASLT").is_ok_and(|v| v.trim() == "1") {
        panic!("FOVEA_REQUIRE_CUBLASLT=1 but the lane runs without cuBLASLt: {}", lane.device_name());
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: cuBLASLt (libcublasLt.so.13) not found: {}", lane.device_name());
    false
}

/// A prefill chunk's sink attention in fast precision runs on tensor cores
/// (`sink_attention_fast_d512`, cuda/lm_attention.cu) at the released geometry, 64 heads × 512
/// sharing one latent: 300 queries with windows of 128 keys and 64 compressed slots (every fifth
/// −1), against the CPU lane within tests/ops.rs's FAST_ATTENTION bound (q and the keys uniform in
/// ±1.5, the same derivation: 4 · FAST_GEMM_NMSE · (1 + 0.75²)). A decode step's one query keeps
/// the f32 kernel with its key splits, as does an exact backend, and so does a device whose blocks
/// cannot have the kernel's 196 KiB of shared memory (below sm_90).
#[test]
fn cuda_fast_sink_attention_runs_on_tensor_cores_for_a_prefill_chunk() {
    use fovea::backend::Precision;
    use fovea::backend::cpu::CpuBackend;
    use fovea::backend::cuda::Options;
    use rand::{Rng, SeedableRng};
    let fast = Options { precision: Precision::Fast, ..explicit_timed_options() };
    let Some(lane) = common::cuda_lane_with_or_skip(fast.clone()) else { return };
    let exact = CudaBackend::with_options(Options { precision: Precision::Exact, ..fast }).unwrap();
    let (heads, hd, m, c, k) = (64, 512, 640, 150, 64);
    let mut r = rand::rngs::StdRng::seed_from_u64(0x51c4);
    let mut uniform = |len: usize, s: f32| (0..len).map(|_| r.random_range(-s..s)).collect::<Vec<f32>>();
    let (kv, comp, sinks) = (uniform(m * hd, 1.5), uniform(c * hd, 1.5), uniform(heads, 2.0));
    for n in [300, 1] {
        let q = uniform(n * heads * hd, 1.5);
        let window: Vec<i32> = (0..n as i32).flat_map(|i| [i + 200, i + 327]).collect();
        let idx: Vec<i32> = (0..n * k).map(|j| if j % 5 == 4 { -1 } else { ((j * 7919) % c) as i32 }).collect();
        let inputs = [
            HostTensor::f32(vec![n, heads * hd], q).unwrap(),
            HostTensor::f32(vec![m, hd], kv.clone()).unwrap(),
            HostTensor::i32(vec![n, 2], window).unwrap(),
            HostTensor::f32(vec![c, hd], comp.clone()).unwrap(),
            HostTensor::i32(vec![n, k], idx).unwrap(),
            HostTensor::f32(vec![heads], sinks.clone()).unwrap(),
        ];
        fn run<B: Backend>(b: &B, t: &[HostTensor]) -> Vec<f32> {
            let u: Vec<_> = t.iter().map(|h| b.upload(h).unwrap()).collect();
            let y = b.sink_attention(&u[0], &u[1], &u[2], Some((&u[3], &u[4])), &u[5], 64).unwrap();
            b.download(&y).unwrap().into_f32("y").unwrap()
        }
        let want = run(&CpuBackend::new(), &inputs);
        // the lane's own rule (fast_sink_kernel); on sm_90 the d512 kernel's 196 KiB of shared
        // memory fit (227 KiB), on an A100 or sm_86/89 they do not and the f32 kernel runs
        let tensor_cores = lane.sink_attention_on_tensor_cores(n, heads, hd).unwrap();
        if n == 1 {
            assert!(!tensor_cores, "a decode step's one query splits its keys on the f32 kernel");
        }
        if n == 300 && lane.arch() >= 90 {
            assert!(tensor_cores, "300 queries on sm_90 take the tensor cores");
        }
        assert!(!exact.sink_attention_on_tensor_cores(n, heads, hd).unwrap());
        for (b, on_tensor_cores) in [(&lane, tensor_cores), (&exact, false)] {
            let y = run(b, &inputs);
            let ran = ran_kernels(b);
            let what = format!("n {n}, {:?}", b.precision());
            assert_eq!(ran.iter().any(|k| k == "sink_attention_fast_d512"), on_tensor_cores, "{what}: {ran:?}");
            assert_eq!(ran.iter().any(|k| k == "sink_attention_f32"), !on_tensor_cores, "{what}: {ran:?}");
            let nmse = common::rel_l2(&y, &want).powi(2);
            let bound = if on_tensor_cores { 4.0 * common::FAST_GEMM_NMSE * (1.0 + 0.75 * 0.75) } else { 1e-10 };
            assert!(nmse <= bound, "{what}: nmse {nmse:.2e} over {bound:.1e}");
        }
    }
}

/// A ViT block's attention from its fused projection (`attention_rope_2d`) in fast precision on
/// sm_80+: one launch (`attention_qkv_rope_f16`) prepares q and the f16 keys and values for
/// `attention_fast_d64`, none of the composition's slices, rotations or `attention_kv_f16` run;
/// exact precision keeps the composition. Both against the CPU lane (65 rows on a 5 × 13 grid,
/// 2 heads of 64; q, k, v uniform in ±1.5): the fast bound of tests/ops.rs's FAST_ATTENTION, the
/// exact one its REDUCTION.
#[test]
fn cuda_fast_vit_attention_prepares_its_operands_in_one_launch() {
    use fovea::backend::Precision;
    use fovea::backend::cpu::CpuBackend;
    use fovea::backend::cuda::Options;
    use rand::{Rng, SeedableRng};
    let fast = Options { precision: Precision::Fast, ..explicit_timed_options() };
    let Some(lane) = common::cuda_lane_with_or_skip(fast.clone()) else { return };
    let exact = CudaBackend::with_options(Options { precision: Precision::Exact, ..fast }).unwrap();
    let (gh, gw, heads, hd, theta) = (5, 13, 2, 64, 10000.0);
    let mut r = rand::rngs::StdRng::seed_from_u64(0x9c7);
    let qkv = HostTensor::f32(
        vec![gh * gw, 3 * heads * hd],
        (0..gh * gw * 3 * heads * hd).map(|_| r.random_range(-1.5f32..1.5)).collect(),
    )
    .unwrap();
    fn run<B: Backend>(b: &B, qkv: &HostTensor, heads: usize, gw: usize, theta: f32) -> Vec<f32> {
        let y = b.attention_rope_2d(&b.upload(qkv).unwrap(), heads, gw, theta).unwrap();
        b.download(&y).unwrap().into_f32("y").unwrap()
    }
    let want = run(&CpuBackend::new(), &qkv, heads, gw, theta);
    let fused = lane.arch() >= 80;
    for (b, on_tensor_cores) in [(&lane, fused), (&exact, false)] {
        let y = run(b, &qkv, heads, gw, theta);
        let ran = ran_kernels(b);
        let what = format!("{:?}", b.precision());
        for (kernel, runs) in [
            ("attention_qkv_rope_f16", on_tensor_cores),
            ("attention_fast_d64", on_tensor_cores),
            ("slice_cols_f32", !on_tensor_cores),
            ("rope_2d_f32", !on_tensor_cores),
            ("attention_kv_f16", false),
        ] {
            assert_eq!(ran.iter().any(|k| k == kernel), runs, "{what}: {kernel}: {ran:?}");
        }
        let nmse = common::rel_l2(&y, &want).powi(2);
        let bound = if on_tensor_cores { 4.0 * common::FAST_GEMM_NMSE * (1.0 + 0.75 * 0.75) } else { 1e-10 };
        assert!(nmse <= bound, "{what}: nmse {nmse:.2e} over {bound:.1e}");
    }
}
