//! Language-model conformance against the transformers 5.24.0 goldens (fixtures/gen/lm), generic
//! over the lane: lm-tiny, `lm-text` (304 tokens) and `lm-vision` (96 tokens, one image block
//! merged per vision.md §5.1, `bias_vl` routing, image-span visibility); vl-tiny with several
//! images per prompt (`vl-two`, `vl-three` of fixtures/gen/vl), through the pipeline. Each lane's
//! test file states its tolerance and the derivation; router ids, indexer picks and greedy tokens
//! are exact on every lane in exact precision (the generator guaranteed margins > 1e-4 at every
//! selection boundary); fast precision has its own [`Contract`].

use std::collections::BTreeMap;

use fovea::backend::{Backend, HostData, HostTensor};
use fovea::config::LmConfig;
use fovea::model::lm::vision::{ImageBlock, MAX_IMAGE_TOKENS, visible_bounds};
use fovea::model::lm::{LmInput, LmModel, LmOutput, LmTrace};
use fovea::pipeline::{LmSource, LoadedLm, PromptToken};
use fovea::weights::Checkpoint;
use safetensors::{Dtype, SafeTensors};

use super::{near_tie, rel_l2, root};

/// A golden file's tensors as f32 or i64 vectors, and its metadata.
pub struct LmGolden {
    pub f: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    pub i: BTreeMap<String, (Vec<usize>, Vec<i64>)>,
    pub meta: BTreeMap<String, String>,
}

pub fn lm_golden(name: &str) -> LmGolden {
    let bytes = std::fs::read(root().join(format!("fixtures/goldens/lm/{name}.safetensors"))).unwrap();
    let (_, header) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = header.metadata().clone().unwrap_or_default().into_iter().collect();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let (mut f, mut i) = (BTreeMap::new(), BTreeMap::new());
    for (k, v) in st.tensors() {
        let shape = v.shape().to_vec();
        match v.dtype() {
            Dtype::F32 => {
                f.insert(
                    k,
                    (shape, v.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()),
                );
            }
            Dtype::I64 => {
                i.insert(
                    k,
                    (shape, v.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()),
                );
            }
            d => panic!("{k}: unexpected dtype {d}"),
        }
    }
    LmGolden { f, i, meta }
}

pub fn f32s<B: Backend>(b: &B, t: &B::Tensor) -> Vec<f32> {
    b.download(t).unwrap().into_f32("test").unwrap()
}

pub fn i32s<B: Backend>(b: &B, t: &B::Tensor) -> Vec<i32> {
    match b.download(t).unwrap().data {
        HostData::I32(v) => v,
        _ => panic!("expected i32"),
    }
}

/// What one lane's run is held to.
#[derive(Clone, Copy, Debug)]
pub enum Contract {
    /// f32 products (`--precision exact`): every float within this relative L2; router ids,
    /// indexer picks (the prefill's and every decode step's), top-1 at every position and greedy
    /// tokens exact.
    Exact(f64),
    /// `--precision fast`: the prefill's floats within this relative L2; top-1 at every position
    /// but the near-ties; each decode step's logits within it and its token exact but at a step
    /// where a router or indexer choice moved (the golden's `greedy_step_*`; at most
    /// `MAX_MOVED_DECODE_STEPS` such steps). A near-tie is a position where the reference's
    /// top-2 gap is under tol · the rms of its logits row, or where a router or indexer choice
    /// moved: the goldens' selection margins (> 1e-4, made for f32 lanes) are below fast
    /// precision's resolution, and a moved expert changes that token's output by O(1) (a
    /// teacher-forced decode step is one more such position). Moved choices are printed with
    /// their positions and steps.
    Fast(f64),
}

impl From<f64> for Contract {
    fn from(tol: f64) -> Self {
        Contract::Exact(tol)
    }
}

