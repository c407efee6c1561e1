//! The library's front door: load a checkpoint on a chosen lane and run whole jobs. The CLI and
//! the examples call only this module; they never touch tensors.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use crate::backend::cpu::CpuBackend;
use crate::backend::cuda::CudaBackend;
use crate::backend::wgpu::WgpuBackend;
use crate::backend::{Backend, HostTensor, HostWeight, Op, Precision, WeightFormat};
use crate::config::{LmConfig, VisionConfig};
use crate::error::{Error, Result};
use crate::model::lm::generate::{self, Sampling, StopReason};
use crate::model::lm::vision::{ImageBlock, MAX_IMAGE_TOKENS, visible_bounds};
use crate::model::lm::{LmInput, LmModel};
use crate::model::vision::VisionModel;
use crate::model::{CountingSource, LoadProgress, ParamSource, PrefillProgress};
use crate::processor::{self, PreprocessConfig};
use crate::tokenizer::ChatTokenizer;
use crate::weights::gguf::Gguf;
use crate::weights::gguf_lm::{GgufLm, GgufPair};
use crate::weights::gguf_vision::{Mmproj, open_mmproj};
use crate::weights::{Checkpoint, footprint};

/// Which lane runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneChoice {
    /// wgpu when an adapter exists, else the CPU lane.
    Auto,
    Cpu,
    Wgpu,
    /// The native CUDA lane (the whole model; never chosen by `Auto`).
    Cuda,
}

impl FromStr for LaneChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(LaneChoice::Auto),
            "cpu" => Ok(LaneChoice::Cpu),
            "wgpu" | "vulkan" => Ok(LaneChoice::Wgpu),
            "cuda" => Ok(LaneChoice::Cuda),
            other => Err(Error::Invalid(format!("unknown backend `{other}` (expected auto, cpu, wgpu or cuda)"))),
        }
    }
}

impl LaneChoice {
    /// The command-line choice if given, else `FOVEA_BACKEND`, else `Auto`.
    pub fn resolve(cli: Option<LaneChoice>) -> Result<LaneChoice> {
        match cli {
            Some(c) => Ok(c),
            None => match std::env::var("FOVEA_BACKEND") {
                Ok(v) if !v.is_empty() => v.parse().map_err(|e: Error| Error::Invalid(format!("FOVEA_BACKEND: {e}"))),
                _ => Ok(LaneChoice::Auto),
            },
        }
    }
}

/// Options of `fovea dump` for the vision path.
#[derive(Clone, Debug)]
pub struct VisionDumpRequest {
    pub model_dir: PathBuf,
    /// The mmproj GGUF, when `model_dir` is a text GGUF.
    pub mmproj: Option<PathBuf>,
    /// The image token budget of an mmproj (which cannot store it; default: llama.cpp's 384).
    pub image_max_tokens: Option<usize>,
    pub image: PathBuf,
    pub lane: LaneChoice,
    /// `--precision` / `FOVEA_PRECISION`; `None`: the lane's default ([`lane_precision`]).
    pub precision: Option<Precision>,
    /// Index of the image placeholder in the token stream (sets the lead pads).
    pub start_pos: usize,
}

/// Every stage of the vision path for one image, on the host (what `fovea dump` writes).
#[derive(Clone, Debug)]
pub struct VisionDump {
    pub lane: &'static str,
    pub device: String,
    pub n_vit_h: usize,
    pub n_vit_w: usize,
    pub n_llm_h: usize,
    pub n_llm_w: usize,
    pub hidden: usize,
    pub patch_dim: usize,
    pub vision_dim: usize,
    /// `[n_vit_h·n_vit_w, 3·p·p]`
    pub patches: Vec<f32>,
    /// `[n_vit_h·n_vit_w, vision_dim]`
    pub vit: Vec<f32>,
    /// `[n_llm_h·n_llm_w, hidden]`
    pub aligner: Vec<f32>,
    /// `[block_len, hidden]`
    pub block: Vec<f32>,
    pub block_types: Vec<u8>,
    pub perm: Vec<u32>,
}

/// The processor settings a vision config implies.
pub fn preprocess_config(cfg: &VisionConfig) -> PreprocessConfig {
    PreprocessConfig {
        patch_size: cfg.patch_size,
        downsample_ratio: cfg.downsample_ratio,
        max_n_token: cfg.max_n_token,
        min_pixels: cfg.min_pixels as u64,
        max_wh_ratio: cfg.max_wh_ratio,
    }
}

/// Run the vision path for one image on the requested lane and return every stage.
pub fn dump_vision(req: &VisionDumpRequest) -> Result<VisionDump> {
    let src = match (is_gguf(&req.model_dir), &req.mmproj) {
        (true, Some(path)) => {
            let m = with_budget(open_mmproj(path)?, req.image_max_tokens)?;
            m.check_lm_hidden_size(GgufLm::open(&req.model_dir)?.config().hidden_size)?;
            VisionSource::Mmproj(m)
        }
        (true, None) => {
            return Err(Error::file(&req.model_dir, "a text GGUF holds no vision tower: pass its --mmproj FILE"));
        }
        (false, Some(path)) => {
            return Err(Error::file(
                path,
                format!("--mmproj goes with a .gguf --model; {} is a checkpoint directory", req.model_dir.display()),
            ));
        }
        (false, None) => VisionSource::Checkpoint(Checkpoint::open(&req.model_dir)?),
    };
    run_on_lane(req.lane, req.precision, VisionJob { src: &src, req })
}

/// The vision dump of one image, for [`run_on_lane`]: it needs no language-model op.
struct VisionJob<'a> {
    src: &'a VisionSource,
    req: &'a VisionDumpRequest,
}

impl LaneJob for VisionJob<'_> {
    type Output = VisionDump;
    const LANGUAGE_MODEL: bool = false;
    fn run<B: Backend>(self, b: &B, note: Option<&str>) -> Result<VisionDump> {
        if let Some(note) = note {
            eprintln!("fovea: {note}");
        }
        VisionRunner::from_source(b, self.src)?.run(&self.req.image, self.req.start_pos)
    }
}

