//! GGUF v3 reader: our own parser over a memory map (no GGUF crate).
//!
//! Layout (ggml's `gguf.cpp`, little-endian): magic `GGUF`, version `u32` (3), tensor count
//! `u64`, key-value count `u64`; the key-values (key string, value type `u32`, value); the tensor
//! infos (name string, `n_dims` `u32`, `ne[n_dims]` `u64`, ggml type `u32`, offset `u64`); padding
//! to `general.alignment` (default 32); the data section. Strings are a `u64` length then bytes.
//!
//! Every count and length read from the header is checked against the bytes left in the file
//! (count × the element's smallest encoding) before anything is reserved for it, and reservations
//! never exceed the bytes left, so a hostile header costs no more memory than the file holds.
//! Values are validated while the header is walked and kept as byte ranges of the map: arrays
//! (a tokenizer's 129 280 strings) are read on demand through [`ArrayView`], not copied.
//!
//! Split models (`gguf-split`): the first shard `NAME-00001-of-0000N.gguf` names the rest;
//! [`Gguf::open`] opens them all, checks each shard's `split.*` keys and that no tensor is stored
//! twice. Metadata is read from the first shard.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::formats::WeightFormat;

/// The file magic.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// The only version read.
pub const VERSION: u32 = 3;
/// `general.alignment` when the key is absent (ggml's `GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions.
pub const MAX_DIMS: usize = 4;
/// Deepest array nesting accepted (an array of arrays of … ); deeper is refused by key.
pub const MAX_ARRAY_DEPTH: usize = 4;
/// Key of the data alignment.
pub const KEY_ALIGNMENT: &str = "general.alignment";
/// Split keys written by `gguf-split` (llama.cpp's `LLM_KV_SPLIT_*`).
pub const KEY_SPLIT_NO: &str = "split.no";
pub const KEY_SPLIT_COUNT: &str = "split.count";
pub const KEY_SPLIT_TENSORS: &str = "split.tensors.count";

/// Smallest encodings, used to bound counts before anything is reserved.
const MIN_KV_BYTES: usize = 8 + 4 + 1; // empty key, type, one-byte value
const MIN_TENSOR_INFO_BYTES: usize = 8 + 4 + 8 + 4 + 8; // empty name, n_dims, one ne, type, offset

/// A tensor's storage type: a weight format (matrices and float vectors) or one of the integer
/// types the model needs (`tid2eid` is I32 after llama.cpp's conversion, I64 in HF files).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GgmlType {
    Weight(WeightFormat),
    I32,
    I64,
}

impl GgmlType {
    /// ggml's id for I32 / I64.
    pub const I32_ID: u32 = 26;
    pub const I64_ID: u32 = 27;

