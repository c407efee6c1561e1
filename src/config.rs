//! `config.json` → typed, validated configuration. Every refusal names the offending key.
//!
//! The released checkpoint stores its vision settings as flat top-level `vision_*` keys (spec
//! vision.md §1.1) next to the language model's keys. [`VisionConfig`] reads the vision keys plus
//! the LM's `hidden_size` (the aligner's output width) and keeps the whole parsed document in
//! [`VisionConfig::raw`] so the language-model config can be read from the same file later.

use std::fmt;
use std::path::Path;

use serde_json::Value;

use crate::error::{Error, Result};

/// Default RMSNorm epsilon of the vision tower (spec §3.2: PyTorch default, not the LM's 1e-20).
pub const DEFAULT_VISION_NORM_EPS: f64 = 1e-6;

/// Vision-side configuration (spec vision.md §1.1), validated.
#[derive(Clone, Debug, PartialEq)]
pub struct VisionConfig {
    /// `vision_n_layers`: transformer blocks in the ViT.
    pub n_layers: usize,
    /// `vision_dim`: ViT width.
    pub dim: usize,
    /// `vision_n_heads`: attention heads (`dim % n_heads == 0`, head_dim divisible by 4).
    pub n_heads: usize,
    /// `vision_inter_dim`: SwiGLU hidden width (w1 has `2 * inter_dim` rows).
    pub inter_dim: usize,
    /// `vision_patch_size`: square patch side in pixels.
    pub patch_size: usize,
    /// `vision_rope_theta`: 2-D RoPE base.
    pub rope_theta: f64,
    /// `vision_downsample_ratio`: aligner unfold side `r` (r×r ViT cells → one LM token).
    pub downsample_ratio: usize,
    /// `vision_max_n_token`: token budget of one image block (leading pads included).
    pub max_n_token: usize,
    /// `vision_min_pixels`: images below this pixel count are upscaled.
    pub min_pixels: usize,
    /// `vision_max_wh_ratio`: width/height clamp; `None` when the key is `null`.
    pub max_wh_ratio: Option<f64>,
    /// `vision_norm_eps` (optional, default 1e-6): RMSNorm epsilon of the ViT.
    pub norm_eps: f64,
    /// `hidden_size`: the language model's width = aligner output width = sentinel width.
    pub hidden_size: usize,
    /// The whole parsed config.json (the language-model keys are read from it later).
    pub raw: Value,
}

