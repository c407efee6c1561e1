//! Checkpoint loader: `config.json` plus safetensors weights (one `model.safetensors`, or shards
//! listed in `model.safetensors.index.json`), every file memory-mapped.
//!
//! Headers are parsed with the `safetensors` crate. Before it sees a file we check that the file
//! holds at least the 8-byte length prefix and that the declared header length fits inside the
//! file, so nothing is ever allocated from an unchecked header length; the crate then checks that
//! the tensors' `data_offsets` are contiguous, non-overlapping, match dtype × shape, and cover the
//! data section exactly. Every refusal names the file (and the tensor where there is one).
//!
//! Tensor data is borrowed from the mmap when its offset is aligned for its dtype, and copied out
//! otherwise (safetensors does not require aligned offsets). The official FP8/FP4 matrices and
//! their `.scale` tensors are paired when the checkpoint opens and re-laid row-local by
//! [`Checkpoint::weight`] ([`fp8`]).

pub mod footprint;
pub mod fp8;
pub mod gguf;
pub mod gguf_lm;
pub mod gguf_vision;
pub mod lm;
pub mod vision;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Component, Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{SafeTensorError, TensorInfo};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;

use crate::backend::{HostTensor, HostWeight, WeightFormat, decode_row};
use crate::config::{QuantConfig, VisionConfig};
use crate::error::{Error, Result};

pub use gguf_vision::{Mmproj, MmprojAccounting, open_mmproj};
pub use lm::{ExpectedLm, LmAccounting, check_lm, lm_manifest};
pub use safetensors::Dtype as SafetensorsDtype;
pub use vision::{Expected, VisionAccounting, check_vision, vision_manifest};

/// File name of a single-file checkpoint.
pub const SINGLE_FILE: &str = "model.safetensors";
/// File name of the shard index of a sharded checkpoint.
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// File name of the configuration.
pub const CONFIG_FILE: &str = "config.json";

/// One memory-mapped safetensors file.
struct Shard {
    path: PathBuf,
    mmap: Mmap,
}

/// Where one tensor lives.
#[derive(Clone, Debug)]
struct Entry {
    shard: usize,
    dtype: Dtype,
    shape: Vec<usize>,
    /// Absolute byte offset of the data in the file (header included).
    start: usize,
    nbytes: usize,
}

/// Header-level facts about one tensor (no data touched).
#[derive(Clone, Copy, Debug)]
pub struct TensorMeta<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [usize],
    pub nbytes: usize,
    /// The file the tensor is stored in.
    pub file: &'a Path,
}

impl TensorMeta<'_> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Count and bytes of the tensors of one dtype.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DtypeStat {
    pub count: usize,
    pub bytes: u64,
}

/// An opened checkpoint directory.
pub struct Checkpoint {
    dir: PathBuf,
    /// `None` only for checkpoints opened with [`Checkpoint::open_without_vision`].
    config: Option<VisionConfig>,
    shards: Vec<Shard>,
    tensors: BTreeMap<String, Entry>,
    /// The index's `metadata` object, when the checkpoint is sharded.
    index_metadata: Option<Value>,
    /// The official FP8/FP4 storage config.json announces (`None`: plain float checkpoint).
    quant: Option<QuantConfig>,
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("dir", &self.dir)
            .field("files", &self.files())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// The weight format of an F32/F16/BF16 dtype.
fn float_format(dtype: Dtype) -> Option<WeightFormat> {
    match dtype {
        Dtype::F32 => Some(WeightFormat::F32),
        Dtype::F16 => Some(WeightFormat::F16),
        Dtype::BF16 => Some(WeightFormat::BF16),
        _ => None,
    }
}

/// A tensor's data: borrowed from the mmap when aligned for its dtype, copied otherwise.
#[derive(Clone, Debug)]
pub struct TensorView<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Little-endian elements, row-major, exactly `numel * dtype size` bytes.
    pub bytes: Cow<'a, [u8]>,
}