    /// The type of a ggml id, if this reader implements it (forks reuse ids: refuse the rest).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        match id {
            Self::I32_ID => Some(GgmlType::I32),
            Self::I64_ID => Some(GgmlType::I64),
            _ => WeightFormat::from_ggml_type(id).map(GgmlType::Weight),
        }
    }

    /// `(elements, bytes)` per block (1 element for the plain types).
    pub fn block(self) -> (usize, usize) {
        match self {
            GgmlType::Weight(f) => (f.block_elems(), f.block_bytes()),
            GgmlType::I32 => (1, 4),
            GgmlType::I64 => (1, 8),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            GgmlType::Weight(f) => f.name(),
            GgmlType::I32 => "I32",
            GgmlType::I64 => "I64",
        }
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// GGUF key-value types (`enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Bytes of a fixed-size value; `None` for strings and arrays.
    pub fn fixed_size(self) -> Option<usize> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// Smallest encoding of one value: an empty string is its 8-byte length, an empty array its
    /// element type and count.
    fn min_size(self) -> usize {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.fixed_size().unwrap_or(1),
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

/// One key's value, borrowed from the file. Strings are raw bytes (GGUF does not promise UTF-8;
/// [`Value::as_str`] checks).
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(&'a [u8]),
    Array(ArrayView<'a>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl<'a> Value<'a> {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// Any integer type, as i128 (every GGUF integer fits).
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// F32 or F64.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// A string value that is valid UTF-8.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::String(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<ArrayView<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short description for error messages: the type, and the value when it is a scalar.
    pub fn describe(&self) -> String {
        match self {
            Value::String(b) => format!("string {}", quote(b)),
            Value::Array(a) => format!("array of {} {}", a.len(), a.elem_type().name()),
            v => format!("{} {}", v.value_type().name(), v.scalar_text()),
        }
    }

    fn scalar_text(&self) -> String {
        match self {
            Value::Bool(b) => b.to_string(),
            v => match (v.as_int(), v.as_float()) {
                (Some(i), _) => i.to_string(),
                (_, Some(f)) => f.to_string(),
                _ => String::new(),
            },
        }
    }
}

/// The first bytes of a string for an error message (a name can be as long as the file).
fn quote(b: &[u8]) -> String {
    const SHOWN: usize = 48;
    let more = if b.len() > SHOWN { format!("… ({} bytes)", b.len()) } else { String::new() };
    format!("{:?}{more}", String::from_utf8_lossy(&b[..b.len().min(SHOWN)]))
}

/// An array value: `len` elements of `elem_type`, read on demand. The bytes were validated
/// when the file was opened.
#[derive(Clone, Copy, Debug)]
pub struct ArrayView<'a> {
    elem: ValueType,
    len: usize,
    /// From the first element to the end of the array.
    bytes: &'a [u8],
}

impl<'a> ArrayView<'a> {
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn elem_type(&self) -> ValueType {
        self.elem
    }
    /// The elements in order.
    pub fn iter(&self) -> ArrayIter<'a> {
        ArrayIter { elem: self.elem, left: self.len, bytes: self.bytes }
    }
}

/// Iterator over an [`ArrayView`].
pub struct ArrayIter<'a> {
    elem: ValueType,
    left: usize,
    bytes: &'a [u8],
}

impl<'a> Iterator for ArrayIter<'a> {
    type Item = Value<'a>;
    fn next(&mut self) -> Option<Value<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        // validated at open: decoding cannot fail; a `None` would only end the iteration early
        let mut c = Reader { buf: self.bytes, pos: 0 };
        let v = c.value(self.elem).ok()?;
        self.bytes = &self.bytes[c.pos..];
        Some(v)
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

/// Infallible-by-construction decoding over already-validated bytes (used by [`ArrayIter`] and
/// [`GgufFile::kv`]); errors carry no context because validation already named everything.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> std::result::Result<&'a [u8], ()> {
        let end = self.pos.checked_add(n).ok_or(())?;
        let s = self.buf.get(self.pos..end).ok_or(())?;
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self) -> std::result::Result<[u8; N], ()> {
        self.take(N)?.try_into().map_err(|_| ())
    }
    fn u64(&mut self) -> std::result::Result<u64, ()> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn value(&mut self, ty: ValueType) -> std::result::Result<Value<'a>, ()> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.arr::<1>()?[0]),
            ValueType::I8 => Value::I8(self.arr::<1>()?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.arr()?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.arr()?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.arr()?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.arr()?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.arr()?)),
            ValueType::Bool => Value::Bool(self.arr::<1>()?[0] != 0),
            ValueType::U64 => Value::U64(self.u64()?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.arr()?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.arr()?)),
            ValueType::String => {
                let n = usize::try_from(self.u64()?).map_err(|_| ())?;
                Value::String(self.take(n)?)
            }
            ValueType::Array => {
                let elem = ValueType::from_id(u32::from_le_bytes(self.arr()?)).ok_or(())?;
                let len = usize::try_from(self.u64()?).map_err(|_| ())?;
                let start = self.pos;
                for _ in 0..len {
                    self.value(elem)?;
                }
                Value::Array(ArrayView { elem, len, bytes: &self.buf[start..self.pos] })
            }
        })
    }
}

/// Where one key's value lies in the file.
#[derive(Clone, Debug)]
struct KvEntry {
    ty: ValueType,
    /// Byte offset of the value (after its type tag).
    start: usize,
}

