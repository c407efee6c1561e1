//! The DeepSeek-V4-Flash language model (language.md §2-4) plus the Vision-Exp behaviours
//! (vision.md §5: embedding merge, `bias_vl` routing, image-span visibility), written once
//! against [`Backend`]. [`LmModel::prefill`] runs a whole prompt from position 0 and returns an
//! [`LmCache`]; [`LmModel::decode`] extends it one token at a time.
//!
//! Per layer: `hc_split → hc_pre → attn_norm → attention → hc_post`, then
//! `hc_split → hc_pre → ffn_norm → MoE → hc_post`; then the HC head → `norm` → `head`. (Each
//! `hc_post` but the last layer's and the next sublayer's split, pre and norm are one backend op,
//! which a lane may fuse.)

pub mod generate;
pub mod vision;

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::rc::Rc;
use std::sync::Arc;

use crate::backend::{Backend, DeviceTensor, HostTensor};
use crate::config::LmConfig;
use crate::error::{Error, Result};
use crate::model::{ParamSource, PrefillProgress};

/// HC mixing parameters of one sublayer (`hc_{attn,ffn}_{fn,scale,base}`) or the head.
struct Hc<B: Backend> {
    /// `[(2+hc)·hc, hc·d]` (sublayer) or `[hc, hc·d]` (head).
    mix: B::Weight,
    scale: B::Tensor,
    base: B::Tensor,
}

/// A compressor (`attn.compressor.*` or `attn.indexer.compressor.*`, §2.2).
struct Compressor<B: Backend> {
    wkv: B::Weight,
    wgate: B::Weight,
    /// `[ratio, w]`, w = 2·width with overlap (ratio 4), width otherwise.
    ape: B::Tensor,
    norm: B::Tensor,
    ratio: usize,
    overlap: bool,
}

/// The lightning indexer of a CSA layer (§2.3).
struct Indexer<B: Backend> {
    wq_b: B::Weight,
    weights_proj: B::Weight,
    compressor: Compressor<B>,
}

struct Attention<B: Backend> {
    wq_a: B::Weight,
    q_norm: B::Tensor,
    wq_b: B::Weight,
    wkv: B::Weight,
    kv_norm: B::Tensor,
    sinks: B::Tensor,
    wo_a: B::Weight,
    wo_b: B::Weight,
    compressor: Option<Compressor<B>>,
    indexer: Option<Indexer<B>>,
}

struct Moe<B: Backend> {
    gate: B::Weight,
    /// `[2, E]`: row 0 = the text selection bias (`gate.bias`, zeros on hash layers), row 1 = the
    /// image-token bias (`gate.bias_vl`; row 0 when the checkpoint has none).
    bias: B::Tensor,
    /// `tid2eid` as i32 `[vocab, k]` on hash layers.
    tid2eid: Option<B::Tensor>,
    /// Per expert: gate w1 and up w3 `[I, d]`, down w2 `[d, I]`; separate weights, so each keeps
    /// its own storage format (GGUF mixes may store w1 and w3 in different block formats).
    w1: Vec<B::Weight>,
    w3: Vec<B::Weight>,
    w2: Vec<B::Weight>,
    shared_w1: B::Weight,
    shared_w3: B::Weight,
    shared_w2: B::Weight,
}

struct Layer<B: Backend> {
    ratio: usize,
    hc_attn: Hc<B>,
    attn_norm: B::Tensor,
    attn: Attention<B>,
    hc_ffn: Hc<B>,
    ffn_norm: B::Tensor,
    moe: Moe<B>,
}

/// The language model with its parameters resident on one lane.
pub struct LmModel<B: Backend> {
    cfg: LmConfig,
    embed: B::Weight,
    layers: Vec<Layer<B>>,
    hc_head: Hc<B>,
    norm: B::Tensor,
    head: B::Weight,
    /// RoPE inverse frequencies `[rd/2]`: ratio-0 layers, and compressed layers (YaRN).
    inv_freq_main: B::Tensor,
    inv_freq_comp: B::Tensor,
    /// `[5, d]`: image_start, image_pad, image_pad, image_newline, image_end (vision.md §5.1),
    /// when the checkpoint has them.
    sentinels: Option<B::Tensor>,
}

/// What a prompt feeds the model.
#[derive(Clone, Debug)]
pub struct LmInput {
    /// Token ids at positions `0..T`; ids ≥ vocab are image-block sentinels (vocab + type).
    pub ids: Vec<i32>,
    /// Inclusive raw-key window `(lo, hi)` of every query; `None` = the plain causal sliding
    /// window. [`vision::visible_bounds`] builds the image-span version (§5.3).
    pub window: Option<Vec<(usize, usize)>>,
}

/// Rows `start..start + len` of a tensor that several sequences' caches may share: a forward
/// over several sequences lays all their raw keys (or a compressor's rows, or its entries) out
/// back to back in one tensor, so that one op reads or extends all of them, and each cache keeps
/// its span of it.
pub struct SharedRows<B: Backend> {
    tensor: Arc<B::Tensor>,
    start: usize,
    len: usize,
}

impl<B: Backend> SharedRows<B> {
    /// All rows of `t`, shared with no one yet.
    fn whole(t: B::Tensor) -> Self {
        let len = t.rows();
        SharedRows { tensor: Arc::new(t), start: 0, len }
    }
    pub fn rows(&self) -> usize {
        self.len
    }
    /// `[rows, cols]` of the span.
    pub fn shape(&self) -> [usize; 2] {
        [self.len, self.tensor.cols()]
    }
}

/// A compressor's running state: its emitted entries plus the raw projected rows it still needs
/// (the incomplete block, and with overlap the previous complete block).
pub struct CompState<B: Backend> {
    /// Emitted entries `[⌊P/r⌋, width]` (normed, roped at `r·i`).
    pub entries: SharedRows<B>,
    /// Buffered `wkv` / `wgate` rows of positions `buf_start..P` `[P − buf_start, w]`;
    /// `buf_start` is a block boundary.
    pub rows_kv: SharedRows<B>,
    pub rows_gate: SharedRows<B>,
    pub buf_start: usize,
}

/// One layer's cache.
pub struct LayerCache<B: Backend> {
    /// Raw K = V latents (roped) of positions `kv_start..P`: between chunks only the last
    /// `sliding_window − 1`, all a later query can see (a chunk never splits an image span, and
    /// a span's window reaches back no further than the window of its first token).
    pub kv: SharedRows<B>,
    pub kv_start: usize,
    /// The attention compressor (ratio ≠ 0 layers).
    pub comp: Option<CompState<B>>,
    /// The indexer's compressor (CSA layers).
    pub index: Option<CompState<B>>,
}

/// Model state after `pos` tokens; [`LmModel::forward`] extends it by a chunk.
pub struct LmCache<B: Backend> {
    pub pos: usize,
    pub layers: Vec<LayerCache<B>>,
}

/// One sequence's rows in a forward over several sequences ([`LmModel::decode_batch`]).
struct SeqChunk<'a, B: Backend> {
    cache: &'a mut LmCache<B>,
    /// The rows of the forward's chunk that are this sequence's, at positions `cache.pos..`.
    rows: Range<usize>,
    /// Each row's inclusive raw-key window, absolute positions.
    window: &'a [(usize, usize)],
}

/// A prefill in progress ([`LmModel::start_prefill`]): the prompt, its chunks still to run, and
/// the cache of those that ran.
pub struct Prefill<B: Backend> {
    ids: Vec<i32>,
    embeds: Option<B::Tensor>,
    window: Vec<(usize, usize)>,
    chunks: std::vec::IntoIter<std::ops::Range<usize>>,
    /// How many chunks the prompt has, and how many of its tokens have run.
    n_chunks: usize,
    done_tokens: usize,
    pub cache: LmCache<B>,
}

impl<B: Backend> Prefill<B> {
    /// Whether every chunk has run.
    pub fn is_done(&self) -> bool {
        self.chunks.len() == 0
    }

    /// Where the prefill stands, for a progress report.
    pub fn progress(&self) -> PrefillProgress {
        PrefillProgress { done_tokens: self.done_tokens, total_tokens: self.ids.len(), chunks: self.n_chunks }
    }
}