impl<'a> TensorView<'a> {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the data is borrowed straight from the mmap (aligned offset) rather than copied.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.bytes, Cow::Borrowed(_))
    }

    /// The storage format if this is an F32/F16/BF16 tensor.
    pub fn weight_format(&self) -> Option<WeightFormat> {
        float_format(self.dtype)
    }

    /// All elements converted to f32 (F32, F16 or BF16 only).
    pub fn to_f32_vec(&self) -> Result<Vec<f32>> {
        let format = self.weight_format().ok_or_else(|| {
            Error::tensor(self.name, format!("cannot convert dtype {} to f32 (accepted: F32, F16, BF16)", self.dtype))
        })?;
        let n = self.numel();
        if self.bytes.len() != format.row_bytes(n) {
            return Err(Error::tensor(self.name, format!("{} bytes for {n} {format} elements", self.bytes.len())));
        }
        let mut out = vec![0f32; n];
        decode_row(format, &self.bytes, &mut out);
        Ok(out)
    }

    /// All elements of an I64 or I32 tensor (e.g. `tid2eid`) as i64.
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        match self.dtype {
            Dtype::I64 => Ok(self.bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect()),
            Dtype::I32 => {
                Ok(self.bytes.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64).collect())
            }
            d => Err(Error::tensor(self.name, format!("dtype {d} is not an integer dtype (accepted: I64, I32)"))),
        }
    }

    /// The tensor as an f32 host tensor of the same shape (for biases, norm weights, sentinels).
    pub fn to_host_tensor(&self) -> Result<HostTensor> {
        HostTensor::f32(self.shape.clone(), self.to_f32_vec()?)
    }

    /// A 2-D F32/F16/BF16 tensor as a weight matrix `[rows, cols]` named `name`, keeping its
    /// storage format. Borrowed data stays borrowed (lifetime of the checkpoint); copied data is
    /// cloned (use [`into_weight`](Self::into_weight) to avoid that).
    pub fn as_weight(&self, name: &str) -> Result<HostWeight<'a>> {
        let (format, rows, cols) = self.weight_parts(name)?;
        let bytes = match &self.bytes {
            Cow::Borrowed(b) => Cow::Borrowed(*b),
            Cow::Owned(v) => Cow::Owned(v.clone()),
        };
        let w = HostWeight { name: name.to_string(), format, rows, cols, bytes };
        w.validate()?;
        Ok(w)
    }

    /// Like [`as_weight`](Self::as_weight), moving copied data instead of cloning it.
    pub fn into_weight(self, name: &str) -> Result<HostWeight<'a>> {
        let (format, rows, cols) = self.weight_parts(name)?;
        let w = HostWeight { name: name.to_string(), format, rows, cols, bytes: self.bytes };
        w.validate()?;
        Ok(w)
    }

    fn weight_parts(&self, name: &str) -> Result<(WeightFormat, usize, usize)> {
        let format = self.weight_format().ok_or_else(|| {
            Error::tensor(name, format!("dtype {} is not a weight format (accepted: F32, F16, BF16)", self.dtype))
        })?;
        let [rows, cols] = self.shape[..] else {
            return Err(Error::tensor(name, format!("expected a 2-D matrix, found shape {:?}", self.shape)));
        };
        Ok((format, rows, cols))
    }
}

/// Alignment a dtype's elements need to be read in place.
fn dtype_align(d: Dtype) -> usize {
    (d.bitsize() / 8).clamp(1, 8)
}

fn bad_name(component: &str) -> bool {
    let p = Path::new(component);
    component.is_empty() || !p.components().all(|c| matches!(c, Component::Normal(_)))
}

impl Checkpoint {
    /// Open a checkpoint directory: `config.json` (validated as [`VisionConfig`]), then
    /// `model.safetensors` if present, otherwise `model.safetensors.index.json` and its shards.
    pub fn open(dir: &Path) -> Result<Checkpoint> {
        let config = VisionConfig::from_file(&dir.join(CONFIG_FILE))?;
        let quant = QuantConfig::from_value(&config.raw)?;
        Self::open_with(dir, Some(config), quant)
    }