impl VisionConfig {
    /// Read and validate `path` (a config.json). File-level problems name the file; key-level
    /// problems name the key.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, format!("cannot read config: {e}")))?;
        let raw: Value =
            serde_json::from_str(&text).map_err(|e| Error::file(path, format!("config is not valid JSON: {e}")))?;
        if !raw.is_object() {
            return Err(Error::file(path, "config must be a JSON object"));
        }
        Self::from_value(raw)
    }

    /// Parse from JSON text.
    pub fn from_json_str(text: &str) -> Result<Self> {
        let raw: Value =
            serde_json::from_str(text).map_err(|e| Error::Invalid(format!("config is not valid JSON: {e}")))?;
        Self::from_value(raw)
    }

    /// Validate an already-parsed config document (must be a JSON object with flat keys).
    pub fn from_value(raw: Value) -> Result<Self> {
        let obj = raw.as_object().ok_or_else(|| Error::Invalid("config must be a JSON object".into()))?;
        let get = |key: &str| obj.get(key);

        let n_layers = positive_int(get, "vision_n_layers")?;
        let dim = positive_int(get, "vision_dim")?;
        let n_heads = positive_int(get, "vision_n_heads")?;
        let inter_dim = positive_int(get, "vision_inter_dim")?;
        let patch_size = positive_int(get, "vision_patch_size")?;
        let rope_theta = positive_float(get, "vision_rope_theta")?;
        let downsample_ratio = positive_int(get, "vision_downsample_ratio")?;
        let max_n_token = positive_int(get, "vision_max_n_token")?;
        let min_pixels = positive_int(get, "vision_min_pixels")?;
        let max_wh_ratio = match get("vision_max_wh_ratio") {
            None => return Err(Error::config("vision_max_wh_ratio", "missing (use null for no limit)")),
            Some(Value::Null) => None,
            Some(_) => Some(positive_float(get, "vision_max_wh_ratio")?),
        };
        let norm_eps = match get("vision_norm_eps") {
            None | Some(Value::Null) => DEFAULT_VISION_NORM_EPS,
            Some(_) => positive_float(get, "vision_norm_eps")?,
        };
        let hidden_size = positive_int(get, "hidden_size")?;

        if dim % n_heads != 0 {
            return Err(Error::config(
                "vision_n_heads",
                format!("vision_dim {dim} is not divisible by vision_n_heads {n_heads}"),
            ));
        }
        let head_dim = dim / n_heads;
        if head_dim % 4 != 0 {
            return Err(Error::config(
                "vision_n_heads",
                format!(
                    "head_dim = vision_dim {dim} / vision_n_heads {n_heads} = {head_dim} is not divisible by 4 \
                     (2-D RoPE needs head_dim/4 frequencies per axis)"
                ),
            ));
        }
        if norm_eps >= 1.0 {
            return Err(Error::config(
                "vision_norm_eps",
                format!("{norm_eps} is not a plausible epsilon (must be < 1)"),
            ));
        }
        // Derived sizes must not overflow (the manifest and byte counts multiply them).
        let too_large = |key: &str| Error::config(key, "value too large: derived tensor sizes overflow");
        dim.checked_mul(3).and_then(|x| x.checked_mul(dim)).ok_or_else(|| too_large("vision_dim"))?;
        inter_dim.checked_mul(2).and_then(|x| x.checked_mul(dim)).ok_or_else(|| too_large("vision_inter_dim"))?;
        patch_size
            .checked_mul(patch_size)
            .and_then(|x| x.checked_mul(3))
            .and_then(|x| x.checked_mul(dim))
            .ok_or_else(|| too_large("vision_patch_size"))?;
        downsample_ratio
            .checked_mul(downsample_ratio)
            .and_then(|x| x.checked_mul(dim))
            .and_then(|x| x.checked_mul(hidden_size))
            .ok_or_else(|| too_large("vision_downsample_ratio"))?;
        hidden_size.checked_mul(hidden_size).ok_or_else(|| too_large("hidden_size"))?;

        Ok(Self {
            n_layers,
            dim,
            n_heads,
            inter_dim,
            patch_size,
            rope_theta,
            downsample_ratio,
            max_n_token,
            min_pixels,
            max_wh_ratio,
            norm_eps,
            hidden_size,
            raw,
        })
    }

    /// Per-head width: `dim / n_heads`.
    pub fn head_dim(&self) -> usize {
        self.dim / self.n_heads
    }

    /// Length of a flattened patch: `3 * p * p` (order channel, dy, dx).
    pub fn patch_dim(&self) -> usize {
        3 * self.patch_size * self.patch_size
    }

    /// Aligner input width: `dim * r * r`.
    pub fn aligner_in_dim(&self) -> usize {
        self.dim * self.downsample_ratio * self.downsample_ratio
    }

    /// RoPE frequencies per spatial axis: `head_dim / 4`.
    pub fn rope_freqs_per_axis(&self) -> usize {
        self.head_dim() / 4
    }
}

impl fmt::Display for VisionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "vision config:")?;
        writeln!(
            f,
            "  ViT: {} layers, dim {}, {} heads (head_dim {}), inter_dim {}, norm eps {:e}",
            self.n_layers,
            self.dim,
            self.n_heads,
            self.head_dim(),
            self.inter_dim,
            self.norm_eps
        )?;
        writeln!(
            f,
            "  patches: {}x{} px ({} values), 2-D RoPE theta {} ({} freqs/axis)",
            self.patch_size,
            self.patch_size,
            self.patch_dim(),
            self.rope_theta,
            self.rope_freqs_per_axis()
        )?;
        writeln!(
            f,
            "  aligner: {}x{} unfold, {} -> {} (LM hidden_size)",
            self.downsample_ratio,
            self.downsample_ratio,
            self.aligner_in_dim(),
            self.hidden_size
        )?;
        let ratio = match self.max_wh_ratio {
            Some(r) => format!("{r}"),
            None => "none".to_string(),
        };
        write!(f, "  image: max {} tokens, min {} pixels, max w/h ratio {}", self.max_n_token, self.min_pixels, ratio)
    }
}