/// The wgpu lane `auto` would use, in the precision asked for (else the adapter's default): the
/// best adapter, unless it is a software rasterizer that nobody asked for by name
/// (`FOVEA_ADAPTER`).
fn auto_wgpu(asked: Option<Precision>) -> Result<WgpuBackend> {
    let named = adapter_from_env();
    let b = WgpuBackend::open(named.as_deref(), asked)?;
    if named.is_none() && b.is_software() {
        return Err(Error::Device(format!("the only wgpu adapter is a software one ({})", b.device_name())));
    }
    Ok(b)
}

/// The CPU lane `auto` falls back to (`why`): an error instead when fast precision was asked
/// for, which the CPU lane does not have (not a silent exact run).
fn auto_cpu(asked: Option<Precision>, why: &str) -> Result<CpuBackend> {
    if asked == Some(Precision::Fast) {
        return Err(Error::Unsupported {
            lane: "auto",
            op: "precision",
            what: format!(
                "fast: auto fell back to the CPU lane, which computes in f32 only ({why}); use --precision exact, \
                 or name the lane with --backend"
            ),
        });
    }
    Ok(CpuBackend::new())
}

/// The wgpu lane on `FOVEA_ADAPTER` (else the best adapter) in the precision asked for (the CLI's
/// `--precision`, else `FOVEA_PRECISION`), else the adapter's default
/// ([`crate::backend::wgpu::default_precision`]: fast on a GPU with SHADER_F16, exact on a
/// software adapter or one without it). Fast on an adapter without SHADER_F16 is an error naming
/// the adapter.
pub fn wgpu_lane(asked: Option<Precision>) -> Result<WgpuBackend> {
    WgpuBackend::open(adapter_from_env().as_deref(), Precision::from_cli_or_env(asked)?)
}

/// `FOVEA_ADAPTER`: a substring of the adapter name to use.
pub fn adapter_from_env() -> Option<String> {
    std::env::var("FOVEA_ADAPTER").ok().filter(|s| !s.is_empty())
}

/// The precision a job runs in on the CPU or CUDA lane: the one asked for (the CLI's
/// `--precision`, else `FOVEA_PRECISION`), else the lane's default: `fast` on the CUDA lane,
/// `exact` on the CPU lane, which has no fast kernels (asking it for `fast` is an error, not a
/// silent exact run). The wgpu lane's default depends on its adapter ([`wgpu_lane`]: fast on a
/// GPU with SHADER_F16, exact on a software adapter such as lavapipe); `auto` takes the wgpu
/// lane's, or exact where it falls back to the CPU lane (and refuses fast there).
pub fn lane_precision(lane: &'static str, asked: Option<Precision>) -> Result<Precision> {
    match (lane, Precision::from_cli_or_env(asked)?) {
        ("cuda", None) => Ok(Precision::Fast),
        (_, None) => Ok(Precision::Exact),
        ("cuda", Some(p)) | (_, Some(p @ Precision::Exact)) => Ok(p),
        (lane, Some(Precision::Fast)) => Err(Error::Unsupported {
            lane,
            op: "precision",
            what: "fast (this lane computes in f32 only; use --precision exact)".into(),
        }),
    }
}

/// The CUDA lane on `FOVEA_CUDA_DEVICE` in the precision asked for (default fast).
pub fn cuda_lane(asked: Option<Precision>) -> Result<CudaBackend> {
    let precision = lane_precision("cuda", asked)?;
    CudaBackend::with_options(crate::backend::cuda::Options {
        ordinal: cuda_device_from_env()?,
        precision,
        ..Default::default()
    })
}

/// The CPU lane computes in f32 only: check that nothing else was asked for.
fn cpu_exact_only(asked: Option<Precision>) -> Result<()> {
    lane_precision("cpu", asked).map(|_| ())
}

/// `FOVEA_CUDA_DEVICE`: the CUDA device ordinal for `--backend cuda` (default 0).
pub fn cuda_device_from_env() -> Result<usize> {
    match std::env::var("FOVEA_CUDA_DEVICE") {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| Error::Invalid(format!("FOVEA_CUDA_DEVICE: `{v}` is not a device ordinal (0, 1, ...)"))),
        _ => Ok(0),
    }
}

/// Where the vision tower comes from: a Vision checkpoint directory, or llama.cpp's mmproj GGUF.
enum VisionSource {
    Checkpoint(Checkpoint),
    Mmproj(Mmproj),
}

/// A checkpoint's vision model resident on one lane, reusable across images.
pub struct VisionRunner<'b, B: Backend> {
    b: &'b B,
    cfg: VisionConfig,
    model: VisionModel<B>,
}

impl<'b, B: Backend> VisionRunner<'b, B> {
    /// Check the checkpoint's vision tensors (names, shapes, dtypes) and upload them.
    pub fn load(b: &'b B, ckpt: &Checkpoint) -> Result<Self> {
        let cfg = ckpt.config().clone();
        crate::weights::check_vision(ckpt, &cfg)?;
        Self::upload(b, cfg, ckpt)
    }

    /// Check and upload the vision weights of a checkpoint or an (already accounted) mmproj.
    fn from_source(b: &'b B, src: &VisionSource) -> Result<Self> {
        match src {
            VisionSource::Checkpoint(ckpt) => Self::load(b, ckpt),
            VisionSource::Mmproj(m) => Self::upload(b, m.config().clone(), m),
        }
    }

    /// Upload the vision weights of `src` (already checked against `cfg`).
    fn upload(b: &'b B, cfg: VisionConfig, src: &impl ParamSource) -> Result<Self> {
        let model = VisionModel::load(b, src, &cfg)?;
        Ok(VisionRunner { b, cfg, model })
    }

