//! The vision GGUF (llama.cpp's "mmproj": `general.architecture = clip`,
//! `clip.projector_type = deepseek4v`) as a parameter source for the vision graph.
//!
//! The graph reads parameters by official Hugging Face name (`vision.*`, `aligner.*`, the
//! `image_*` sentinels, spec vision.md §6.2); this module resolves each official name to the
//! GGUF tensor(s) llama.cpp's converter wrote for it (its `gguf-py` tables,
//! `get_tensor_name_map(MODEL_ARCH.MMPROJ, n_layers)`, with the re-layouts of
//! `conversion/deepseek.py` `DeepseekV4FlashVisionModel` undone), and builds a [`VisionConfig`]
//! from the `clip.*` keys. Opening checks the whole file first, as the safetensors loader does
//! ([`super::check_vision`]): every expected tensor present with its shape and a weight format,
//! every tensor of the file consumed by exactly one official name; refusals name the file and
//! the tensor or key.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use super::gguf::{GgmlType, Gguf, TensorInfo, Value};
use super::vision::vision_manifest;
use crate::backend::{HostWeight, WeightFormat, decode_row};
use crate::config::VisionConfig;
use crate::error::{Error, Result};
use crate::model::ParamSource;

/// `general.architecture` of an mmproj.
pub const ARCH: &str = "clip";
/// `clip.projector_type` of DeepSeek-V4-Flash-Vision's mmproj.
pub const PROJECTOR_TYPE: &str = "deepseek4v";

/// `vision_rope_theta`: the converter writes no key; clip.cpp hard-codes it for deepseek4v
/// (tools/mtmd/clip.cpp:1613, `hparams.rope_theta = 10000.0f`).
pub const DEEPSEEK4V_ROPE_THETA: f64 = 10000.0;
/// `vision_max_n_token`: hard-coded by clip.cpp (tools/mtmd/clip.cpp:1616,
/// `hparams.dsv4_max_n_token = 384`); `--image-max-tokens` overrides it there, not here.
pub const DEEPSEEK4V_MAX_N_TOKEN: usize = 384;
/// `vision_max_wh_ratio`: hard-coded by clip.cpp (tools/mtmd/clip.cpp:1617,
/// `hparams.dsv4_max_wh_ratio = 8`).
pub const DEEPSEEK4V_MAX_WH_RATIO: f64 = 8.0;
/// The normalization the processor applies (`(x - 0.5) / 0.5`, spec vision.md §2); the file's
/// `clip.vision.image_mean` / `image_std` must say the same.
const IMAGE_MEAN_STD: f64 = 0.5;

/// One GGUF tensor an official parameter is read from, with its expected torch-order shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufPart {
    pub name: String,
    pub shape: Vec<usize>,
}

/// Where one official parameter comes from: one GGUF tensor, or several stacked along rows
/// (`mlp.w1` = gate rows then up rows; a split `attn.wqkv` = q, k, v rows).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The official (graph) shape.
    pub shape: Vec<usize>,
    pub parts: Vec<GgufPart>,
}

/// Bytes and tensors of the mmproj per ggml type, from a successful open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmprojAccounting {
    /// Official parameters the graph reads (= `vision_tensor_count(n_layers)`).
    pub official: usize,
    /// GGUF tensors in the file (all consumed).
    pub gguf_tensors: usize,
    pub bytes: u64,
    pub by_type: BTreeMap<GgmlType, (usize, u64)>,
    /// Whether q/k/v are stored fused (`attn_qkv`) rather than split (`attn_q/k/v`).
    pub fused_qkv: bool,
}

impl fmt::Display for MmprojAccounting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "mmproj accounting: OK, {} official parameters from {} GGUF tensors ({} q/k/v), {} bytes",
            self.official,
            self.gguf_tensors,
            if self.fused_qkv { "fused" } else { "split" },
            self.bytes
        )?;
        for (t, (count, bytes)) in &self.by_type {
            writeln!(f, "  {t:>5}: {count:>6} tensors, {bytes:>14} bytes")?;
        }
        Ok(())
    }
}

/// An opened, validated and fully accounted mmproj.
pub struct Mmproj {
    path: PathBuf,
    gguf: Gguf,
    config: VisionConfig,
    plan: BTreeMap<String, Resolved>,
    accounting: MmprojAccounting,
}

impl fmt::Debug for Mmproj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mmproj").field("path", &self.path).field("tensors", &self.gguf.len()).finish()
    }
}