/// One tensor's header entry, checked: its type is implemented, its dimensions multiply out,
/// its data lies inside the file, aligned and overlapping no other tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml `ne`, innermost (contiguous) dimension first.
    pub ne: Vec<u64>,
    pub ty: GgmlType,
    /// Offset of the data relative to the data section.
    pub offset: u64,
    /// Absolute byte offset of the data in the file.
    pub start: usize,
    pub nbytes: usize,
}

impl TensorInfo {
    /// The shape in torch order (outermost first): `ne` reversed.
    pub fn shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.ne.iter().product()
    }
}

/// The file's bytes: a memory map, or (tests) an owned buffer.
enum Bytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

/// One opened and validated GGUF file.
pub struct GgufFile {
    path: PathBuf,
    bytes: Bytes,
    version: u32,
    kvs: BTreeMap<String, KvEntry>,
    /// Key names in file order.
    kv_order: Vec<String>,
    /// In file (header) order.
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_start: usize,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("kvs", &self.kvs.len())
            .field("tensors", &self.tensors.len())
            .finish()
    }
}

/// The header walker: every read is bounds-checked and every refusal names the file and the
/// key or tensor being read.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn err(&self, msg: String) -> Error {
        Error::file(self.path, msg)
    }
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.left() {
            return Err(self.err(format!(
                "truncated: {} needs {n} bytes at offset {}, the file ends after {} ({} bytes)",
                what(),
                self.pos,
                self.left(),
                self.buf.len()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    }
    /// A length-prefixed string; the length is checked against the bytes left first.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        let n = self.u64(&|| format!("the length of {}", what()))?;
        if n > self.left() as u64 {
            return Err(self.err(format!(
                "{} claims a string of {n} bytes at offset {}, but only {} bytes remain",
                what(),
                self.pos,
                self.left()
            )));
        }
        self.take(n as usize, what)
    }
    /// A UTF-8 name (key or tensor name).
    fn name(&mut self, what: &dyn Fn() -> String) -> Result<&'a str> {
        let b = self.string(what)?;
        std::str::from_utf8(b).map_err(|e| self.err(format!("{} is not valid UTF-8 ({e}): {}", what(), quote(b))))
    }
    /// Walk (validate) one value of type `ty`.
    fn skip_value(&mut self, ty: ValueType, key: &str, depth: usize) -> Result<()> {
        let what = || format!("the value of key `{key}`");
        match ty {
            ValueType::String => {
                self.string(&what)?;
            }
            ValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!(
                        "key `{key}`: arrays nested deeper than {MAX_ARRAY_DEPTH} levels are not accepted"
                    )));
                }
                let id = self.u32(&|| format!("the element type of array key `{key}`"))?;
                let elem = ValueType::from_id(id).ok_or_else(|| {
                    self.err(format!("key `{key}`: unknown array element type id {id} (GGUF types are 0-12)"))
                })?;
                let n = self.u64(&|| format!("the element count of array key `{key}`"))?;
                let need = (elem.min_size() as u64).checked_mul(n);
                if need.is_none_or(|need| need > self.left() as u64) {
                    return Err(self.err(format!(
                        "key `{key}`: an array of {n} {} elements cannot fit in the {} bytes that remain",
                        elem.name(),
                        self.left()
                    )));
                }
                match elem.fixed_size() {
                    Some(size) => {
                        self.take(size * n as usize, &what)?;
                    }
                    None => {
                        for _ in 0..n {
                            self.skip_value(elem, key, depth + 1)?;
                        }
                    }
                }
            }
            fixed => {
                self.take(fixed.fixed_size().unwrap_or(0), &what)?;
            }
        }
        Ok(())
    }
}

impl GgufFile {
    /// Memory-map and validate one GGUF file (one shard; see [`Gguf::open`] for split models).
    pub fn open(path: &Path) -> Result<GgufFile> {
        let file = File::open(path).map_err(|e| Error::file(path, format!("cannot open: {e}")))?;
        // SAFETY: the map is read-only; like every mmap-based loader we assume the file is not
        // truncated or rewritten by another process while it is open.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::file(path, format!("cannot memory-map: {e}")))?;
        Self::parse(path, Bytes::Map(map))
    }