    /// Open the tensors of a checkpoint directory without validating a vision config (a
    /// text-only language-model checkpoint such as `lm-tiny`); the caller validates config.json
    /// itself (e.g. with [`crate::config::LmConfig`]). [`Checkpoint::config`] panics on such a
    /// checkpoint; use [`Checkpoint::vision_config`].
    /// Its `quantization_config` is read here when config.json exists (FP8/FP4 weights need
    /// it); without a config.json the checkpoint holds plain float tensors only.
    pub fn open_without_vision(dir: &Path) -> Result<Checkpoint> {
        let path = dir.join(CONFIG_FILE);
        let quant = if path.is_file() { QuantConfig::from_value(&read_config(&path)?)? } else { None };
        Self::open_with(dir, None, quant)
    }

    /// Open a checkpoint that may or may not have a vision side: the vision config is validated
    /// (as by [`Checkpoint::open`]) when config.json has any `vision_*` key, as a Vision-Exp
    /// checkpoint does, and left out otherwise (a text-only checkpoint such as `lm-tiny`).
    pub fn open_auto(dir: &Path) -> Result<Checkpoint> {
        let raw = read_config(&dir.join(CONFIG_FILE))?;
        let quant = QuantConfig::from_value(&raw)?;
        let has_vision = raw.as_object().is_some_and(|o| o.keys().any(|k| k.starts_with("vision_")));
        let config = if has_vision { Some(VisionConfig::from_value(raw)?) } else { None };
        Self::open_with(dir, config, quant)
    }

    /// Open the tensors, then pair every FP8/FP4 weight with its `.scale` (from headers).
    fn open_with(dir: &Path, config: Option<VisionConfig>, quant: Option<QuantConfig>) -> Result<Checkpoint> {
        let single = dir.join(SINGLE_FILE);
        let index = dir.join(INDEX_FILE);
        let ckpt = if single.is_file() {
            let (shard, meta) = open_shard(&single)?;
            let mut tensors = BTreeMap::new();
            insert_all(&mut tensors, 0, &meta);
            Checkpoint { dir: dir.to_path_buf(), config, shards: vec![shard], tensors, index_metadata: None, quant }
        } else if index.is_file() {
            Self::open_sharded(dir, &index, config, quant)?
        } else {
            return Err(Error::file(dir, format!("no {SINGLE_FILE} or {INDEX_FILE} in this directory")));
        };
        fp8::check_scales(&ckpt)?;
        Ok(ckpt)
    }

