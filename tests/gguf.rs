//! GGUF reader (`weights::gguf`): every refusal by name, split models, and a mutation test
//! (flipped and truncated headers: no panic, no allocation beyond the file's size).
//!
//! Files are written by a small GGUF writer in this test (the layout of ggml's `gguf.cpp`);
//! `fixtures/gen/gguf/` checks the reader against files written by llama.cpp's own gguf-py.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use fovea::backend::WeightFormat;
use fovea::weights::gguf::{GgmlType, Gguf, GgufFile, Value, ValueType};

// ---- a counting allocator: live and peak bytes, and the largest single request, counted only
// on a thread that asked for it (the test harness runs tests on parallel threads) ------------

struct Counting;

thread_local! {
    static TRACK: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<usize> = const { Cell::new(0) };
    static PEAK: Cell<usize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note_alloc(size: usize) {
    let _ = TRACK.try_with(|t| {
        if t.get() {
            LIVE.with(|l| {
                let now = l.get() + size;
                l.set(now);
                PEAK.with(|p| p.set(p.get().max(now)));
            });
            LARGEST.with(|m| m.set(m.get().max(size)));
        }
    });
}

fn note_free(size: usize) {
    let _ = TRACK.try_with(|t| {
        if t.get() {
            LIVE.with(|l| l.set(l.get().saturating_sub(size)));
        }
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note_alloc(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        note_free(layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note_free(layout.size());
        note_alloc(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Run `f` counting this thread's allocations: `(result, peak live bytes, largest request)`.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LIVE.with(|l| l.set(0));
    PEAK.with(|p| p.set(0));
    LARGEST.with(|m| m.set(0));
    TRACK.with(|t| t.set(true));
    let r = f();
    TRACK.with(|t| t.set(false));
    (r, PEAK.with(Cell::get), LARGEST.with(Cell::get))
}

// ---- the writer ---------------------------------------------------------------------------

fn s(x: &str) -> Vec<u8> {
    let mut v = (x.len() as u64).to_le_bytes().to_vec();
    v.extend(x.as_bytes());
    v
}

/// One key-value: type id and encoded value.
struct Kv {
    key: String,
    ty: u32,
    value: Vec<u8>,
}

fn kv(key: &str, ty: u32, value: Vec<u8>) -> Kv {
    Kv { key: key.into(), ty, value }
}
fn kv_u32(key: &str, v: u32) -> Kv {
    kv(key, 4, v.to_le_bytes().to_vec())
}
fn kv_u16(key: &str, v: u16) -> Kv {
    kv(key, 2, v.to_le_bytes().to_vec())
}
fn kv_i32(key: &str, v: i32) -> Kv {
    kv(key, 5, v.to_le_bytes().to_vec())
}
fn kv_str(key: &str, v: &str) -> Kv {
    kv(key, 8, s(v))
}
fn arr(elem: u32, n: u64, body: Vec<u8>) -> Vec<u8> {
    let mut v = elem.to_le_bytes().to_vec();
    v.extend(n.to_le_bytes());
    v.extend(body);
    v
}

struct Tensor {
    name: String,
    ne: Vec<u64>,
    ty: u32,
    data: Vec<u8>,
    /// Offset override (else packed at the alignment).
    offset: Option<u64>,
}

fn tensor(name: &str, ne: &[u64], ty: u32, data: Vec<u8>) -> Tensor {
    Tensor { name: name.into(), ne: ne.to_vec(), ty, data, offset: None }
}

fn f32_tensor(name: &str, ne: &[u64], seed: f32) -> Tensor {
    let n: u64 = ne.iter().product();
    let data = (0..n).flat_map(|i| (seed + i as f32 * 0.25).to_le_bytes()).collect();
    tensor(name, ne, 0, data)
}

/// A GGUF v3 image: header, key-values, tensor infos, padding, data.
fn write(kvs: &[Kv], tensors: &[Tensor], alignment: u64) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((kvs.len() as u64).to_le_bytes());
    for k in kvs {
        out.extend(s(&k.key));
        out.extend(k.ty.to_le_bytes());
        out.extend(&k.value);
    }
    let mut offsets = Vec::new();
    let mut at = 0u64;
    for t in tensors {
        let off = t.offset.unwrap_or(at);
        offsets.push(off);
        at = (off + t.data.len() as u64).div_ceil(alignment) * alignment;
    }
    for (t, off) in tensors.iter().zip(&offsets) {
        out.extend(s(&t.name));
        out.extend((t.ne.len() as u32).to_le_bytes());
        for d in &t.ne {
            out.extend(d.to_le_bytes());
        }
        out.extend(t.ty.to_le_bytes());
        out.extend(off.to_le_bytes());
    }
    while out.len() as u64 % alignment != 0 {
        out.push(0);
    }
    let base = out.len();
    for (t, off) in tensors.iter().zip(&offsets) {
        let at = base + *off as usize;
        if out.len() < at + t.data.len() {
            out.resize(at + t.data.len(), 0);
        }
        out[at..at + t.data.len()].copy_from_slice(&t.data);
    }
    while out.len() as u64 % alignment != 0 {
        out.push(0);
    }
    out
}

/// A small valid file using every value type, nested arrays, and F32 / Q8_0 / I32 tensors.
fn sample() -> Vec<u8> {
    let nested =
        arr(9, 2, [arr(4, 2, [1u32, 2].iter().flat_map(|v| v.to_le_bytes()).collect()), arr(4, 0, vec![])].concat());
    let kvs = vec![
        kv_str("general.architecture", "test"),
        kv("t.u8", 0, vec![200]),
        kv("t.i8", 1, vec![0xfe]),
        kv("t.u16", 2, 60000u16.to_le_bytes().to_vec()),
        kv("t.i16", 3, (-300i16).to_le_bytes().to_vec()),
        kv_u32("t.u32", 4_000_000_000),
        kv_i32("t.i32", -7),
        kv("t.f32", 6, 1.5f32.to_le_bytes().to_vec()),
        kv("t.bool", 7, vec![1]),
        kv("t.u64", 10, u64::MAX.to_le_bytes().to_vec()),
        kv("t.i64", 11, (-9i64).to_le_bytes().to_vec()),
        kv("t.f64", 12, 0.125f64.to_le_bytes().to_vec()),
        kv("t.strings", 9, arr(8, 3, [s("a"), s(""), s("ĠHello")].concat())),
        kv("t.nested", 9, nested),
    ];
    let mut q8 = Vec::new();
    for b in 0..4u8 {
        q8.extend(half::f16::from_f32(0.5).to_le_bytes());
        q8.extend((0..32u8).map(|i| i.wrapping_mul(b + 1)));
    }
    let tensors = vec![
        f32_tensor("a.weight", &[3, 2], 1.0),
        tensor("q.weight", &[64, 2], 8, q8),
        tensor("ids", &[2, 3], 26, (0..6i32).flat_map(|v| v.to_le_bytes()).collect()),
        f32_tensor("v", &[5], -2.0),
        // a data section of a realistic share of the file (tensor data dominates real files)
        f32_tensor("big", &[64, 16], 0.0),
    ];
    write(&kvs, &tensors, 32)
}

fn open(bytes: Vec<u8>) -> fovea::Result<GgufFile> {
    GgufFile::from_bytes(Path::new("test.gguf"), bytes)
}

fn refused(bytes: Vec<u8>, parts: &[&str]) {
    let e = open(bytes).expect_err("expected a refusal").to_string();
    assert!(e.starts_with("test.gguf: "), "names the file: {e}");
    for p in parts {
        assert!(e.contains(p), "`{p}` not in: {e}");
    }
}

#[test]
fn reads_every_value_type_and_tensor() {
    let f = open(sample()).unwrap();
    assert_eq!((f.version(), f.alignment(), f.tensors().len()), (3, 32, 5));
    assert_eq!(f.kv("general.architecture").unwrap().as_str(), Some("test"));
    assert!(matches!(f.kv("t.u8"), Some(Value::U8(200))));
    assert!(matches!(f.kv("t.i8"), Some(Value::I8(-2))));
    assert!(matches!(f.kv("t.u16"), Some(Value::U16(60000))));
    assert!(matches!(f.kv("t.i16"), Some(Value::I16(-300))));
    assert_eq!(f.kv("t.u32").unwrap().as_int(), Some(4_000_000_000));
    assert_eq!(f.kv("t.i32").unwrap().as_int(), Some(-7));
    assert_eq!(f.kv("t.f32").unwrap().as_float(), Some(1.5));
    assert_eq!(f.kv("t.bool").unwrap().as_bool(), Some(true));
    assert_eq!(f.kv("t.u64").unwrap().as_int(), Some(u64::MAX as i128));
    assert_eq!(f.kv("t.i64").unwrap().as_int(), Some(-9));
    assert_eq!(f.kv("t.f64").unwrap().as_float(), Some(0.125));
    let strings: Vec<&str> =
        f.kv("t.strings").unwrap().as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(strings, ["a", "", "ĠHello"]);
    let nested = f.kv("t.nested").unwrap().as_array().unwrap();
    assert_eq!(nested.elem_type(), ValueType::Array);
    let inner: Vec<Vec<i128>> =
        nested.iter().map(|v| v.as_array().unwrap().iter().map(|x| x.as_int().unwrap()).collect()).collect();
    assert_eq!(inner, vec![vec![1, 2], vec![]]);
    assert_eq!(f.keys().count(), 14);

    let a = f.tensor_info("a.weight").unwrap();
    assert_eq!(
        (a.ne.clone(), a.shape(), a.ty, a.nbytes),
        (vec![3, 2], vec![2, 3], GgmlType::Weight(WeightFormat::F32), 24)
    );
    let vals: Vec<f32> = f.tensor_data(a).chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(vals, [1.0, 1.25, 1.5, 1.75, 2.0, 2.25]);
    let q = f.tensor_info("q.weight").unwrap();
    assert_eq!((q.ty, q.nbytes, q.offset), (GgmlType::Weight(WeightFormat::Q8_0), 4 * 34, 32));
    assert_eq!(f.tensor_data(q)[34 + 2 + 3], 6, "block 1 code 3 = 3·2");
    assert_eq!(f.tensor_info("ids").unwrap().ty, GgmlType::I32);
    assert!(f.tensor_data(f.tensor_info("v").unwrap()).len() == 20);
    assert_eq!(f.data_start() % 32, 0);
}

#[test]
fn refuses_bad_magic_and_versions() {
    let mut b = sample();
    b[0] = b'X';
    refused(b, &["not a GGUF file", "magic"]);
    let mut b = sample();
    b[4..8].copy_from_slice(&2u32.to_le_bytes());
    refused(b, &["GGUF version 2 is not supported"]);
    let mut b = sample();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    refused(b, &["big-endian"]);
    refused(b"GGU".to_vec(), &["truncated", "the magic"]);
}

#[test]
fn refuses_unknown_types_by_name() {
    // a fork's id 42 and Q4_0 (2): not implemented
    for id in [42u32, 2, 15] {
        let b = write(&[], &[tensor("blk.0.ffn_gate_exps.weight", &[32], id, vec![0; 64])], 32);
        refused(b, &["tensor `blk.0.ffn_gate_exps.weight`", &format!("ggml type id {id} is not one")]);
    }
    refused(write(&[kv("odd.key", 13, vec![0; 8])], &[], 32), &["key `odd.key`", "unknown value type id 13"]);
    refused(write(&[kv("odd.arr", 9, arr(99, 0, vec![]))], &[], 32), &["key `odd.arr`", "element type id 99"]);
}

#[test]
fn refuses_counts_and_lengths_that_cannot_fit() {
    // tensor and kv counts
    let mut b = sample();
    b[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    refused(b, &["tensors", "cannot fit"]);
    let mut b = sample();
    b[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
    refused(b, &["key-values", "cannot fit"]);
    // a string length
    let mut v = s("x");
    v[..8].copy_from_slice(&(1u64 << 50).to_le_bytes());
    refused(
        write(&[kv("big.string", 8, v)], &[], 32),
        &["value of key `big.string`", "string of 1125899906842624 bytes"],
    );
    // an array count
    refused(
        write(&[kv("big.arr", 9, arr(10, 1 << 61, vec![]))], &[], 32),
        &["key `big.arr`", "array of 2305843009213693952 u64"],
    );
    refused(write(&[kv("big.strs", 9, arr(8, 1 << 40, vec![]))], &[], 32), &["key `big.strs`", "cannot fit"]);
    // a key length
    let mut b = write(&[kv_u32("k", 1)], &[], 32);
    b[24..32].copy_from_slice(&(1u64 << 33).to_le_bytes());
    refused(b, &["key #0", "cannot fit", "string of"].map(|p| if p == "cannot fit" { "claims" } else { p }));
    // nesting
    let mut deep = arr(4, 0, vec![]);
    for _ in 0..5 {
        deep = arr(9, 1, deep);
    }
    refused(write(&[kv("deep", 9, deep)], &[], 32), &["key `deep`", "nested deeper than 4"]);
}

#[test]
fn refuses_truncation_anywhere() {
    let full = sample();
    let f = open(full.clone()).unwrap();
    let data_end = f.tensors().iter().map(|t| t.start + t.nbytes).max().unwrap();
    for cut in [3, 6, 12, 20, 30, 40, 100, 200, f.data_start() - 1, data_end - 1] {
        let e = open(full[..cut].to_vec()).expect_err(&format!("cut at {cut}")).to_string();
        // a short file fails the count check before the field it cuts is reached
        assert!(e.contains("truncated") || e.contains("cannot fit"), "cut {cut}: {e}");
    }
    // the trailing padding after the last tensor may go
    open(full[..data_end].to_vec()).unwrap();
}

#[test]
fn refuses_bad_tensor_infos_by_name() {
    let one = |t: Tensor| write(&[], &[t], 32);
    refused(one(tensor("t0", &[], 0, vec![])), &["tensor `t0`", "0 dimensions"]);
    refused(one(tensor("t5", &[1, 1, 1, 1, 1], 0, vec![0; 4])), &["tensor `t5`", "5 dimensions"]);
    refused(one(tensor("z", &[4, 0], 0, vec![])), &["tensor `z`", "zero dimension"]);
    refused(one(tensor("huge", &[1 << 40, 1 << 40], 0, vec![])), &["tensor `huge`", "overflows"]);
    refused(
        one(tensor("rows", &[48, 2], 8, vec![0; 34 * 3])),
        &["tensor `rows`", "48 is not a whole number of Q8_0 blocks"],
    );
    let mut t = f32_tensor("unaligned", &[4], 0.0);
    t.offset = Some(4);
    refused(one(t), &["tensor `unaligned`", "offset 4 is not a multiple of the alignment 32"]);
    let mut t = f32_tensor("far", &[4], 0.0);
    t.offset = Some(1 << 20);
    let mut b = one(t);
    b.truncate(b.len() - 20);
    refused(b, &["tensor `far`", "runs past the end"]);
    let mut t2 = f32_tensor("second", &[16], 0.0);
    t2.offset = Some(32);
    refused(write(&[], &[f32_tensor("first", &[16], 0.0), t2], 32), &["tensor `second`", "overlaps tensor `first`"]);
    refused(
        write(&[], &[f32_tensor("dup", &[4], 0.0), f32_tensor("dup", &[4], 1.0)], 32),
        &["tensor `dup` appears twice"],
    );
    refused(write(&[kv_u32("k", 1), kv_u32("k", 2)], &[], 32), &["key `k` appears twice"]);
    refused(write(&[kv_u32("general.alignment", 24)], &[], 32), &["`general.alignment`", "u32 24", "power of two"]);
    refused(write(&[kv_i32("general.alignment", 32)], &[], 32), &["`general.alignment`", "i32 32"]);
    // a valid non-default alignment
    let b = write(&[kv_u32("general.alignment", 64)], &[f32_tensor("a", &[3], 0.0), f32_tensor("b", &[3], 1.0)], 64);
    let f = open(b).unwrap();
    assert_eq!((f.alignment(), f.tensor_info("b").unwrap().offset, f.data_start() % 64), (64, 64, 0));
}

fn shard(no: u16, count: u16, total: i32, tensors: &[Tensor]) -> Vec<u8> {
    let kvs = vec![kv_u16("split.no", no), kv_u16("split.count", count), kv_i32("split.tensors.count", total)];
    write(&kvs, tensors, 32)
}

#[test]
fn split_models_open_from_the_first_shard() {
    let dir = tempfile::tempdir().unwrap();
    let p = |k: u32| dir.path().join(format!("m-{k:05}-of-00003.gguf"));
    std::fs::write(p(1), shard(0, 3, 4, &[f32_tensor("a", &[2], 0.0)])).unwrap();
    std::fs::write(p(2), shard(1, 3, 4, &[f32_tensor("b", &[2], 1.0), f32_tensor("c", &[1], 2.0)])).unwrap();
    std::fs::write(p(3), shard(2, 3, 4, &[f32_tensor("d", &[3], 3.0)])).unwrap();
    let g = Gguf::open(&p(1)).unwrap();
    assert_eq!((g.len(), g.files().len()), (4, 3));
    let (info, file) = g.tensor("c").unwrap();
    assert_eq!((info.nbytes, file), (4, p(2).as_path()));
    assert_eq!(g.data("d").unwrap(), [3.0f32, 3.25, 3.5].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    assert_eq!(g.type_stats()[&GgmlType::Weight(WeightFormat::F32)], (4, 8 * 4));

    let err = |path: &Path| Gguf::open(path).unwrap_err().to_string();
    let e = err(&p(2));
    assert!(e.contains("shard 2 of 3") && e.contains("pass the first shard"), "{e}");

    std::fs::write(p(3), shard(1, 3, 4, &[f32_tensor("d", &[3], 3.0)])).unwrap();
    let e = err(&p(1));
    assert!(e.contains("m-00003-of-00003.gguf") && e.contains("`split.no` is Some(1), expected 2"), "{e}");
    std::fs::write(p(3), shard(2, 4, 4, &[f32_tensor("d", &[3], 3.0)])).unwrap();
    assert!(err(&p(1)).contains("`split.count` is Some(4)"));
    std::fs::write(p(3), shard(2, 3, 5, &[f32_tensor("d", &[3], 3.0)])).unwrap();
    assert!(err(&p(1)).contains("`split.tensors.count`"));
    std::fs::write(p(3), shard(2, 3, 4, &[f32_tensor("a", &[3], 3.0)])).unwrap();
    let e = err(&p(1));
    assert!(e.contains("tensor `a` is also stored in") && e.contains("m-00001-of-00003.gguf"), "{e}");
    std::fs::write(p(3), shard(2, 3, 5, &[f32_tensor("d", &[3], 3.0), f32_tensor("e", &[3], 3.0)])).unwrap();
    std::fs::write(p(1), shard(0, 3, 5, &[f32_tensor("a", &[2], 0.0)])).unwrap();
    std::fs::write(p(2), shard(1, 3, 5, &[f32_tensor("b", &[2], 1.0)])).unwrap();
    let e = err(&p(1));
    assert!(e.contains("`split.tensors.count` is 5, but the 3 shards hold 4 tensors"), "{e}");
    std::fs::remove_file(p(3)).unwrap();
    let e = err(&p(1));
    assert!(e.contains("shard 3 of 3") && e.contains("does not exist"), "{e}");

    // a split key on a file whose name does not say where the others are
    let lone = dir.path().join("lone.gguf");
    std::fs::write(&lone, shard(0, 2, 1, &[f32_tensor("a", &[2], 0.0)])).unwrap();
    assert!(err(&lone).contains("does not follow NAME-00001-of-00002.gguf"));
}

/// Flip bytes, set counts and truncate at seeded positions of the header (and a little past it): each open
/// returns Ok or Err — never panics — and never allocates more than the file holds (neither in
/// one request nor in live bytes at the peak).
#[test]
fn mutated_headers_never_panic_or_over_allocate() {
    let base = sample();
    let header_end = open(base.clone()).unwrap().data_start();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    const ERROR_TEXT: usize = 1024;
    let (mut ok, mut err, mut max_ratio, mut max_one) = (0, 0, 0f64, 0f64);
    for round in 0..5000 {
        let mut b = base.clone();
        let pos = (next() % (header_end as u64 + 16)) as usize;
        match round % 5 {
            // a tensor or key-value count just inside what the count check lets through
            4 => {
                let at = if next() % 2 == 0 { 8 } else { 16 };
                b[at..at + 8].copy_from_slice(&(next() % (base.len() as u64 / 13 + 1)).to_le_bytes());
            }
            0 => b[pos] ^= 1 << (next() % 8),
            1 => b[pos] = next() as u8,
            // a length or count field set to something large
            2 => {
                let at = pos.min(b.len() - 8);
                b[at..at + 8].copy_from_slice(&(next() >> (next() % 64)).to_le_bytes());
            }
            _ => b.truncate(pos),
        }
        let len = b.len();
        let (result, peak, largest) = counted(|| std::panic::catch_unwind(|| open(b).map(|_| ())));
        let result = result.unwrap_or_else(|_| panic!("round {round}: open panicked (mutation at {pos})"));
        // The file image itself is not counted (allocated before `counted`). What is: the
        // header's names (at most the file's bytes), their containers (a tree node or hash table
        // per few hundred bytes of names, at most a few times the bytes they index) and one error
        // message (fixed text plus a quoted name). A reservation sized by a header count instead
        // of by the bytes left is 2^20 times past these bounds for the large counts drawn here.
        assert!(largest <= len + ERROR_TEXT, "round {round}: one allocation of {largest} bytes for a {len}-byte file");
        assert!(peak <= 4 * len + ERROR_TEXT, "round {round}: {peak} live bytes at the peak for a {len}-byte file");
        max_ratio = max_ratio.max(peak.saturating_sub(ERROR_TEXT) as f64 / len.max(1) as f64);
        max_one = max_one.max(largest.saturating_sub(ERROR_TEXT) as f64 / len.max(1) as f64);
        match result {
            Ok(()) => ok += 1,
            Err(e) => {
                assert!(e.to_string().starts_with("test.gguf: "), "{e}");
                err += 1;
            }
        }
    }
    eprintln!(
        "mutations: {ok} opened, {err} refused; peak heap / file bytes at most {max_ratio:.2}, one allocation {max_one:.2}"
    );
    assert!(ok > 100 && err > 1000, "ok {ok}, err {err}: the mutations should hit both outcomes");
}

/// A file written by llama.cpp's own gguf-py `GGUFWriter` (fixtures/gen/gguf/write_sample.py):
/// every key, type, shape, offset and data byte as that writer laid them out.
#[test]
fn reads_a_file_written_by_gguf_py() {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/gguf/sample.gguf"));
    let g = Gguf::open(path).unwrap();
    let f = g.meta();
    assert_eq!((f.version(), f.alignment(), g.len()), (3, 64, 4));
    assert_eq!(g.kv("general.architecture").unwrap().as_str(), Some("deepseek4"));
    assert_eq!(g.kv("general.name").unwrap().as_str(), Some("sample"));
    assert_eq!(g.kv("deepseek4.block_count").unwrap().as_int(), Some(5));
    assert_eq!(g.kv("deepseek4.attention.layer_norm_rms_epsilon").unwrap().as_float(), Some(1e-6f32 as f64));
    assert_eq!(g.kv("deepseek4.expert_weights_norm").unwrap().as_bool(), Some(true));
    let ratios: Vec<i128> = g
        .kv("deepseek4.attention.compress_ratios")
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_int().unwrap())
        .collect();
    assert_eq!(ratios, [0, 4, 128, 4, 0]);
    let tokens: Vec<&str> =
        g.kv("tokenizer.ggml.tokens").unwrap().as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(tokens, ["<｜begin▁of▁sentence｜>", "Ġthe", "a"]);
    let clamp = g.kv("deepseek4.swiglu_clamp_exp").unwrap().as_array().unwrap();
    assert_eq!(
        (clamp.elem_type(), clamp.iter().map(|v| v.as_float().unwrap()).collect::<Vec<_>>()),
        (ValueType::F32, vec![10.0, 10.0])
    );

    let (emb, _) = g.tensor("token_embd.weight").unwrap();
    assert_eq!((emb.ne.clone(), emb.shape(), emb.ty), (vec![4, 6], vec![6, 4], GgmlType::Weight(WeightFormat::F32)));
    let vals: Vec<f32> =
        g.data("token_embd.weight").unwrap().chunks(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
    assert_eq!(vals, (0..24).map(|i| i as f32 * 0.5 - 3.0).collect::<Vec<_>>());
    let (q, _) = g.tensor("blk.0.attn_q_a.weight").unwrap();
    assert_eq!(
        (q.ne.clone(), q.ty, q.nbytes, q.offset % 64),
        (vec![64, 2], GgmlType::Weight(WeightFormat::Q8_0), 4 * 34, 0)
    );
    // row 0 block 0 holds i/16 - 4 for i < 32: scale max|x| / 127 = 4/127 as f16
    let d = g.data("blk.0.attn_q_a.weight").unwrap();
    assert_eq!(half::f16::from_le_bytes([d[0], d[1]]), half::f16::from_f32(4.0 / 127.0));
    let (ids, _) = g.tensor("blk.0.ffn_gate_tid2eid.weight").unwrap();
    assert_eq!((ids.shape(), ids.ty), (vec![3, 2], GgmlType::I32));
    let ints: Vec<i32> = g
        .data("blk.0.ffn_gate_tid2eid.weight")
        .unwrap()
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(ints, [0, 1, 2, 3, 4, 5]);
    assert_eq!(g.tensor("output_norm.weight").unwrap().0.ty, GgmlType::Weight(WeightFormat::F16));
}