    /// Validate a GGUF image held in memory (`path` names it in errors).
    pub fn from_bytes(path: &Path, bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(path, Bytes::Owned(bytes))
    }

    fn parse(path: &Path, bytes: Bytes) -> Result<GgufFile> {
        let h = parse_header(path, &bytes)?;
        Ok(GgufFile {
            path: path.to_path_buf(),
            bytes,
            version: h.version,
            kvs: h.kvs,
            kv_order: h.kv_order,
            tensors: h.tensors,
            by_name: h.by_name,
            alignment: h.alignment,
            data_start: h.data_start,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn version(&self) -> u32 {
        self.version
    }
    pub fn alignment(&self) -> u64 {
        self.alignment
    }
    /// Absolute offset of the data section.
    pub fn data_start(&self) -> usize {
        self.data_start
    }
    /// Bytes in the file.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Key names in file order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.kv_order.iter().map(String::as_str)
    }

    /// A key's value, if present.
    pub fn kv(&self, key: &str) -> Option<Value<'_>> {
        let e = self.kvs.get(key)?;
        Reader { buf: &self.bytes, pos: e.start }.value(e.ty).ok()
    }

    /// Tensor infos in header order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.by_name.get(name).map(|&i| &self.tensors[i])
    }

    /// A tensor's data, borrowed from the map (validated in range at open).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        &self.bytes[info.start..info.start + info.nbytes]
    }
}

/// What [`parse_header`] finds.
struct Header {
    version: u32,
    kvs: BTreeMap<String, KvEntry>,
    kv_order: Vec<String>,
    tensors: Vec<TensorInfo>,
    by_name: HashMap<String, usize>,
    alignment: u64,
    data_start: usize,
}