impl Contract {
    pub fn tol(self) -> f64 {
        match self {
            Contract::Exact(t) | Contract::Fast(t) => t,
        }
    }
    fn selections_exact(self) -> bool {
        matches!(self, Contract::Exact(_))
    }
}

fn argmax(r: &[f32]) -> usize {
    r.iter().enumerate().fold((0, f32::NEG_INFINITY), |m, (i, &x)| if x > m.1 { (i, x) } else { m }).0
}

/// lm-tiny on lane `b`.
pub fn load_lm_tiny<B: Backend>(b: &B) -> (LmModel<B>, LmConfig) {
    let dir = root().join("fixtures/models/lm-tiny");
    let cfg = LmConfig::from_file(&dir.join("config.json")).unwrap();
    let ckpt = Checkpoint::open_without_vision(&dir).unwrap();
    let model = LmModel::load(b, &ckpt, &cfg).unwrap();
    (model, cfg)
}

/// Compare one prefill with a golden under `contract`; returns a list of failures (empty = pass).
pub fn compare<B: Backend>(
    name: &str,
    b: &B,
    cfg: &LmConfig,
    out: &LmOutput<B>,
    g: &LmGolden,
    contract: impl Into<Contract>,
) -> Vec<String> {
    let contract = contract.into();
    let tol = contract.tol();
    let mut fails = Vec::new();
    let t = g.i["input_ids"].1.len();
    let (hc, d) = (cfg.hc_mult, cfg.hidden_size);
    // per-layer 4-stream residual (the several-image goldens leave it out: fixture size)
    match g.f.get("hidden_states") {
        Some((_, gh)) => {
            for (l, h) in out.hidden.iter().enumerate() {
                let e = rel_l2(&f32s(b, h), &gh[l * t * hc * d..(l + 1) * t * hc * d]);
                eprintln!("{name}: hidden_states[{l}] rel L2 {e:.2e}");
                if !(e <= tol) {
                    fails.push(format!("hidden_states[{l}] rel L2 {e:.3e} > {tol:.0e}"));
                }
            }
        }
        None => eprintln!("{name}: no per-layer hidden states in this golden"),
    }
    let e = rel_l2(&f32s(b, &out.final_hidden), &g.f["final_hidden"].1);
    eprintln!("{name}: final_hidden rel L2 {e:.2e}");
    if !(e <= tol) {
        fails.push(format!("final_hidden rel L2 {e:.3e}"));
    }
    let logits = f32s(b, &out.logits);
    let gl = &g.f["logits"].1;
    let e = rel_l2(&logits, gl);
    let v = cfg.vocab_size;
    let max_abs = logits.iter().zip(gl).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    eprintln!("{name}: logits rel L2 {e:.2e} (max |Δ| {max_abs:.2e})");
    if !(e <= tol) {
        fails.push(format!("logits rel L2 {e:.3e}"));
    }
    // router selections: exact (sorted ascending, as stored)
    let k = cfg.num_experts_per_tok;
    let (gr, gw) = (&g.i["router_ids"].1, &g.f["router_weights"].1);
    let mut moved = std::collections::BTreeSet::new();
    for (l, (ids, w)) in out.router_ids.iter().zip(&out.router_weights).enumerate() {
        let (ids, w) = (i32s(b, ids), f32s(b, w));
        let mut mism = 0;
        let mut ours_w = Vec::with_capacity(t * k);
        for i in 0..t {
            let mut pairs: Vec<(i32, f32)> = (0..k).map(|s| (ids[i * k + s], w[i * k + s])).collect();
            pairs.sort_by_key(|p| p.0);
            if pairs.iter().map(|p| p.0 as i64).ne(gr[(l * t + i) * k..(l * t + i + 1) * k].iter().copied()) {
                mism += 1;
                moved.insert(i);
            }
            ours_w.extend(pairs.iter().map(|p| p.1));
        }
        let ew = rel_l2(&ours_w, &gw[l * t * k..(l + 1) * t * k]);
        eprintln!("{name}: layer {l} router: {mism} of {t} positions differ; weights rel L2 {ew:.2e}");
        if contract.selections_exact() {
            if mism != 0 {
                fails.push(format!("layer {l}: router ids differ at {mism} positions"));
            }
            if !(ew <= tol) {
                fails.push(format!("layer {l}: router weights rel L2 {ew:.3e}"));
            }
        }
    }
    // indexer selections: exact as sets where defined
    for (&l, picks) in &out.indexer {
        let key = format!("indexer_topk.{l}");
        let (shape, gold) = &g.i[&key];
        let kk = shape[1];
        let picks = i32s(b, picks);
        assert_eq!(picks.len(), t * kk, "{key}: shape");
        let mut mism = 0;
        for i in 0..t {
            if !same_set(&picks[i * kk..(i + 1) * kk], &gold[i * kk..(i + 1) * kk]) {
                mism += 1;
                moved.insert(i);
            }
        }
        eprintln!("{name}: indexer layer {l}: {mism} of {t} positions differ");
        if mism != 0 && contract.selections_exact() {
            fails.push(format!("{key}: {mism} positions differ"));
        }
    }
    if !moved.is_empty() {
        eprintln!("{name}: positions with a moved router or indexer choice: {moved:?}");
    }
    // top-1 at every position (fast: but the near-ties)
    let differs: Vec<usize> =
        (0..t).filter(|&i| argmax(&logits[i * v..(i + 1) * v]) != argmax(&gl[i * v..(i + 1) * v])).collect();
    let (ties, bad): (Vec<usize>, Vec<usize>) = differs.into_iter().partition(|&i| {
        matches!(contract, Contract::Fast(_)) && (near_tie(&gl[i * v..(i + 1) * v], tol) || moved.contains(&i))
    });
    if !ties.is_empty() {
        eprintln!("{name}: top-1 differs at near-ties {ties:?} (allowed in fast precision)");
    }
    if !bad.is_empty() {
        fails.push(format!("top-1 differs at positions {bad:?}"));
    }
    fails
}