    fn open_sharded(
        dir: &Path,
        index_path: &Path,
        config: Option<VisionConfig>,
        quant: Option<QuantConfig>,
    ) -> Result<Checkpoint> {
        let text = std::fs::read_to_string(index_path)
            .map_err(|e| Error::file(index_path, format!("cannot read shard index: {e}")))?;
        let root: Value = serde_json::from_str(&text)
            .map_err(|e| Error::file(index_path, format!("shard index is not valid JSON: {e}")))?;
        let map = root
            .get("weight_map")
            .ok_or_else(|| Error::file(index_path, "shard index has no `weight_map`"))?
            .as_object()
            .ok_or_else(|| Error::file(index_path, "shard index `weight_map` is not an object"))?;
        // name -> shard file name, and the distinct shard files (sorted).
        let mut weight_map: BTreeMap<&str, &str> = BTreeMap::new();
        let mut files: BTreeMap<&str, &str> = BTreeMap::new(); // file -> first tensor naming it
        for (name, file) in map {
            let file = file.as_str().ok_or_else(|| {
                Error::file(index_path, format!("weight_map entry for tensor `{name}` is not a file name string"))
            })?;
            if bad_name(file) {
                return Err(Error::file(
                    index_path,
                    format!("weight_map entry for tensor `{name}` names `{file}`, which is not a plain relative path"),
                ));
            }
            weight_map.insert(name, file);
            files.entry(file).or_insert(name);
        }
        if weight_map.is_empty() {
            return Err(Error::file(index_path, "shard index `weight_map` is empty"));
        }

        let mut shards = Vec::new();
        let mut metas = Vec::new();
        let mut shard_of_file: HashMap<&str, usize> = HashMap::new();
        for (&file, &first) in &files {
            let path = dir.join(file);
            if !path.is_file() {
                return Err(Error::file(
                    &path,
                    format!("shard listed in {INDEX_FILE} (e.g. for tensor `{first}`) does not exist or is not a file"),
                ));
            }
            let (shard, meta) = open_shard(&path)?;
            shard_of_file.insert(file, shards.len());
            shards.push(shard);
            metas.push(meta);
        }

        // Where each tensor name is actually stored (possibly several shards: an error).
        let mut found: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, meta) in metas.iter().enumerate() {
            for name in meta.tensors().into_keys() {
                found.entry(name).or_default().push(i);
            }
        }
        for (name, where_) in &found {
            if where_.len() > 1 {
                let list: Vec<String> = where_.iter().map(|&i| shards[i].path.display().to_string()).collect();
                return Err(Error::tensor(name, format!("present in more than one shard: {}", list.join(", "))));
            }
            let here = &shards[where_[0]].path;
            match weight_map.get(name.as_str()) {
                None => {
                    return Err(Error::tensor(
                        name,
                        format!("stored in {} but not listed in {INDEX_FILE} weight_map", here.display()),
                    ));
                }
                Some(&file) if shard_of_file[file] != where_[0] => {
                    return Err(Error::tensor(
                        name,
                        format!(
                            "{INDEX_FILE} maps it to {} but it is stored in {}",
                            shards[shard_of_file[file]].path.display(),
                            here.display()
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        for (&name, &file) in &weight_map {
            if !found.contains_key(name) {
                return Err(Error::tensor(
                    name,
                    format!("listed in {INDEX_FILE} for shard {} but absent from that file", dir.join(file).display()),
                ));
            }
        }

        let mut tensors = BTreeMap::new();
        for (i, meta) in metas.iter().enumerate() {
            insert_all(&mut tensors, i, meta);
        }
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            config,
            shards,
            tensors,
            index_metadata: root.get("metadata").cloned(),
            quant,
        })
    }

    /// The checkpoint directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The validated vision configuration (its `raw` field holds the whole config.json).
    ///
    /// Panics on a checkpoint opened with [`Checkpoint::open_without_vision`].
    pub fn config(&self) -> &VisionConfig {
        self.config.as_ref().expect("checkpoint opened without a vision config (open_without_vision)")
    }

    /// The vision configuration, `None` when opened with [`Checkpoint::open_without_vision`].
    pub fn vision_config(&self) -> Option<&VisionConfig> {
        self.config.as_ref()
    }

    /// The FP8/FP4 storage config.json announces (`None` for a plain float checkpoint).
    pub fn quant(&self) -> Option<QuantConfig> {
        self.quant
    }

    /// The format and `[rows, cols]` that [`Checkpoint::weight`] gives `name`, from headers
    /// only (the re-lay plan for an official FP8/FP4 matrix): what `fovea inspect` sizes.
    pub fn weight_layout(&self, name: &str) -> Result<(WeightFormat, usize, usize)> {
        let meta =
            self.meta(name).ok_or_else(|| Error::tensor(name, format!("not in checkpoint {}", self.dir.display())))?;
        if fp8::is_quantized(meta.dtype) {
            let plan = fp8::plan(self, &meta)?;
            return Ok((plan.format, plan.rows, plan.cols));
        }
        let format = float_format(meta.dtype).ok_or_else(|| {
            Error::tensor(name, format!("dtype {} is not a weight format (accepted: F32, F16, BF16)", meta.dtype))
        })?;
        match meta.shape {
            &[rows, cols] => Ok((format, rows, cols)),
            s => Err(Error::tensor(name, format!("expected a 2-D matrix, found shape {s:?}"))),
        }
    }

    /// Bytes of `name` in the files, with its `.scale` when it is an official FP8/FP4 matrix
    /// (the two load as one); `None` when there is no such tensor.
    pub fn stored_bytes(&self, name: &str) -> Option<u64> {
        let meta = self.meta(name)?;
        let scale = fp8::scale_name(name).filter(|_| fp8::is_quantized(meta.dtype)).and_then(|s| self.meta(&s));
        Some(meta.nbytes as u64 + scale.map_or(0, |m| m.nbytes as u64))
    }

    /// A 2-D weight matrix `[out, in]` ready for a lane. F32/F16/BF16 matrices keep their
    /// storage format and are borrowed from the mmap when aligned. The official FP8/FP4 forms
    /// ([`fp8`]) are re-laid row-local into [`WeightFormat::FP8_E4M3_B128_E8M0`],
    /// [`WeightFormat::FP8_E4M3_B128_F32`] or [`WeightFormat::MXFP4`]: those bytes are an owned
    /// copy, the weight and its scale moved together, about the file's size (MXFP4 exactly,
    /// FP8 +0.8 % with E8M0 scales, +3.1 % with F32 scales). GGUF block formats need no re-lay.
    pub fn weight(&self, name: &str) -> Result<HostWeight<'_>> {
        let t = self.tensor(name)?;
        if !fp8::is_quantized(t.dtype) {
            return t.into_weight(name);
        }
        let meta = self.meta(name).ok_or_else(|| Error::tensor(name, "not in checkpoint"))?;
        let plan = fp8::plan(self, &meta)?;
        let scale = self.tensor(&plan.scale)?;
        let bytes = fp8::relay(name, &plan, &t.bytes, &scale.bytes)?;
        let w = HostWeight {
            name: name.to_string(),
            format: plan.format,
            rows: plan.rows,
            cols: plan.cols,
            bytes: bytes.into(),
        };
        w.validate()?;
        Ok(w)
    }

    /// The index's `metadata` object (sharded checkpoints only).
    pub fn index_metadata(&self) -> Option<&Value> {
        self.index_metadata.as_ref()
    }

    /// The safetensors files, in the order they were opened.
    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// Header facts of one tensor, if present.
    pub fn meta(&self, name: &str) -> Option<TensorMeta<'_>> {
        let (k, e) = self.tensors.get_key_value(name)?;
        Some(self.meta_of(k, e))
    }

    /// Header facts of every tensor, sorted by name.
    pub fn metas(&self) -> impl Iterator<Item = TensorMeta<'_>> {
        self.tensors.iter().map(|(k, e)| self.meta_of(k, e))
    }