/// YaRN settings of `rope_scaling` (language.md §2.6); applied only on compressed layers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// `rope_scaling.factor`.
    pub factor: f64,
    /// `rope_scaling.original_max_position_embeddings`.
    pub original_max_position_embeddings: f64,
    /// `rope_scaling.beta_fast`.
    pub beta_fast: f64,
    /// `rope_scaling.beta_slow`.
    pub beta_slow: f64,
}

/// Language-model configuration (DeepSeek-V4, language.md §1), validated. Keys are the official
/// config.json names; every refusal names the key.
#[derive(Clone, Debug, PartialEq)]
pub struct LmConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Width of q heads and of the single shared K = V latent.
    pub head_dim: usize,
    /// RoPE on the last `qk_rope_head_dim` dims of each head (interleaved pairs).
    pub qk_rope_head_dim: usize,
    pub q_lora_rank: usize,
    pub o_groups: usize,
    pub o_lora_rank: usize,
    pub n_routed_experts: usize,
    pub num_experts_per_tok: usize,
    pub n_shared_experts: usize,
    pub moe_intermediate_size: usize,
    /// Layers `0..num_hash_layers` route by `tid2eid`.
    pub num_hash_layers: usize,
    /// Only `"sqrtsoftplus"` is accepted.
    pub scoring_func: String,
    pub routed_scaling_factor: f64,
    pub swiglu_limit: f64,
    pub sliding_window: usize,
    /// One ratio per decoder layer (0 = sliding window only, 4 = CSA with indexer, other = HCA);
    /// the config array may carry extra trailing MTP entries, which are dropped here.
    pub compress_ratios: Vec<usize>,
    pub compress_rope_theta: f64,
    pub rope_theta: f64,
    /// `rope_scaling` with type yarn, or `None` when the key is absent/null.
    pub yarn: Option<Yarn>,
    pub index_n_heads: usize,
    pub index_head_dim: usize,
    pub index_topk: usize,
    pub hc_mult: usize,
    pub hc_sinkhorn_iters: usize,
    pub hc_eps: f64,
    pub rms_norm_eps: f64,
}