    /// Decode, preprocess and encode one image file; `start_pos` is the placeholder's position.
    pub fn run(&self, image: &Path, start_pos: usize) -> Result<VisionDump> {
        let img = processor::load_rgb(image)?;
        let prepared = processor::prepare(&img, &preprocess_config(&self.cfg))?;
        self.run_prepared(prepared, start_pos)
    }

    /// Encode an image already preprocessed; `start_pos` is the placeholder's position.
    pub fn run_prepared(&self, prepared: processor::PreparedImage, start_pos: usize) -> Result<VisionDump> {
        let (b, cfg) = (self.b, &self.cfg);
        let n = prepared.n_vit_h * prepared.n_vit_w;
        let patch_dim = cfg.patch_dim();
        let patches = b.upload(&HostTensor::f32([n, patch_dim], prepared.patches.clone())?)?;
        let stages = self.model.encode(b, &patches, prepared.n_vit_h, prepared.n_vit_w)?;
        let layout = processor::build_image_block(prepared.n_llm_h, prepared.n_llm_w, start_pos);
        let block = self.model.image_block(b, &stages.aligner, &layout.rows)?;
        Ok(VisionDump {
            lane: b.lane(),
            device: b.device_name(),
            n_vit_h: prepared.n_vit_h,
            n_vit_w: prepared.n_vit_w,
            n_llm_h: prepared.n_llm_h,
            n_llm_w: prepared.n_llm_w,
            hidden: cfg.hidden_size,
            patch_dim,
            vision_dim: cfg.dim,
            patches: prepared.patches,
            vit: b.download(&stages.vit)?.into_f32("vit")?,
            aligner: b.download(&stages.aligner)?.into_f32("aligner")?,
            block: b.download(&block)?.into_f32("block")?,
            block_types: layout.types,
            perm: layout.perm,
        })
    }
}

impl VisionDump {
    /// Write the stages as a safetensors file (f32 tensors, i64 indices, grid metadata).
    pub fn write_safetensors(&self, path: &Path) -> Result<()> {
        use safetensors::tensor::{Dtype, TensorView};
        let f32_bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let i64_bytes = |v: &mut dyn Iterator<Item = i64>| -> Vec<u8> { v.flat_map(|x| x.to_le_bytes()).collect() };
        let n_vit = self.n_vit_h * self.n_vit_w;
        let n_llm = self.n_llm_h * self.n_llm_w;
        let block_len = self.block_types.len();
        let owned: Vec<(&str, Dtype, Vec<usize>, Vec<u8>)> = vec![
            ("patches", Dtype::F32, vec![n_vit, self.patch_dim], f32_bytes(&self.patches)),
            ("vit", Dtype::F32, vec![n_vit, self.vision_dim], f32_bytes(&self.vit)),
            ("aligner", Dtype::F32, vec![n_llm, self.hidden], f32_bytes(&self.aligner)),
            ("block", Dtype::F32, vec![block_len, self.hidden], f32_bytes(&self.block)),
            ("block_types", Dtype::I64, vec![block_len], i64_bytes(&mut self.block_types.iter().map(|&t| t as i64))),
            ("perm", Dtype::I64, vec![n_llm], i64_bytes(&mut self.perm.iter().map(|&p| p as i64))),
        ];
        let views = owned
            .iter()
            .map(|(name, dtype, shape, bytes)| {
                TensorView::new(*dtype, shape.clone(), bytes)
                    .map(|v| (*name, v))
                    .map_err(|e| Error::file(path, e.to_string()))
            })
            .collect::<Result<Vec<_>>>()?;
        let meta: HashMap<String, String> = [
            ("n_vit_h", self.n_vit_h),
            ("n_vit_w", self.n_vit_w),
            ("n_llm_h", self.n_llm_h),
            ("n_llm_w", self.n_llm_w),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .chain([("lane".to_string(), self.lane.to_string()), ("device".to_string(), self.device.clone())])
        .collect();
        safetensors::serialize_to_file(views, Some(meta), path).map_err(|e| Error::file(path, e.to_string()))
    }
}

/// `fovea inspect`: the config, the tensor accounting (vision side when config.json has
/// `vision_*` keys, language model when it has `num_hidden_layers`), the dtypes and the bytes,
/// and what the weights take once loaded on each lane ([`footprint`]).
pub fn inspect(model_dir: &Path) -> Result<String> {
    if is_gguf(model_dir) {
        return inspect_gguf(model_dir);
    }
    let config_path = model_dir.join(crate::weights::CONFIG_FILE);
    let raw = read_json(&config_path)?;
    let lm_cfg = match raw.get("num_hidden_layers") {
        Some(_) => Some(LmConfig::from_value(&raw)?),
        None => None,
    };
    let ckpt = Checkpoint::open_auto(model_dir)?;
    if ckpt.vision_config().is_none() && lm_cfg.is_none() {
        return Err(Error::file(
            &config_path,
            "neither a vision config (`vision_*` keys) nor a language-model config (`num_hidden_layers`)",
        ));
    }
    let mut text = format!("{ckpt}\n");
    for file in ckpt.files() {
        let bytes = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
        text += &format!("  file {} ({bytes} bytes)\n", file.display());
    }
    if let Some(vc) = ckpt.vision_config() {
        text += &format!("{}\n", crate::weights::check_vision(&ckpt, vc)?);
    }
    if let Some(cfg) = &lm_cfg {
        text += &format!("{}\n", crate::weights::check_lm(&ckpt, cfg)?);
    }
    text += &footprint::of_checkpoint(&ckpt, lm_cfg.as_ref())?.to_string();
    Ok(text)
}

/// `fovea inspect` on a text GGUF: files, tensors and bytes per type, the config read from the
/// `deepseek4.*` keys, the accounting and the loaded size; on an mmproj, its accounting and
/// loaded size.
fn inspect_gguf(path: &Path) -> Result<String> {
    if Gguf::open(path)?.kv("general.architecture").and_then(|v| v.as_str()) == Some("clip") {
        let m = open_mmproj(path)?;
        return Ok(format!("{m}\n{}", footprint::of_mmproj(&m)?));
    }
    let lm = GgufLm::open(path)?;
    let g = lm.gguf();
    let total: u64 = g.tensors().map(|(t, _)| t.nbytes as u64).sum();
    let mut text = format!(
        "GGUF {}\n  {} file(s), {} tensors, {total} bytes of tensor data\n",
        path.display(),
        g.files().len(),
        g.len()
    );
    for (ty, (count, bytes)) in g.type_stats() {
        text += &format!("  {:>8}: {count:>6} tensors, {bytes:>14} bytes\n", ty.name());
    }
    for file in g.files() {
        let bytes = std::fs::metadata(file).map(|m| m.len()).unwrap_or(0);
        text += &format!("  file {} ({bytes} bytes)\n", file.display());
    }
    text += &format!("{:#?}\n", lm.config());
    text += &format!("{}\n", crate::weights::gguf_lm::check_gguf_lm(&lm)?);
    text += &footprint::of_gguf_lm(&lm)?.to_string();
    Ok(text)
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, format!("cannot read config: {e}")))?;
    serde_json::from_str(&text).map_err(|e| Error::file(path, format!("config is not valid JSON: {e}")))
}

