//! The CPU lane's block decoders against goldens nobody here wrote: ggml's own `to_float`
//! (llama.cpp v0.5.0, through ctypes) for the GGUF formats, and a numpy transcription of
//! DeepSeek's FP8 dequantization for the two row-local FP8 formats
//! (`fixtures/gen/formats/make_format_goldens.py`). Decoding is exact arithmetic on the same
//! f32 operations in the same order, so the comparison is bit for bit (a NaN only has to be a
//! NaN: ggml does not define NaN payloads either).
//!
//! Then the CPU lane's weight ops (`linear`, `grouped_linear`, `moe_experts`, `embed_rows`):
//! each decodes a weight row with `decode_row` and runs the same f32 code as for an F32 weight,
//! so on a block-format weight they must equal, bit for bit, the same op on the decoded matrix.

mod common;

use std::borrow::Cow;
use std::collections::HashMap;

use fovea::backend::cpu::CpuBackend;
use fovea::backend::{Backend, HostTensor, HostWeight, WeightFormat, decode_row};
use safetensors::{Dtype, SafeTensors};

/// One golden file: `rows` rows of `cols` values in `format`.
struct Golden {
    format: WeightFormat,
    cols: usize,
    rows: usize,
    /// `rows × format.row_bytes(cols)` block bytes.
    blocks: Vec<u8>,
    /// `rows × cols` f32 values.
    values: Vec<f32>,
    /// Row ranges by kind ("quantized", "edge", "random"), from the file's metadata.
    kinds: HashMap<String, (usize, usize)>,
}

impl Golden {
    fn row_bytes(&self) -> usize {
        self.format.row_bytes(self.cols)
    }
    fn block_row(&self, r: usize) -> &[u8] {
        &self.blocks[r * self.row_bytes()..][..self.row_bytes()]
    }
    fn value_row(&self, r: usize) -> &[f32] {
        &self.values[r * self.cols..][..self.cols]
    }
}