impl LmConfig {
    /// Read and validate `path` (a config.json).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, format!("cannot read config: {e}")))?;
        let raw: Value =
            serde_json::from_str(&text).map_err(|e| Error::file(path, format!("config is not valid JSON: {e}")))?;
        Self::from_value(&raw)
    }

    /// Validate an already-parsed config document (flat official keys).
    pub fn from_value(raw: &Value) -> Result<Self> {
        let obj = raw.as_object().ok_or_else(|| Error::Invalid("config must be a JSON object".into()))?;
        let get = |key: &str| obj.get(key);
        let int = |key: &str| positive_int(get, key);
        let float = |key: &str| positive_float(get, key);

        let num_hidden_layers = int("num_hidden_layers")?;
        let num_attention_heads = int("num_attention_heads")?;
        let head_dim = int("head_dim")?;
        let qk_rope_head_dim = int("qk_rope_head_dim")?;
        let hidden_size = int("hidden_size")?;
        let o_groups = int("o_groups")?;
        let num_hash_layers = match get("num_hash_layers") {
            Some(Value::Number(n)) if n.as_u64() == Some(0) => 0,
            _ => int("num_hash_layers")?,
        };
        let scoring_func = match get("scoring_func") {
            Some(Value::String(s)) if s == "sqrtsoftplus" => s.clone(),
            Some(v) => {
                return Err(Error::config(
                    "scoring_func",
                    format!("only \"sqrtsoftplus\" is supported, found {}", describe(v)),
                ));
            }
            None => return Err(Error::config("scoring_func", "missing")),
        };
        let ratios_v = get("compress_ratios").ok_or_else(|| Error::config("compress_ratios", "missing"))?;
        let Value::Array(arr) = ratios_v else {
            return Err(Error::config("compress_ratios", format!("expected an array, found {}", describe(ratios_v))));
        };
        if arr.len() < num_hidden_layers {
            return Err(Error::config(
                "compress_ratios",
                format!("{} entries for {num_hidden_layers} layers (num_hidden_layers)", arr.len()),
            ));
        }
        let mut compress_ratios = Vec::with_capacity(num_hidden_layers);
        for (i, v) in arr.iter().take(num_hidden_layers).enumerate() {
            let r = v.as_u64().ok_or_else(|| {
                Error::config(
                    "compress_ratios",
                    format!("entry {i} is {}, expected a non-negative integer", describe(v)),
                )
            })? as usize;
            if r == 1 {
                return Err(Error::config("compress_ratios", format!("entry {i} is 1 (a ratio must be 0 or >= 2)")));
            }
            compress_ratios.push(r);
        }
        let yarn = match get("rope_scaling") {
            None | Some(Value::Null) => None,
            Some(Value::Object(o)) => {
                let ty = o.get("type").or_else(|| o.get("rope_type")).and_then(Value::as_str);
                if ty != Some("yarn") {
                    return Err(Error::config(
                        "rope_scaling",
                        format!("only type \"yarn\" is supported, found {ty:?}"),
                    ));
                }
                let sub = |k: &str| -> Result<f64> {
                    positive_float(|key: &str| o.get(key), k)
                        .map_err(|_| Error::config(format!("rope_scaling.{k}"), "missing or not a positive number"))
                };
                Some(Yarn {
                    factor: sub("factor")?,
                    original_max_position_embeddings: sub("original_max_position_embeddings")?,
                    beta_fast: sub("beta_fast")?,
                    beta_slow: sub("beta_slow")?,
                })
            }
            Some(v) => return Err(Error::config("rope_scaling", format!("expected an object, found {}", describe(v)))),
        };
        let c = LmConfig {
            vocab_size: int("vocab_size")?,
            hidden_size,
            num_hidden_layers,
            num_attention_heads,
            head_dim,
            qk_rope_head_dim,
            q_lora_rank: int("q_lora_rank")?,
            o_groups,
            o_lora_rank: int("o_lora_rank")?,
            n_routed_experts: int("n_routed_experts")?,
            num_experts_per_tok: int("num_experts_per_tok")?,
            n_shared_experts: int("n_shared_experts")?,
            moe_intermediate_size: int("moe_intermediate_size")?,
            num_hash_layers,
            scoring_func,
            routed_scaling_factor: float("routed_scaling_factor")?,
            swiglu_limit: float("swiglu_limit")?,
            sliding_window: int("sliding_window")?,
            compress_ratios,
            compress_rope_theta: float("compress_rope_theta")?,
            rope_theta: float("rope_theta")?,
            yarn,
            index_n_heads: int("index_n_heads")?,
            index_head_dim: int("index_head_dim")?,
            index_topk: int("index_topk")?,
            hc_mult: int("hc_mult")?,
            hc_sinkhorn_iters: int("hc_sinkhorn_iters")?,
            hc_eps: float("hc_eps")?,
            rms_norm_eps: float("rms_norm_eps")?,
        };
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<()> {
        if self.qk_rope_head_dim > self.head_dim || self.qk_rope_head_dim % 2 != 0 {
            return Err(Error::config(
                "qk_rope_head_dim",
                format!("{} must be even and at most head_dim {}", self.qk_rope_head_dim, self.head_dim),
            ));
        }
        if self.num_attention_heads % self.o_groups != 0 {
            return Err(Error::config(
                "o_groups",
                format!("{} does not divide num_attention_heads {}", self.o_groups, self.num_attention_heads),
            ));
        }
        if self.num_experts_per_tok > self.n_routed_experts {
            return Err(Error::config(
                "num_experts_per_tok",
                format!("{} exceeds n_routed_experts {}", self.num_experts_per_tok, self.n_routed_experts),
            ));
        }
        if self.num_hash_layers > self.num_hidden_layers {
            return Err(Error::config(
                "num_hash_layers",
                format!("{} exceeds num_hidden_layers {}", self.num_hash_layers, self.num_hidden_layers),
            ));
        }
        if self.qk_rope_head_dim > self.index_head_dim {
            return Err(Error::config(
                "index_head_dim",
                format!("{} is smaller than qk_rope_head_dim {}", self.index_head_dim, self.qk_rope_head_dim),
            ));
        }
        for (key, v) in [("hc_eps", self.hc_eps), ("rms_norm_eps", self.rms_norm_eps)] {
            if v >= 1.0 {
                return Err(Error::config(key, format!("{v} is not a plausible epsilon (must be < 1)")));
            }
        }
        if let Some(y) = &self.yarn
            && y.beta_fast <= y.beta_slow
        {
            return Err(Error::config(
                "rope_scaling.beta_fast",
                format!("{} must exceed beta_slow {}", y.beta_fast, y.beta_slow),
            ));
        }
        Ok(())
    }

    /// Compression ratio of layer `l` (0 = sliding window only).
    pub fn ratio(&self, l: usize) -> usize {
        self.compress_ratios[l]
    }

    /// RoPE inverse frequencies `[qk_rope_head_dim / 2]` for a layer of compression `ratio`:
    /// ratio 0 → `rope_theta^(−2j/rd)`; otherwise `compress_rope_theta` with YaRN (language.md §2.6,
    /// transformers `_compute_yarn_parameters`; no mscale). Computed in f64, rounded to f32.
    pub fn inv_freq(&self, ratio: usize) -> Vec<f32> {
        let rd = self.qk_rope_head_dim;
        let theta = if ratio == 0 { self.rope_theta } else { self.compress_rope_theta };
        let base: Vec<f64> = (0..rd / 2).map(|j| theta.powf(-(2.0 * j as f64) / rd as f64)).collect();
        match (&self.yarn, ratio) {
            (Some(y), r) if r != 0 => {
                let dcorr = |n: f64| {
                    rd as f64 * (y.original_max_position_embeddings / (2.0 * std::f64::consts::PI * n)).ln()
                        / (2.0 * theta.ln())
                };
                let low = dcorr(y.beta_fast).floor().max(0.0);
                let mut high = dcorr(y.beta_slow).ceil().min(rd as f64 - 1.0);
                if high == low {
                    high += 0.001; // transformers' linear_ramp_factor guard
                }
                base.iter()
                    .enumerate()
                    .map(|(j, f)| {
                        let ramp = ((j as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        (f * (1.0 - ramp) + f / y.factor * ramp) as f32
                    })
                    .collect()
            }
            _ => base.iter().map(|&f| f as f32).collect(),
        }
    }
}

/// "a string (\"16\")"-style description of a JSON value for error messages.
/// How the routed experts of an official checkpoint are stored (`expert_dtype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpertDtype {
    /// `"fp4"`: e2m1 packed two per byte (I8 `[out, in/2]`), E8M0 scale per 32 values.
    Fp4,
    /// `"fp8"`: e4m3 with 128×128 block scales, like the other FP8 matrices.
    Fp8,
}

/// Scale storage of the FP8 matrices (`quantization_config.scale_fmt`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScaleFmt {
    /// `"ue8m0"`: one F8_E8M0 power-of-two exponent per block (V4 Flash, Vision-Exp).
    Ue8m0,
    /// key absent or null: one F32 multiplier per block (the DeepSeek-V3 convention).
    F32,
}