fn parse_header(path: &Path, buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0, path };
    let magic = c.take(4, &|| "the magic".into())?;
    if magic != MAGIC {
        return Err(c.err(format!("not a GGUF file: magic is {magic:02x?}, expected \"GGUF\" (47 47 55 46)")));
    }
    let version = c.u32(&|| "the version".into())?;
    if version != VERSION {
        let hint = if version.swap_bytes() == VERSION { " (a big-endian file?)" } else { "" };
        return Err(c.err(format!("GGUF version {version}{hint} is not supported (only version {VERSION})")));
    }
    let n_tensors = c.u64(&|| "the tensor count".into())?;
    let n_kv = c.u64(&|| "the key-value count".into())?;
    let need = (n_kv as u128) * MIN_KV_BYTES as u128 + (n_tensors as u128) * MIN_TENSOR_INFO_BYTES as u128;
    if need > c.left() as u128 {
        return Err(c.err(format!(
            "header declares {n_kv} key-values and {n_tensors} tensors, which cannot fit in the {} bytes that \
             remain (at least {need} bytes)",
            c.left()
        )));
    }
    let (n_kv, n_tensors) = (n_kv as usize, n_tensors as usize);

    let mut kvs: BTreeMap<String, KvEntry> = BTreeMap::new();
    let mut kv_order = Vec::with_capacity(bounded(n_kv, size_of::<String>(), c.left()));
    for i in 0..n_kv {
        let key = c.name(&|| format!("key #{i}"))?;
        let id = c.u32(&|| format!("the type of key `{key}`"))?;
        let ty = ValueType::from_id(id)
            .ok_or_else(|| c.err(format!("key `{key}`: unknown value type id {id} (GGUF types are 0-12)")))?;
        let start = c.pos;
        c.skip_value(ty, key, 0)?;
        if kvs.contains_key(key) {
            return Err(c.err(format!("key `{key}` appears twice")));
        }
        kvs.insert(key.to_string(), KvEntry { ty, start });
        kv_order.push(key.to_string());
    }

    let alignment = match kvs.get(KEY_ALIGNMENT) {
        None => DEFAULT_ALIGNMENT,
        Some(e) => match (Reader { buf, pos: e.start }).value(e.ty) {
            Ok(Value::U32(a)) if a.is_power_of_two() => u64::from(a),
            Ok(v) => {
                return Err(c.err(format!("key `{KEY_ALIGNMENT}` is {}; it must be a u32 power of two", v.describe())));
            }
            Err(()) => return Err(c.err(format!("key `{KEY_ALIGNMENT}` cannot be read"))),
        },
    };

    let mut tensors: Vec<TensorInfo> = Vec::with_capacity(bounded(n_tensors, size_of::<TensorInfo>(), c.left()));
    let mut by_name: HashMap<String, usize> = HashMap::with_capacity(bounded(n_tensors, 64, c.left()));
    for i in 0..n_tensors {
        let name = c.name(&|| format!("the name of tensor #{i}"))?;
        let n_dims = c.u32(&|| format!("n_dims of tensor `{name}`"))? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(c.err(format!("tensor `{name}`: {n_dims} dimensions (ggml allows 1 to {MAX_DIMS})")));
        }
        let mut ne = Vec::with_capacity(n_dims);
        for d in 0..n_dims {
            ne.push(c.u64(&|| format!("ne[{d}] of tensor `{name}`"))?);
        }
        let id = c.u32(&|| format!("the type of tensor `{name}`"))?;
        let offset = c.u64(&|| format!("the data offset of tensor `{name}`"))?;
        let ty = GgmlType::from_id(id).ok_or_else(|| {
            c.err(format!(
                "tensor `{name}`: ggml type id {id} is not one this reader implements (implemented: {}; \
                 forks reuse ids, so others are refused)",
                implemented_ids()
            ))
        })?;
        let nbytes = tensor_bytes(&ne, ty).map_err(|m| c.err(format!("tensor `{name}`: {m}")))?;
        if offset % alignment != 0 {
            return Err(
                c.err(format!("tensor `{name}`: data offset {offset} is not a multiple of the alignment {alignment}"))
            );
        }
        if by_name.contains_key(name) {
            return Err(c.err(format!("tensor `{name}` appears twice")));
        }
        by_name.insert(name.to_string(), tensors.len());
        tensors.push(TensorInfo { name: name.to_string(), ne, ty, offset, start: 0, nbytes });
    }

    // the data section starts at the next multiple of the alignment
    let data_start = (c.pos as u64).div_ceil(alignment).checked_mul(alignment).unwrap_or(u64::MAX);
    let len = buf.len() as u64;
    let mut order: Vec<usize> = (0..tensors.len()).collect();
    order.sort_by_key(|&i| tensors[i].offset);
    let mut prev: Option<(u64, &str)> = None;
    for &i in &order {
        let t = &tensors[i];
        let end = t.offset.checked_add(t.nbytes as u64);
        let abs_end = end.and_then(|e| e.checked_add(data_start));
        match abs_end {
            Some(e) if e <= len => {}
            _ => {
                return Err(c.err(format!(
                    "tensor `{}`: data [{}, +{}) at offset {} of the data section (which starts at {data_start}) \
                     runs past the end of the file ({len} bytes): truncated or out of range",
                    t.name, t.offset, t.nbytes, t.offset
                )));
            }
        }
        if let Some((prev_end, prev_name)) = prev
            && t.offset < prev_end
        {
            return Err(c.err(format!(
                "tensor `{}`: data at offset {} overlaps tensor `{prev_name}`, which ends at {prev_end}",
                t.name, t.offset
            )));
        }
        prev = Some((t.offset + t.nbytes as u64, &t.name));
    }
    for t in &mut tensors {
        // in range: checked above (data_start + offset + nbytes <= len)
        t.start = (data_start + t.offset) as usize;
    }
    Ok(Header { version, kvs, kv_order, tensors, by_name, alignment, data_start: data_start.min(len) as usize })
}

/// A reservation for `n` checked elements of `size` bytes each, never more bytes than the `left`
/// bytes of the file (the elements are larger in memory than their smallest encoding; past this
/// the container grows only as elements actually parse).
fn bounded(n: usize, size: usize, left: usize) -> usize {
    n.min(left / size.max(1))
}