    fn meta_of<'s>(&'s self, name: &'s str, e: &'s Entry) -> TensorMeta<'s> {
        TensorMeta { name, dtype: e.dtype, shape: &e.shape, nbytes: e.nbytes, file: &self.shards[e.shard].path }
    }

    /// The file a tensor is stored in.
    pub fn file_of(&self, name: &str) -> Option<&Path> {
        self.tensors.get(name).map(|e| self.shards[e.shard].path.as_path())
    }

    /// Total bytes of tensor data (headers excluded).
    pub fn total_bytes(&self) -> u64 {
        self.tensors.values().map(|e| e.nbytes as u64).sum()
    }

    /// Count and bytes per dtype.
    pub fn dtype_stats(&self) -> BTreeMap<Dtype, DtypeStat> {
        let mut m: BTreeMap<Dtype, DtypeStat> = BTreeMap::new();
        for e in self.tensors.values() {
            let s = m.entry(e.dtype).or_default();
            s.count += 1;
            s.bytes += e.nbytes as u64;
        }
        m
    }

    /// A tensor's data: borrowed from the mmap if its offset is aligned for its dtype, copied
    /// out otherwise.
    pub fn tensor(&self, name: &str) -> Result<TensorView<'_>> {
        let (key, e) = self
            .tensors
            .get_key_value(name)
            .ok_or_else(|| Error::tensor(name, format!("not in checkpoint {}", self.dir.display())))?;
        let shard = &self.shards[e.shard];
        // In bounds: the safetensors crate checked the offsets cover the data section exactly.
        let slice = shard.mmap.get(e.start..e.start + e.nbytes).ok_or_else(|| {
            Error::file(&shard.path, format!("tensor `{name}` data out of range (file changed on disk?)"))
        })?;
        let bytes = if (slice.as_ptr() as usize) % dtype_align(e.dtype) == 0 {
            Cow::Borrowed(slice)
        } else {
            Cow::Owned(slice.to_vec())
        };
        Ok(TensorView { name: key, dtype: e.dtype, shape: e.shape.clone(), bytes })
    }
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "checkpoint {}", self.dir.display())?;
        let files = self.files();
        writeln!(f, "  {} file(s), {} tensors, {} bytes of tensor data", files.len(), self.len(), self.total_bytes())?;
        for (d, s) in self.dtype_stats() {
            writeln!(f, "  {d:>5}: {:>6} tensors, {:>14} bytes", s.count, s.bytes)?;
        }
        match &self.config {
            Some(c) => write!(f, "{c}"),
            None => write!(f, "(no vision config)"),
        }
    }
}