// ---- language model (token ids in, logits / token ids out) ---------------------------------

/// One entry of a prompt: a token id, or where an image's block goes (`IMG` in `--token-ids`,
/// `<｜deepseek_image｜>` in a rendered chat prompt).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptToken {
    Id(u32),
    /// Where the block of the next `--image` goes.
    Image,
}

/// Parse `--token-ids`: comma-separated non-negative integers, and `IMG` for the image block.
pub fn parse_token_ids(text: &str) -> Result<Vec<PromptToken>> {
    if text.trim().is_empty() {
        return Err(Error::Invalid("--token-ids: empty prompt".into()));
    }
    text.split(',')
        .map(str::trim)
        .map(|t| match t {
            "IMG" | "img" => Ok(PromptToken::Image),
            _ => t.parse::<u32>().map(PromptToken::Id).map_err(|_| {
                Error::Invalid(format!(
                    "--token-ids: `{t}` is not a token id (expected comma-separated integers >= 0, or IMG)"
                ))
            }),
        })
        .collect()
}

/// What a language-model job runs on.
#[derive(Clone, Debug)]
pub struct LmRequest {
    /// A text-only LM checkpoint, or (with `image`) one with both the vision and the LM tensors;
    /// or a `deepseek4` GGUF file (its only file or first shard, see [`is_gguf`]).
    pub model_dir: PathBuf,
    /// The vision GGUF (llama.cpp's `clip` mmproj) that goes with a GGUF `model_dir`.
    pub mmproj: Option<PathBuf>,
    /// The image token budget of an mmproj (which cannot store it; default: llama.cpp's 384).
    pub image_max_tokens: Option<usize>,
    pub tokens: Vec<PromptToken>,
    /// One image per [`PromptToken::Image`], in order.
    pub images: Vec<PathBuf>,
    pub lane: LaneChoice,
    /// `--precision` / `FOVEA_PRECISION`; `None`: the lane's default ([`lane_precision`]).
    pub precision: Option<Precision>,
}

/// Generation settings.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: Sampling,
}

/// One prefill's result on the host (what `fovea dump --token-ids` writes).
#[derive(Clone, Debug)]
pub struct LmDump {
    pub lane: &'static str,
    pub device: String,
    /// The ids fed to the model (`IMG` expanded to the block's sentinel ids `vocab + type`).
    pub input_ids: Vec<i64>,
    /// `[T, vocab]`
    pub logits: Vec<f32>,
    pub vocab_size: usize,
    /// Where each image's block starts, in prompt order.
    pub image_starts: Vec<usize>,
}

/// The result of `fovea generate`.
#[derive(Clone, Debug)]
pub struct Generated {
    pub lane: &'static str,
    pub prompt_len: usize,
    pub ids: Vec<i32>,
    pub stop: StopReason,
    pub timings: Timings,
}

/// Where a generation's wall time went.
#[derive(Clone, Debug)]
pub struct Timings {
    /// Opening the checkpoint, checking it and uploading the weights.
    pub load: Duration,
    /// Image decode, preprocessing, ViT + aligner and the merge, when the prompt has images.
    pub vision: Option<Duration>,
    /// Prefill of the whole prompt, up to the first token's logits.
    pub prefill: Duration,
    /// All decode steps (one per generated token after the first).
    pub decode: Duration,
}

impl Timings {
    /// One line: `load 0.12 s · vision 0.03 s · prefill 850 tok/s · decode 95 tok/s`.
    pub fn summary(&self, prompt_len: usize, generated: usize) -> String {
        let rate = |n: usize, d: Duration| {
            if n == 0 || d.is_zero() { "-".to_string() } else { format!("{:.1} tok/s", n as f64 / d.as_secs_f64()) }
        };
        let mut parts = vec![format!("load {:.2} s", self.load.as_secs_f64())];
        if let Some(v) = self.vision {
            parts.push(format!("vision encode {:.2} s", v.as_secs_f64()));
        }
        parts.push(format!("prefill {} ({prompt_len} tokens)", rate(prompt_len, self.prefill)));
        parts.push(format!(
            "decode {} ({} steps)",
            rate(generated.saturating_sub(1), self.decode),
            generated.saturating_sub(1)
        ));
        parts.join(" · ")
    }
}

/// What a generation reports while it runs, for progress bars ([`crate::progress::Bars`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// The weights' bytes read so far.
    Load(LoadProgress),
    /// The prompt's tokens prefilled so far.
    Prefill(PrefillProgress),
}