/// The most decode steps whose router or indexer choices may move in fast precision ([`greedy`]).
const MAX_MOVED_DECODE_STEPS: usize = 4;

/// Greedy decode on the cache: token 0 = argmax of the prefill's last logits, step s feeds token
/// s−1 at position T+s−1; its router ids and indexer picks must be the golden's `greedy_step_*`,
/// its logits match `greedy_step_logits[s−1]` within `tol` and its argmax be token s. Fast
/// precision excuses a step whose selections moved (its logits and token, as at a prefill
/// position), at most [`MAX_MOVED_DECODE_STEPS`] of them; every other step is held as above.
pub fn greedy<B: Backend>(
    name: &str,
    b: &B,
    model: &LmModel<B>,
    out: LmOutput<B>,
    g: &LmGolden,
    contract: impl Into<Contract>,
) -> Vec<String> {
    let contract = contract.into();
    let tol = contract.tol();
    let mut fails = Vec::new();
    let v = model.config().vocab_size;
    let want = &g.i["greedy_tokens"].1;
    let step_logits = &g.f["greedy_step_logits"].1;
    let logits = f32s(b, &out.logits);
    let t = logits.len() / v;
    let mut tok = argmax(&logits[(t - 1) * v..]) as i64;
    if tok != want[0] {
        fails.push(format!("greedy token 0: {tok} vs {}", want[0]));
    }
    let mut cache = out.cache;
    let mut worst = 0f64;
    let mut moved_steps = Vec::new();
    let layers = g.i["greedy_step_router_ids"].0[1];
    for s in 1..want.len() {
        let mut trace = LmTrace::new(layers);
        let l = f32s(b, &model.decode_traced(b, &mut cache, want[s - 1] as i32, &mut trace).unwrap());
        let e = rel_l2(&l, &step_logits[(s - 1) * v..s * v]);
        worst = worst.max(e);
        tok = argmax(&l) as i64;
        let moved = step_moves(b, &trace, g, s - 1);
        if !moved.is_empty() {
            eprintln!("{name}: decode step {s}: moved {moved:?}, logits rel L2 {e:.2e}, token {tok} vs {}", want[s]);
            moved_steps.push(s);
            if contract.selections_exact() {
                fails.push(format!("decode step {s}: selections differ: {moved:?}"));
            }
            // fast precision: a moved expert or entry changes this step's output by O(1)
            if matches!(contract, Contract::Fast(_)) {
                continue;
            }
        }
        if !(e <= tol) {
            fails.push(format!("decode step {s}: logits rel L2 {e:.3e}"));
        }
        if tok != want[s] {
            fails.push(format!("decode step {s}: token {tok} vs {}", want[s]));
        }
    }
    // A sanity cap, not a derived bound: fast precision moves few decode steps' choices (lavapipe
    // 1 of 31 and 0 of 31, 2026-12-07), a defect in the decode path most of them.
    if moved_steps.len() > MAX_MOVED_DECODE_STEPS {
        fails.push(format!("selections moved at {} decode steps {moved_steps:?}", moved_steps.len()));
    }
    eprintln!("{name}: greedy decode {} steps, worst step logits rel L2 {worst:.2e}", want.len() - 1);
    fails
}