fn implemented_ids() -> String {
    let mut ids: Vec<String> =
        WeightFormat::ALL.into_iter().filter_map(|f| f.ggml_type().map(|id| format!("{id} {f}"))).collect();
    ids.push(format!("{} I32", GgmlType::I32_ID));
    ids.push(format!("{} I64", GgmlType::I64_ID));
    ids.join(", ")
}

/// Bytes of a tensor of dimensions `ne` and type `ty`, refusing zero or overflowing products and
/// rows that are not whole blocks.
fn tensor_bytes(ne: &[u64], ty: GgmlType) -> std::result::Result<usize, String> {
    if let Some(d) = ne.iter().position(|&n| n == 0) {
        return Err(format!("ne {ne:?} has a zero dimension (ne[{d}])"));
    }
    let (be, bb) = ty.block();
    if ne[0] % be as u64 != 0 {
        return Err(format!("ne[0] = {} is not a whole number of {ty} blocks ({be} values each)", ne[0]));
    }
    let rows = ne[1..].iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    rows.and_then(|r| r.checked_mul(ne[0] / be as u64))
        .and_then(|blocks| blocks.checked_mul(bb as u64))
        .filter(|&b| b <= i64::MAX as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("ne {ne:?} of type {ty} overflows when multiplied out"))
}

/// A GGUF model: one file, or every shard of a split one.
pub struct Gguf {
    shards: Vec<GgufFile>,
    /// name -> (shard, index in that shard's tensors)
    tensors: BTreeMap<String, (usize, usize)>,
}

impl fmt::Debug for Gguf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gguf").field("files", &self.files()).field("tensors", &self.tensors.len()).finish()
    }
}

/// `NAME-0000k-of-0000n.gguf` → `(NAME, k, n)` (llama.cpp's `llama_split_path` pattern).
pub fn split_name(path: &Path) -> Option<(String, u32, u32)> {
    let file = path.file_name()?.to_str()?;
    let stem = file.strip_suffix(".gguf")?;
    let (rest, n) = stem.rsplit_once("-of-")?;
    let (prefix, k) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() >= 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(k) || !digits(n) {
        return None;
    }
    Some((prefix.to_string(), k.parse().ok()?, n.parse().ok()?))
}

impl Gguf {
    /// Open a GGUF model from its only file or its first shard; the other shards are found
    /// from the first one's name (`NAME-00001-of-0000N.gguf` → `NAME-0000k-of-0000N.gguf`).
    pub fn open(path: &Path) -> Result<Gguf> {
        let first = GgufFile::open(path)?;
        let key_u64 = |f: &GgufFile, key: &str| -> Result<Option<u64>> {
            match f.kv(key) {
                None => Ok(None),
                Some(v) => match v.as_int() {
                    Some(i) if i >= 0 => Ok(Some(i as u64)),
                    _ => Err(Error::file(
                        &f.path,
                        format!("key `{key}` is {}, expected a non-negative integer", v.describe()),
                    )),
                },
            }
        };
        let count = key_u64(&first, KEY_SPLIT_COUNT)?;
        let named = split_name(path);
        let count = match (count, &named) {
            (None | Some(1), None) => {
                return Self::index(vec![first]);
            }
            (None, Some((_, k, n))) => {
                return Err(Error::file(
                    path,
                    format!("the name says shard {k} of {n}, but the file has no `{KEY_SPLIT_COUNT}` key"),
                ));
            }
            (Some(c), None) => {
                return Err(Error::file(
                    path,
                    format!(
                        "`{KEY_SPLIT_COUNT}` = {c}, but the file name does not follow NAME-00001-of-{c:05}.gguf, \
                         so the other shards cannot be found"
                    ),
                ));
            }
            (Some(c), Some(_)) => c,
        };
        let (prefix, k, n) = named.unwrap_or_default();
        if k != 1 {
            return Err(Error::file(
                path,
                format!("this is shard {k} of {n}: pass the first shard (-00001-of-{n:05})"),
            ));
        }
        if u64::from(n) != count {
            return Err(Error::file(path, format!("the name says {n} shards but `{KEY_SPLIT_COUNT}` is {count}")));
        }
        let total = key_u64(&first, KEY_SPLIT_TENSORS)?;
        let dir = path.parent().unwrap_or(Path::new(""));
        let mut shards = vec![first];
        for k in 2..=n {
            let p = dir.join(format!("{prefix}-{k:05}-of-{n:05}.gguf"));
            if !p.is_file() {
                return Err(Error::file(
                    &p,
                    format!("shard {k} of {n} (named after {}) does not exist", path.display()),
                ));
            }
            shards.push(GgufFile::open(&p)?);
        }
        for (i, s) in shards.iter().enumerate() {
            let no = key_u64(s, KEY_SPLIT_NO)?;
            if no != Some(i as u64) {
                return Err(Error::file(
                    &s.path,
                    format!("`{KEY_SPLIT_NO}` is {no:?}, expected {i} for shard {}", i + 1),
                ));
            }
            let c = key_u64(s, KEY_SPLIT_COUNT)?;
            if c != Some(count) {
                return Err(Error::file(
                    &s.path,
                    format!("`{KEY_SPLIT_COUNT}` is {c:?}, the first shard says {count}"),
                ));
            }
            let t = key_u64(s, KEY_SPLIT_TENSORS)?;
            if t != total {
                return Err(Error::file(
                    &s.path,
                    format!("`{KEY_SPLIT_TENSORS}` is {t:?}, the first shard says {total:?}"),
                ));
            }
        }
        let g = Self::index(shards)?;
        let found = g.tensors.len() as u64;
        if let Some(t) = total
            && t != found
        {
            return Err(Error::file(
                path,
                format!("`{KEY_SPLIT_TENSORS}` is {t}, but the {n} shards hold {found} tensors"),
            ));
        }
        Ok(g)
    }