fn golden(format: WeightFormat) -> Golden {
    let path = common::root().join(format!("fixtures/goldens/formats/{format}.safetensors"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
    let meta = meta.metadata().clone().unwrap_or_default();
    assert_eq!(meta.get("format").map(String::as_str), Some(format.name()), "{}", path.display());
    let cols: usize = meta["cols"].parse().unwrap();
    let kinds = meta
        .iter()
        .filter_map(|(k, v)| {
            let kind = k.strip_prefix("rows_")?;
            let (first, count) = v.split_once(':')?;
            Some((kind.to_string(), (first.parse().unwrap(), count.parse().unwrap())))
        })
        .collect();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let blocks = st.tensor("blocks").unwrap();
    let values = st.tensor("values").unwrap();
    assert_eq!((blocks.dtype(), values.dtype()), (Dtype::U8, Dtype::U32), "{format}");
    let rows = blocks.shape()[0];
    assert_eq!(blocks.shape(), [rows, format.row_bytes(cols)], "{format}: block bytes per row");
    assert_eq!(values.shape(), [rows, cols], "{format}: values");
    let values = values.data().chunks_exact(4).map(|c| f32::from_bits(u32::from_le_bytes(c.try_into().unwrap())));
    Golden { format, cols, rows, blocks: blocks.data().to_vec(), values: values.collect(), kinds }
}

fn block_formats() -> impl Iterator<Item = WeightFormat> {
    WeightFormat::ALL.into_iter().filter(|f| f.is_block())
}

/// Same f32 bits, or both NaN.
fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

/// Positions where `ours` and `want` differ (bit for bit, NaN as NaN), first few described.
fn differences(ours: &[f32], want: &[f32]) -> (usize, Vec<String>) {
    assert_eq!(ours.len(), want.len());
    let bad: Vec<usize> = (0..ours.len()).filter(|&i| !same(ours[i], want[i])).collect();
    let shown = bad
        .iter()
        .take(4)
        .map(|&i| {
            format!(
                "[{i}] {:e} ({:#010x}), want {:e} ({:#010x})",
                ours[i],
                ours[i].to_bits(),
                want[i],
                want[i].to_bits()
            )
        })
        .collect();
    (bad.len(), shown)
}

#[test]
fn every_block_format_decodes_bit_exactly_as_its_golden() {
    let mut failures = Vec::new();
    for format in block_formats() {
        let g = golden(format);
        // Guard against a golden that lost its content: every file has edge and random rows,
        // the ggml ones also quantized rows.
        let min_rows = |kind: &str| g.kinds.get(kind).map_or(0, |&(_, n)| n);
        assert!(min_rows("edge") >= 3 && min_rows("random") >= 2, "{format}: kinds {:?}", g.kinds);
        if format.ggml_type().is_some() {
            assert!(min_rows("quantized") >= 6, "{format}: kinds {:?}", g.kinds);
        }
        let mut out = vec![0f32; g.cols];
        for r in 0..g.rows {
            decode_row(format, g.block_row(r), &mut out);
            let (n, shown) = differences(&out, g.value_row(r));
            if n > 0 {
                let kind = g.kinds.iter().find(|(_, (f, c))| (*f..f + c).contains(&r)).map(|(k, _)| k.as_str());
                failures.push(format!("{format} row {r} ({}): {n} values differ: {shown:?}", kind.unwrap_or("?")));
            }
        }
        eprintln!("{format}: {} rows of {} values", g.rows, g.cols);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `n` rows of `cols` values for an op test, built from the golden's blocks whose decoded
/// values are all finite (so a sum is not NaN merely because one weight is): slot j of the
/// matrix takes finite block `(7·j + offset) mod count`, spreading different blocks over rows
/// and columns. Returns the block bytes and their decoded f32 twin.
fn matrix(g: &Golden, rows: usize, cols: usize, offset: usize) -> (Vec<u8>, Vec<f32>) {
    let (n, nb) = (g.format.block_elems(), g.format.block_bytes());
    let finite: Vec<usize> =
        (0..g.blocks.len() / nb).filter(|&b| g.values[b * n..(b + 1) * n].iter().all(|v| v.is_finite())).collect();
    assert!(finite.len() >= 4, "{}: only {} finite blocks", g.format, finite.len());
    let slots = rows * cols / n;
    let mut bytes = Vec::with_capacity(slots * nb);
    let mut values = Vec::with_capacity(slots * n);
    for j in 0..slots {
        let b = finite[(7 * j + offset) % finite.len()];
        bytes.extend_from_slice(&g.blocks[b * nb..(b + 1) * nb]);
        values.extend_from_slice(&g.values[b * n..(b + 1) * n]);
    }
    (bytes, values)
}

fn weight(name: &str, format: WeightFormat, rows: usize, cols: usize, bytes: Vec<u8>) -> HostWeight<'static> {
    HostWeight { name: name.into(), format, rows, cols, bytes: Cow::Owned(bytes) }
}

fn f32_weight(name: &str, rows: usize, cols: usize, values: &[f32]) -> HostWeight<'static> {
    let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    weight(name, WeightFormat::F32, rows, cols, bytes)
}

/// Deterministic activations in [−1, 1) (a 64-bit LCG: the values only need to be varied).
fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn download(b: &CpuBackend, t: &<CpuBackend as Backend>::Tensor) -> Vec<f32> {
    b.download(t).unwrap().into_f32("test").unwrap()
}

fn assert_same(what: &str, ours: &[f32], want: &[f32]) {
    // a comparison of all-zero or all-NaN outputs would prove nothing
    assert!(want.iter().any(|v| v.is_finite() && *v != 0.0), "{what}: reference has no finite nonzero value");
    let (n, shown) = differences(ours, want);
    assert_eq!(n, 0, "{what}: {n} of {} values differ: {shown:?}", ours.len());
}

#[test]
fn cpu_linear_and_grouped_linear_on_block_weights_equal_the_decoded_matrix() {
    let b = CpuBackend::new();
    for format in block_formats() {
        let g = golden(format);
        let (rows, cols) = (6, 2 * format.block_elems());
        let (bytes, values) = matrix(&g, rows, cols, 0);
        let wq = b.upload_weight(&weight("w", format, rows, cols, bytes)).unwrap();
        let wf = b.upload_weight(&f32_weight("w_f32", rows, cols, &values)).unwrap();

        let x = b.upload(&HostTensor::f32([3, cols], activations(3 * cols, 1)).unwrap()).unwrap();
        let bias = b.upload(&HostTensor::f32([rows], activations(rows, 2)).unwrap()).unwrap();
        let ours = download(&b, &b.linear(&x, &wq, Some(&bias)).unwrap());
        assert_same(&format!("{format} linear"), &ours, &download(&b, &b.linear(&x, &wf, Some(&bias)).unwrap()));

        // two groups of 3 output rows, each reading its own `cols` columns of x
        let x2 = b.upload(&HostTensor::f32([3, 2 * cols], activations(6 * cols, 3)).unwrap()).unwrap();
        let ours = download(&b, &b.grouped_linear(&x2, &wq, 2).unwrap());
        let want = download(&b, &b.grouped_linear(&x2, &wf, 2).unwrap());
        assert_same(&format!("{format} grouped_linear"), &ours, &want);
    }
}

#[test]
fn cpu_embed_rows_on_block_tables_gives_the_golden_rows() {
    let b = CpuBackend::new();
    for format in block_formats() {
        let g = golden(format);
        let table = b.upload_weight(&weight("embd", format, g.rows, g.cols, g.blocks.clone())).unwrap();
        // every row, in reverse, then one id past the table (a vision sentinel: a zero row)
        let ids: Vec<i32> = (0..g.rows as i32).rev().chain([g.rows as i32]).collect();
        let idt = b.upload(&HostTensor::i32([ids.len()], ids.clone()).unwrap()).unwrap();
        let ours = download(&b, &b.embed_rows(&table, &idt).unwrap());
        let mut want: Vec<f32> = ids[..g.rows].iter().flat_map(|&r| g.value_row(r as usize).to_vec()).collect();
        want.extend(std::iter::repeat_n(0.0, g.cols));
        assert_same(&format!("{format} embed_rows"), &ours, &want);
    }
}

#[test]
fn cpu_moe_experts_on_block_weights_equal_the_decoded_matrices() {
    let b = CpuBackend::new();
    for format in block_formats() {
        let g = golden(format);
        // d = 2 blocks, h = 1 block: w1, w3 [h, d], w2 [d, h]; three experts, two per token
        let (d, h) = (2 * format.block_elems(), format.block_elems());
        let (mut q, mut f) = ([vec![], vec![], vec![]], [vec![], vec![], vec![]]);
        for e in 0..3 {
            // a different walk through the block pool per matrix, so the experts differ
            for (p, (rows, cols)) in [(h, d), (h, d), (d, h)].into_iter().enumerate() {
                let (bytes, values) = matrix(&g, rows, cols, 3 * e + p);
                q[p].push(b.upload_weight(&weight("expert", format, rows, cols, bytes)).unwrap());
                f[p].push(b.upload_weight(&f32_weight("expert_f32", rows, cols, &values)).unwrap());
            }
        }
        let n = 3;
        let x = b.upload(&HostTensor::f32([n, d], activations(n * d, 4)).unwrap()).unwrap();
        let ids = b.upload(&HostTensor::i32([n, 2], vec![0, 2, 1, 0, 2, 1]).unwrap()).unwrap();
        let wts = b.upload(&HostTensor::f32([n, 2], activations(2 * n, 5)).unwrap()).unwrap();
        let ours = download(&b, &b.moe_experts(&x, &ids, &wts, &q[0], &q[1], &q[2], 7.0).unwrap());
        let want = download(&b, &b.moe_experts(&x, &ids, &wts, &f[0], &f[1], &f[2], 7.0).unwrap());
        assert_same(&format!("{format} moe_experts"), &ours, &want);
    }
}

#[test]
fn host_weight_checks_block_geometry_and_reads_block_rows() {
    let g = golden(WeightFormat::Q4_K);
    let w = weight("blk.0.ffn_down.weight", WeightFormat::Q4_K, g.rows, g.cols, g.blocks.clone());
    w.validate().unwrap();
    let mut row = vec![0f32; g.cols];
    w.row_f32(3, &mut row).unwrap();
    assert_same("Q4_K row_f32", &row, g.value_row(3));

    let err = |w: &HostWeight| w.validate().unwrap_err().to_string();
    // 384 columns: 1.5 Q4_K blocks per row (the bytes happen to be a whole number of blocks)
    let half_block = weight("blk.0.ffn_down.weight", WeightFormat::Q4_K, 4, 384, g.blocks[..6 * 144].to_vec());
    let e = err(&half_block);
    assert!(e.contains("blk.0.ffn_down.weight") && e.contains("256"), "{e}");
    let short = weight("blk.0.ffn_down.weight", WeightFormat::Q4_K, g.rows, g.cols, g.blocks[1..].to_vec());
    let e = err(&short);
    assert!(e.contains("blk.0.ffn_down.weight") && e.contains(&format!("expected {}", g.blocks.len())), "{e}");
    // a header claiming usize::MAX rows must not overflow the byte count
    let absurd = weight("blk.0.ffn_down.weight", WeightFormat::Q4_K, usize::MAX, g.cols, vec![]);
    assert!(err(&absurd).contains("more than fits"), "{}", err(&absurd));

    let e = w.row_f32(g.rows, &mut row).unwrap_err().to_string();
    assert!(e.contains("blk.0.ffn_down.weight") && e.contains(&format!("row {}", g.rows)), "{e}");
    let e = w.row_f32(0, &mut row[..256]).unwrap_err().to_string();
    assert!(e.contains("into 256 values"), "{e}");
}