/// The selections of one traced decode step that differ from the golden's row `r` of
/// `greedy_step_router_ids` `[steps, L, k]` (sorted ascending) and `greedy_step_indexer_topk.<l>`
/// `[steps, index_topk]` (compared as sets), named `layer l router` / `layer l indexer`.
fn step_moves<B: Backend>(b: &B, trace: &LmTrace<B>, g: &LmGolden, r: usize) -> Vec<String> {
    let (shape, gold) = &g.i["greedy_step_router_ids"];
    let (layers, k) = (shape[1], shape[2]);
    assert_eq!(trace.router_ids.len(), layers, "decode step: traced layers");
    let mut moved = Vec::new();
    for (l, rows) in trace.router_ids.iter().enumerate() {
        assert_eq!(rows.len(), 1, "decode step: one traced forward");
        if !same_set(&i32s(b, &rows[0]), &gold[(r * layers + l) * k..(r * layers + l + 1) * k]) {
            moved.push(format!("layer {l} router"));
        }
    }
    let golden_layers: std::collections::BTreeSet<usize> =
        g.i.keys().filter_map(|key| key.strip_prefix("greedy_step_indexer_topk.")?.parse().ok()).collect();
    assert!(trace.indexer.keys().copied().eq(golden_layers), "decode step: indexer layers differ from the golden's");
    for (&l, picks) in &trace.indexer {
        let (shape, gold) = &g.i[&format!("greedy_step_indexer_topk.{l}")];
        let kk = shape[1];
        if !same_set(&i32s(b, &picks[0]), &gold[r * kk..(r + 1) * kk]) {
            moved.push(format!("layer {l} indexer"));
        }
    }
    moved
}

/// Whether a lane's selections (router ids, indexer picks) hold the golden's, in any order.
fn same_set(ours: &[i32], gold: &[i64]) -> bool {
    let mut a: Vec<i64> = ours.iter().map(|&x| x as i64).collect();
    let mut z = gold.to_vec();
    a.sort();
    z.sort();
    a == z
}

fn ids_of(g: &LmGolden) -> Vec<i32> {
    g.i["input_ids"].1.iter().map(|&x| x as i32).collect()
}