/// Prefill, then decode, streaming the text: `on_text` gets each piece as soon as it is complete
/// UTF-8 (special tokens, EOS included, print nothing). Needs `tokenizer` for the model.
/// `on_progress` sees the load and the prefill advance.
pub fn generate_text(
    req: &LmRequest,
    opts: &GenerateOptions,
    tokenizer: &ChatTokenizer,
    on_progress: &mut dyn FnMut(Progress),
    on_text: &mut dyn FnMut(&str) -> Result<()>,
) -> Result<Generated> {
    opts.sampling.validate()?;
    let mut text = tokenizer.stream();
    let mut on_token = |id: i32| {
        let id = u32::try_from(id).map_err(|_| Error::Invalid(format!("generated a negative token id {id}")))?;
        match text.push(id)? {
            Some(piece) => on_text(&piece),
            None => Ok(()),
        }
    };
    let g = match run_lm(req, LmJob::Generate(opts, &mut on_token), on_progress)? {
        LmOutcome::Generated(g) => g,
        LmOutcome::Dump(_) => unreachable!("generate job"),
    };
    let rest = text.finish()?;
    if !rest.is_empty() {
        on_text(&rest)?;
    }
    Ok(g)
}

enum LmJob<'a> {
    Dump,
    Generate(&'a GenerateOptions, &'a mut dyn FnMut(i32) -> Result<()>),
}

enum LmOutcome {
    Dump(LmDump),
    Generated(Generated),
}

/// Run one prefill over the prompt and return its logits.
pub fn dump_lm(req: &LmRequest) -> Result<LmDump> {
    match run_lm(req, LmJob::Dump, &mut |_| {})? {
        LmOutcome::Dump(d) => Ok(d),
        LmOutcome::Generated(_) => unreachable!("dump job"),
    }
}

/// Prefill, then decode token by token; `on_token` sees each id as it is produced, `on_progress`
/// the load and the prefill advance.
pub fn generate_lm(
    req: &LmRequest,
    opts: &GenerateOptions,
    on_progress: &mut dyn FnMut(Progress),
    on_token: &mut dyn FnMut(i32) -> Result<()>,
) -> Result<Generated> {
    opts.sampling.validate()?;
    match run_lm(req, LmJob::Generate(opts, on_token), on_progress)? {
        LmOutcome::Generated(g) => Ok(g),
        LmOutcome::Dump(_) => unreachable!("generate job"),
    }
}

/// The first language-model op a lane lacks, if any.
fn missing_lm_op<B: Backend>(b: &B) -> Option<Op> {
    Op::LM.into_iter().find(|&op| !b.supports(op, WeightFormat::F32))
}

/// The language-model op `b` lacks, when job `J` runs the language model.
fn lacks_lm_op<J: LaneJob, B: Backend>(b: &B) -> Option<Op> {
    if J::LANGUAGE_MODEL { missing_lm_op(b) } else { None }
}

/// The error for a language-model job on a lane that lacks `op`.
fn lm_lane_error(lane: &'static str, op: Op) -> Error {
    Error::Unsupported { lane, op: op.name(), what: "the language model (use --backend cpu)".into() }
}

fn run_lm(req: &LmRequest, job: LmJob<'_>, on_progress: &mut dyn FnMut(Progress)) -> Result<LmOutcome> {
    run_on_lane(req.lane, req.precision, LmJobOnLane { req, job, on_progress })
}

/// A job generic over the backend: [`run_on_lane`] runs it on the lane a [`LaneChoice`]
/// resolves to (a closure cannot be generic over `B`).
pub trait LaneJob {
    type Output;
    /// Whether the job runs the language model: a named lane must then have every op of it, and
    /// `auto` falls back to the CPU lane where the wgpu adapter lacks one.
    const LANGUAGE_MODEL: bool = true;
    /// Run on `b`; `note` says why `auto` fell back to the CPU lane, when it did.
    fn run<B: Backend>(self, b: &B, note: Option<&str>) -> Result<Self::Output>;
}

/// Run a job on the chosen lane in the precision asked for (`None`: the lane's default,
/// [`lane_precision`]): for a language-model job, a named lane that lacks one of its ops is an
/// error; `auto` takes the wgpu lane (when it has them all), else the CPU lane (with a note).
pub fn run_on_lane<J: LaneJob>(lane: LaneChoice, precision: Option<Precision>, job: J) -> Result<J::Output> {
    match LaneChoice::resolve(Some(lane))? {
        LaneChoice::Cpu => {
            cpu_exact_only(precision)?;
            job.run(&CpuBackend::new(), None)
        }
        LaneChoice::Wgpu => {
            let b = wgpu_lane(precision)?;
            if let Some(op) = lacks_lm_op::<J, _>(&b) {
                return Err(lm_lane_error(b.lane(), op));
            }
            job.run(&b, None)
        }
        LaneChoice::Cuda => {
            let b = cuda_lane(precision)?;
            if let Some(op) = lacks_lm_op::<J, _>(&b) {
                return Err(lm_lane_error(b.lane(), op));
            }
            job.run(&b, None)
        }
        LaneChoice::Auto => {
            let asked = Precision::from_cli_or_env(precision)?;
            let why = match auto_wgpu(asked) {
                Ok(b) if lacks_lm_op::<J, _>(&b).is_none() => return job.run(&b, None),
                Ok(_) => "this wgpu adapter lacks a language-model op".to_owned(),
                Err(e) => format!("no usable wgpu adapter ({e})"),
            };
            job.run(&auto_cpu(asked, &why)?, Some(&format!("{why}; using the CPU lane")))
        }
    }
}

/// A `dump` or `generate` job of the CLI, for [`run_on_lane`].
struct LmJobOnLane<'r, 'j, 'l> {
    req: &'r LmRequest,
    job: LmJob<'j>,
    on_progress: &'l mut dyn FnMut(Progress),
}

impl LaneJob for LmJobOnLane<'_, '_, '_> {
    type Output = LmOutcome;
    fn run<B: Backend>(self, b: &B, note: Option<&str>) -> Result<LmOutcome> {
        lm_job(b, self.req, self.job, self.on_progress, note)
    }
}