/// What `inspect` prints for an mmproj: the file, the bytes per type, the config, the accounting.
impl fmt::Display for Mmproj {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "mmproj {} ({ARCH}, {PROJECTOR_TYPE})", self.path.display())?;
        writeln!(f, "{}", self.config)?;
        write!(f, "{}", self.accounting)
    }
}

/// Open an mmproj GGUF: validate its `clip.*` keys into a [`VisionConfig`], resolve every
/// official vision parameter to its GGUF tensors and account for every tensor of the file.
pub fn open_mmproj(path: &Path) -> Result<Mmproj> {
    let gguf = Gguf::open(path)?;
    let config = mmproj_config(&gguf, path)?;
    let fused_qkv = gguf.tensor("v.blk.0.attn_qkv.weight").is_some();
    let mut plan = BTreeMap::new();
    for exp in vision_manifest(&config) {
        let parts = gguf_parts(&exp.name, &exp.shape, &config, fused_qkv).ok_or_else(|| {
            Error::tensor(&exp.name, format!("no GGUF name rule for this parameter ({})", path.display()))
        })?;
        plan.insert(exp.name, Resolved { shape: exp.shape, parts });
    }
    let accounting = account(&gguf, path, &plan, fused_qkv)?;
    Ok(Mmproj { path: path.to_path_buf(), gguf, config, plan, accounting })
}

impl Mmproj {
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The vision configuration built from the `clip.*` keys (its `raw` holds the equivalent
    /// `vision_*` keys and `hidden_size` only: an mmproj carries no language-model keys).
    pub fn config(&self) -> &VisionConfig {
        &self.config
    }
    /// The same mmproj with another image token budget (`vision_max_n_token`), which the file
    /// cannot carry: clip.cpp hard-codes 384 and takes `--image-max-tokens` instead
    /// (tools/mtmd/clip.cpp:1623-1625). A checkpoint trained with another budget (the
    /// `vl-scenes` fixture: 64) needs it to preprocess images as its config.json says.
    pub fn with_max_n_token(mut self, max_n_token: usize) -> Result<Mmproj> {
        if max_n_token == 0 {
            return Err(Error::config("vision_max_n_token", "the image token budget must be positive"));
        }
        self.config.max_n_token = max_n_token;
        if let Some(o) = self.config.raw.as_object_mut() {
            o.insert("vision_max_n_token".into(), Json::from(max_n_token));
        }
        Ok(self)
    }
    /// Check that the mmproj feeds a language model of width `lm_hidden_size` (the aligner's
    /// output and the sentinel rows are `clip.vision.projection_dim` wide), before uploading.
    pub fn check_lm_hidden_size(&self, lm_hidden_size: usize) -> Result<()> {
        if self.config.hidden_size != lm_hidden_size {
            return Err(Error::config(
                "clip.vision.projection_dim",
                format!(
                    "is {} in {}, but the language model's hidden size is {lm_hidden_size}: this mmproj belongs \
                     to another model",
                    self.config.hidden_size,
                    self.path.display()
                ),
            ));
        }
        Ok(())
    }
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }
    pub fn accounting(&self) -> &MmprojAccounting {
        &self.accounting
    }
    /// Every official parameter with the GGUF tensors it is read from.
    pub fn plan(&self) -> &BTreeMap<String, Resolved> {
        &self.plan
    }

    /// Bytes in the file of the GGUF tensors the official parameter `name` is read from.
    pub fn stored_bytes(&self, name: &str) -> Result<u64> {
        self.resolved(name)?.parts.iter().map(|p| Ok(self.part(p)?.0.nbytes as u64)).sum()
    }

    fn resolved(&self, name: &str) -> Result<&Resolved> {
        self.plan
            .get(name)
            .ok_or_else(|| Error::tensor(name, format!("not a vision parameter of the mmproj {}", self.path.display())))
    }

    /// A part's info and bytes (present: checked at open).
    fn part(&self, p: &GgufPart) -> Result<(&TensorInfo, &[u8])> {
        let missing = || Error::tensor(&p.name, format!("not in {}", self.path.display()));
        let (info, _) = self.gguf.tensor(&p.name).ok_or_else(missing)?;
        let data = self.gguf.data(&p.name).ok_or_else(missing)?;
        Ok((info, data))
    }
}