/// `lm-text` on lane `b`: per-layer prefill and 32 greedy steps; returns the failures.
pub fn check_lm_text<B: Backend>(b: &B, contract: impl Into<Contract>) -> Vec<String> {
    let contract = contract.into();
    let (model, cfg) = load_lm_tiny(b);
    let g = lm_golden("lm-text");
    let out = model.prefill(b, &LmInput { ids: ids_of(&g), window: None }, None).unwrap();
    assert_eq!(out.indexer.keys().copied().collect::<Vec<_>>(), vec![1, 3], "CSA layers");
    let mut fails = compare("lm-text", b, &cfg, &out, &g, contract);
    fails.extend(greedy("lm-text", b, &model, out, &g, contract));
    fails
}

/// `lm-vision` on lane `b`: the §5.1 merge from the golden's aligner rows (bit-exact: it is a
/// copy), then per-layer prefill with image-span visibility and 32 greedy steps.
pub fn check_lm_vision<B: Backend>(b: &B, contract: impl Into<Contract>) -> Vec<String> {
    let contract = contract.into();
    let (model, cfg) = load_lm_tiny(b);
    let g = lm_golden("lm-vision");
    let ids = ids_of(&g);
    let v = cfg.vocab_size;
    // the block starts at the first sentinel id
    let start = ids.iter().position(|&i| i as usize >= v).expect("vision prompt has an image block");
    let types: Vec<i32> = g.i["image_types"].1.iter().map(|&x| x as i32).collect();
    let perm: Vec<usize> = g.i["image_perm"].1.iter().map(|&x| x as usize).collect();
    let (ashape, arows) = g.f["aligner_rows"].clone();
    let aligner = b.upload(&HostTensor::f32(ashape, arows).unwrap()).unwrap();
    let block = ImageBlock { start, types: &types, perm: &perm, aligner: &aligner };
    let embeds = model.merge_images(b, &ids, &[block]).unwrap();
    let e = rel_l2(&f32s(b, &embeds), &g.f["inputs_embeds"].1);
    eprintln!("lm-vision: inputs_embeds rel L2 {e:.2e}");
    assert!(e == 0.0, "the merge is a copy; inputs_embeds must be bit-exact (rel L2 {e:.3e})");
    let window = visible_bounds(&ids, v, cfg.sliding_window, MAX_IMAGE_TOKENS);
    let out = model.prefill(b, &LmInput { ids, window: Some(window) }, Some(embeds)).unwrap();
    let mut fails = compare("lm-vision", b, &cfg, &out, &g, contract);
    fails.extend(greedy("lm-vision", b, &model, out, &g, contract));
    fails
}

/// Decode steps of several sequences in one forward (`decode_batch`, the server's continuous
/// batching): eight prefixes of `lm-text`, each prefilled on its own, at positions that put them
/// in different places (before and past the window of 16, on and off the ratio-4 and ratio-16
/// block boundaries), then four batched steps feeding the golden's next ids. Row i of step s is
/// position `len_i + s` of the golden's one-piece prefill, which sees the same keys and entries:
/// it is held to the lane's prefill tolerance and the golden's top-1 (fast precision: the errors
/// are reported, as for the decode steps of [`greedy`], and top-1 is held but at near-ties).
pub fn check_batched_decode<B: Backend>(b: &B, contract: impl Into<Contract>) -> Vec<String> {
    let contract = contract.into();
    let tol = contract.tol();
    let (model, cfg) = load_lm_tiny(b);
    let g = lm_golden("lm-text");
    let ids = ids_of(&g);
    let v = cfg.vocab_size;
    let want = &g.f["logits"].1;
    let lens = [1usize, 15, 16, 63, 64, 127, 200, 290];
    let mut caches: Vec<_> = lens
        .iter()
        .map(|&n| {
            let input = LmInput { ids: ids[..n].to_vec(), window: None };
            model.prefill_cache(b, &input, None, 64, &mut |_| {}).unwrap().1
        })
        .collect();
    let mut fails = Vec::new();
    let mut worst = 0f64;
    for s in 0..4 {
        let step: Vec<i32> = lens.iter().map(|&n| ids[n + s]).collect();
        let mut refs: Vec<_> = caches.iter_mut().collect();
        let logits = f32s(b, &model.decode_batch(b, &mut refs, &step).unwrap());
        assert_eq!(logits.len(), lens.len() * v, "decode_batch: one logits row per sequence");
        for (i, &n) in lens.iter().enumerate() {
            let p = n + s;
            let (got, reference) = (&logits[i * v..(i + 1) * v], &want[p * v..(p + 1) * v]);
            let e = rel_l2(got, reference);
            worst = worst.max(e);
            if !(e <= tol) && contract.selections_exact() {
                fails.push(format!("batched decode, sequence {i} at position {p}: logits rel L2 {e:.3e}"));
            }
            if argmax(got) != argmax(reference) && !(matches!(contract, Contract::Fast(_)) && near_tie(reference, tol))
            {
                fails.push(format!("batched decode, sequence {i} at position {p}: top-1 differs"));
            }
        }
    }
    eprintln!("batched decode: {} sequences × 4 steps, worst logits rel L2 {worst:.2e}", lens.len());
    fails
}