/// `eos_token_id` of config.json: an integer, a list of integers, or absent.
fn eos_ids(config: &Path) -> Result<Vec<i32>> {
    let raw = read_json(config)?;
    let bad = || Error::config("eos_token_id", "expected an integer or a list of integers");
    let one = |v: &serde_json::Value| v.as_i64().and_then(|x| i32::try_from(x).ok()).ok_or_else(bad);
    match raw.get("eos_token_id") {
        None | Some(serde_json::Value::Null) => Ok(Vec::new()),
        Some(serde_json::Value::Array(a)) => a.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

/// Whether `--model` names a GGUF file (its only file or its first shard) rather than a
/// checkpoint directory.
pub fn is_gguf(path: &Path) -> bool {
    !path.is_dir() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// `tokenizer.ggml.eos_token_id` of a GGUF (the converter writes config.json's `eos_token_id`
/// there), or none.
fn gguf_eos_ids(lm: &GgufLm) -> Result<Vec<i32>> {
    const KEY: &str = "tokenizer.ggml.eos_token_id";
    match lm.gguf().kv(KEY) {
        None => Ok(Vec::new()),
        Some(v) => match v.as_int().and_then(|i| i32::try_from(i).ok()) {
            Some(id) => Ok(vec![id]),
            None => Err(Error::config(
                KEY,
                format!("is {}, expected a token id (in {})", v.describe(), lm.gguf().files()[0].display()),
            )),
        },
    }
}

/// An mmproj with the image token budget the user gave (`--image-max-tokens`, as llama.cpp's
/// flag): the file cannot store one, and a model trained with another than clip.cpp's 384 (the
/// shipped describe_image model: 64) tiles images differently without it.
fn with_budget(m: Mmproj, image_max_tokens: Option<usize>) -> Result<Mmproj> {
    match image_max_tokens {
        Some(n) => m.with_max_n_token(n),
        None => Ok(m),
    }
}

/// Check a text GGUF's tensors, and the mmproj's when given (headers only), then upload the
/// language model, and the vision tower for an image prompt.
fn load_gguf<'b, B: Backend>(
    b: &'b B,
    lm: &GgufLm,
    mmproj: Option<&Path>,
    image_max_tokens: Option<usize>,
    image: bool,
    on_load: &mut dyn FnMut(LoadProgress),
) -> Result<(LmModel<B>, Option<VisionRunner<'b, B>>)> {
    // opening the mmproj closes its own accounting
    let mmproj = match mmproj {
        Some(p) => {
            let m = with_budget(open_mmproj(p)?, image_max_tokens)?;
            m.check_lm_hidden_size(lm.config().hidden_size)?;
            Some(m)
        }
        None if image => {
            return Err(Error::file(
                lm.gguf().files()[0],
                "an image prompt on a GGUF model needs --mmproj FILE (the vision GGUF)",
            ));
        }
        None => None,
    };
    crate::weights::gguf_lm::check_gguf_lm(lm)?;
    let total_bytes = [Some(lm.gguf()), mmproj.as_ref().map(|m| m.gguf())]
        .into_iter()
        .flatten()
        .flat_map(|g| g.tensors().map(|(t, _)| t.nbytes as u64))
        .sum();
    on_load(LoadProgress { done_bytes: 0, total_bytes });
    let pair = GgufPair { lm, mmproj: mmproj.as_ref() };
    let counted = BytesRead { src: &pair, total_bytes, done: Cell::new(0), report: RefCell::new(on_load) };
    let model = LmModel::load(b, &counted, lm.config())?;
    let runner = match (&mmproj, image) {
        (Some(m), true) => Some(VisionRunner::upload(b, m.config().clone(), &counted)?),
        _ => None,
    };
    let on_load = counted.report.into_inner();
    on_load(LoadProgress { done_bytes: total_bytes, total_bytes });
    Ok((model, runner))
}

/// A GGUF pair that reports the bytes of each parameter as the graph reads it, for the load
/// bar (the matrices dominate: a routed expert's row range is its bytes in the file).
struct BytesRead<'s, 'f> {
    src: &'s GgufPair<'s>,
    total_bytes: u64,
    done: Cell<u64>,
    report: RefCell<&'f mut dyn FnMut(LoadProgress)>,
}

impl BytesRead<'_, '_> {
    fn add(&self, bytes: usize) {
        self.done.set(self.done.get() + bytes as u64);
        let done_bytes = self.done.get().min(self.total_bytes);
        (self.report.borrow_mut())(LoadProgress { done_bytes, total_bytes: self.total_bytes });
    }
}

impl ParamSource for BytesRead<'_, '_> {
    fn matrix(&self, name: &str) -> Result<HostWeight<'_>> {
        let w = self.src.matrix(name)?;
        self.add(w.bytes.len());
        Ok(w)
    }
    fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let v = self.src.vector(name)?;
        self.add(v.len() * 4);
        Ok(v)
    }
    fn integers(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        self.src.integers(name)
    }
    fn has(&self, name: &str) -> bool {
        self.src.has(name)
    }
}