/// The weight format of a tensor (integer tensors are refused at open).
fn weight_format(info: &TensorInfo, path: &Path) -> Result<WeightFormat> {
    match info.ty {
        GgmlType::Weight(f) => Ok(f),
        t => Err(Error::tensor(
            &info.name,
            format!(
                "type {t} in {} is not a weight format (vision tensors are float or block-quantized)",
                path.display()
            ),
        )),
    }
}

impl ParamSource for Mmproj {
    /// A matrix `[rows, cols]` (cols = the product of the official shape's trailing dims). One
    /// GGUF tensor is borrowed from the map; a stacked parameter (`mlp.w1`, split `attn.wqkv`) is
    /// an owned concatenation of its parts' bytes — every format is row-local, so stacking rows
    /// is concatenating bytes; it costs one copy of those matrices at load (they are uploaded
    /// once and dropped).
    fn matrix(&self, name: &str) -> Result<HostWeight<'_>> {
        let r = self.resolved(name)?;
        let [rows, ref rest @ ..] = r.shape[..] else {
            return Err(Error::tensor(name, "a scalar is not a matrix"));
        };
        let cols: usize = rest.iter().product();
        let mut format = None;
        let mut datas = Vec::with_capacity(r.parts.len());
        for p in &r.parts {
            let (info, data) = self.part(p)?;
            let f = weight_format(info, &self.path)?;
            if format.is_some_and(|g| g != f) {
                return Err(Error::tensor(
                    &p.name,
                    format!(
                        "type {f} differs from the {} of the other part(s) of `{name}` in {}: rows of different \
                         formats cannot be stacked into one matrix",
                        format.map_or("", WeightFormat::name),
                        self.path.display()
                    ),
                ));
            }
            format = Some(f);
            datas.push(data);
        }
        let bytes = match datas[..] {
            [one] => Cow::Borrowed(one),
            _ => Cow::Owned(datas.concat()),
        };
        let format = format.ok_or_else(|| Error::tensor(name, "resolved to no GGUF tensor"))?;
        let w = HostWeight { name: name.to_string(), format, rows, cols, bytes };
        w.validate()?;
        Ok(w)
    }

    /// A vector decoded to f32 (parts concatenated, for a split `attn.wqkv.bias`).
    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let r = self.resolved(name)?;
        let mut out = Vec::with_capacity(r.shape.iter().product());
        for p in &r.parts {
            let (info, data) = self.part(p)?;
            let f = weight_format(info, &self.path)?;
            let n = p.shape.iter().product::<usize>();
            f.check_cols(n).map_err(|msg| Error::tensor(&p.name, msg))?;
            if data.len() != f.row_bytes(n) {
                return Err(Error::tensor(&p.name, format!("{} bytes for {n} {f} values", data.len())));
            }
            let start = out.len();
            out.resize(start + n, 0.0);
            decode_row(f, data, &mut out[start..]);
        }
        Ok(out)
    }

    fn has(&self, name: &str) -> bool {
        self.plan.contains_key(name)
    }
}