/// Per-layer records of a forward, one tensor per chunk (conformance tests and dumps).
pub struct LmTrace<B: Backend> {
    /// Per layer, the 4-stream residual `[n, hc·d]` after the layer.
    pub hidden: Vec<Vec<B::Tensor>>,
    /// Per layer, the selected experts i32 `[n, k]` (unspecified order).
    pub router_ids: Vec<Vec<B::Tensor>>,
    /// Per layer, their routing weights `[n, k]` (× routed_scaling_factor).
    pub router_weights: Vec<Vec<B::Tensor>>,
    /// Per CSA layer, the indexer's picks i32 `[n, index_topk]` (descending score, −1 = empty).
    pub indexer: BTreeMap<usize, Vec<B::Tensor>>,
}

impl<B: Backend> LmTrace<B> {
    pub fn new(layers: usize) -> Self {
        LmTrace {
            hidden: (0..layers).map(|_| Vec::new()).collect(),
            router_ids: (0..layers).map(|_| Vec::new()).collect(),
            router_weights: (0..layers).map(|_| Vec::new()).collect(),
            indexer: BTreeMap::new(),
        }
    }
}

/// Everything a prefill produces, still on the device (rows over the whole prompt).
pub struct LmOutput<B: Backend> {
    /// `[T, vocab]`.
    pub logits: B::Tensor,
    /// `[T, d]`: `norm(hc_head(X))`, the head's input.
    pub final_hidden: B::Tensor,
    /// Per layer, the 4-stream residual `[T, hc·d]` after the layer.
    pub hidden: Vec<B::Tensor>,
    /// Per layer, the selected experts i32 `[T, k]` (unspecified order).
    pub router_ids: Vec<B::Tensor>,
    /// Per layer, their routing weights `[T, k]` (× routed_scaling_factor).
    pub router_weights: Vec<B::Tensor>,
    /// Per CSA layer, the indexer's picks i32 `[T, index_topk]` (descending score, −1 = empty).
    pub indexer: BTreeMap<usize, B::Tensor>,
    /// The cache a decode continues from.
    pub cache: LmCache<B>,
}

/// How many raw keys a layer keeps after position `end`: the last `window − 1`, all a later
/// query can see (see [`LayerCache::kv`]).
fn kept_keys(window: usize, end: usize) -> usize {
    window.saturating_sub(1).min(end)
}

/// The first position whose projected rows a compressor still buffers once it has emitted
/// `done` entries: the open block's start, or with overlap the start of the last complete block
/// (whose first halves the next entry pools).
fn open_rows_start(done: usize, ratio: usize, overlap: bool) -> usize {
    if overlap { done.saturating_sub(1) * ratio } else { done * ratio }
}

/// Split `0..ids.len()` into chunks of at most `max_chunk` tokens that never split an image block
/// (its lead PADs, START through END: ids ≥ `vocab`, vision.md §5.3: a span's tokens see each
/// other both ways); a block longer than `max_chunk` gets a chunk of its own. Two blocks back to
/// back are two blocks: a chunk may end after the first one's END.
pub fn chunk_plan(ids: &[i32], vocab: usize, max_chunk: usize) -> Vec<std::ops::Range<usize>> {
    let max_chunk = max_chunk.max(1);
    let is_image = |i: usize| ids[i] >= 0 && ids[i] as usize >= vocab;
    let end_id = vocab as i64 + vision::IMAGE_END as i64;
    // whether a cut before position i would split a block
    let splits = |i: usize| is_image(i - 1) && is_image(i) && ids[i - 1] as i64 != end_id;
    let mut plan = Vec::new();
    let mut start = 0;
    while start < ids.len() {
        let mut end = (start + max_chunk).min(ids.len());
        if end < ids.len() && splits(end) {
            // cut before the block that holds `end`, or take the whole block if it starts here
            end = match (start + 1..end).rev().find(|&i| !splits(i)) {
                Some(block_start) => block_start,
                None => (end + 1..ids.len()).find(|&i| !splits(i)).unwrap_or(ids.len()),
            };
        }
        plan.push(start..end);
        start = end;
    }
    plan
}

/// The index lists one forward uploads (window bounds, rows to gather, entry positions), each
/// distinct list once: every layer keeps the same window of keys and the compressors of one ratio
/// emit alike, so the layers of a decode step ask for the same few lists (on the CUDA lane a copy
/// costs the host ~4 µs, and a decode step of the released model made 515 of them).
struct IndexUploads<'a, B: Backend> {
    b: &'a B,
    /// By (shape, values).
    memo: RefCell<HashMap<IndexKey, Rc<B::Tensor>>>,
}

type IndexKey = (Vec<usize>, Vec<i32>);

impl<'a, B: Backend> IndexUploads<'a, B> {
    fn new(b: &'a B) -> Self {
        IndexUploads { b, memo: RefCell::default() }
    }

    /// An i32 tensor of `shape` holding `idx`: uploaded at its first request in this forward.
    fn i32(&self, shape: &[usize], idx: Vec<i32>) -> Result<Rc<B::Tensor>> {
        let key = (shape.to_vec(), idx);
        if let Some(t) = self.memo.borrow().get(&key) {
            return Ok(t.clone());
        }
        let t = Rc::new(self.b.upload(&HostTensor::i32(key.0.clone(), key.1.clone())?)?);
        self.memo.borrow_mut().insert(key, t.clone());
        Ok(t)
    }

    /// Rows `idx` of `x` (`Backend::gather_rows`), the list uploaded once per forward.
    fn gather(&self, x: &B::Tensor, idx: Vec<i32>) -> Result<B::Tensor> {
        self.b.gather_rows(x, &*self.i32(&[idx.len()], idx)?)
    }
}

/// Rows `range` of x `[m, d]` (a copy).
fn rows_of<B: Backend>(b: &B, x: &B::Tensor, range: std::ops::Range<usize>) -> Result<B::Tensor> {
    let idx: Vec<i32> = range.map(|i| i as i32).collect();
    b.gather_rows(x, &b.upload(&HostTensor::i32([idx.len()], idx)?)?)
}

/// A cache's rows compacted out of a packed tensor once it holds more than twice their count
/// plus this many rows (a prefill chunk's, of which a cache keeps the last few).
const PACK_SLACK_ROWS: usize = 64;

/// One tensor with every sequence's rows back to back: sequence s's `kept[s]`, then rows
/// `fresh.1[s]` of `fresh.0` (the new rows of all sequences). Returns it and the row where each
/// sequence's rows start. Without fresh rows, kept rows that already share one tensor stay where
/// they are (no op); else one concatenation per distinct tensor and one gather (none when the
/// layout is a run of consecutive rows of the concatenation: the tensor then holds rows before
/// the spans, until [`keep_spans`] compacts it).
fn pack_rows<B: Backend>(
    u: &IndexUploads<'_, B>,
    kept: &[&SharedRows<B>],
    fresh: Option<(B::Tensor, &[Range<usize>])>,
) -> Result<(Arc<B::Tensor>, Vec<usize>)> {
    let first = kept.first().ok_or_else(|| Error::Invalid("pack_rows: no sequence".into()))?;
    // the distinct tensors of non-empty spans, each with its first row in the concatenation
    let mut sources: Vec<(&Arc<B::Tensor>, usize)> = Vec::new();
    let mut total = 0;
    for k in kept.iter().filter(|k| k.len > 0) {
        if !sources.iter().any(|(t, _)| Arc::ptr_eq(t, &k.tensor)) {
            sources.push((&k.tensor, total));
            total += k.tensor.rows();
        }
    }
    let fresh = fresh.filter(|(_, ranges)| ranges.iter().any(|r| !r.is_empty()));
    match (&fresh, sources.as_slice()) {
        (None, []) => Ok((first.tensor.clone(), vec![0; kept.len()])),
        (None, [(t, _)]) => Ok(((*t).clone(), kept.iter().map(|k| k.start).collect())),
        (Some((_, ranges)), _) if ranges.len() != kept.len() => {
            Err(Error::Invalid(format!("pack_rows: {} row ranges for {} sequences", ranges.len(), kept.len())))
        }
        _ => pack_into_one(u, kept, &sources, fresh),
    }
}