    fn index(shards: Vec<GgufFile>) -> Result<Gguf> {
        let mut tensors = BTreeMap::new();
        for (s, f) in shards.iter().enumerate() {
            for (i, t) in f.tensors.iter().enumerate() {
                if let Some((other, _)) = tensors.insert(t.name.clone(), (s, i)) {
                    return Err(Error::file(
                        &f.path,
                        format!("tensor `{}` is also stored in {}", t.name, shards[other].path.display()),
                    ));
                }
            }
        }
        Ok(Gguf { shards, tensors })
    }

    /// The metadata (the first shard's key-values).
    pub fn meta(&self) -> &GgufFile {
        &self.shards[0]
    }

    /// A metadata value.
    pub fn kv(&self, key: &str) -> Option<Value<'_>> {
        self.shards[0].kv(key)
    }

    /// The shards, in order.
    pub fn shards(&self) -> &[GgufFile] {
        &self.shards
    }

    pub fn files(&self) -> Vec<&Path> {
        self.shards.iter().map(|s| s.path.as_path()).collect()
    }

    /// Number of tensors over all shards.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Every tensor with the file holding it, sorted by name.
    pub fn tensors(&self) -> impl Iterator<Item = (&TensorInfo, &Path)> {
        self.tensors.values().map(|&(s, i)| (&self.shards[s].tensors[i], self.shards[s].path.as_path()))
    }

    /// One tensor's info and file.
    pub fn tensor(&self, name: &str) -> Option<(&TensorInfo, &Path)> {
        let &(s, i) = self.tensors.get(name)?;
        Some((&self.shards[s].tensors[i], self.shards[s].path.as_path()))
    }

    /// One tensor's data, borrowed from its shard's map.
    pub fn data(&self, name: &str) -> Option<&[u8]> {
        let &(s, i) = self.tensors.get(name)?;
        let shard = &self.shards[s];
        Some(shard.tensor_data(&shard.tensors[i]))
    }

    /// Count and bytes per tensor type.
    pub fn type_stats(&self) -> BTreeMap<GgmlType, (usize, u64)> {
        let mut m: BTreeMap<GgmlType, (usize, u64)> = BTreeMap::new();
        for (t, _) in self.tensors() {
            let e = m.entry(t.ty).or_default();
            e.0 += 1;
            e.1 += t.nbytes as u64;
        }
        m
    }
}