/// The GGUF tensors of one official vision parameter and their torch-order shapes (the names of
/// `gguf.get_tensor_name_map(MODEL_ARCH.MMPROJ, n)` for the official names, printed once from
/// the oracle's gguf-py; the converter's re-layouts noted per rule). `None`: not a vision name.
pub fn gguf_parts(official: &str, shape: &[usize], cfg: &VisionConfig, fused_qkv: bool) -> Option<Vec<GgufPart>> {
    let one = |name: String, shape: &[usize]| Some(vec![GgufPart { name, shape: shape.to_vec() }]);
    let (d, p) = (cfg.dim, cfg.patch_size);
    let fixed = match official {
        // v.patch_embd.weight: written as the conv kernel [dim, 3, p, p], the same bytes as the
        // official [dim, 3·p·p] (row-major, channel then dy then dx).
        "vision.patch_embed.proj.weight" => return one("v.patch_embd.weight".into(), &[d, 3, p, p]),
        "vision.patch_embed.proj.bias" => "v.patch_embd.bias",
        "vision.norm.weight" => "v.post_ln.weight",
        "aligner.w1.weight" => "mm.1.weight",
        "aligner.w1.bias" => "mm.1.bias",
        "aligner.w2.weight" => "mm.2.weight",
        "aligner.w2.bias" => "mm.2.bias",
        "image_start" => "v.token_embd.img_start",
        "image_end" => "v.token_embd.img_end",
        "image_pad" => "v.token_embd.img_pad",
        "image_newline" => "v.image_newline",
        _ => "",
    };
    if !fixed.is_empty() {
        return one(fixed.into(), shape);
    }
    let rest = official.strip_prefix("vision.blocks.")?;
    let (n, field) = rest.split_once('.')?;
    let n: usize = n.parse().ok().filter(|&n| n < cfg.n_layers)?;
    let blk = |s: &str| format!("v.blk.{n}.{s}");
    match field {
        "norm1.weight" => one(blk("ln1.weight"), shape),
        "norm2.weight" => one(blk("ln2.weight"), shape),
        "attn.wo.weight" => one(blk("attn_out.weight"), shape),
        "attn.wo.bias" => one(blk("attn_out.bias"), shape),
        "mlp.w2.weight" => one(blk("ffn_down.weight"), shape),
        // v.blk.N.ffn_gate / ffn_up: the converter splits w1 [2·inter, d] into its halves
        // (`w1_gate` = rows [0, inter), `w1_up` = rows [inter, 2·inter)).
        "mlp.w1.weight" => Some(
            ["ffn_gate.weight", "ffn_up.weight"]
                .into_iter()
                .map(|s| GgufPart { name: blk(s), shape: vec![cfg.inter_dim, d] })
                .collect(),
        ),
        // v.blk.N.attn_qkv (as our converter run writes it), or v.blk.N.attn_q / attn_k / attn_v
        // (clip.cpp loads either, clip.cpp:2280-2299): q rows, then k, then v.
        "attn.wqkv.weight" | "attn.wqkv.bias" => {
            let suffix = field.rsplit('.').next()?;
            if fused_qkv {
                one(blk(&format!("attn_qkv.{suffix}")), shape)
            } else {
                let part_shape: Vec<usize> = if suffix == "weight" { vec![d, d] } else { vec![d] };
                Some(
                    ["attn_q", "attn_k", "attn_v"]
                        .into_iter()
                        .map(|s| GgufPart { name: blk(&format!("{s}.{suffix}")), shape: part_shape.clone() })
                        .collect(),
                )
            }
        }
        _ => None,
    }
}

/// Every planned part present once with its shape and a weight format; every tensor of the file
/// used. The first problem is returned, naming file and tensor, with the count of the others.
fn account(gguf: &Gguf, path: &Path, plan: &BTreeMap<String, Resolved>, fused_qkv: bool) -> Result<MmprojAccounting> {
    let mut problems: Vec<(String, String)> = Vec::new();
    let mut used: BTreeSet<&str> = BTreeSet::new();
    let mut by_type: BTreeMap<GgmlType, (usize, u64)> = BTreeMap::new();
    let mut bytes = 0u64;
    for (official, r) in plan {
        for p in &r.parts {
            let Some((info, _)) = gguf.tensor(&p.name) else {
                problems.push((
                    p.name.clone(),
                    format!("missing from {} (expected shape {:?}, for `{official}`)", path.display(), p.shape),
                ));
                continue;
            };
            used.insert(&p.name);
            let found = info.shape();
            if found != p.shape {
                problems.push((
                    p.name.clone(),
                    format!(
                        "wrong shape in {}: found {found:?}, expected {:?} (for `{official}`)",
                        path.display(),
                        p.shape
                    ),
                ));
                continue;
            }
            if let Err(e) = weight_format(info, path) {
                problems.push((p.name.clone(), e.to_string()));
                continue;
            }
            let e = by_type.entry(info.ty).or_default();
            e.0 += 1;
            e.1 += info.nbytes as u64;
            bytes += info.nbytes as u64;
        }
    }
    for (info, file) in gguf.tensors() {
        if !used.contains(info.name.as_str()) {
            problems.push((
                info.name.clone(),
                format!(
                    "unexpected tensor in {} (shape {:?}, {}): no official vision parameter reads it",
                    file.display(),
                    info.shape(),
                    info.ty
                ),
            ));
        }
    }
    if let Some((name, msg)) = problems.first() {
        let more = problems.len() - 1;
        let msg = if more > 0 { format!("{msg} (and {more} more mmproj accounting problem(s))") } else { msg.clone() };
        return Err(Error::tensor(name, msg));
    }
    Ok(MmprojAccounting { official: plan.len(), gguf_tensors: gguf.len(), bytes, by_type, fused_qkv })
}

/// A key's value, or an error naming key and file.
fn key<'g>(gguf: &'g Gguf, path: &Path, key: &str) -> Result<Value<'g>> {
    gguf.kv(key).ok_or_else(|| Error::config(key, format!("missing from {}", path.display())))
}

