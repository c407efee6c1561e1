//! The library's front door: load a checkpoint on a chosen lane and run whole jobs. The CLI and
//! the examples call only this module; they never touch tensors.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::backend::cpu::CpuBackend;
use crate::backend::wgpu::WgpuBackend;
use crate::backend::{Backend, HostTensor};
use crate::config::VisionConfig;
use crate::error::{Error, Result};
use crate::model::vision::VisionModel;
use crate::processor::{self, PreprocessConfig};
use crate::weights::Checkpoint;

/// Which lane runs the model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LaneChoice {
    /// wgpu when an adapter exists, else the CPU lane.
    Auto,
    Cpu,
    Wgpu,
}

impl FromStr for LaneChoice {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(LaneChoice::Auto),
            "cpu" => Ok(LaneChoice::Cpu),
            "wgpu" | "vulkan" => Ok(LaneChoice::Wgpu),
            other => Err(Error::Invalid(format!("unknown backend `{other}` (expected auto, cpu or wgpu)"))),
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
    pub image: PathBuf,
    pub lane: LaneChoice,
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
    let ckpt = Checkpoint::open(&req.model_dir)?;
    match LaneChoice::resolve(Some(req.lane))? {
        LaneChoice::Cpu => VisionRunner::load(&CpuBackend::new(), &ckpt)?.run(&req.image, req.start_pos),
        LaneChoice::Wgpu => {
            let b = WgpuBackend::new(adapter_from_env().as_deref())?;
            VisionRunner::load(&b, &ckpt)?.run(&req.image, req.start_pos)
        }
        LaneChoice::Auto => match WgpuBackend::new(adapter_from_env().as_deref()) {
            Ok(b) => VisionRunner::load(&b, &ckpt)?.run(&req.image, req.start_pos),
            Err(e) => {
                eprintln!("fovea: no usable wgpu adapter ({e}); using the CPU lane");
                VisionRunner::load(&CpuBackend::new(), &ckpt)?.run(&req.image, req.start_pos)
            }
        },
    }
}

/// `FOVEA_ADAPTER`: a substring of the adapter name to use.
pub fn adapter_from_env() -> Option<String> {
    std::env::var("FOVEA_ADAPTER").ok().filter(|s| !s.is_empty())
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
        let model = VisionModel::load(b, ckpt, &cfg)?;
        Ok(VisionRunner { b, cfg, model })
    }

    /// Decode, preprocess and encode one image file; `start_pos` is the placeholder's position.
    pub fn run(&self, image: &Path, start_pos: usize) -> Result<VisionDump> {
        let img = processor::load_rgb(image)?;
        let prepared = processor::prepare(&img, &preprocess_config(&self.cfg))?;
        self.run_prepared(prepared, start_pos)
    }

    fn run_prepared(&self, prepared: processor::PreparedImage, start_pos: usize) -> Result<VisionDump> {
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
                TensorView::new(*dtype, shape.clone(), bytes).map(|v| (*name, v)).map_err(|e| Error::file(path, e.to_string()))
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

/// `fovea inspect`: the config, the tensor accounting, the dtypes and the bytes.
pub fn inspect(model_dir: &Path) -> Result<String> {
    let ckpt = Checkpoint::open(model_dir)?;
    let accounting = crate::weights::check_vision(&ckpt, ckpt.config())?;
    Ok(format!("{}\n{ckpt}\n{accounting}\n", ckpt.config()))
}