/// A config.json parsed as JSON (not yet validated).
fn read_config(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(path, format!("cannot read config: {e}")))?;
    serde_json::from_str(&text).map_err(|e| Error::file(path, format!("config is not valid JSON: {e}")))
}

fn insert_all(tensors: &mut BTreeMap<String, Entry>, shard: usize, meta: &ShardMeta) {
    for (name, info) in meta.tensors() {
        let (s, e) = info.data_offsets;
        tensors.insert(
            name,
            Entry { shard, dtype: info.dtype, shape: info.shape.clone(), start: meta.data_start + s, nbytes: e - s },
        );
    }
}

/// A validated header.
struct ShardMeta {
    data_start: usize,
    meta: safetensors::tensor::Metadata,
}

impl ShardMeta {
    fn tensors(&self) -> HashMap<String, &TensorInfo> {
        self.meta.tensors()
    }
}

/// Memory-map one safetensors file and validate its header.
fn open_shard(path: &Path) -> Result<(Shard, ShardMeta)> {
    let file = File::open(path).map_err(|e| Error::file(path, format!("cannot open: {e}")))?;
    let len = file.metadata().map_err(|e| Error::file(path, format!("cannot stat: {e}")))?.len();
    if len < 8 {
        return Err(Error::file(
            path,
            format!("{len} bytes is too short for a safetensors file (needs an 8-byte header length)"),
        ));
    }
    // SAFETY: the map is read-only; like every mmap-based loader we assume the file is not
    // truncated or rewritten by another process while the checkpoint is open.
    let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::file(path, format!("cannot memory-map: {e}")))?;
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&mmap[..8]);
    let n = u64::from_le_bytes(prefix);
    let room = mmap.len() as u64 - 8;
    if n > room {
        return Err(Error::file(
            path,
            format!("header length {n} bytes exceeds the file ({} bytes, {room} after the length prefix)", mmap.len()),
        ));
    }
    let (n, meta) = SafeTensors::read_metadata(&mmap).map_err(|e| header_error(path, &mmap, n as usize, e))?;
    Ok((Shard { path: path.to_path_buf(), mmap }, ShardMeta { data_start: 8 + n, meta }))
}