/// The official FP8/FP4 storage announced by config.json (formats.md §1), validated key by key.
/// `None` from [`QuantConfig::from_value`] means a plain F32/BF16/F16 checkpoint: then no FP8
/// or FP4 tensor is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantConfig {
    pub scale_fmt: ScaleFmt,
    /// `expert_dtype`; absent means the experts are FP8 like every other quantized matrix.
    pub expert_dtype: ExpertDtype,
}

/// The one block shape the official checkpoints use and the row-local re-lay supports.
pub const FP8_BLOCK: usize = 128;

impl QuantConfig {
    /// Read `quantization_config` and `expert_dtype` from a parsed config.json. Accepted:
    /// `quant_method "fp8"`, `fmt "e4m3"`, `weight_block_size [128, 128]`, `scale_fmt "ue8m0"`
    /// or absent/null, `activation_scheme "dynamic"` or absent (activations stay f32 here, so a
    /// dynamic scheme needs nothing; a static one would need input scales we do not read).
    /// Any other value is refused naming its key. `expert_dtype` without a quantization_config
    /// is accepted (a dequantized twin may keep it) and announces nothing.
    pub fn from_value(raw: &Value) -> Result<Option<QuantConfig>> {
        let obj = raw.as_object().ok_or_else(|| Error::Invalid("config must be a JSON object".into()))?;
        let expert_dtype = match obj.get("expert_dtype") {
            None | Some(Value::Null) => ExpertDtype::Fp8,
            Some(Value::String(s)) if s == "fp4" => ExpertDtype::Fp4,
            Some(Value::String(s)) if s == "fp8" => ExpertDtype::Fp8,
            Some(v) => {
                return Err(Error::config(
                    "expert_dtype",
                    format!("expected \"fp4\" or \"fp8\", found {}", describe(v)),
                ));
            }
        };
        let q = match obj.get("quantization_config") {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Object(q)) => q,
            Some(v) => {
                return Err(Error::config("quantization_config", format!("expected an object, found {}", describe(v))));
            }
        };
        let string = |key: &str, want: &str, required: bool| -> Result<bool> {
            match q.get(key) {
                Some(Value::String(s)) if s == want => Ok(true),
                None | Some(Value::Null) if !required => Ok(false),
                None => {
                    Err(Error::config(format!("quantization_config.{key}"), format!("missing (expected \"{want}\")")))
                }
                Some(v) => Err(Error::config(
                    format!("quantization_config.{key}"),
                    format!("only \"{want}\" is supported, found {}", describe(v)),
                )),
            }
        };
        string("quant_method", "fp8", true)?;
        string("fmt", "e4m3", true)?;
        string("activation_scheme", "dynamic", false)?;
        let scale_fmt = if string("scale_fmt", "ue8m0", false)? { ScaleFmt::Ue8m0 } else { ScaleFmt::F32 };
        let block_key = "quantization_config.weight_block_size";
        match q.get("weight_block_size") {
            Some(Value::Array(a)) if a.len() == 2 && a.iter().all(|v| v.as_u64() == Some(FP8_BLOCK as u64)) => {}
            Some(v) => {
                return Err(Error::config(
                    block_key,
                    format!("only [{FP8_BLOCK}, {FP8_BLOCK}] is supported, found {}", compact(v)),
                ));
            }
            None => return Err(Error::config(block_key, format!("missing (expected [{FP8_BLOCK}, {FP8_BLOCK}])"))),
        }
        Ok(Some(QuantConfig { scale_fmt, expert_dtype }))
    }
}