/// [`pack_rows`]' copy: concatenate `sources`, then the fresh rows, and gather the layout.
fn pack_into_one<B: Backend>(
    u: &IndexUploads<'_, B>,
    kept: &[&SharedRows<B>],
    sources: &[(&Arc<B::Tensor>, usize)],
    fresh: Option<(B::Tensor, &[Range<usize>])>,
) -> Result<(Arc<B::Tensor>, Vec<usize>)> {
    // the fresh rows follow every source
    let fresh_base = sources.last().map_or(0, |&(t, base)| base + t.rows());
    let mut idx: Vec<i32> = Vec::new();
    let mut starts = Vec::with_capacity(kept.len());
    for (s, k) in kept.iter().enumerate() {
        starts.push(idx.len());
        if k.len > 0 {
            let base = sources.iter().find(|(t, _)| Arc::ptr_eq(t, &k.tensor)).map_or(0, |&(_, base)| base);
            idx.extend((base + k.start..base + k.start + k.len).map(|i| i as i32));
        }
        if let Some((_, ranges)) = &fresh {
            idx.extend(ranges[s].clone().map(|i| (fresh_base + i) as i32));
        }
    }
    let all: Arc<B::Tensor> = match (sources, fresh) {
        ([], Some((f, _))) => Arc::new(f),
        ([], None) => return Err(Error::Invalid("pack_rows: no rows to lay out".into())),
        ([(t, _)], None) => (*t).clone(),
        (_, fresh) => {
            let mut parts: Vec<&B::Tensor> = sources.iter().map(|(t, _)| t.as_ref()).collect();
            if let Some((f, _)) = &fresh {
                parts.push(f);
            }
            // two parts at least: several sources, or one and the fresh rows
            let mut acc: Option<B::Tensor> = None;
            for t in &parts[1..] {
                acc = Some(u.b.concat_rows(acc.as_ref().unwrap_or(parts[0]), t)?);
            }
            Arc::new(acc.ok_or_else(|| Error::Invalid("pack_rows: one part to concatenate".into()))?)
        }
    };
    // a run of consecutive rows (a lone sequence whose kept span ends its tensor, as a decode
    // step's is) is already the layout: the spans start further in, and no gather is needed
    if let Some(&first) = idx.first()
        && idx.iter().enumerate().all(|(i, &j)| j as usize == first as usize + i)
    {
        return Ok((all, starts.iter().map(|s| s + first as usize).collect()));
    }
    Ok((Arc::new(u.gather(&all, idx)?), starts))
}

/// The caches' spans `(start, len)` of `packed`; when they hold less than half of it (plus
/// [`PACK_SLACK_ROWS`]), a compact copy of them instead, so that a cache does not keep a whole
/// chunk alive.
fn keep_spans<B: Backend>(
    u: &IndexUploads<'_, B>,
    packed: Arc<B::Tensor>,
    spans: &[(usize, usize)],
) -> Result<Vec<SharedRows<B>>> {
    let kept: usize = spans.iter().map(|&(_, len)| len).sum();
    if packed.rows() <= 2 * kept + PACK_SLACK_ROWS {
        return Ok(spans.iter().map(|&(start, len)| SharedRows { tensor: packed.clone(), start, len }).collect());
    }
    let idx: Vec<i32> = spans.iter().flat_map(|&(start, len)| (start..start + len).map(|i| i as i32)).collect();
    let compact = Arc::new(u.gather(&packed, idx)?);
    let mut start = 0;
    Ok(spans
        .iter()
        .map(|&(_, len)| {
            start += len;
            SharedRows { tensor: compact.clone(), start: start - len, len }
        })
        .collect())
}

/// Concatenate one record's per-chunk tensors.
fn concat_all<B: Backend>(b: &B, parts: Vec<B::Tensor>) -> Result<B::Tensor> {
    let mut parts = parts.into_iter();
    let first = parts.next().ok_or_else(|| Error::Invalid("prefill: no chunk was run".into()))?;
    parts.try_fold(first, |acc, t| b.concat_rows(&acc, &t))
}

fn param<B: Backend>(b: &B, src: &impl ParamSource, name: &str) -> Result<B::Tensor> {
    let v = src.vector(name)?;
    b.upload_param(&HostTensor::f32([v.len()], v)?)
}

fn param2<B: Backend>(b: &B, src: &impl ParamSource, name: &str, rows: usize) -> Result<B::Tensor> {
    let v = src.vector(name)?;
    if rows == 0 || v.len() % rows != 0 {
        return Err(Error::tensor(name, format!("{} elements do not form {rows} rows", v.len())));
    }
    let cols = v.len() / rows;
    b.upload_param(&HostTensor::f32([rows, cols], v)?)
}

fn i32_of(name: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::tensor(name, format!("value {v} does not fit i32")))
}

impl<B: Backend> LmModel<B> {
    /// Upload every language-model parameter (official names, language.md §5.1).
    pub fn load(b: &B, src: &impl ParamSource, cfg: &LmConfig) -> Result<Self> {
        let matrix = |name: &str| -> Result<B::Weight> { b.upload_weight(&src.matrix(name)?) };
        // the weights each `linear_pair` takes, uploaded together (a lane may launch it once)
        let pair = |a: &str, c: &str| -> Result<(B::Weight, B::Weight)> {
            b.upload_weight_pair(&src.matrix(a)?, &src.matrix(c)?)
        };
        // f32 products in every precision: the hyper-connection mixes feed the Sinkhorn that
        // weighs the residual streams, the router's scores pick the experts
        let exact_matrix = |name: &str| -> Result<B::Weight> { b.upload_weight_exact(&src.matrix(name)?) };
        let hc_of = |p: &str| -> Result<Hc<B>> {
            Ok(Hc {
                mix: exact_matrix(&format!("{p}_fn"))?,
                scale: param(b, src, &format!("{p}_scale"))?,
                base: param(b, src, &format!("{p}_base"))?,
            })
        };
        let compressor = |p: &str, ratio: usize| -> Result<Compressor<B>> {
            let (wkv, wgate) = pair(&format!("{p}wkv.weight"), &format!("{p}wgate.weight"))?;
            Ok(Compressor {
                wkv,
                wgate,
                ape: param2(b, src, &format!("{p}ape"), ratio)?,
                norm: param(b, src, &format!("{p}norm.weight"))?,
                ratio,
                overlap: ratio == 4,
            })
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let p = format!("layers.{l}.");
            let a = format!("{p}attn.");
            let ratio = cfg.ratio(l);
            let (wq_a, wkv) = pair(&format!("{a}wq_a.weight"), &format!("{a}wkv.weight"))?;
            let attn = Attention {
                wq_a,
                q_norm: param(b, src, &format!("{a}q_norm.weight"))?,
                wq_b: matrix(&format!("{a}wq_b.weight"))?,
                wkv,
                kv_norm: param(b, src, &format!("{a}kv_norm.weight"))?,
                sinks: param(b, src, &format!("{a}attn_sink"))?,
                wo_a: matrix(&format!("{a}wo_a.weight"))?,
                wo_b: matrix(&format!("{a}wo_b.weight"))?,
                compressor: if ratio != 0 { Some(compressor(&format!("{a}compressor."), ratio)?) } else { None },
                indexer: if ratio == 4 {
                    Some(Indexer {
                        wq_b: matrix(&format!("{a}indexer.wq_b.weight"))?,
                        weights_proj: matrix(&format!("{a}indexer.weights_proj.weight"))?,
                        compressor: compressor(&format!("{a}indexer.compressor."), 4)?,
                    })
                } else {
                    None
                },
            };
            let f = format!("{p}ffn.");
            let e = cfg.n_routed_experts;
            let hash = l < cfg.num_hash_layers;
            let text_bias = if hash { vec![0f32; e] } else { src.vector(&format!("{f}gate.bias"))? };
            let vl_name = format!("{f}gate.bias_vl");
            let vl_bias = if src.has(&vl_name) { src.vector(&vl_name)? } else { text_bias.clone() };
            for (name, v) in [(format!("{f}gate.bias"), &text_bias), (vl_name, &vl_bias)] {
                if v.len() != e {
                    return Err(Error::tensor(name, format!("{} elements, expected n_routed_experts {e}", v.len())));
                }
            }
            let tid2eid = if hash {
                let name = format!("{f}gate.tid2eid");
                let (shape, vals) = src.integers(&name)?;
                if shape != [cfg.vocab_size, cfg.num_experts_per_tok] {
                    return Err(Error::tensor(
                        &name,
                        format!("shape {shape:?}, expected [{}, {}]", cfg.vocab_size, cfg.num_experts_per_tok),
                    ));
                }
                let vals = vals.iter().map(|&v| i32_of(&name, v)).collect::<Result<Vec<_>>>()?;
                if let Some(bad) = vals.iter().find(|&&v| v < 0 || v as usize >= e) {
                    return Err(Error::tensor(&name, format!("expert id {bad} outside 0..{e}")));
                }
                Some(b.upload_param(&HostTensor::i32(shape, vals)?)?)
            } else {
                None
            };
            let expert = |j: usize, w: &str| src.matrix(&format!("{f}experts.{j}.{w}.weight"));
            let (w1, w3) = b.upload_expert_pair(e, &mut |j| expert(j, "w1"), &mut |j| expert(j, "w3"))?;
            let w2 = b.upload_experts(e, &mut |j| expert(j, "w2"))?;
            let x = format!("{f}shared_experts.");
            let (shared_w1, shared_w3) = pair(&format!("{x}w1.weight"), &format!("{x}w3.weight"))?;
            let moe = Moe {
                gate: exact_matrix(&format!("{f}gate.weight"))?,
                bias: b.upload_param(&HostTensor::f32([2, e], [text_bias, vl_bias].concat())?)?,
                tid2eid,
                w1,
                w3,
                w2,
                shared_w1,
                shared_w3,
                shared_w2: matrix(&format!("{x}w2.weight"))?,
            };
            layers.push(Layer {
                ratio,
                hc_attn: hc_of(&format!("{p}hc_attn"))?,
                attn_norm: param(b, src, &format!("{p}attn_norm.weight"))?,
                attn,
                hc_ffn: hc_of(&format!("{p}hc_ffn"))?,
                ffn_norm: param(b, src, &format!("{p}ffn_norm.weight"))?,
                moe,
            });
        }
        let inv = |r: usize| -> Result<B::Tensor> {
            let f = cfg.inv_freq(r);
            b.upload_param(&HostTensor::f32([f.len()], f)?)
        };
        let sentinels = if src.has("image_start") {
            let mut table = Vec::with_capacity(5 * cfg.hidden_size);
            for name in ["image_start", "image_pad", "image_pad", "image_newline", "image_end"] {
                let v = src.vector(name)?;
                if v.len() != cfg.hidden_size {
                    return Err(Error::tensor(
                        name,
                        format!("{} elements, expected hidden_size {}", v.len(), cfg.hidden_size),
                    ));
                }
                table.extend(v);
            }
            Some(b.upload_param(&HostTensor::f32([5, cfg.hidden_size], table)?)?)
        } else {
            None
        };
        Ok(LmModel {
            cfg: cfg.clone(),
            embed: matrix("embed.weight")?,
            layers,
            hc_head: hc_of("hc_head")?,
            norm: param(b, src, "norm.weight")?,
            head: matrix("head.weight")?,
            inv_freq_main: inv(0)?,
            inv_freq_comp: inv(1)?,
            sentinels,
        })
    }