fn lm_job<B: Backend>(
    b: &B,
    req: &LmRequest,
    job: LmJob<'_>,
    on_progress: &mut dyn FnMut(Progress),
    note: Option<&str>,
) -> Result<LmOutcome> {
    let on_load = &mut |p: LoadProgress| on_progress(Progress::Load(p));
    let src = LmSource::open(&req.model_dir, req.mmproj.as_deref(), req.image_max_tokens)?;
    let v = src.config().vocab_size;
    // validate the prompt before loading anything heavy
    let n_img = req.tokens.iter().filter(|t| **t == PromptToken::Image).count();
    let n_files = req.images.len();
    if n_img != n_files {
        return Err(Error::Invalid(format!(
            "the prompt has {n_img} image placeholder(s) (IMG in --token-ids) but {n_files} --image file(s) were given"
        )));
    }
    check_token_ids(&req.tokens, v)?;
    let lm = src.load(b, !req.images.is_empty(), on_load)?;
    let t = Instant::now();
    let images =
        req.images.iter().map(|path| lm.preprocess(&processor::load_rgb(path)?)).collect::<Result<Vec<_>>>()?;
    let prompt = lm.prompt(&req.tokens, images)?;
    let vision = (!prompt.image_starts.is_empty()).then(|| t.elapsed());
    if let Some(n) = note {
        eprintln!("fovea: {n}");
    }
    let PromptInput { input, embeds, image_starts } = prompt;
    match job {
        LmJob::Dump => {
            let (hidden, _) = lm
                .model
                .prefill_cache(b, &input, embeds, b.prefill_chunk(), &mut |p| on_progress(Progress::Prefill(p)))?;
            let logits = lm.model.logits(b, &hidden)?;
            Ok(LmOutcome::Dump(LmDump {
                lane: b.lane(),
                device: b.device_name(),
                input_ids: input.ids.iter().map(|&i| i as i64).collect(),
                logits: b.download(&logits)?.into_f32("logits")?,
                vocab_size: v,
                image_starts,
            }))
        }
        LmJob::Generate(opts, on_token) => {
            let on_prefill = &mut |p: PrefillProgress| on_progress(Progress::Prefill(p));
            let g = generate::generate(
                &lm.model,
                b,
                &input,
                embeds,
                opts.max_tokens,
                &lm.eos,
                &opts.sampling,
                on_prefill,
                on_token,
            )?;
            let timings = Timings { load: lm.load_time, vision, prefill: g.prefill, decode: g.decode };
            Ok(LmOutcome::Generated(Generated {
                lane: b.lane(),
                prompt_len: input.ids.len(),
                ids: g.ids,
                stop: g.stop,
                timings,
            }))
        }
    }
}

/// Every token id of a prompt must lie in the text vocabulary (`vocab_size` of the config).
pub fn check_token_ids(tokens: &[PromptToken], vocab_size: usize) -> Result<()> {
    for (pos, t) in tokens.iter().enumerate() {
        if let PromptToken::Id(id) = *t
            && id as usize >= vocab_size
        {
            return Err(Error::Invalid(format!(
                "token id {id} (position {pos}) is outside the vocabulary: vocab_size is {vocab_size}"
            )));
        }
    }
    Ok(())
}

/// A language model opened from its files: the config and EOS ids, read before any weight is
/// uploaded, so a prompt can be checked against them first.
pub struct LmSource {
    model_dir: PathBuf,
    mmproj: Option<PathBuf>,
    image_max_tokens: Option<usize>,
    /// A GGUF's headers, opened here for its config; a checkpoint directory reads config.json.
    gguf: Option<GgufLm>,
    cfg: LmConfig,
    eos: Vec<i32>,
    has_vision: bool,
}

impl LmSource {
    /// Open a checkpoint directory or a text GGUF (with its mmproj, when given); headers only.
    pub fn open(model_dir: &Path, mmproj: Option<&Path>, image_max_tokens: Option<usize>) -> Result<Self> {
        let (gguf, cfg, eos, has_vision) = if is_gguf(model_dir) {
            let lm = GgufLm::open(model_dir)?;
            let eos = gguf_eos_ids(&lm)?;
            let cfg = lm.config().clone();
            (Some(lm), cfg, eos, mmproj.is_some())
        } else {
            if let Some(m) = mmproj {
                return Err(Error::file(
                    m,
                    format!("--mmproj goes with a .gguf --model; {} is a checkpoint directory", model_dir.display()),
                ));
            }
            let config_path = model_dir.join("config.json");
            let raw = read_json(&config_path)?;
            let has_vision = raw.as_object().is_some_and(|o| o.keys().any(|k| k.starts_with("vision_")));
            (None, LmConfig::from_file(&config_path)?, eos_ids(&config_path)?, has_vision)
        };
        Ok(LmSource {
            model_dir: model_dir.to_path_buf(),
            mmproj: mmproj.map(Path::to_path_buf),
            image_max_tokens,
            gguf,
            cfg,
            eos,
            has_vision,
        })
    }

    pub fn config(&self) -> &LmConfig {
        &self.cfg
    }

    /// Whether image prompts can run: a checkpoint with `vision_*` config keys, or a GGUF with
    /// its mmproj.
    pub fn has_vision(&self) -> bool {
        self.has_vision
    }

    /// Check the tensors (headers only) and upload the language model, and the vision tower
    /// when `vision`; `on_load` sees the weights' bytes as they are read.
    pub fn load<'b, B: Backend>(
        &self,
        b: &'b B,
        vision: bool,
        on_load: &mut dyn FnMut(LoadProgress),
    ) -> Result<LoadedLm<'b, B>> {
        let t_load = Instant::now();
        let (model, vision) = match &self.gguf {
            Some(lm) => load_gguf(b, lm, self.mmproj.as_deref(), self.image_max_tokens, vision, on_load)?,
            None => {
                let ckpt =
                    if vision { Checkpoint::open(&self.model_dir)? } else { Checkpoint::open_auto(&self.model_dir)? };
                // the accounting closes in both directions, from headers only, before anything is uploaded
                if let Some(vc) = ckpt.vision_config() {
                    crate::weights::check_vision(&ckpt, vc)?;
                }
                crate::weights::check_lm(&ckpt, &self.cfg)?;
                let counting = CountingSource::new(&ckpt, on_load);
                let model = LmModel::load(b, &counting, &self.cfg)?;
                let runner = match vision {
                    true => Some(VisionRunner::upload(b, ckpt.config().clone(), &counting)?),
                    false => None,
                };
                counting.finish();
                (model, runner)
            }
        };
        Ok(LoadedLm { b, cfg: self.cfg.clone(), eos: self.eos.clone(), model, vision, load_time: t_load.elapsed() })
    }
}