/// The several-image goldens of fixtures/gen/vl/make_vl.py (vl-tiny; issue 15 item 1).
pub const VL_MULTI: [&str; 2] = ["vl-two", "vl-three"];

/// [`check_vl_images`] on every golden of [`VL_MULTI`] in exact precision
/// ([`VL_REL_L2`]); failures prefixed with the golden's name.
pub fn check_vl_multi<B: Backend>(b: &B) -> Vec<String> {
    VL_MULTI
        .iter()
        .flat_map(|name| check_vl_images(b, name, VL_REL_L2).into_iter().map(move |f| format!("{name}: {f}")))
        .collect()
}

/// Logits etc. of a prompt whose image rows come from the lane's own vision tower, relative L2.
/// Two f32 error sources add up (the derivation of tests/lm_vl.rs): the LM's, ≤ 1e-5 as for
/// lm-text, and the vision rows' (gated at 2e-5 against timm by the vision tests, measured ~1e-6)
/// times the LM's gain from aligner rows to logits, which the generator measures on each golden
/// (`aligner_sensitivity`, every image's rows moved at once) and [`check_vl_images`] holds to
/// ≤ [`VL_MAX_ALIGNER_GAIN`] (measured 1.24 to 2.21; vl-three, three images moved at once, is the
/// largest): 1e-5 + 2.5 × 2e-5 = 6e-5. A real bug (a block merged at another image's place, two
/// spans seeing each other, a lead PAD count off by one) moves the logits by 1e-2 or more.
pub const VL_REL_L2: f64 = 6e-5;
/// The gain [`VL_REL_L2`] assumes.
pub const VL_MAX_ALIGNER_GAIN: f64 = 2.5;
/// The vision rows merged into the prompt, against the golden's (timm's) rows: the vision tests'
/// f32 gate (tests/common `tolerance`).
const VL_EMBEDS_REL_L2: f64 = 2e-5;

/// vl-tiny loaded as the pipeline loads it: the LM and the vision tower on lane `b`.
pub fn load_vl_tiny<B: Backend>(b: &B) -> LoadedLm<'_, B> {
    let dir = root().join("fixtures/models/vl-tiny");
    LmSource::open(&dir, None, None).unwrap().load(b, true, &mut |_| {}).unwrap()
}

/// The i-th image's metadata key of a several-image golden (`image.0`, `image_block_start.1`).
fn image_key(g: &LmGolden, key: &str, k: usize) -> String {
    g.meta.get(&format!("{key}.{k}")).unwrap_or_else(|| panic!("golden metadata `{key}.{k}`")).clone()
}

