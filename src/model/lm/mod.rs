//! The DeepSeek-V4-Flash language model (language.md §2-4) plus the Vision-Exp behaviours
//! (vision.md §5: embedding merge, `bias_vl` routing, image-span visibility), written once
//! against [`Backend`]. [`LmModel::prefill`] runs a whole prompt from position 0 and returns an
//! [`LmCache`]; [`LmModel::decode`] extends it one token at a time.
//!
//! Per layer: `hc_split → hc_pre → attn_norm → attention → hc_post`, then
//! `hc_split → hc_pre → ffn_norm → MoE → hc_post`; then the HC head → `norm` → `head`.

pub mod generate;
pub mod vision;

use std::collections::BTreeMap;

use crate::backend::{Backend, DeviceTensor, HostTensor, HostWeight};
use crate::config::LmConfig;
use crate::error::{Error, Result};
use crate::model::ParamSource;

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
    /// Per expert: w1 rows then w3 rows `[2I, d]`, and w2 `[d, I]`.
    w13: Vec<B::Weight>,
    w2: Vec<B::Weight>,
    shared_w13: B::Weight,
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

/// A compressor's decode state: its emitted entries plus the raw projected rows it still needs
/// (the incomplete block, and with overlap the previous complete block).
pub struct CompState<B: Backend> {
    /// Emitted entries `[⌊P/r⌋, width]` (normed, roped at `r·i`).
    pub entries: B::Tensor,
    /// Buffered `wkv` / `wgate` rows `[P − buf_start, w]`; `buf_start` is a block boundary.
    pub rows_kv: B::Tensor,
    pub rows_gate: B::Tensor,
}

/// One layer's decode cache.
pub struct LayerCache<B: Backend> {
    /// Raw K = V latents `[P, hd]` (roped). The whole history is kept (a W−1 ring later).
    pub kv: B::Tensor,
    /// The attention compressor (ratio ≠ 0 layers).
    pub comp: Option<CompState<B>>,
    /// The indexer's compressor (CSA layers).
    pub index: Option<CompState<B>>,
}

/// Decode state after `pos` tokens.
pub struct LmCache<B: Backend> {
    pub pos: usize,
    pub layers: Vec<LayerCache<B>>,
}

/// Everything a prefill produces, still on the device.
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

/// `[w1; w3]` stacked row-wise into one `[2I, d]` weight (same storage format).
fn stack_rows<'a>(a: HostWeight<'a>, c: HostWeight<'a>, name: String) -> Result<HostWeight<'a>> {
    if a.format != c.format || a.cols != c.cols {
        return Err(Error::tensor(
            &c.name,
            format!(
                "does not stack with `{}` ({} [{}, {}] vs {} [{}, {}])",
                a.name, a.format, a.rows, a.cols, c.format, c.rows, c.cols
            ),
        ));
    }
    let mut bytes = a.bytes.into_owned();
    bytes.extend_from_slice(&c.bytes);
    Ok(HostWeight { name, format: a.format, rows: a.rows + c.rows, cols: a.cols, bytes: bytes.into() })
}

fn i32_of(name: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::tensor(name, format!("value {v} does not fit i32")))
}