/// A language model, and its vision tower for image prompts, resident on one lane.
pub struct LoadedLm<'b, B: Backend> {
    b: &'b B,
    pub cfg: LmConfig,
    /// Generation stops after emitting one of these.
    pub eos: Vec<i32>,
    pub model: LmModel<B>,
    vision: Option<VisionRunner<'b, B>>,
    /// Opening, checking and uploading the weights.
    pub load_time: Duration,
}

/// A prompt ready for the language model.
pub struct PromptInput<B: Backend> {
    /// Ids with each image's block expanded, and the image-span windows.
    pub input: LmInput,
    /// The token embeddings with the image blocks merged in (`None` for a text prompt).
    pub embeds: Option<B::Tensor>,
    /// Where each image's block starts, in prompt order.
    pub image_starts: Vec<usize>,
}

impl<'b, B: Backend> LoadedLm<'b, B> {
    pub fn backend(&self) -> &'b B {
        self.b
    }

    /// The preprocessing settings of the vision tower, when one was loaded.
    pub fn preprocess_config(&self) -> Option<PreprocessConfig> {
        self.vision.as_ref().map(|v| preprocess_config(&v.cfg))
    }

    /// Resize and cut one decoded image into the tower's patches (pure CPU).
    pub fn preprocess(&self, img: &image::RgbImage) -> Result<processor::PreparedImage> {
        let cfg = self.preprocess_config().ok_or_else(|| Error::Invalid("this model has no vision tower".into()))?;
        processor::prepare(img, &cfg)
    }

    /// The model input of a prompt whose [`PromptToken::Image`] entries take `images` in order:
    /// each image runs through the vision tower with its block placed where its placeholder lands
    /// (after the blocks before it, which sets its own lead pads), and every block is merged in.
    pub fn prompt(&self, tokens: &[PromptToken], images: Vec<processor::PreparedImage>) -> Result<PromptInput<B>> {
        let (b, v) = (self.b, self.cfg.vocab_size);
        let n_img = tokens.iter().filter(|t| **t == PromptToken::Image).count();
        if n_img != images.len() {
            return Err(Error::Invalid(format!("{n_img} image placeholders for {} images", images.len())));
        }
        if images.is_empty() {
            let ids =
                tokens.iter().filter_map(|t| if let PromptToken::Id(i) = t { Some(*i as i32) } else { None }).collect();
            return Ok(PromptInput { input: LmInput { ids, window: None }, embeds: None, image_starts: Vec::new() });
        }
        let runner = self.vision.as_ref().ok_or_else(|| Error::Invalid("this model has no vision tower".into()))?;
        let mut images = images.into_iter();
        let mut ids = Vec::with_capacity(tokens.len());
        // per image: where its block starts, its types, perm and aligner rows on the device
        let mut encoded = Vec::with_capacity(n_img);
        for t in tokens {
            match t {
                PromptToken::Id(i) => ids.push(*i as i32),
                PromptToken::Image => {
                    let start = ids.len();
                    let vis = runner.run_prepared(images.next().expect("counted above"), start)?;
                    ids.extend(vis.block_types.iter().map(|&ty| (v + ty as usize) as i32));
                    let types: Vec<i32> = vis.block_types.iter().map(|&t| t as i32).collect();
                    let perm: Vec<usize> = vis.perm.iter().map(|&p| p as usize).collect();
                    let aligner = b.upload(&HostTensor::f32([vis.n_llm_h * vis.n_llm_w, vis.hidden], vis.aligner)?)?;
                    encoded.push((start, types, perm, aligner));
                }
            }
        }
        let blocks: Vec<ImageBlock<'_, B>> = encoded
            .iter()
            .map(|(start, types, perm, aligner)| ImageBlock { start: *start, types, perm, aligner })
            .collect();
        let embeds = self.model.merge_images(b, &ids, &blocks)?;
        let window = visible_bounds(&ids, v, self.cfg.sliding_window, MAX_IMAGE_TOKENS);
        let image_starts = encoded.iter().map(|e| e.0).collect();
        Ok(PromptInput { input: LmInput { ids, window: Some(window) }, embeds: Some(embeds), image_starts })
    }
}

/// The number of positions [`LoadedLm::prompt`] feeds the model: every token, each image
/// placeholder expanded to its block (whose lead pads depend on where it starts).
pub fn prompt_len(tokens: &[PromptToken], images: &[processor::PreparedImage]) -> usize {
    let mut images = images.iter();
    tokens.iter().fold(0, |pos, t| match t {
        PromptToken::Image => pos + images.next().map_or(1, |img| processor::block_len(img.n_llm_h, img.n_llm_w, pos)),
        PromptToken::Id(_) => pos + 1,
    })
}

impl LmDump {
    /// Write `input_ids` (i64 `[T]`) and `logits` (f32 `[T, vocab]`) as a safetensors file.
    pub fn write_safetensors(&self, path: &Path) -> Result<()> {
        use safetensors::tensor::{Dtype, TensorView};
        let t = self.input_ids.len();
        let ids: Vec<u8> = self.input_ids.iter().flat_map(|x| x.to_le_bytes()).collect();
        let logits: Vec<u8> = self.logits.iter().flat_map(|x| x.to_le_bytes()).collect();
        let view = |dtype, shape: Vec<usize>, bytes| {
            TensorView::new(dtype, shape, bytes).map_err(|e| Error::file(path, e.to_string()))
        };
        let views = vec![
            ("input_ids", view(Dtype::I64, vec![t], &ids)?),
            ("logits", view(Dtype::F32, vec![t, self.vocab_size], &logits)?),
        ];
        let mut meta: HashMap<String, String> =
            [("lane".to_string(), self.lane.to_string()), ("device".to_string(), self.device.clone())]
                .into_iter()
                .collect();
        if !self.image_starts.is_empty() {
            let starts: Vec<String> = self.image_starts.iter().map(usize::to_string).collect();
            meta.insert("image_starts".into(), starts.join(","));
        }
        safetensors::serialize_to_file(views, Some(meta), path).map_err(|e| Error::file(path, e.to_string()))
    }
}