/// A several-image golden on lane `b`, the whole path of an image prompt:
/// 1. the §5.1 merge alone, from the golden's own aligner rows: every block at its own place, a
///    copy, so `inputs_embeds` is bit-exact;
/// 2. the prompt as given (`IMG` at each placeholder) with the image files, through
///    [`LoadedLm::prompt`]: the lane's vision tower, each block's lead PADs from where it lands,
///    the merge and the image-span windows; the expanded ids and block starts exact, the merged
///    rows within the vision gate;
/// 3. the prefill (per layer: logits, final hidden, router and indexer selections) and 32 greedy
///    decode steps, under `contract`.
pub fn check_vl_images<B: Backend>(b: &B, name: &str, contract: impl Into<Contract>) -> Vec<String> {
    let contract = contract.into();
    let g = lm_golden(name);
    let n: usize = g.meta["images"].parse().unwrap();
    let gain: f64 = g.meta["aligner_sensitivity"].parse().unwrap();
    assert!(gain <= VL_MAX_ALIGNER_GAIN, "{name}: aligner sensitivity {gain} > {VL_MAX_ALIGNER_GAIN}: re-derive");
    let lm = load_vl_tiny(b);
    let ids = ids_of(&g);
    let starts: Vec<usize> = (0..n).map(|k| image_key(&g, "image_block_start", k).parse().unwrap()).collect();
    let mut fails = Vec::new();

    // 1. the merge of the golden's rows
    let rows: Vec<(Vec<i32>, Vec<usize>, B::Tensor)> = (0..n)
        .map(|k| {
            let types = g.i[&format!("image_types.{k}")].1.iter().map(|&x| x as i32).collect();
            let perm = g.i[&format!("image_perm.{k}")].1.iter().map(|&x| x as usize).collect();
            let (shape, al) = g.f[&format!("aligner_rows.{k}")].clone();
            (types, perm, b.upload(&HostTensor::f32(shape, al).unwrap()).unwrap())
        })
        .collect();
    let blocks: Vec<ImageBlock<'_, B>> = rows
        .iter()
        .zip(&starts)
        .map(|((types, perm, aligner), &start)| ImageBlock { start, types, perm, aligner })
        .collect();
    let merged = f32s(b, &lm.model.merge_images(b, &ids, &blocks).unwrap());
    let e = rel_l2(&merged, &g.f["inputs_embeds"].1);
    eprintln!("{name}: merge of the golden's aligner rows: inputs_embeds rel L2 {e:.2e}");
    if e != 0.0 {
        fails.push(format!("the merge is a copy; inputs_embeds rel L2 {e:.3e}, not bit-exact"));
    }

    // 2. the prompt through the pipeline on this lane
    let tokens: Vec<PromptToken> = g.i["prompt_ids"]
        .1
        .iter()
        .map(|&x| if x == -1 { PromptToken::Image } else { PromptToken::Id(x as u32) })
        .collect();
    let images = (0..n)
        .map(|k| {
            let path = root().join(image_key(&g, "image", k));
            lm.preprocess(&fovea::processor::load_rgb(&path).unwrap()).unwrap()
        })
        .collect();
    let prompt = lm.prompt(&tokens, images).unwrap();
    if prompt.input.ids != ids {
        fails.push("the expanded prompt ids differ from the golden's".into());
    }
    if prompt.image_starts != starts {
        fails.push(format!("image blocks start at {:?}, the golden's at {starts:?}", prompt.image_starts));
    }
    let embeds = prompt.embeds.expect("an image prompt has merged rows");
    let e = rel_l2(&f32s(b, &embeds), &g.f["inputs_embeds"].1);
    eprintln!("{name}: merged rows from this lane's vision tower: rel L2 {e:.2e}");
    if !(e <= VL_EMBEDS_REL_L2) {
        fails.push(format!("merged rows rel L2 {e:.3e} > {VL_EMBEDS_REL_L2:.0e}"));
    }

    // 3. prefill and greedy decode
    let out = lm.model.prefill(b, &prompt.input, Some(embeds)).unwrap();
    fails.extend(compare(name, b, &lm.cfg, &out, &g, contract));
    fails.extend(greedy(name, b, &lm.model, out, &g, contract));
    fails
}