fn key_str<'g>(gguf: &'g Gguf, path: &Path, k: &str) -> Result<&'g str> {
    let v = key(gguf, path, k)?;
    v.as_str().ok_or_else(|| Error::config(k, format!("is {} in {}, expected a string", v.describe(), path.display())))
}

fn key_positive_int(gguf: &Gguf, path: &Path, k: &str) -> Result<usize> {
    let v = key(gguf, path, k)?;
    v.as_int().filter(|&i| i > 0).and_then(|i| usize::try_from(i).ok()).ok_or_else(|| {
        Error::config(k, format!("is {} in {}, expected a positive integer", v.describe(), path.display()))
    })
}

/// A positive float key. An F32 value is read back as the shortest decimal that rounds to it
/// (the converter wrote an f32 rounding of a decimal such as 1e-6), so it compares equal to the
/// same value in config.json.
fn key_positive_float(gguf: &Gguf, path: &Path, k: &str) -> Result<f64> {
    let v = key(gguf, path, k)?;
    let x = match v {
        Value::F32(x) => x.to_string().parse::<f64>().ok(),
        _ => v.as_float(),
    };
    x.filter(|x| x.is_finite() && *x > 0.0).ok_or_else(|| {
        Error::config(k, format!("is {} in {}, expected a positive number", v.describe(), path.display()))
    })
}

/// The [`VisionConfig`] of an mmproj: each `clip.*` key validated by name, translated to the
/// config.json key it stands for, then the config's own cross-checks (`VisionConfig::from_value`).
pub fn mmproj_config(gguf: &Gguf, path: &Path) -> Result<VisionConfig> {
    let arch = key_str(gguf, path, "general.architecture")?;
    if arch != ARCH {
        return Err(Error::config(
            "general.architecture",
            format!("is `{arch}` in {}, expected `{ARCH}`", path.display()),
        ));
    }
    let proj = key_str(gguf, path, "clip.projector_type")?;
    if proj != PROJECTOR_TYPE {
        return Err(Error::config(
            "clip.projector_type",
            format!("is `{proj}` in {}, expected `{PROJECTOR_TYPE}` (DeepSeek-V4-Flash-Vision)", path.display()),
        ));
    }
    let has = key(gguf, path, "clip.has_vision_encoder")?;
    if has.as_bool() != Some(true) {
        return Err(Error::config(
            "clip.has_vision_encoder",
            format!("is {} in {}, expected true", has.describe(), path.display()),
        ));
    }
    for k in ["clip.vision.image_mean", "clip.vision.image_std"] {
        let v = key(gguf, path, k)?;
        let ok = v
            .as_array()
            .is_some_and(|a| a.len() == 3 && a.iter().all(|x| x.as_float().is_some_and(|f| f == IMAGE_MEAN_STD)));
        if !ok {
            return Err(Error::config(
                k,
                format!(
                    "is {} in {}, expected [0.5, 0.5, 0.5] (the normalization of spec vision.md §2)",
                    v.describe(),
                    path.display()
                ),
            ));
        }
    }
    let mut o = Map::new();
    let ints = [
        ("vision_n_layers", "clip.vision.block_count"),
        ("vision_dim", "clip.vision.embedding_length"),
        ("vision_n_heads", "clip.vision.attention.head_count"),
        ("vision_inter_dim", "clip.vision.feed_forward_length"),
        ("vision_patch_size", "clip.vision.patch_size"),
        ("vision_downsample_ratio", "clip.vision.projector.scale_factor"),
        ("vision_min_pixels", "clip.vision.image_min_pixels"),
        ("hidden_size", "clip.vision.projection_dim"),
    ];
    for (json_key, gguf_key) in ints {
        o.insert(json_key.into(), Json::from(key_positive_int(gguf, path, gguf_key)?));
    }
    let eps = key_positive_float(gguf, path, "clip.vision.attention.layer_norm_epsilon")?;
    o.insert("vision_norm_eps".into(), Json::from(eps));
    o.insert("vision_rope_theta".into(), Json::from(DEEPSEEK4V_ROPE_THETA));
    o.insert("vision_max_n_token".into(), Json::from(DEEPSEEK4V_MAX_N_TOKEN));
    o.insert("vision_max_wh_ratio".into(), Json::from(DEEPSEEK4V_MAX_WH_RATIO));
    VisionConfig::from_value(Json::Object(o))
        .map_err(|e| Error::file(path, format!("the clip.* keys give an invalid vision config: {e}")))
}