/// A short rendering of a value for an error message (arrays and objects shown, not just typed).
fn compact(v: &Value) -> String {
    let s = v.to_string();
    if s.len() > 80 { describe(v) } else { s }
}

fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Array(_) | Value::Object(_) => type_name(v).to_string(),
        _ => format!("{} ({v})", type_name(v)),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A required positive integer; integral floats (`32.0`) are accepted.
fn positive_int<'a>(get: impl Fn(&str) -> Option<&'a Value>, key: &str) -> Result<usize> {
    let v = get(key).ok_or_else(|| Error::config(key, "missing"))?;
    let Value::Number(n) = v else {
        return Err(Error::config(key, format!("expected a positive integer, found {}", describe(v))));
    };
    let int = if let Some(u) = n.as_u64() {
        u
    } else if let Some(i) = n.as_i64() {
        return Err(Error::config(key, format!("must be positive, found {i}")));
    } else {
        let f = n.as_f64().unwrap_or(f64::NAN);
        if !f.is_finite() || f.fract() != 0.0 {
            return Err(Error::config(key, format!("expected an integer, found {n}")));
        }
        if f <= 0.0 {
            return Err(Error::config(key, format!("must be positive, found {n}")));
        }
        if f > u64::MAX as f64 / 2.0 {
            return Err(Error::config(key, format!("value {n} too large")));
        }
        f as u64
    };
    if int == 0 {
        return Err(Error::config(key, "must be positive, found 0"));
    }
    usize::try_from(int).map_err(|_| Error::config(key, format!("value {int} too large for this platform")))
}