    pub fn config(&self) -> &LmConfig {
        &self.cfg
    }

    /// Token embeddings `[T, d]` (sentinel ids give zero rows, §5.1).
    pub fn embed(&self, b: &B, ids: &[i32]) -> Result<B::Tensor> {
        let ids = b.upload(&HostTensor::i32([ids.len()], ids.to_vec())?)?;
        b.embed_rows(&self.embed, &ids)
    }

    /// An empty cache (position 0).
    pub fn new_cache(&self, b: &B) -> Result<LmCache<B>> {
        let empty = |cols: usize| b.upload(&HostTensor::f32([0, cols], Vec::new())?);
        let state = |c: &Compressor<B>| -> Result<CompState<B>> {
            Ok(CompState {
                entries: SharedRows::whole(empty(c.norm.rows())?),
                rows_kv: SharedRows::whole(empty(c.ape.cols())?),
                rows_gate: SharedRows::whole(empty(c.ape.cols())?),
                buf_start: 0,
            })
        };
        let layers = self
            .layers
            .iter()
            .map(|layer| {
                Ok(LayerCache {
                    kv: SharedRows::whole(empty(self.cfg.head_dim)?),
                    kv_start: 0,
                    comp: layer.attn.compressor.as_ref().map(state).transpose()?,
                    index: layer.attn.indexer.as_ref().map(|ix| state(&ix.compressor)).transpose()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(LmCache { pos: 0, layers })
    }

    /// A cache at position `pos` shaped as a prefill of `pos` text tokens leaves it: per layer
    /// the last `sliding_window − 1` raw keys, `⌊pos/r⌋` entries in each compressor (the
    /// attention's and, on CSA layers, the indexer's) and the projected rows of the blocks still
    /// open, but holding `values(n)` (n values each) instead of what a prompt would put there.
    /// For benchmarks: a decode step's cost at a long context depends on these counts, not on
    /// the values, and building the cache costs an upload instead of a prefill of `pos` tokens.
    /// `values` must give finite numbers; entries of a real cache are RMS-normed, so values of
    /// magnitude ~1 keep a decode on it in range.
    #[doc(hidden)]
    pub fn synthetic_cache(&self, b: &B, pos: usize, values: &mut dyn FnMut(usize) -> Vec<f32>) -> Result<LmCache<B>> {
        let mut filled = |rows: usize, cols: usize| -> Result<B::Tensor> {
            let v = values(rows * cols);
            if v.len() != rows * cols {
                return Err(Error::Invalid(format!(
                    "synthetic_cache: {} values for a [{rows}, {cols}] tensor",
                    v.len()
                )));
            }
            b.upload(&HostTensor::f32([rows, cols], v)?)
        };
        let state = |c: &Compressor<B>, filled: &mut dyn FnMut(usize, usize) -> Result<B::Tensor>| {
            let done = pos / c.ratio;
            let buf_start = open_rows_start(done, c.ratio, c.overlap);
            Ok::<_, Error>(CompState {
                entries: SharedRows::whole(filled(done, c.norm.rows())?),
                rows_kv: SharedRows::whole(filled(pos - buf_start, c.ape.cols())?),
                rows_gate: SharedRows::whole(filled(pos - buf_start, c.ape.cols())?),
                buf_start,
            })
        };
        let keep = kept_keys(self.cfg.sliding_window, pos);
        let mut layers = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            let comp = layer.attn.compressor.as_ref().map(|c| state(c, &mut filled)).transpose()?;
            let index = layer.attn.indexer.as_ref().map(|ix| state(&ix.compressor, &mut filled)).transpose()?;
            let kv = SharedRows::whole(filled(keep, self.cfg.head_dim)?);
            layers.push(LayerCache { kv, kv_start: pos - keep, comp, index });
        }
        Ok(LmCache { pos, layers })
    }

    /// The raw-key window `(lo, hi)` of every prompt token, absolute positions: the image-span
    /// bounds of `input.window`, or the plain causal sliding window.
    fn prompt_window(&self, input: &LmInput) -> Result<Vec<(usize, usize)>> {
        let t = input.ids.len();
        match &input.window {
            Some(w) if w.len() != t => {
                Err(Error::Invalid(format!("prefill: {} window bounds for {t} tokens", w.len())))
            }
            Some(w) => Ok(w.clone()),
            None => Ok((0..t).map(|i| ((i + 1).saturating_sub(self.cfg.sliding_window), i)).collect()),
        }
    }

    /// Prefill from position 0 over `input` in one chunk, recording every layer; `embeds`
    /// `[T, d]` replaces the token embeddings (the §5.1 merge result).
    pub fn prefill(&self, b: &B, input: &LmInput, embeds: Option<B::Tensor>) -> Result<LmOutput<B>> {
        self.prefill_chunked(b, input, embeds, usize::MAX)
    }

    /// Prefill in chunks of [`chunk_plan`], recording every layer; rows are concatenated over
    /// the chunks.
    pub fn prefill_chunked(
        &self,
        b: &B,
        input: &LmInput,
        embeds: Option<B::Tensor>,
        max_chunk: usize,
    ) -> Result<LmOutput<B>> {
        let mut trace = LmTrace::new(self.layers.len());
        let (final_hidden, cache) = self.run_chunks(b, input, embeds, max_chunk, Some(&mut trace), &mut |_| {})?;
        let cat = |parts: Vec<Vec<B::Tensor>>| parts.into_iter().map(|p| concat_all(b, p)).collect::<Result<Vec<_>>>();
        Ok(LmOutput {
            logits: self.logits(b, &final_hidden)?,
            final_hidden,
            hidden: cat(trace.hidden)?,
            router_ids: cat(trace.router_ids)?,
            router_weights: cat(trace.router_weights)?,
            indexer: trace.indexer.into_iter().map(|(l, p)| Ok((l, concat_all(b, p)?))).collect::<Result<_>>()?,
            cache,
        })
    }

    /// Prefill in chunks of [`chunk_plan`], nothing recorded: the final hidden rows `[T, d]`
    /// (the head's input; [`LmModel::logits`] maps the rows a caller wants) and the cache.
    /// `on_chunk` sees the tokens done before the first chunk and after each one.
    pub fn prefill_cache(
        &self,
        b: &B,
        input: &LmInput,
        embeds: Option<B::Tensor>,
        max_chunk: usize,
        on_chunk: &mut dyn FnMut(PrefillProgress),
    ) -> Result<(B::Tensor, LmCache<B>)> {
        self.run_chunks(b, input, embeds, max_chunk, None, on_chunk)
    }

    /// The chunk loop of both prefills: final hidden rows `[T, d]` and the cache.
    fn run_chunks(
        &self,
        b: &B,
        input: &LmInput,
        embeds: Option<B::Tensor>,
        max_chunk: usize,
        mut trace: Option<&mut LmTrace<B>>,
        on_chunk: &mut dyn FnMut(PrefillProgress),
    ) -> Result<(B::Tensor, LmCache<B>)> {
        let mut prefill = self.start_prefill(b, input, embeds, max_chunk)?;
        let mut finals = Vec::new();
        on_chunk(prefill.progress());
        while let Some(hidden) = self.prefill_step(b, &mut prefill, trace.as_deref_mut())? {
            finals.push(hidden);
            if prefill.n_chunks > 1 {
                // a GPU lane returns once a chunk's work is queued: wait for it, so a report (a
                // progress bar's rate and time left) counts finished tokens; one wait per chunk
                b.sync()?;
            }
            on_chunk(prefill.progress());
        }
        Ok((concat_all(b, finals)?, prefill.cache))
    }

    /// A prefill to be run one chunk at a time with [`LmModel::prefill_step`] (a server
    /// interleaves the chunks of a new prompt with other sequences' decode steps); the chunks are
    /// those of [`chunk_plan`].
    pub fn start_prefill(
        &self,
        b: &B,
        input: &LmInput,
        embeds: Option<B::Tensor>,
        max_chunk: usize,
    ) -> Result<Prefill<B>> {
        let chunks = chunk_plan(&input.ids, self.cfg.vocab_size, max_chunk);
        Ok(Prefill {
            window: self.prompt_window(input)?,
            ids: input.ids.clone(),
            embeds,
            n_chunks: chunks.len(),
            chunks: chunks.into_iter(),
            done_tokens: 0,
            cache: self.new_cache(b)?,
        })
    }

    /// Run the next chunk of `prefill`: its final hidden rows `[n, d]`, or `None` when every
    /// chunk has run (the cache is then complete).
    pub fn prefill_step(
        &self,
        b: &B,
        prefill: &mut Prefill<B>,
        trace: Option<&mut LmTrace<B>>,
    ) -> Result<Option<B::Tensor>> {
        let Some(range) = prefill.chunks.next() else { return Ok(None) };
        let e = prefill.embeds.as_ref().map(|e| rows_of(b, e, range.clone())).transpose()?;
        let ids = &prefill.ids[range.clone()];
        prefill.done_tokens = range.end;
        self.forward(b, &mut prefill.cache, ids, e, &prefill.window[range], trace).map(Some)
    }

    /// Logits `[1, vocab]` of the last row of final hidden rows `[n, d]`.
    pub fn last_logits(&self, b: &B, final_hidden: &B::Tensor) -> Result<B::Tensor> {
        let n = final_hidden.rows();
        if n == 0 {
            return Err(Error::Invalid("logits of an empty chunk".into()));
        }
        self.logits(b, &rows_of(b, final_hidden, n - 1..n)?)
    }

    /// One decode step: feed text token `id` at position `cache.pos`, extend the cache, return
    /// the logits `[1, vocab]` (image blocks enter through a prefill, vision.md §5.1).
    pub fn decode(&self, b: &B, cache: &mut LmCache<B>, id: i32) -> Result<B::Tensor> {
        self.decode_seqs(b, &mut [cache], &[id], None)
    }

    /// [`LmModel::decode`], recording the step's per-layer records in `trace` (conformance tests).
    pub fn decode_traced(&self, b: &B, cache: &mut LmCache<B>, id: i32, trace: &mut LmTrace<B>) -> Result<B::Tensor> {
        self.decode_seqs(b, &mut [cache], &[id], Some(trace))
    }

    /// One decode step of several sequences in one forward: `ids[i]` extends `caches[i]` at its
    /// own position. Returns the logits `[B, vocab]`, row i for sequence i. The per-token work
    /// (projections, MoE, hyper-connections, head) runs on all B rows at once; RoPE, the caches,
    /// the compressors and attention run per sequence. After an error the caches are not to be
    /// used again: a failure part way leaves some layers extended and others not.
    pub fn decode_batch(&self, b: &B, caches: &mut [&mut LmCache<B>], ids: &[i32]) -> Result<B::Tensor> {
        self.decode_seqs(b, caches, ids, None)
    }

    /// [`LmModel::decode_batch`] with an optional trace (one sequence only: `forward_seqs`).
    fn decode_seqs(
        &self,
        b: &B,
        caches: &mut [&mut LmCache<B>],
        ids: &[i32],
        trace: Option<&mut LmTrace<B>>,
    ) -> Result<B::Tensor> {
        let v = self.cfg.vocab_size;
        if let Some(&id) = ids.iter().find(|&&id| id < 0 || id as usize >= v) {
            return Err(Error::Invalid(format!("decode: token id {id} outside the text vocabulary 0..{v}")));
        }
        if caches.len() != ids.len() {
            return Err(Error::Invalid(format!("decode: {} caches for {} tokens", caches.len(), ids.len())));
        }
        let windows: Vec<[(usize, usize); 1]> =
            caches.iter().map(|c| [((c.pos + 1).saturating_sub(self.cfg.sliding_window), c.pos)]).collect();
        let mut seqs: Vec<SeqChunk<'_, B>> = caches
            .iter_mut()
            .zip(&windows)
            .enumerate()
            .map(|(i, (cache, window))| SeqChunk { cache: &mut **cache, rows: i..i + 1, window })
            .collect();
        let y = self.forward_seqs(b, &mut seqs, ids, None, trace)?;
        self.logits(b, &y)
    }

    /// The head: final hidden `[n, d]` → logits `[n, vocab]`.
    pub fn logits(&self, b: &B, final_hidden: &B::Tensor) -> Result<B::Tensor> {
        b.linear(final_hidden, &self.head, None)
    }

    /// Run tokens `ids` at positions `cache.pos..` through every layer, extending the cache;
    /// returns `norm(hc_head(X))` `[n, d]`. `embeds` `[n, d]` replaces the token embeddings;
    /// `window[i]` is token i's inclusive raw-key range in absolute positions, which must lie in
    /// what the cache keeps plus this chunk.
    pub fn forward(
        &self,
        b: &B,
        cache: &mut LmCache<B>,
        ids: &[i32],
        embeds: Option<B::Tensor>,
        window: &[(usize, usize)],
        trace: Option<&mut LmTrace<B>>,
    ) -> Result<B::Tensor> {
        let mut seqs = [SeqChunk { cache, rows: 0..ids.len(), window }];
        self.forward_seqs(b, &mut seqs, ids, embeds, trace)
    }

    /// [`LmModel::forward`] over rows that belong to several sequences: `seqs[s]` owns rows
    /// `seqs[s].rows` of `ids` (consecutive, in order, covering all of them) and extends its own
    /// cache. A trace needs a single sequence (its indexer picks are per sequence).
    fn forward_seqs(
        &self,
        b: &B,
        seqs: &mut [SeqChunk<'_, B>],
        ids: &[i32],
        embeds: Option<B::Tensor>,
        mut trace: Option<&mut LmTrace<B>>,
    ) -> Result<B::Tensor> {
        let cfg = &self.cfg;
        let n = ids.len();
        if n == 0 {
            return Err(Error::Invalid("forward: empty chunk".into()));
        }
        let mut next_row = 0;
        for s in seqs.iter() {
            if s.rows.start != next_row || s.rows.is_empty() {
                return Err(Error::Invalid(format!("forward: sequence rows {:?} after row {next_row}", s.rows)));
            }
            next_row = s.rows.end;
            if s.window.len() != s.rows.len() {
                return Err(Error::Invalid(format!(
                    "forward: {} window bounds for {} tokens",
                    s.window.len(),
                    s.rows.len()
                )));
            }
            if s.cache.layers.len() != self.layers.len() {
                return Err(Error::Invalid(format!(
                    "forward: cache has {} layers, model {}",
                    s.cache.layers.len(),
                    self.layers.len()
                )));
            }
        }
        if next_row != n {
            return Err(Error::Invalid(format!("forward: the sequences own {next_row} of {n} rows")));
        }
        if trace.is_some() && seqs.len() != 1 {
            return Err(Error::Invalid("forward: a trace records one sequence".into()));
        }
        let (eps, hc) = (cfg.rms_norm_eps as f32, cfg.hc_mult);
        let h = match embeds {
            Some(e) if e.shape() != [n, cfg.hidden_size] => {
                return Err(Error::Invalid(format!(
                    "forward: embeds {:?} for {n} tokens of width {}",
                    e.shape(),
                    cfg.hidden_size
                )));
            }
            Some(e) => e,
            None => self.embed(b, ids)?,
        };
        let ids_t = b.upload(&HostTensor::i32([n], ids.to_vec())?)?;
        // 0 = text token, 1 = image-block token (selects the `bias_vl` row of each router)
        let kind: Vec<i32> = ids.iter().map(|&i| i32::from(i >= 0 && i as usize >= cfg.vocab_size)).collect();
        let kind = b.upload(&HostTensor::i32([n], kind)?)?;

        // every row's position (its sequence's), uploaded once for the RoPE of every layer
        let mut positions = Vec::with_capacity(n);
        for s in seqs.iter() {
            for p in s.cache.pos..s.cache.pos + s.rows.len() {
                positions
                    .push(i32::try_from(p).map_err(|_| Error::Invalid(format!("forward: position {p} beyond i32")))?);
            }
        }
        let positions = b.upload(&HostTensor::i32([n], positions)?)?;
        let uploads = IndexUploads::new(b);
        let x0 = b.hc_expand(&h, hc)?;
        // the first layer's attention split and input; every later sublayer's come with the
        // previous sublayer's post (`hc_post_split_pre_norm`)
        let mut split_input = match self.layers.first() {
            Some(first) => Some(self.hc_split_pre_norm(b, &x0, &first.hc_attn, &first.attn_norm)?),
            None => None,
        };
        let mut carry = Some(x0);
        for (l, layer) in self.layers.iter().enumerate() {
            // the residual entering this layer: carried, or the previous layer's traced output
            let x = match (&carry, &trace) {
                (Some(c), _) => c,
                (None, Some(t)) => t.hidden[l - 1].last().expect("traced layer output"),
                (None, None) => unreachable!("the residual is either carried or traced"),
            };
            // attention sublayer; `split` is [T, pre hc | post hc | comb hc·hc]
            let (split, xa) = split_input.take().expect("each layer's split made before it");
            let (att, picks) = self.attention(&uploads, layer, l, seqs, &positions, &xa)?;
            // MoE sublayer, its residual written back with the attention's output
            let (x, split, xf) = self.hc_post_split_pre_norm(b, x, &att, &split, &layer.hc_ffn, &layer.ffn_norm)?;
            let (m, sel, w) = self.moe(b, &layer.moe, &xf, &ids_t, &kind)?;
            let next = match self.layers.get(l + 1) {
                Some(after) => {
                    let (next, s, a) =
                        self.hc_post_split_pre_norm(b, &x, &m, &split, &after.hc_attn, &after.attn_norm)?;
                    split_input = Some((s, a));
                    next
                }
                None => b.hc_post(&x, &m, &split)?,
            };
            match trace.as_deref_mut() {
                Some(t) => {
                    t.hidden[l].push(next);
                    t.router_ids[l].push(sel);
                    t.router_weights[l].push(w);
                    if let Some(p) = picks {
                        t.indexer.entry(l).or_default().push(p);
                    }
                    carry = None;
                }
                None => carry = Some(next),
            }
        }
        for s in seqs.iter_mut() {
            s.cache.pos += s.rows.len();
        }
        let x = match (&carry, &trace) {
            (Some(c), _) => c,
            (None, Some(t)) => t.hidden.last().and_then(|h| h.last()).expect("traced layer output"),
            (None, None) => unreachable!("the residual is either carried or traced"),
        };
        let mix = b.linear(&b.rms_norm_heads(x, 1, eps)?, &self.hc_head.mix, None)?;
        let w = b.hc_head_weights(&mix, &self.hc_head.scale, &self.hc_head.base, cfg.hc_eps as f32)?;
        b.hc_pre_norm(x, &w, hc, &self.norm, eps)
    }

    /// `[T, pre hc | post hc | comb hc·hc]` of one HC sublayer from the residual X `[T, hc·d]`
    /// (`hc_post` reads its parts in place), and the sublayer's input `[T, d]`: the streams
    /// collapsed by pre and normalised by `norm`.
    fn hc_split_pre_norm(&self, b: &B, x: &B::Tensor, p: &Hc<B>, norm: &B::Tensor) -> Result<(B::Tensor, B::Tensor)> {
        let (hc, eps, hc_eps) = (self.cfg.hc_mult, self.cfg.rms_norm_eps as f32, self.cfg.hc_eps as f32);
        b.hc_mix_split_pre_norm(x, &p.mix, &p.scale, &p.base, hc, self.cfg.hc_sinkhorn_iters, hc_eps, eps, norm)
    }

    /// `hc_post(x, f, split)` of a sublayer's output `f` `[T, d]`, then the next sublayer's split
    /// and input from the residual it writes (`hc_split_pre_norm`): (X' `[T, hc·d]`, split, input).
    fn hc_post_split_pre_norm(
        &self,
        b: &B,
        x: &B::Tensor,
        f: &B::Tensor,
        split: &B::Tensor,
        p: &Hc<B>,
        norm: &B::Tensor,
    ) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let (hc, eps, hc_eps, iters) =
            (self.cfg.hc_mult, self.cfg.rms_norm_eps as f32, self.cfg.hc_eps as f32, self.cfg.hc_sinkhorn_iters);
        b.hc_post_mix_split_pre_norm(x, f, split, &p.mix, &p.scale, &p.base, hc, iters, hc_eps, eps, norm)
    }

    /// Feed the compressor projections `kv = x·wkv`, `gate = x·wgate` `[n, w]` of every row to
    /// the compressor states `states` of the sequences owning rows `rows[s]`: buffer them, emit
    /// the entry of every block they complete (pool, RMSNorm, RoPE at `r·i`), and keep only the
    /// rows a later block still needs. Every sequence's buffered rows and entries are laid out in
    /// shared tensors ([`pack_rows`]), so the ops do not grow with the number of sequences, but
    /// for the pooling of a sequence's very first block past the first such in a step. Returns
    /// the entries of all sequences in one tensor, and where each sequence's start.
    fn compress(
        &self,
        u: &IndexUploads<'_, B>,
        c: &Compressor<B>,
        states: &mut [&mut CompState<B>],
        rows: &[Range<usize>],
        kv: B::Tensor,
        gate: B::Tensor,
    ) -> Result<(Arc<B::Tensor>, Vec<usize>)> {
        let (b, r) = (u.b, c.ratio);
        let kept: Vec<&SharedRows<B>> = states.iter().map(|st| &st.rows_kv).collect();
        let (kv_all, kv_at) = pack_rows(u, &kept, Some((kv, rows)))?;
        let kept: Vec<&SharedRows<B>> = states.iter().map(|st| &st.rows_gate).collect();
        let (gate_all, gate_at) = pack_rows(u, &kept, Some((gate, rows)))?;
        // per sequence: complete blocks in its buffer, and how many of them are already emitted
        // (with overlap the buffer starts at the last emitted block, kept for its first halves)
        let blocks: Vec<(usize, usize)> = states
            .iter()
            .zip(rows)
            .map(|(st, rows)| ((st.rows_kv.len + rows.len()) / r, st.entries.len - st.buf_start / r))
            .collect();
        // pooling groups: blocks laid out back to back pool, with overlap, the previous block's
        // first halves, so a sequence's very first block (none before it, nothing emitted yet)
        // must open a group; the others' first block is an emitted one, pooled but skipped
        let (mut firsts, others): (Vec<usize>, Vec<usize>) =
            (0..states.len()).filter(|&s| blocks[s].0 > blocks[s].1).partition(|&s| c.overlap && blocks[s].1 == 0);
        let mut groups: Vec<Vec<usize>> = Vec::new();
        let opener = firsts.pop();
        if opener.is_some() || !others.is_empty() {
            groups.push(opener.into_iter().chain(others).collect());
        }
        groups.extend(firsts.into_iter().map(|s| vec![s]));

        // the fresh entries of every group, their sequences' fresh rows in that order
        let mut fresh_parts = Vec::with_capacity(groups.len());
        let mut fresh_rows = vec![0..0; states.len()];
        let mut entry_positions = Vec::new();
        for group in &groups {
            let (mut kv_idx, mut gate_idx, mut keep) = (Vec::new(), Vec::new(), Vec::new());
            for &s in group {
                let (n_blocks, skip) = blocks[s];
                // this sequence's first pooled entry: one per block gathered before it
                let first = kv_idx.len() / r;
                kv_idx.extend((kv_at[s]..kv_at[s] + n_blocks * r).map(|i| i as i32));
                gate_idx.extend((gate_at[s]..gate_at[s] + n_blocks * r).map(|i| i as i32));
                keep.extend((first + skip..first + n_blocks).map(|i| i as i32));
                let (so_far, emitted) = (entry_positions.len(), states[s].entries.len);
                fresh_rows[s] = so_far..so_far + n_blocks - skip;
                entry_positions.extend((emitted..emitted + n_blocks - skip).map(|e| (e * r) as i32));
            }
            let pooled =
                b.compress_pool(&u.gather(&kv_all, kv_idx)?, &u.gather(&gate_all, gate_idx)?, &c.ape, r, c.overlap)?;
            let identity = keep.len() == pooled.rows() && keep.iter().enumerate().all(|(i, &j)| j as usize == i);
            fresh_parts.push(if identity { pooled } else { u.gather(&pooled, keep)? });
        }
        let fresh = if fresh_parts.is_empty() {
            None
        } else {
            let at = u.i32(&[entry_positions.len()], entry_positions)?;
            let eps = self.cfg.rms_norm_eps as f32;
            let entries =
                b.rms_norm_rope(&concat_all(b, fresh_parts)?, Some(&c.norm), 1, eps, &self.inv_freq_comp, &at)?;
            Some((entries, fresh_rows.as_slice()))
        };
        let kept: Vec<&SharedRows<B>> = states.iter().map(|st| &st.entries).collect();
        let (entries, entries_at) = pack_rows(u, &kept, fresh)?;

        // keep the rows a later block still needs
        let (mut kv_spans, mut gate_spans) = (Vec::with_capacity(states.len()), Vec::with_capacity(states.len()));
        for (s, st) in states.iter_mut().enumerate() {
            let (n_blocks, skip) = blocks[s];
            let done = st.entries.len + n_blocks.saturating_sub(skip);
            let buffered = st.rows_kv.len + rows[s].len();
            let buf_start = open_rows_start(done, r, c.overlap);
            let dropped = buf_start - st.buf_start;
            kv_spans.push((kv_at[s] + dropped, buffered - dropped));
            gate_spans.push((gate_at[s] + dropped, buffered - dropped));
            st.entries = SharedRows { tensor: entries.clone(), start: entries_at[s], len: done };
            st.buf_start = buf_start;
        }
        let kv_kept = keep_spans(u, kv_all, &kv_spans)?;
        let gate_kept = keep_spans(u, gate_all, &gate_spans)?;
        for ((st, kv), gate) in states.iter_mut().zip(kv_kept).zip(gate_kept) {
            st.rows_kv = kv;
            st.rows_gate = gate;
        }
        Ok((entries, entries_at))
    }

    /// Attention sublayer of layer `l` over rows x `[n, d]` that belong to `seqs` (each at its
    /// own positions `cache.pos..`, `positions` i32 `[n]`): output `[n, d]`, and the indexer
    /// picks on CSA layers (a single sequence). Every op runs once on the rows of all sequences:
    /// their keys, compressor rows and entries are laid out back to back ([`pack_rows`]), each
    /// query's window and entries point into its own sequence's part.
    fn attention(
        &self,
        u: &IndexUploads<'_, B>,
        layer: &Layer<B>,
        l: usize,
        seqs: &mut [SeqChunk<'_, B>],
        positions: &B::Tensor,
        x: &B::Tensor,
    ) -> Result<(B::Tensor, Option<B::Tensor>)> {
        let (b, cfg) = (u.b, &self.cfg);
        let a = &layer.attn;
        let eps = cfg.rms_norm_eps as f32;
        let nh = cfg.num_attention_heads;
        let n = x.rows();
        let f = if layer.ratio == 0 { &self.inv_freq_main } else { &self.inv_freq_comp };
        let rows: Vec<Range<usize>> = seqs.iter().map(|s| s.rows.clone()).collect();
        // projections of every row, roped at its position
        let (qa, kva) = b.linear_pair(x, &a.wq_a, &a.wkv)?;
        // the normed low-rank q: the indexer (CSA layers) reads it too; elsewhere the norm is
        // wq_b's own (`rms_norm_linear`, which a lane may fuse)
        let (qr, qb) = match a.indexer {
            Some(_) => {
                let qr = b.rms_norm(&qa, &a.q_norm, eps)?;
                let qb = b.linear(&qr, &a.wq_b, None)?;
                (Some(qr), qb)
            }
            None => (None, b.rms_norm_linear(&qa, &a.q_norm, eps, &a.wq_b, None)?),
        };
        let q = b.rms_norm_rope(&qb, None, nh, eps, f, positions)?;
        let kv = b.rms_norm_rope(&kva, Some(&a.kv_norm), 1, eps, f, positions)?;

        // every sequence's kept keys then its new ones, back to back
        let kept: Vec<&SharedRows<B>> = seqs.iter().map(|s| &s.cache.layers[l].kv).collect();
        let (keys, keys_at) = pack_rows(u, &kept, Some((kv, rows.as_slice())))?;
        // window bounds as rows of `keys`
        let mut window = Vec::with_capacity(2 * n);
        for (s, &at) in seqs.iter().zip(&keys_at) {
            let (p0, lc) = (s.cache.pos, &s.cache.layers[l]);
            let end = p0 + s.rows.len();
            for (i, &(lo, hi)) in s.window.iter().enumerate() {
                if lo <= hi && (lo < lc.kv_start || hi >= end) {
                    return Err(Error::Invalid(format!(
                        "attention: token {} sees keys {lo}..={hi}, outside the kept {}..{end} (a chunk split an \
                         image span?)",
                        p0 + i,
                        lc.kv_start
                    )));
                }
                let (lo, hi) = if lo <= hi { (at + lo - lc.kv_start, at + hi - lc.kv_start) } else { (1, 0) };
                window.extend([lo as i32, hi as i32]);
            }
        }
        let window = u.i32(&[n, 2], window)?;

        let project = |c: &Compressor<B>| -> Result<(B::Tensor, B::Tensor)> { b.linear_pair(x, &c.wkv, &c.wgate) };
        let entries = match &a.compressor {
            Some(c) => {
                let (ckv, cgate) = project(c)?;
                let mut states =
                    seqs.iter_mut().map(|s| s.cache.layers[l].comp.as_mut()).collect::<Option<Vec<_>>>().ok_or_else(
                        || Error::Invalid(format!("attention: layer {l}'s cache has no compressor state")),
                    )?;
                Some(self.compress(u, c, &mut states, &rows, ckv, cgate)?)
            }
            None => None,
        };
        let picks = match (&a.indexer, &entries) {
            (Some(ix), Some((_, entries_at))) => {
                let (ikv, igate) = project(&ix.compressor)?;
                let mut states = seqs
                    .iter_mut()
                    .map(|s| s.cache.layers[l].index.as_mut())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| Error::Invalid(format!("attention: layer {l}'s cache has no indexer state")))?;
                let (ix_entries, ix_at) = self.compress(u, &ix.compressor, &mut states, &rows, ikv, igate)?;
                // the picks index the attention's entries: both compressors emit alike, so their
                // entries lie alike
                if ix_at != *entries_at {
                    return Err(Error::Invalid(format!(
                        "attention: layer {l}'s indexer entries lie apart from its own"
                    )));
                }
                let qr = qr.as_ref().expect("a layer with an indexer keeps its normed q");
                Some(self.indexer_picks(b, ix, seqs, positions, qr, x, &ix_entries, &ix_at)?)
            }
            _ => None,
        };
        // the compressed entries each query sees, as rows of `entries`
        let hca_idx = match (&picks, &entries) {
            (None, Some((_, entries_at))) => {
                // HCA: every complete entry is visible: j < (p + 1) / r
                let r = layer.ratio;
                let visible = |s: &SeqChunk<'_, B>, p: usize| {
                    ((p + 1) / r).min(s.cache.layers[l].comp.as_ref().map_or(0, |st| st.entries.len))
                };
                let k = seqs
                    .iter()
                    .flat_map(|s| (s.cache.pos..s.cache.pos + s.rows.len()).map(|p| visible(s, p)))
                    .max()
                    .unwrap_or(0);
                let mut idx = vec![-1i32; n * k];
                for (s, &at) in seqs.iter().zip(entries_at) {
                    for (i, p) in (s.cache.pos..s.cache.pos + s.rows.len()).enumerate() {
                        let row = &mut idx[(s.rows.start + i) * k..][..visible(s, p)];
                        row.iter_mut().enumerate().for_each(|(j, e)| *e = (at + j) as i32);
                    }
                }
                match k {
                    0 => None,
                    _ => Some(u.i32(&[n, k], idx)?),
                }
            }
            _ => None,
        };
        // the output rotated back (inverse RoPE) at the query positions
        let comp = match (&entries, picks.as_ref().or(hca_idx.as_deref())) {
            (Some((c, _)), Some(i)) if c.rows() > 0 => Some((&**c, i)),
            _ => None,
        };
        let o = b.sink_attention_rope(&q, &keys, &window, comp, &a.sinks, nh, f, positions)?;
        // later chunks see at most the last W − 1 keys
        let mut spans = Vec::with_capacity(seqs.len());
        for (s, &at) in seqs.iter_mut().zip(&keys_at) {
            let lc = &mut s.cache.layers[l];
            let (len, end) = (lc.kv.len + s.rows.len(), s.cache.pos + s.rows.len());
            let keep = kept_keys(cfg.sliding_window, len);
            spans.push((at + len - keep, keep));
            lc.kv_start = end - keep;
        }
        for (s, kv) in seqs.iter_mut().zip(keep_spans(u, keys, &spans)?) {
            s.cache.layers[l].kv = kv;
        }
        // grouped `wo_a`, `wo_b` on every row
        let z = b.grouped_linear(&o, &a.wo_a, cfg.o_groups)?;
        Ok((b.linear(&z, &a.wo_b, None)?, picks.filter(|_| seqs.len() == 1)))
    }

    /// The lightning indexer's picks i32 `[n, index_topk]` of every row, as rows of the entries
    /// `keys` (all sequences', sequence s's from row `keys_at[s]`; −1 = empty slot). A lone
    /// sequence at the start of `keys` takes the op's own causal mask; rows of several are
    /// scored against every entry and masked to their own sequence's complete blocks.
    #[allow(clippy::too_many_arguments)]
    fn indexer_picks(
        &self,
        b: &B,
        ix: &Indexer<B>,
        seqs: &[SeqChunk<'_, B>],
        positions: &B::Tensor,
        qr: &B::Tensor,
        x: &B::Tensor,
        keys: &B::Tensor,
        keys_at: &[usize],
    ) -> Result<B::Tensor> {
        let cfg = &self.cfg;
        let (ih, ihd, r) = (cfg.index_n_heads, cfg.index_head_dim, ix.compressor.ratio);
        let qi = b.rope_tail_at(&b.linear(qr, &ix.wq_b, None)?, ih, &self.inv_freq_comp, positions, false)?;
        let w = b.linear(x, &ix.weights_proj, None)?;
        let scale = 1.0 / ((ih * ihd) as f32).sqrt();
        let scores = match (seqs, keys_at) {
            ([s], [0]) => b.indexer_scores(&qi, keys, &w, ih, scale, s.cache.pos, r)?,
            _ => {
                // no entry is future to a query past r·m; the mask adds −0 to a row's own
                // sequence's complete blocks (an exact no-op, −0 scores included) and −inf to
                // every other entry
                let (n, m) = (x.rows(), keys.rows());
                let all = b.indexer_scores(&qi, keys, &w, ih, scale, r * m, r)?;
                let mut mask = vec![f32::NEG_INFINITY; n * m];
                for (s, &at) in seqs.iter().zip(keys_at) {
                    for (i, p) in (s.cache.pos..s.cache.pos + s.rows.len()).enumerate() {
                        let visible = ((p + 1) / r).min(m - at);
                        mask[(s.rows.start + i) * m + at..][..visible].fill(-0.0);
                    }
                }
                b.add(&all, &b.upload(&HostTensor::f32([n, m], mask)?)?)?
            }
        };
        b.topk_rows(&scores, cfg.index_topk)
    }

    /// MoE sublayer output `[T, d]`, the selected experts and their weights.
    #[allow(clippy::too_many_arguments)]
    fn moe(
        &self,
        b: &B,
        m: &Moe<B>,
        x: &B::Tensor,
        ids: &B::Tensor,
        kind: &B::Tensor,
    ) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let cfg = &self.cfg;
        let limit = cfg.swiglu_limit as f32;
        let logits = b.linear(x, &m.gate, None)?;
        // text rows select with bias (hash layers: zeros, the table decides), image rows with
        // bias_vl (§5.2); the weights come from the unbiased scores
        let hash = m.tid2eid.as_ref().map(|table| (table, ids));
        let (sel, w) =
            b.route_experts(&logits, &m.bias, kind, hash, cfg.num_experts_per_tok, cfg.routed_scaling_factor as f32)?;
        let routed = b.moe_experts(x, &sel, &w, &m.w1, &m.w3, &m.w2, limit)?;
        Ok((b.shared_expert(x, &m.shared_w1, &m.shared_w3, &m.shared_w2, limit, &routed)?, sel, w))
    }
}

#[cfg(test)]
mod tests {
    use super::chunk_plan;

    #[test]
    fn chunks_never_split_an_image_block() {
        // vocab 10: ids ≥ 10 are image-block sentinels; the block is positions 3..=8
        let ids = [1, 2, 3, 11, 10, 12, 12, 13, 14, 5, 6, 7];
        assert_eq!(chunk_plan(&ids, 10, 100), vec![0..12]);
        assert_eq!(chunk_plan(&ids, 10, 9), vec![0..9, 9..12], "a cut right after the block stays");
        // a cut inside the block moves to its start; a block longer than a chunk gets its own
        assert_eq!(chunk_plan(&ids, 10, 5), vec![0..3, 3..9, 9..12]);
        assert_eq!(chunk_plan(&ids, 10, 4), vec![0..3, 3..9, 9..12]);
        assert_eq!(chunk_plan(&ids, 10, 1), vec![0..1, 1..2, 2..3, 3..9, 9..10, 10..11, 11..12]);
        assert_eq!(chunk_plan(&[1, 2, 3], 10, 2), vec![0..2, 2..3]);
    }

    #[test]
    fn blocks_back_to_back_are_cut_between_but_never_inside() {
        // vocab 10: a block 2..=5 (a lead PAD, START, IMAGE, END), right after it a block 6..=9
        // (START, IMAGE, IMAGE, END), then text
        let ids = [1, 2, 11, 10, 12, 14, 10, 12, 12, 14, 5];
        assert_eq!(chunk_plan(&ids, 10, 6), vec![0..6, 6..11], "a cut after the first END");
        assert_eq!(chunk_plan(&ids, 10, 4), vec![0..2, 2..6, 6..10, 10..11]);
        assert_eq!(chunk_plan(&ids, 10, 8), vec![0..6, 6..11]);
        assert_eq!(chunk_plan(&ids, 10, 3), vec![0..2, 2..6, 6..10, 10..11]);
    }
}