/// Turn a safetensors error into a message naming the file and, where one can be pinned down,
/// the tensor. `n` has already been checked to fit in the file.
fn header_error(path: &Path, buf: &[u8], n: usize, e: SafeTensorError) -> Error {
    let generic = match &e {
        SafeTensorError::HeaderTooLarge => {
            format!("header length {n} bytes exceeds the safetensors limit of 100000000 bytes")
        }
        SafeTensorError::HeaderTooSmall => "too short for a safetensors header".to_string(),
        SafeTensorError::InvalidHeaderLength => format!("header length {n} is inconsistent with the file size"),
        SafeTensorError::InvalidHeader(u) => format!("header is not valid UTF-8: {u}"),
        SafeTensorError::InvalidHeaderStart => "header does not start with `{`".to_string(),
        SafeTensorError::InvalidHeaderDeserialization(j) | SafeTensorError::JsonError(j) => {
            format!("header is not a valid safetensors JSON header: {j}")
        }
        SafeTensorError::InvalidOffset(t) => {
            format!("tensor `{t}` has data_offsets that overlap, leave a gap, or run backwards")
        }
        SafeTensorError::TensorInvalidInfo => "a tensor's byte range does not match its dtype and shape".to_string(),
        SafeTensorError::MetadataIncompleteBuffer => {
            "tensor data does not match the file size (truncated file or trailing bytes)".to_string()
        }
        SafeTensorError::ValidationOverflow => "a tensor's shape overflows when multiplied out".to_string(),
        SafeTensorError::MisalignedSlice => "a tensor's size is not a whole number of bytes".to_string(),
        other => format!("invalid safetensors header: {other:?}"),
    };
    let detail = diagnose(buf.get(8..8 + n).unwrap_or(&[]), buf.len().saturating_sub(8 + n));
    // The diagnosis names the tensor and the numbers; fall back to the crate's verdict.
    Error::file(path, detail.unwrap_or(generic))
}

/// Second look at a header the crate refused, to name the offending tensor. `header` is in
/// bounds of the file; `data_len` is the number of bytes after it.
fn diagnose(header: &[u8], data_len: usize) -> Option<String> {
    let text = std::str::from_utf8(header).ok()?;
    let map: serde_json::Map<String, Value> = serde_json::from_str(text).ok()?;
    let mut infos: Vec<(String, TensorInfo)> = Vec::new();
    for (name, v) in map {
        if name == "__metadata__" {
            continue;
        }
        match serde_json::from_value::<TensorInfo>(v) {
            Ok(info) => infos.push((name, info)),
            Err(e) => return Some(format!("tensor `{name}`: bad entry: {e}")),
        }
    }
    infos.sort_by_key(|a| a.1.data_offsets);
    let mut prev_end = 0usize;
    let mut prev_name: Option<&str> = None;
    for (name, info) in &infos {
        let (s, e) = info.data_offsets;
        if e < s {
            return Some(format!("tensor `{name}`: data_offsets [{s}, {e}] run backwards"));
        }
        if s != prev_end {
            return Some(match prev_name {
                Some(p) if s < prev_end => {
                    format!("tensor `{name}`: data_offsets [{s}, {e}] overlap tensor `{p}` ending at {prev_end}")
                }
                Some(p) => format!(
                    "tensor `{name}`: data_offsets [{s}, {e}] leave a gap after tensor `{p}` ending at {prev_end}"
                ),
                None => format!("tensor `{name}`: data_offsets [{s}, {e}] do not start at 0"),
            });
        }
        let want = info
            .shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .and_then(|x| x.checked_mul(info.dtype.bitsize()))
            .map(|bits| (bits, bits / 8));
        match want {
            None => return Some(format!("tensor `{name}`: shape {:?} overflows", info.shape)),
            Some((bits, _)) if bits % 8 != 0 => {
                return Some(format!("tensor `{name}`: {bits} bits is not a whole number of bytes"));
            }
            Some((_, bytes)) if bytes != e - s => {
                return Some(format!(
                    "tensor `{name}`: dtype {} shape {:?} needs {bytes} bytes but data_offsets [{s}, {e}] span {}",
                    info.dtype,
                    info.shape,
                    e - s
                ));
            }
            _ => {}
        }
        prev_end = e;
        prev_name = Some(name);
    }
    if prev_end > data_len {
        return Some(format!(
            "truncated: header declares {prev_end} bytes of tensor data, the file holds {data_len} after the header{}",
            prev_name.map(|p| format!(" (tensor `{p}` runs past the end)")).unwrap_or_default()
        ));
    }
    if prev_end < data_len {
        return Some(format!(
            "header declares {prev_end} bytes of tensor data, the file holds {data_len} after the header ({} trailing bytes)",
            data_len - prev_end
        ));
    }
    None
}