/// A required positive finite number (ints or floats).
fn positive_float<'a>(get: impl Fn(&str) -> Option<&'a Value>, key: &str) -> Result<f64> {
    let v = get(key).ok_or_else(|| Error::config(key, "missing"))?;
    let Value::Number(n) = v else {
        return Err(Error::config(key, format!("expected a positive number, found {}", describe(v))));
    };
    let f = n.as_f64().ok_or_else(|| Error::config(key, format!("not representable as a number: {n}")))?;
    if !f.is_finite() || f <= 0.0 {
        return Err(Error::config(key, format!("must be positive and finite, found {n}")));
    }
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn released() -> Value {
        json!({
            "vision_n_layers": 32, "vision_dim": 1024, "vision_n_heads": 16, "vision_inter_dim": 2816,
            "vision_patch_size": 14, "vision_rope_theta": 10000, "vision_downsample_ratio": 3,
            "vision_max_n_token": 384, "vision_min_pixels": 147456, "vision_max_wh_ratio": 8,
            "hidden_size": 4096, "vocab_size": 129280
        })
    }

    fn err_of(v: Value) -> String {
        VisionConfig::from_value(v).unwrap_err().to_string()
    }

    #[test]
    fn released_config_parses() {
        let c = VisionConfig::from_value(released()).unwrap();
        assert_eq!(c.head_dim(), 64);
        assert_eq!(c.patch_dim(), 588);
        assert_eq!(c.aligner_in_dim(), 9216);
        assert_eq!(c.rope_freqs_per_axis(), 16);
        assert_eq!(c.rope_theta, 10000.0);
        assert_eq!(c.max_wh_ratio, Some(8.0));
        assert_eq!(c.norm_eps, 1e-6);
        assert_eq!(c.raw["vocab_size"], 129280);
        let s = c.to_string();
        assert!(s.contains("32 layers") && s.contains("9216 -> 4096"), "{s}");
    }

    #[test]
    fn floats_and_nulls_accepted() {
        let mut v = released();
        v["vision_rope_theta"] = json!(10000.0);
        v["vision_dim"] = json!(1024.0);
        v["vision_max_wh_ratio"] = Value::Null;
        v["vision_norm_eps"] = json!(1e-5);
        let c = VisionConfig::from_value(v).unwrap();
        assert_eq!(c.dim, 1024);
        assert_eq!(c.max_wh_ratio, None);
        assert_eq!(c.norm_eps, 1e-5);
    }

    #[test]
    fn refusals_name_the_key() {
        let keys = [
            "vision_n_layers",
            "vision_dim",
            "vision_n_heads",
            "vision_inter_dim",
            "vision_patch_size",
            "vision_rope_theta",
            "vision_downsample_ratio",
            "vision_max_n_token",
            "vision_min_pixels",
            "vision_max_wh_ratio",
            "hidden_size",
        ];
        for key in keys {
            let mut v = released();
            v.as_object_mut().unwrap().remove(key);
            let e = err_of(v);
            assert!(e.contains(&format!("`{key}`")) && e.contains("missing"), "{e}");

            let mut v = released();
            v[key] = json!("16");
            let e = err_of(v);
            assert!(e.contains(&format!("`{key}`")) && e.contains("a string"), "{e}");

            let mut v = released();
            v[key] = json!(0);
            let e = err_of(v);
            assert!(e.contains(&format!("`{key}`")) && e.contains("positive"), "{e}");

            let mut v = released();
            v[key] = json!(-3);
            let e = err_of(v);
            assert!(e.contains(&format!("`{key}`")) && e.contains("positive"), "{e}");
        }
        let mut v = released();
        v["vision_dim"] = json!(1024.5);
        assert!(err_of(v).contains("`vision_dim`"));
        let mut v = released();
        v["vision_norm_eps"] = json!(true);
        assert!(err_of(v).contains("`vision_norm_eps`"));
        let mut v = released();
        v["vision_norm_eps"] = json!(0.0);
        assert!(err_of(v).contains("`vision_norm_eps`"));
    }

    #[test]
    fn inconsistent_heads_refused() {
        let mut v = released();
        v["vision_n_heads"] = json!(10);
        let e = err_of(v);
        assert!(e.contains("`vision_n_heads`") && e.contains("not divisible by vision_n_heads"), "{e}");
        // dim 1024 / 512 heads = head_dim 2: not divisible by 4.
        let mut v = released();
        v["vision_n_heads"] = json!(512);
        let e = err_of(v);
        assert!(e.contains("`vision_n_heads`") && e.contains("divisible by 4"), "{e}");
    }

    #[test]
    fn overflow_refused() {
        let mut v = released();
        v["vision_dim"] = json!(1u64 << 40);
        v["vision_n_heads"] = json!(1);
        let e = err_of(v);
        assert!(e.contains("`vision_dim`") && e.contains("overflow"), "{e}");
    }
    fn lm_tiny() -> Value {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/models/lm-tiny/config.json"))
            .unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn lm_err(v: Value) -> String {
        LmConfig::from_value(&v).unwrap_err().to_string()
    }

    #[test]
    fn lm_tiny_config_parses() {
        let c = LmConfig::from_value(&lm_tiny()).unwrap();
        assert_eq!((c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.head_dim), (64, 5, 4, 32));
        assert_eq!(c.compress_ratios, vec![0, 4, 16, 4, 0], "the MTP slot is dropped");
        assert_eq!((c.index_n_heads, c.index_head_dim, c.index_topk), (16, 32, 8));
        let y = c.yarn.unwrap();
        assert_eq!((y.factor, y.original_max_position_embeddings, y.beta_fast, y.beta_slow), (4.0, 4096.0, 32.0, 1.0));
    }

    #[test]
    #[allow(clippy::needless_range_loop)]
    fn lm_inv_freq_main_and_yarn() {
        let c = LmConfig::from_value(&lm_tiny()).unwrap();
        let main = c.inv_freq(0);
        assert_eq!(main.len(), 8);
        assert!((main[1] - 5000f32.powf(-2.0 / 16.0)).abs() < 1e-7);
        // README: the YaRN ramp covers frequency indices 2..5 of 8: j ≤ 2 unscaled, j ≥ 5 divided by 4.
        let comp = c.inv_freq(4);
        let base = |j: usize| 80000f64.powf(-(2.0 * j as f64) / 16.0);
        for j in 0..=2 {
            assert!(((comp[j] as f64) - base(j)).abs() <= 1e-7 * base(j));
        }
        for j in 5..8 {
            assert!(((comp[j] as f64) - base(j) / 4.0).abs() <= 1e-7 * base(j));
        }
        assert!((comp[3] as f64) < base(3) && (comp[3] as f64) > base(3) / 4.0);
    }

    #[test]
    fn lm_refusals_name_the_key() {
        let mut v = lm_tiny();
        v.as_object_mut().unwrap().remove("index_topk");
        assert!(lm_err(v).contains("`index_topk`"));
        let mut v = lm_tiny();
        v["scoring_func"] = json!("sigmoid");
        assert!(lm_err(v).contains("`scoring_func`"));
        let mut v = lm_tiny();
        v["compress_ratios"] = json!([0, 4]);
        assert!(lm_err(v).contains("`compress_ratios`"));
        let mut v = lm_tiny();
        v["o_groups"] = json!(3);
        assert!(lm_err(v).contains("`o_groups`"));
        let mut v = lm_tiny();
        v["rope_scaling"] = json!({"type": "yarn", "factor": 4});
        assert!(lm_err(v).contains("rope_scaling.original_max_position_embeddings"));
        let mut v = lm_tiny();
        v["hidden_size"] = json!("64");
        assert!(lm_err(v).contains("`hidden_size`"));
    }
}