impl<B: Backend> LmModel<B> {
    /// Upload every language-model parameter (official names, language.md §5.1).
    pub fn load(b: &B, src: &impl ParamSource, cfg: &LmConfig) -> Result<Self> {
        let matrix = |name: &str| -> Result<B::Weight> { b.upload_weight(&src.matrix(name)?) };
        let hc_of = |p: &str| -> Result<Hc<B>> {
            Ok(Hc {
                mix: matrix(&format!("{p}_fn"))?,
                scale: param(b, src, &format!("{p}_scale"))?,
                base: param(b, src, &format!("{p}_base"))?,
            })
        };
        let compressor = |p: &str, ratio: usize| -> Result<Compressor<B>> {
            Ok(Compressor {
                wkv: matrix(&format!("{p}wkv.weight"))?,
                wgate: matrix(&format!("{p}wgate.weight"))?,
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
            let attn = Attention {
                wq_a: matrix(&format!("{a}wq_a.weight"))?,
                q_norm: param(b, src, &format!("{a}q_norm.weight"))?,
                wq_b: matrix(&format!("{a}wq_b.weight"))?,
                wkv: matrix(&format!("{a}wkv.weight"))?,
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
            let mut w13 = Vec::with_capacity(e);
            let mut w2 = Vec::with_capacity(e);
            for j in 0..e {
                let x = format!("{f}experts.{j}.");
                w13.push(b.upload_weight(&stack_rows(
                    src.matrix(&format!("{x}w1.weight"))?,
                    src.matrix(&format!("{x}w3.weight"))?,
                    format!("{x}w13"),
                )?)?);
                w2.push(matrix(&format!("{x}w2.weight"))?);
            }
            let x = format!("{f}shared_experts.");
            let moe = Moe {
                gate: matrix(&format!("{f}gate.weight"))?,
                bias: b.upload_param(&HostTensor::f32([2, e], [text_bias, vl_bias].concat())?)?,
                tid2eid,
                w13,
                w2,
                shared_w13: b.upload_weight(&stack_rows(
                    src.matrix(&format!("{x}w1.weight"))?,
                    src.matrix(&format!("{x}w3.weight"))?,
                    format!("{x}w13"),
                )?)?,
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

    /// Prefill from position 0 over `input`; `embeds` `[T, d]` replaces the token embeddings
    /// (the §5.1 merge result), otherwise the ids are embedded.
    pub fn prefill(&self, b: &B, input: &LmInput, embeds: Option<B::Tensor>) -> Result<LmOutput<B>> {
        let cfg = &self.cfg;
        let t = input.ids.len();
        if t == 0 {
            return Err(Error::Invalid("prefill: empty prompt".into()));
        }
        let eps = cfg.rms_norm_eps as f32;
        let hc = cfg.hc_mult;
        let h = match embeds {
            Some(e) if e.shape() != [t, cfg.hidden_size] => {
                return Err(Error::Invalid(format!(
                    "prefill: embeds {:?} for {t} tokens of width {}",
                    e.shape(),
                    cfg.hidden_size
                )));
            }
            Some(e) => e,
            None => self.embed(b, &input.ids)?,
        };
        let ids = b.upload(&HostTensor::i32([t], input.ids.clone())?)?;
        // 0 = text token, 1 = image-block token (selects the `bias_vl` row of each router)
        let kind: Vec<i32> = input.ids.iter().map(|&i| i32::from(i as usize >= cfg.vocab_size)).collect();
        let kind = b.upload(&HostTensor::i32([t], kind)?)?;
        let window: Vec<i32> = match &input.window {
            Some(w) if w.len() != t => {
                return Err(Error::Invalid(format!("prefill: {} window bounds for {t} tokens", w.len())));
            }
            Some(w) => w.iter().flat_map(|&(lo, hi)| [lo as i32, hi as i32]).collect(),
            None => (0..t).flat_map(|i| [(i + 1).saturating_sub(cfg.sliding_window) as i32, i as i32]).collect(),
        };
        let window = b.upload(&HostTensor::i32([t, 2], window)?)?;

        let x0 = b.hc_expand(&h, hc)?;
        let mut out_hidden = Vec::with_capacity(self.layers.len());
        let mut router_ids = Vec::with_capacity(self.layers.len());
        let mut router_weights = Vec::with_capacity(self.layers.len());
        let mut indexer = BTreeMap::new();
        let mut caches = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            let x = out_hidden.last().unwrap_or(&x0);
            // attention sublayer
            let (pre, post, comb) = self.hc_split(b, x, &layer.hc_attn)?;
            let xa = b.rms_norm(&b.hc_pre(x, &pre)?, &layer.attn_norm, eps)?;
            let (att, st, picks) = self.attention(b, layer, &xa, &window, t)?;
            if let Some(p) = picks {
                indexer.insert(l, p);
            }
            caches.push(st);
            let x = b.hc_post(x, &att, &post, &comb)?;
            // MoE sublayer
            let (pre, post, comb) = self.hc_split(b, &x, &layer.hc_ffn)?;
            let xf = b.rms_norm(&b.hc_pre(&x, &pre)?, &layer.ffn_norm, eps)?;
            let (m, sel, w) = self.moe(b, &layer.moe, &xf, &ids, &kind)?;
            out_hidden.push(b.hc_post(&x, &m, &post, &comb)?);
            router_ids.push(sel);
            router_weights.push(w);
        }
        // head
        let x = out_hidden.last().unwrap_or(&x0);
        let mix = b.linear(&b.rms_norm_heads(x, 1, eps)?, &self.hc_head.mix, None)?;
        let w = b.hc_head_weights(&mix, &self.hc_head.scale, &self.hc_head.base, cfg.hc_eps as f32)?;
        let final_hidden = b.rms_norm(&b.hc_pre(x, &w)?, &self.norm, eps)?;
        let logits = b.linear(&final_hidden, &self.head, None)?;
        let cache = LmCache { pos: t, layers: caches };
        Ok(LmOutput { logits, final_hidden, hidden: out_hidden, router_ids, router_weights, indexer, cache })
    }

    /// One decode step: feed `id` at position `cache.pos`, extend the cache, return the logits
    /// `[1, vocab]`. Text tokens only (image blocks are prefilled in one chunk, vision.md §5.1).
    pub fn decode(&self, b: &B, cache: &mut LmCache<B>, id: i32) -> Result<B::Tensor> {
        let cfg = &self.cfg;
        if id < 0 || id as usize >= cfg.vocab_size {
            return Err(Error::Invalid(format!(
                "decode: token id {id} outside the text vocabulary 0..{}",
                cfg.vocab_size
            )));
        }
        if cache.layers.len() != self.layers.len() {
            return Err(Error::Invalid(format!(
                "decode: cache has {} layers, model {}",
                cache.layers.len(),
                self.layers.len()
            )));
        }
        let (eps, nh, p) = (cfg.rms_norm_eps as f32, cfg.num_attention_heads, cache.pos);
        let ids = b.upload(&HostTensor::i32([1], vec![id])?)?;
        let kind = b.upload(&HostTensor::i32([1], vec![0])?)?;
        let window =
            b.upload(&HostTensor::i32([1, 2], vec![(p + 1).saturating_sub(cfg.sliding_window) as i32, p as i32])?)?;
        let mut x = b.hc_expand(&b.embed_rows(&self.embed, &ids)?, cfg.hc_mult)?;
        for (layer, lc) in self.layers.iter().zip(cache.layers.iter_mut()) {
            let a = &layer.attn;
            let f = if layer.ratio == 0 { &self.inv_freq_main } else { &self.inv_freq_comp };
            let (pre, post, comb) = self.hc_split(b, &x, &layer.hc_attn)?;
            let xa = b.rms_norm(&b.hc_pre(&x, &pre)?, &layer.attn_norm, eps)?;
            let qr = b.rms_norm(&b.linear(&xa, &a.wq_a, None)?, &a.q_norm, eps)?;
            let q = b.rope_tail(&b.rms_norm_heads(&b.linear(&qr, &a.wq_b, None)?, nh, eps)?, nh, f, p, 1, false)?;
            let kv = b.rope_tail(&b.rms_norm(&b.linear(&xa, &a.wkv, None)?, &a.kv_norm, eps)?, 1, f, p, 1, false)?;
            lc.kv = b.concat_rows(&lc.kv, &kv)?;
            if let (Some(c), Some(st)) = (&a.compressor, lc.comp.as_mut()) {
                self.compress_step(b, c, st, &xa, p)?;
            }
            let comp_idx = match (&a.indexer, lc.index.as_mut(), lc.comp.as_ref()) {
                (Some(ix), Some(st), Some(_)) => {
                    self.compress_step(b, &ix.compressor, st, &xa, p)?;
                    let (ih, ihd) = (cfg.index_n_heads, cfg.index_head_dim);
                    let qi = b.rope_tail(&b.linear(&qr, &ix.wq_b, None)?, ih, f, p, 1, false)?;
                    let w = b.linear(&xa, &ix.weights_proj, None)?;
                    let scale = 1.0 / ((ih * ihd) as f32).sqrt();
                    let scores = b.indexer_scores(&qi, &st.entries, &w, ih, scale, p, 4)?;
                    Some(b.topk_rows(&scores, cfg.index_topk)?)
                }
                (None, _, Some(st)) => {
                    // HCA: every emitted entry is complete, hence visible
                    let n = st.entries.rows();
                    Some(b.upload(&HostTensor::i32([1, n], (0..n as i32).collect())?)?)
                }
                _ => None,
            };
            let o = match (lc.comp.as_ref(), comp_idx.as_ref()) {
                (Some(st), Some(i)) => b.sink_attention(&q, &lc.kv, &window, Some((&st.entries, i)), &a.sinks, nh)?,
                _ => b.sink_attention(&q, &lc.kv, &window, None, &a.sinks, nh)?,
            };
            let att = self.attn_output(b, a, &o, p)?;
            x = b.hc_post(&x, &att, &post, &comb)?;
            let (pre, post, comb) = self.hc_split(b, &x, &layer.hc_ffn)?;
            let xf = b.rms_norm(&b.hc_pre(&x, &pre)?, &layer.ffn_norm, eps)?;
            let (m, _, _) = self.moe(b, &layer.moe, &xf, &ids, &kind)?;
            x = b.hc_post(&x, &m, &post, &comb)?;
        }
        cache.pos += 1;
        let mix = b.linear(&b.rms_norm_heads(&x, 1, eps)?, &self.hc_head.mix, None)?;
        let w = b.hc_head_weights(&mix, &self.hc_head.scale, &self.hc_head.base, cfg.hc_eps as f32)?;
        let y = b.rms_norm(&b.hc_pre(&x, &w)?, &self.norm, eps)?;
        b.linear(&y, &self.head, None)
    }

    /// `(pre, post, comb)` of one HC sublayer from the residual X `[T, hc·d]`.
    fn hc_split(&self, b: &B, x: &B::Tensor, p: &Hc<B>) -> Result<(B::Tensor, B::Tensor, B::Tensor)> {
        let (hc, eps) = (self.cfg.hc_mult, self.cfg.rms_norm_eps as f32);
        let mix = b.linear(&b.rms_norm_heads(x, 1, eps)?, &p.mix, None)?;
        let s = b.hc_split(&mix, &p.scale, &p.base, hc, self.cfg.hc_sinkhorn_iters, self.cfg.hc_eps as f32)?;
        Ok((b.slice_cols(&s, 0, hc)?, b.slice_cols(&s, hc, hc)?, b.slice_cols(&s, 2 * hc, hc * hc)?))
    }

    /// One compressor over a prompt from position 0: its entries `[⌊T/r⌋, width]` (pool,
    /// RMSNorm, RoPE at `r·i`) and the raw rows a decode still needs.
    fn compress(&self, b: &B, c: &Compressor<B>, x: &B::Tensor) -> Result<CompState<B>> {
        let t = x.rows();
        let kv = b.linear(x, &c.wkv, None)?;
        let gate = b.linear(x, &c.wgate, None)?;
        let pooled = b.compress_pool(&kv, &gate, &c.ape, c.ratio, c.overlap)?;
        let entries = self.finish_entries(b, c, &pooled, 0)?;
        // keep rows from the start of the previous complete block (overlap) or the current one
        let done = t / c.ratio;
        let buf_start = if c.overlap { done.saturating_sub(1) * c.ratio } else { done * c.ratio };
        let keep = b.upload(&HostTensor::i32([t - buf_start], (buf_start as i32..t as i32).collect())?)?;
        Ok(CompState { entries, rows_kv: b.gather_rows(&kv, &keep)?, rows_gate: b.gather_rows(&gate, &keep)? })
    }

    /// RMSNorm + RoPE of pooled entries whose first one is entry `first`.
    fn finish_entries(&self, b: &B, c: &Compressor<B>, pooled: &B::Tensor, first: usize) -> Result<B::Tensor> {
        let normed = b.rms_norm(pooled, &c.norm, self.cfg.rms_norm_eps as f32)?;
        b.rope_tail(&normed, 1, &self.inv_freq_comp, first * c.ratio, c.ratio, false)
    }

    /// Decode: buffer one token's rows (x `[1, d]` at position `p`); when its block completes,
    /// emit the block's entry and drop the rows no longer needed.
    fn compress_step(&self, b: &B, c: &Compressor<B>, st: &mut CompState<B>, x: &B::Tensor, p: usize) -> Result<()> {
        st.rows_kv = b.concat_rows(&st.rows_kv, &b.linear(x, &c.wkv, None)?)?;
        st.rows_gate = b.concat_rows(&st.rows_gate, &b.linear(x, &c.wgate, None)?)?;
        if (p + 1) % c.ratio != 0 {
            return Ok(());
        }
        // the buffer starts at a block boundary: [previous block (overlap, if any) | this block]
        let pooled = b.compress_pool(&st.rows_kv, &st.rows_gate, &c.ape, c.ratio, c.overlap)?;
        let n = pooled.rows();
        let last = b.gather_rows(&pooled, &b.upload(&HostTensor::i32([1], vec![n as i32 - 1])?)?)?;
        let entry = self.finish_entries(b, c, &last, (p + 1) / c.ratio - 1)?;
        st.entries = b.concat_rows(&st.entries, &entry)?;
        let len = st.rows_kv.rows();
        let keep: Vec<i32> = if c.overlap { (len - c.ratio) as i32..len as i32 } else { 0..0 }.collect();
        let keep = b.upload(&HostTensor::i32([keep.len()], keep)?)?;
        st.rows_kv = b.gather_rows(&st.rows_kv, &keep)?;
        st.rows_gate = b.gather_rows(&st.rows_gate, &keep)?;
        Ok(())
    }

    /// Attention sublayer output `[T, d]`, its state, and the indexer picks on CSA layers.
    #[allow(clippy::type_complexity)]
    fn attention(
        &self,
        b: &B,
        layer: &Layer<B>,
        x: &B::Tensor,
        window: &B::Tensor,
        t: usize,
    ) -> Result<(B::Tensor, LayerCache<B>, Option<B::Tensor>)> {
        let cfg = &self.cfg;
        let a = &layer.attn;
        let eps = cfg.rms_norm_eps as f32;
        let nh = cfg.num_attention_heads;
        let f = if layer.ratio == 0 { &self.inv_freq_main } else { &self.inv_freq_comp };
        let qr = b.rms_norm(&b.linear(x, &a.wq_a, None)?, &a.q_norm, eps)?;
        let q = b.rms_norm_heads(&b.linear(&qr, &a.wq_b, None)?, nh, eps)?;
        let q = b.rope_tail(&q, nh, f, 0, 1, false)?;
        let kv = b.rms_norm(&b.linear(x, &a.wkv, None)?, &a.kv_norm, eps)?;
        let kv = b.rope_tail(&kv, 1, f, 0, 1, false)?;

        let comp_state = match &a.compressor {
            Some(c) => Some(self.compress(b, c, x)?),
            None => None,
        };
        let comp = comp_state.as_ref().map(|c| &c.entries);
        let (hca_idx, index_state, picks) = match (&a.indexer, comp) {
            (Some(ix), Some(_)) => {
                let st = self.compress(b, &ix.compressor, x)?;
                let keys = &st.entries;
                let (ih, ihd) = (cfg.index_n_heads, cfg.index_head_dim);
                let qi = b.rope_tail(&b.linear(&qr, &ix.wq_b, None)?, ih, f, 0, 1, false)?;
                let w = b.linear(x, &ix.weights_proj, None)?;
                let scale = 1.0 / ((ih * ihd) as f32).sqrt();
                let scores = b.indexer_scores(&qi, keys, &w, ih, scale, 0, 4)?;
                let picks = b.topk_rows(&scores, cfg.index_topk)?;
                (None, Some(st), Some(picks))
            }
            (None, Some(c)) => {
                // HCA: every complete entry is visible: i < (t+1)/r
                let n = c.rows();
                let r = layer.ratio;
                let idx: Vec<i32> =
                    (0..t).flat_map(|i| (0..n).map(move |j| if j < (i + 1) / r { j as i32 } else { -1 })).collect();
                (Some(b.upload(&HostTensor::i32([t, n], idx)?)?), None, None)
            }
            _ => (None, None, None),
        };
        let o = match (comp, picks.as_ref().or(hca_idx.as_ref())) {
            (Some(c), Some(i)) => b.sink_attention(&q, &kv, window, Some((c, i)), &a.sinks, nh)?,
            _ => b.sink_attention(&q, &kv, window, None, &a.sinks, nh)?,
        };
        let out = self.attn_output(b, a, &o, 0)?;
        Ok((out, LayerCache { kv, comp: comp_state, index: index_state }, picks))
    }

    /// Inverse RoPE at the query positions, grouped `wo_a`, `wo_b`: o `[n, heads·hd]` → `[n, d]`.
    fn attn_output(&self, b: &B, a: &Attention<B>, o: &B::Tensor, pos0: usize) -> Result<B::Tensor> {
        let f = if a.compressor.is_none() { &self.inv_freq_main } else { &self.inv_freq_comp };
        let o = b.rope_tail(o, self.cfg.num_attention_heads, f, pos0, 1, true)?;
        let z = b.grouped_linear(&o, &a.wo_a, self.cfg.o_groups)?;
        b.linear(&z, &a.wo_b, None)
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
        let scores = b.sqrt_softplus(&b.linear(x, &m.gate, None)?)?;
        // text rows: scores + bias (hash layers: unused); image rows: scores + bias_vl (§5.2)
        let biased = b.add(&scores, &b.gather_rows(&m.bias, kind)?)?;
        let mut sel = b.topk_rows(&biased, cfg.num_experts_per_tok)?;
        if let Some(table) = &m.tid2eid {
            sel = b.hash_route(table, ids, &sel)?;
        }
        let w = b.route_weights(&scores, &sel, cfg.routed_scaling_factor as f32)?;
        let routed = b.moe_experts(x, &sel, &w, &m.w13, &m.w2, limit)?;
        let shared = b.linear(&b.swiglu_clamp(&b.linear(x, &m.shared_w13, None)?, limit)?, &m.shared_w2, None)?;
        Ok((b.add(&routed, &shared)?, sel, w))
    }
}
