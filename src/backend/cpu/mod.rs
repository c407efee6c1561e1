//! CPU reference lane: a readable f32 implementation of every op of the contract. It is the
//! oracle the other lanes are compared with op by op, so clarity wins over speed; the only
//! concession to speed is splitting independent rows over threads in the two heavy ops
//! (`linear`, `attention`), which changes no arithmetic.

mod lm;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::backend::{
    Backend, Capacity, DType, DeviceTensor, DeviceWeight, HostData, HostTensor, HostWeight, MemoryReport, Op,
    WeightFormat, decode_row,
};
use crate::error::{Error, Result};

/// A host-memory tensor. Data is shared (`Arc`) so handles are cheap to clone.
#[derive(Clone, Debug)]
pub struct CpuTensor {
    shape: Vec<usize>,
    data: Arc<HostData>,
}

impl DeviceTensor for CpuTensor {
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn dtype(&self) -> DType {
        match *self.data {
            HostData::F32(_) => DType::F32,
            HostData::I32(_) => DType::I32,
        }
    }
}

impl CpuTensor {
    fn f32(&self, op: &'static str) -> Result<&[f32]> {
        match &*self.data {
            HostData::F32(v) => Ok(v),
            HostData::I32(_) => Err(Error::shape(op, "expected an f32 tensor, found i32")),
        }
    }
    fn i32(&self, op: &'static str) -> Result<&[i32]> {
        match &*self.data {
            HostData::I32(v) => Ok(v),
            HostData::F32(_) => Err(Error::shape(op, "expected an i32 index tensor, found f32")),
        }
    }
    fn new_f32(shape: Vec<usize>, data: Vec<f32>) -> Self {
        CpuTensor { shape, data: Arc::new(HostData::F32(data)) }
    }
}

/// A weight matrix kept in its storage format; rows are decoded to f32 inside `linear`.
#[derive(Clone, Debug)]
pub struct CpuWeight {
    format: WeightFormat,
    rows: usize,
    cols: usize,
    bytes: Arc<Vec<u8>>,
}

impl DeviceWeight for CpuWeight {
    fn format(&self) -> WeightFormat {
        self.format
    }
    fn rows(&self) -> usize {
        self.rows
    }
    fn cols(&self) -> usize {
        self.cols
    }
}

/// Ops of fewer multiply-adds than this run on the calling thread: spawning and joining a
/// thread costs tens of microseconds, as much as ~10⁵ multiply-adds (a decode step of a small
/// model is hundreds of such ops; spawning for each made thread start-up most of its time).
const PAR_MIN_WORK: usize = 1 << 17;

/// The CPU lane. `threads` bounds the row-parallel split of the heavy ops.
pub struct CpuBackend {
    threads: usize,
    weight_bytes: AtomicU64,
    matrix_bytes: AtomicU64,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        CpuBackend { threads, weight_bytes: AtomicU64::new(0), matrix_bytes: AtomicU64::new(0) }
    }

    /// How many threads an op of about `work` multiply-adds is split over: one (the calling
    /// thread, nothing spawned) below [`PAR_MIN_WORK`].
    fn workers(&self, work: usize) -> usize {
        if work < PAR_MIN_WORK { 1 } else { self.threads.max(1) }
    }

    /// Run `f(row_range, out_chunk)` over `rows` output rows of width `width`, split across threads
    /// when the op's `work` (multiply-adds) pays for them.
    fn par_rows(
        &self,
        rows: usize,
        width: usize,
        work: usize,
        f: impl Fn(std::ops::Range<usize>, &mut [f32]) + Sync,
    ) -> Vec<f32> {
        let mut out = vec![0f32; rows * width];
        if rows == 0 || width == 0 {
            return out;
        }
        let workers = self.workers(work).min(rows);
        if workers == 1 {
            f(0..rows, &mut out);
            return out;
        }
        let per = rows.div_ceil(workers);
        std::thread::scope(|s| {
            for (i, chunk) in out.chunks_mut(per * width).enumerate() {
                let start = i * per;
                let f = &f;
                s.spawn(move || f(start..start + chunk.len() / width, chunk));
            }
        });
        out
    }
}

fn check_2d(op: &'static str, what: &str, t: &CpuTensor) -> Result<(usize, usize)> {
    if t.shape.len() != 2 {
        return Err(Error::shape(op, format!("{what} must be 2-D, got shape {:?}", t.shape)));
    }
    Ok((t.shape[0], t.shape[1]))
}

fn check_heads(op: &'static str, cols: usize, n_heads: usize) -> Result<usize> {
    if n_heads == 0 || cols % n_heads != 0 {
        return Err(Error::shape(op, format!("{cols} columns do not split into {n_heads} heads")));
    }
    Ok(cols / n_heads)
}

/// 2-D RoPE cos/sin tables in f32, exactly as the reference builds them: `inv_freq[j] =
/// 1/θ^(2j/(hd/2))` for `j < hd/4`; angle = pos·inv_freq with pos = row for the first hd/4
/// frequencies and col for the next hd/4. Returns `[n, hd/2]` cos and sin.
pub fn rope_2d_tables(n: usize, grid_w: usize, head_dim: usize, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let half = head_dim / 2; // rotated pairs per head
    let quarter = head_dim / 4; // frequencies per axis
    // torch: 1.0 / (theta ** (torch.arange(0, half, 2, dtype=float32) / half))
    let inv_freq: Vec<f32> = (0..quarter).map(|j| 1.0f32 / theta.powf((2 * j) as f32 / half as f32)).collect();
    let mut cos = vec![0f32; n * half];
    let mut sin = vec![0f32; n * half];
    for p in 0..n {
        let (row, col) = ((p / grid_w) as f32, (p % grid_w) as f32);
        for d in 0..half {
            let angle = if d < quarter { row * inv_freq[d] } else { col * inv_freq[d - quarter] };
            cos[p * half + d] = angle.cos();
            sin[p * half + d] = angle.sin();
        }
    }
    (cos, sin)
}

impl Backend for CpuBackend {
    type Tensor = CpuTensor;
    type Weight = CpuWeight;

    fn lane(&self) -> &'static str {
        "cpu"
    }

    fn device_name(&self) -> String {
        format!("CPU reference ({} threads)", self.threads)
    }

    fn supports(&self, _op: Op, _format: WeightFormat) -> bool {
        true
    }

    fn memory(&self) -> MemoryReport {
        MemoryReport {
            weight_bytes: self.weight_bytes.load(Ordering::Relaxed),
            matrix_bytes: self.matrix_bytes.load(Ordering::Relaxed),
            ..Default::default()
        }
    }

    /// The host's memory: `MemAvailable` and `MemTotal` of /proc/meminfo (Linux), within the
    /// memory limit of this process's cgroup when it has one (a container's `--memory`: the
    /// kernel kills a process past it however much the host has free).
    fn capacity(&self) -> Option<Capacity> {
        let info = std::fs::read_to_string("/proc/meminfo").ok()?;
        let kib = |key: &str| -> Option<u64> {
            let line = info.lines().find(|l| l.starts_with(key))?;
            line[key.len()..].trim().trim_end_matches("kB").trim().parse::<u64>().ok().map(|k| k * 1024)
        };
        let host = Capacity { free_bytes: kib("MemAvailable:")?, total_bytes: kib("MemTotal:")? };
        Some(match cgroup_memory_limit() {
            Some((limit, usage)) => within_limit(host, limit, usage),
            None => host,
        })
    }

    fn upload(&self, host: &HostTensor) -> Result<CpuTensor> {
        Ok(CpuTensor { shape: host.shape.clone(), data: Arc::new(host.data.clone()) })
    }

    fn upload_param(&self, host: &HostTensor) -> Result<CpuTensor> {
        self.weight_bytes.fetch_add(host.numel() as u64 * 4, Ordering::Relaxed);
        self.upload(host)
    }

    fn upload_weight(&self, w: &HostWeight<'_>) -> Result<CpuWeight> {
        w.validate()?;
        // validated: the bytes are exactly the rows as stored, which the lane keeps
        let bytes = Self::weight_alloc_bytes(w.format, w.rows, w.cols);
        self.weight_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.matrix_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(CpuWeight { format: w.format, rows: w.rows, cols: w.cols, bytes: Arc::new(w.bytes.to_vec()) })
    }

    fn download(&self, t: &CpuTensor) -> Result<HostTensor> {
        Ok(HostTensor { shape: t.shape.clone(), data: (*t.data).clone() })
    }

    // every op has finished when it returns
    fn sync(&self) -> Result<()> {
        Ok(())
    }

    // x [n, in] · W[out, in]ᵀ + b[out] → [n, out]; each weight row decoded to f32 once.
    fn linear(&self, x: &CpuTensor, w: &CpuWeight, bias: Option<&CpuTensor>) -> Result<CpuTensor> {
        let (n, k) = check_2d("linear", "x", x)?;
        if k != w.cols {
            return Err(Error::shape("linear", format!("x has {k} columns, weight expects {}", w.cols)));
        }
        let xs = x.f32("linear")?;
        let b = match bias {
            Some(b) if b.shape.iter().product::<usize>() != w.rows => {
                return Err(Error::shape("linear", format!("bias has shape {:?}, expected [{}]", b.shape, w.rows)));
            }
            Some(b) => Some(b.f32("linear")?),
            None => None,
        };
        let out_cols = w.rows;
        if k == 0 {
            // empty sums: the bias alone
            let out = (0..n * out_cols).map(|e| b.map_or(0.0, |b| b[e % out_cols])).collect();
            return Ok(CpuTensor::new_f32(vec![n, out_cols], out));
        }
        let row_bytes = w.format.row_bytes(k);
        // Parallelise over output columns (weight rows) so each thread decodes its own rows.
        let per = out_cols.div_ceil(self.workers(n.max(1) * k * out_cols)).max(1);
        // x's rows in blocks of ROW_BLOCK, transposed: xt[blk][j·ROW_BLOCK + r] = x[blk·ROW_BLOCK + r][j],
        // so that a block's sums take one vector of x a weight element
        const ROW_BLOCK: usize = 8;
        let blocks = n / ROW_BLOCK;
        let mut xt = vec![0f32; blocks * ROW_BLOCK * k];
        for (blk, t) in xt.chunks_exact_mut(ROW_BLOCK * k).enumerate() {
            for r in 0..ROW_BLOCK {
                for (j, &v) in xs[(blk * ROW_BLOCK + r) * k..(blk * ROW_BLOCK + r + 1) * k].iter().enumerate() {
                    t[j * ROW_BLOCK + r] = v;
                }
            }
        }
        // Rows past the blocks of eight (a lone decode step's row, an expert's few) meet COL_GROUP
        // weight rows at once instead: that many sums that do not wait on each other.
        const COL_GROUP: usize = 4;
        // out_t[o - o0][i] = dot(x[i], W[o]) + b[o] for weight rows o0..o1. Every sum adds its
        // products in j order from -0.0, whichever block it is in, so a row's result is the same
        // bits alone or in a batch.
        let columns = |o0: usize, o1: usize| {
            let mut wrows = vec![0f32; COL_GROUP * k];
            let mut out_t = vec![0f32; (o1 - o0) * n];
            let bias_of = |o: usize| b.map_or(0.0, |b| b[o]);
            let mut o = o0;
            while o < o1 {
                let g = COL_GROUP.min(o1 - o);
                for (c, wrow) in wrows.chunks_exact_mut(k).take(g).enumerate() {
                    decode_row(w.format, &w.bytes[(o + c) * row_bytes..(o + c + 1) * row_bytes], wrow);
                }
                for (c, wrow) in wrows.chunks_exact(k).take(g).enumerate() {
                    let bo = bias_of(o + c);
                    let out_o = &mut out_t[(o + c - o0) * n..(o + c - o0 + 1) * n];
                    // ROW_BLOCK rows at a time: a batched decode step's 8 rows cost about one
                    // row's chain of additions
                    for (blk, t) in xt.chunks_exact(ROW_BLOCK * k).enumerate() {
                        let mut acc = [-0.0f32; ROW_BLOCK];
                        for (xj, &wj) in t.chunks_exact(ROW_BLOCK).zip(wrow) {
                            for r in 0..ROW_BLOCK {
                                acc[r] += xj[r] * wj;
                            }
                        }
                        for (r, a) in acc.into_iter().enumerate() {
                            out_o[blk * ROW_BLOCK + r] = a + bo;
                        }
                    }
                }
                for i in blocks * ROW_BLOCK..n {
                    let xi = &xs[i * k..(i + 1) * k];
                    let mut acc = [-0.0f32; COL_GROUP];
                    if g == COL_GROUP {
                        let (w0, w1, w2, w3) = (&wrows[..k], &wrows[k..2 * k], &wrows[2 * k..3 * k], &wrows[3 * k..]);
                        for (j, &xv) in xi.iter().enumerate() {
                            acc[0] += xv * w0[j];
                            acc[1] += xv * w1[j];
                            acc[2] += xv * w2[j];
                            acc[3] += xv * w3[j];
                        }
                    } else {
                        for (c, wrow) in wrows.chunks_exact(k).take(g).enumerate() {
                            acc[c] = xi.iter().zip(wrow).fold(-0.0f32, |a, (&xv, &wv)| a + xv * wv);
                        }
                    }
                    for (c, a) in acc.into_iter().take(g).enumerate() {
                        out_t[(o + c - o0) * n + i] = a + bias_of(o + c);
                    }
                }
                o += g;
            }
            out_t
        };
        let cols_out: Vec<Vec<f32>> = if per >= out_cols {
            vec![columns(0, out_cols)]
        } else {
            std::thread::scope(|s| {
                let handles: Vec<_> = (0..out_cols)
                    .step_by(per)
                    .map(|o0| {
                        let columns = &columns;
                        s.spawn(move || columns(o0, (o0 + per).min(out_cols)))
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().expect("linear worker panicked")).collect()
            })
        };
        let mut out = vec![0f32; n * out_cols];
        for (c, chunk) in cols_out.iter().enumerate() {
            let o0 = c * per;
            let width = chunk.len() / n.max(1);
            for j in 0..width {
                for i in 0..n {
                    out[i * out_cols + o0 + j] = chunk[j * n + i];
                }
            }
        }
        Ok(CpuTensor::new_f32(vec![n, out_cols], out))
    }

    // x [n, d] → x · rsqrt(mean(x²) + eps) · weight[d], per row.
    fn rms_norm(&self, x: &CpuTensor, weight: &CpuTensor, eps: f32) -> Result<CpuTensor> {
        let (n, d) = check_2d("rms_norm", "x", x)?;
        let w = weight.f32("rms_norm")?;
        if w.len() != d {
            return Err(Error::shape("rms_norm", format!("weight has {} elements, x has {d} columns", w.len())));
        }
        let xs = x.f32("rms_norm")?;
        let mut out = vec![0f32; n * d];
        for i in 0..n {
            let row = &xs[i * d..(i + 1) * d];
            let mean_sq = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (mean_sq + eps).sqrt();
            for j in 0..d {
                out[i * d + j] = row[j] * inv * w[j];
            }
        }
        Ok(CpuTensor::new_f32(vec![n, d], out))
    }

    // a [n, d] + b [n, d] → [n, d]
    fn add(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        if a.shape != b.shape {
            return Err(Error::shape("add", format!("shapes {:?} and {:?} differ", a.shape, b.shape)));
        }
        let (xa, xb) = (a.f32("add")?, b.f32("add")?);
        Ok(CpuTensor::new_f32(a.shape.clone(), xa.iter().zip(xb).map(|(p, q)| p + q).collect()))
    }

    // x [n, d] → x[:, start..start+len] [n, len]
    fn slice_cols(&self, x: &CpuTensor, start: usize, len: usize) -> Result<CpuTensor> {
        let (n, d) = check_2d("slice_cols", "x", x)?;
        if start + len > d {
            return Err(Error::shape("slice_cols", format!("columns {start}..{} out of {d}", start + len)));
        }
        let xs = x.f32("slice_cols")?;
        let out = (0..n).flat_map(|i| xs[i * d + start..i * d + start + len].iter().copied()).collect();
        Ok(CpuTensor::new_f32(vec![n, len], out))
    }

    // a [n, d], b [m, d] → [n+m, d]
    fn concat_rows(&self, a: &CpuTensor, b: &CpuTensor) -> Result<CpuTensor> {
        let (n, d) = check_2d("concat_rows", "a", a)?;
        let (m, d2) = check_2d("concat_rows", "b", b)?;
        if d != d2 {
            return Err(Error::shape("concat_rows", format!("column counts {d} and {d2} differ")));
        }
        let data = match (&*a.data, &*b.data) {
            (HostData::F32(x), HostData::F32(y)) => HostData::F32([x.as_slice(), y].concat()),
            (HostData::I32(x), HostData::I32(y)) => HostData::I32([x.as_slice(), y].concat()),
            _ => return Err(Error::shape("concat_rows", format!("a is {}, b is {}", a.dtype(), b.dtype()))),
        };
        Ok(CpuTensor { shape: vec![n + m, d], data: Arc::new(data) })
    }

    // src [m, d], idx [n] → out[i] = src[idx[i]]  [n, d]
    fn gather_rows(&self, src: &CpuTensor, idx: &CpuTensor) -> Result<CpuTensor> {
        let (m, d) = check_2d("gather_rows", "src", src)?;
        let xs = src.f32("gather_rows")?;
        let ids = idx.i32("gather_rows")?;
        let mut out = Vec::with_capacity(ids.len() * d);
        for &r in ids {
            if r < 0 || r as usize >= m {
                return Err(Error::shape("gather_rows", format!("index {r} out of 0..{m}")));
            }
            out.extend_from_slice(&xs[r as usize * d..(r as usize + 1) * d]);
        }
        Ok(CpuTensor::new_f32(vec![ids.len(), d], out))
    }

    // x [n, 2h] → silu(x[:, :h]) * x[:, h:]  [n, h]
    fn swiglu(&self, x: &CpuTensor) -> Result<CpuTensor> {
        const OP: &str = "swiglu";
        let (n, d2) = check_2d(OP, "x", x)?;
        if d2 % 2 != 0 {
            return Err(Error::shape(OP, format!("{d2} columns is not even")));
        }
        let h = d2 / 2;
        let xs = x.f32(OP)?;
        let mut out = vec![0f32; n * h];
        for i in 0..n {
            for j in 0..h {
                let (g, u) = (xs[i * d2 + j], xs[i * d2 + h + j]);
                out[i * h + j] = g / (1.0 + (-g).exp()) * u;
            }
        }
        Ok(CpuTensor::new_f32(vec![n, h], out))
    }

    // x [n, d] → x/2 · (1 + erf(x/√2))  [n, d]
    fn gelu_erf(&self, x: &CpuTensor) -> Result<CpuTensor> {
        let xs = x.f32("gelu_erf")?;
        let out = xs
            .iter()
            .map(|&v| (0.5 * v as f64 * (1.0 + libm::erf(v as f64 / std::f64::consts::SQRT_2))) as f32)
            .collect();
        Ok(CpuTensor::new_f32(x.shape.clone(), out))
    }

    // x [n, heads·hd] → each head rotated: (x[d], x[d+hd/2]) by the 2-D angle of row p.
    fn rope_2d(&self, x: &CpuTensor, n_heads: usize, grid_w: usize, theta: f32) -> Result<CpuTensor> {
        let (n, cols) = check_2d("rope_2d", "x", x)?;
        let hd = check_heads("rope_2d", cols, n_heads)?;
        if hd % 4 != 0 || grid_w == 0 || n % grid_w != 0 {
            return Err(Error::shape(
                "rope_2d",
                format!("head_dim {hd} must be a multiple of 4 and {n} rows a multiple of grid_w {grid_w}"),
            ));
        }
        let half = hd / 2;
        let (cos, sin) = rope_2d_tables(n, grid_w, hd, theta);
        let xs = x.f32("rope_2d")?;
        let mut out = xs.to_vec();
        for p in 0..n {
            for h in 0..n_heads {
                let base = p * cols + h * hd;
                for d in 0..half {
                    let (c, s) = (cos[p * half + d], sin[p * half + d]);
                    let (x1, x2) = (xs[base + d], xs[base + d + half]);
                    out[base + d] = x1 * c - x2 * s;
                    out[base + d + half] = x2 * c + x1 * s;
                }
            }
        }
        Ok(CpuTensor::new_f32(x.shape.clone(), out))
    }

    // q, k, v [n, heads·hd] → softmax(q·kᵀ/√hd)·v per head, no mask  [n, heads·hd]
    fn attention(&self, q: &CpuTensor, k: &CpuTensor, v: &CpuTensor, n_heads: usize) -> Result<CpuTensor> {
        let (n, cols) = check_2d("attention", "q", q)?;
        if k.shape != q.shape || v.shape != q.shape {
            return Err(Error::shape("attention", format!("q {:?}, k {:?}, v {:?} differ", q.shape, k.shape, v.shape)));
        }
        let hd = check_heads("attention", cols, n_heads)?;
        let (qs, ks, vs) = (q.f32("attention")?, k.f32("attention")?, v.f32("attention")?);
        let scale = 1.0 / (hd as f32).sqrt();
        let out = self.par_rows(n, cols, 2 * n * n * cols, |rows, out| {
            let mut scores = vec![0f32; n];
            for (r, i) in rows.enumerate() {
                for h in 0..n_heads {
                    let qi = &qs[i * cols + h * hd..][..hd];
                    let mut max = f32::NEG_INFINITY;
                    for (j, s) in scores.iter_mut().enumerate() {
                        let kj = &ks[j * cols + h * hd..][..hd];
                        *s = qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f32>() * scale;
                        max = max.max(*s);
                    }
                    let mut denom = 0f32;
                    for s in scores.iter_mut() {
                        *s = (*s - max).exp();
                        denom += *s;
                    }
                    let o = &mut out[r * cols + h * hd..][..hd];
                    for (j, s) in scores.iter().enumerate() {
                        let vj = &vs[j * cols + h * hd..][..hd];
                        let p = s / denom;
                        for (od, vd) in o.iter_mut().zip(vj) {
                            *od += p * vd;
                        }
                    }
                }
            }
        });
        Ok(CpuTensor::new_f32(vec![n, cols], out))
    }

    // x [h·w, c] → zero-pad to [ceil(h/r)·r, ceil(w/r)·r] → [ceil(h/r)·ceil(w/r), c·r·r], feature ch·r²+dy·r+dx
    fn unfold(&self, x: &CpuTensor, h: usize, w: usize, r: usize) -> Result<CpuTensor> {
        let (n, c) = check_2d("unfold", "x", x)?;
        if n != h * w || r == 0 {
            return Err(Error::shape("unfold", format!("{n} rows is not a {h}x{w} grid (r = {r})")));
        }
        let (oh, ow) = (h.div_ceil(r), w.div_ceil(r));
        let feat = c * r * r;
        let xs = x.f32("unfold")?;
        let mut out = vec![0f32; oh * ow * feat];
        for by in 0..oh {
            for bx in 0..ow {
                let cell = &mut out[(by * ow + bx) * feat..][..feat];
                for dy in 0..r {
                    for dx in 0..r {
                        let (y, xx) = (by * r + dy, bx * r + dx);
                        if y >= h || xx >= w {
                            continue; // zero padding
                        }
                        let src = &xs[(y * w + xx) * c..][..c];
                        for ch in 0..c {
                            cell[ch * r * r + dy * r + dx] = src[ch];
                        }
                    }
                }
            }
        }
        Ok(CpuTensor::new_f32(vec![oh * ow, feat], out))
    }

    // ---- language model (implementations in `lm.rs`) ----------------------------------------
    fn embed_rows(&self, table: &CpuWeight, ids: &CpuTensor) -> Result<CpuTensor> {
        lm::embed_rows(table, ids)
    }
    fn hc_expand(&self, x: &CpuTensor, hc: usize) -> Result<CpuTensor> {
        lm::hc_expand(x, hc)
    }
    fn rms_norm_heads(&self, x: &CpuTensor, n_heads: usize, eps: f32) -> Result<CpuTensor> {
        lm::rms_norm_heads(x, n_heads, eps)
    }
    fn hc_split(
        &self,
        mix: &CpuTensor,
        scale: &CpuTensor,
        base: &CpuTensor,
        hc: usize,
        iters: usize,
        eps: f32,
    ) -> Result<CpuTensor> {
        lm::hc_split(mix, scale, base, hc, iters, eps)
    }
    fn hc_pre(&self, x: &CpuTensor, w: &CpuTensor, hc: usize) -> Result<CpuTensor> {
        lm::hc_pre(x, w, hc)
    }
    fn hc_post(&self, x: &CpuTensor, f: &CpuTensor, split: &CpuTensor) -> Result<CpuTensor> {
        lm::hc_post(x, f, split)
    }
    fn hc_head_weights(&self, mix: &CpuTensor, scale: &CpuTensor, base: &CpuTensor, eps: f32) -> Result<CpuTensor> {
        lm::hc_head_weights(mix, scale, base, eps)
    }
    fn rope_tail(
        &self,
        x: &CpuTensor,
        n_heads: usize,
        inv_freq: &CpuTensor,
        pos0: usize,
        stride: usize,
        inverse: bool,
    ) -> Result<CpuTensor> {
        lm::rope_tail(x, n_heads, inv_freq, pos0, stride, inverse)
    }
    fn rope_tail_at(
        &self,
        x: &CpuTensor,
        n_heads: usize,
        inv_freq: &CpuTensor,
        positions: &CpuTensor,
        inverse: bool,
    ) -> Result<CpuTensor> {
        lm::rope_tail_at(x, n_heads, inv_freq, positions, inverse)
    }
    fn sink_attention(
        &self,
        q: &CpuTensor,
        kv: &CpuTensor,
        window: &CpuTensor,
        comp: Option<(&CpuTensor, &CpuTensor)>,
        sinks: &CpuTensor,
        n_heads: usize,
    ) -> Result<CpuTensor> {
        lm::sink_attention(self, q, kv, window, comp, sinks, n_heads)
    }
    fn grouped_linear(&self, x: &CpuTensor, w: &CpuWeight, groups: usize) -> Result<CpuTensor> {
        lm::grouped_linear(x, w, groups)
    }
    fn compress_pool(
        &self,
        kv: &CpuTensor,
        gate: &CpuTensor,
        ape: &CpuTensor,
        ratio: usize,
        overlap: bool,
    ) -> Result<CpuTensor> {
        lm::compress_pool(kv, gate, ape, ratio, overlap)
    }
    fn indexer_scores(
        &self,
        q: &CpuTensor,
        k: &CpuTensor,
        w: &CpuTensor,
        n_heads: usize,
        scale: f32,
        pos0: usize,
        ratio: usize,
    ) -> Result<CpuTensor> {
        lm::indexer_scores(q, k, w, n_heads, scale, pos0, ratio)
    }
    fn topk_rows(&self, x: &CpuTensor, k: usize) -> Result<CpuTensor> {
        lm::topk_rows(x, k)
    }
    fn sqrt_softplus(&self, x: &CpuTensor) -> Result<CpuTensor> {
        lm::sqrt_softplus(x)
    }
    fn hash_route(&self, table: &CpuTensor, ids: &CpuTensor, fallback: &CpuTensor) -> Result<CpuTensor> {
        lm::hash_route(table, ids, fallback)
    }
    fn route_weights(&self, scores: &CpuTensor, ids: &CpuTensor, scale: f32) -> Result<CpuTensor> {
        lm::route_weights(scores, ids, scale)
    }
    fn swiglu_clamp(&self, g: &CpuTensor, u: &CpuTensor, limit: f32) -> Result<CpuTensor> {
        lm::swiglu_clamp(g, u, limit)
    }
    fn moe_experts(
        &self,
        x: &CpuTensor,
        ids: &CpuTensor,
        weights: &CpuTensor,
        w1: &[CpuWeight],
        w3: &[CpuWeight],
        w2: &[CpuWeight],
        limit: f32,
    ) -> Result<CpuTensor> {
        lm::moe_experts(self, x, ids, weights, w1, w3, w2, limit)
    }
}

/// `(limit, usage)` in bytes of the memory cgroup this process is in, when it sets a limit:
/// cgroup v2 (`memory.max`, `memory.current`) or v1 (`memory.limit_in_bytes`,
/// `memory.usage_in_bytes`), at the path /proc/self/cgroup names under /sys/fs/cgroup, else at
/// the hierarchy's root (inside a container's cgroup namespace the path reads "/").
fn cgroup_memory_limit() -> Option<(u64, u64)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |dir: &str, file: &str| std::fs::read_to_string(format!("{dir}/{file}")).ok();
    for (dir, max, current) in cgroup_memory_dirs(&own) {
        if let (Some(m), Some(c)) = (read(&dir, max), read(&dir, current))
            && let Some(limit) = parse_cgroup_limit(&m)
        {
            return Some((limit, c.trim().parse().ok()?));
        }
    }
    None
}

/// The directories (with their limit and usage files) to look for this process's memory limit
/// in, given /proc/self/cgroup: its own group first, then the hierarchy's root, v2 before v1.
fn cgroup_memory_dirs(own: &str) -> Vec<(String, &'static str, &'static str)> {
    let mut dirs = Vec::new();
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next()) else { continue };
        let path = path.trim_end_matches('/');
        if controllers.is_empty() {
            dirs.push((format!("/sys/fs/cgroup{path}"), "memory.max", "memory.current"));
        } else if controllers.split(',').any(|c| c == "memory") {
            dirs.push((format!("/sys/fs/cgroup/memory{path}"), "memory.limit_in_bytes", "memory.usage_in_bytes"));
        }
    }
    let roots = [
        ("/sys/fs/cgroup".to_string(), "memory.max", "memory.current"),
        ("/sys/fs/cgroup/memory".to_string(), "memory.limit_in_bytes", "memory.usage_in_bytes"),
    ];
    for root in roots {
        if !dirs.contains(&root) {
            dirs.push(root);
        }
    }
    dirs
}

/// A cgroup memory limit file's bytes, or `None` when it sets no limit: v2 writes `max`, v1 a
/// page-rounded `i64::MAX` (anything past 2^62 bytes is no limit in practice).
fn parse_cgroup_limit(text: &str) -> Option<u64> {
    let v: u64 = text.trim().parse().ok()?;
    (v < 1 << 62).then_some(v)
}

/// The host's capacity within a cgroup limit: at most `limit` in all and `limit - usage` free.
fn within_limit(host: Capacity, limit: u64, usage: u64) -> Capacity {
    Capacity { free_bytes: host.free_bytes.min(limit.saturating_sub(usage)), total_bytes: host.total_bytes.min(limit) }
}

#[cfg(test)]
mod tests {
    use super::{Capacity, cgroup_memory_dirs, parse_cgroup_limit, within_limit};

    /// A container's memory limit caps what the CPU lane reports free and in all; "no limit"
    /// in either cgroup version leaves the host's figures.
    #[test]
    fn capacity_stays_within_a_cgroup_memory_limit() {
        assert_eq!(parse_cgroup_limit("max\n"), None);
        assert_eq!(parse_cgroup_limit("9223372036854771712\n"), None);
        assert_eq!(parse_cgroup_limit("8589934592\n"), Some(8 << 30));
        assert_eq!(parse_cgroup_limit("garbage"), None);
        let host = Capacity { free_bytes: 20 << 30, total_bytes: 24 << 30 };
        assert_eq!(within_limit(host, 8 << 30, 3 << 30), Capacity { free_bytes: 5 << 30, total_bytes: 8 << 30 });
        assert_eq!(within_limit(host, 8 << 30, 9 << 30), Capacity { free_bytes: 0, total_bytes: 8 << 30 });
        assert_eq!(within_limit(host, 64 << 30, 1 << 30), host);
        let v2 = cgroup_memory_dirs("0::/user.slice/docker-1.scope\n");
        assert_eq!(v2[0], ("/sys/fs/cgroup/user.slice/docker-1.scope".into(), "memory.max", "memory.current"));
        let v1 = cgroup_memory_dirs("5:devices:/\n4:memory:/process_api/ab\n0::/\n");
        assert_eq!(
            v1[0],
            ("/sys/fs/cgroup/memory/process_api/ab".into(), "memory.limit_in_bytes", "memory.usage_in_bytes")
        );
        // the roots once each, after the process's own groups
        assert_eq!(v1.len(), 3);
        assert_eq!(v1[1], ("/sys/fs/cgroup".into(), "memory.max", "memory.current"));
    }

    use super::*;

    fn t(b: &CpuBackend, shape: &[usize], v: Vec<f32>) -> CpuTensor {
        b.upload(&HostTensor::f32(shape.to_vec(), v).unwrap()).unwrap()
    }
    fn get(b: &CpuBackend, x: &CpuTensor) -> Vec<f32> {
        b.download(x).unwrap().into_f32("test").unwrap()
    }

    #[test]
    fn unfold_orders_features_channel_then_dy_then_dx_and_zero_pads() {
        // 2x4 grid, 2 channels, value = 100·ch + 10·y + x; r = 3 → 1x2 cells, 18 features.
        let b = CpuBackend::new();
        let (h, w, c) = (2, 4, 2);
        let v = (0..h * w).flat_map(|p| (0..c).map(move |ch| (100 * ch + 10 * (p / w) + p % w) as f32)).collect();
        let out = get(&b, &b.unfold(&t(&b, &[h * w, c], v), h, w, 3).unwrap());
        assert_eq!(out.len(), 2 * 18);
        // cell 1 (bx = 1) covers x = 3..6; only x = 3 exists, rows y = 0, 1.
        let cell1 = &out[18..];
        for ch in 0..2 {
            for dy in 0..3 {
                for dx in 0..3 {
                    let want = if dy < 2 && dx == 0 { (100 * ch + 10 * dy + 3) as f32 } else { 0.0 };
                    assert_eq!(cell1[ch * 9 + dy * 3 + dx], want, "ch {ch} dy {dy} dx {dx}");
                }
            }
        }
    }

    #[test]
    fn gelu_is_the_exact_erf_form() {
        let b = CpuBackend::new();
        let out = get(&b, &b.gelu_erf(&t(&b, &[1, 3], vec![1.0, -0.5, 3.0])).unwrap());
        // x/2·(1+erf(x/√2)) from Python's math.erf (correctly rounded f64).
        let want = [0.841_344_746_068_542_9f32, -0.154_268_769_362_993_44, 2.995_950_305_905_11];
        for (o, w) in out.iter().zip(want) {
            assert!((o - w).abs() <= 1e-7 * w.abs().max(1.0), "{o} vs {w}");
        }
    }

    #[test]
    fn rope_2d_uses_rows_for_the_first_quarter_and_columns_for_the_second() {
        // One head of 8 dims on a 2x3 grid, θ = 100: pairs (d, d+4); d = 0,1 rows, d = 2,3 cols.
        let b = CpuBackend::new();
        let x: Vec<f32> = (0..6).flat_map(|_| [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]).collect();
        let out = get(&b, &b.rope_2d(&t(&b, &[6, 8], x), 1, 3, 100.0).unwrap());
        let inv = [1.0f32, 1.0 / 10.0]; // 1/100^(2j/4)
        for p in 0..6 {
            let (row, col) = ((p / 3) as f32, (p % 3) as f32);
            for d in 0..4 {
                let angle = if d < 2 { row * inv[d] } else { col * inv[d - 2] };
                assert!((out[p * 8 + d] - angle.cos()).abs() < 1e-6);
                assert!((out[p * 8 + d + 4] - angle.sin()).abs() < 1e-6);
            }
        }
    }

    #[test]
    fn attention_with_identical_keys_averages_values() {
        let b = CpuBackend::new();
        let q = t(&b, &[3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let k = t(&b, &[3, 2], vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
        let v = t(&b, &[3, 2], vec![0.0, 3.0, 6.0, 9.0, 3.0, 0.0]);
        let out = get(&b, &b.attention(&q, &k, &v, 1).unwrap());
        for row in out.chunks(2) {
            assert!((row[0] - 3.0).abs() < 1e-6 && (row[1] - 4.0).abs() < 1e-6, "{row:?}");
        }
    }

    /// Rows summed in blocks of eight, and rows summed against several weight rows at once, are the
    /// same bits as each row alone.
    #[test]
    fn linear_in_row_blocks_matches_each_row_alone() {
        let b = CpuBackend::new();
        let (n, k, o) = (21, 37, 5); // two blocks of 8, five rows against weight rows 4 + 1 at a time
        let xs: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.013).collect();
        let ws: Vec<f32> = (0..o * k).map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021).collect();
        let w = b
            .upload_weight(&HostWeight {
                name: "w".into(),
                format: WeightFormat::F32,
                rows: o,
                cols: k,
                bytes: ws.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into(),
            })
            .unwrap();
        let all = get(&b, &b.linear(&t(&b, &[n, k], xs.clone()), &w, None).unwrap());
        // rows of no columns: the bias alone, in blocks too
        let empty = b
            .upload_weight(&HostWeight {
                name: "e".into(),
                format: WeightFormat::F32,
                rows: 2,
                cols: 0,
                bytes: Vec::<u8>::new().into(),
            })
            .unwrap();
        let bias = t(&b, &[2], vec![0.5, -2.0]);
        let none = get(&b, &b.linear(&t(&b, &[9, 0], vec![]), &empty, Some(&bias)).unwrap());
        assert_eq!(none, [0.5, -2.0].repeat(9));
        for i in 0..n {
            let alone = get(&b, &b.linear(&t(&b, &[1, k], xs[i * k..(i + 1) * k].to_vec()), &w, None).unwrap());
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&all[i * o..(i + 1) * o]), bits(&alone), "row {i}");
        }
    }

    #[test]
    fn linear_decodes_bf16_rows() {
        let b = CpuBackend::new();
        let w: Vec<u8> = [1.0f32, 2.0, -1.0, 0.5].iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect();
        let w = b
            .upload_weight(&HostWeight {
                name: "w".into(),
                format: WeightFormat::BF16,
                rows: 2,
                cols: 2,
                bytes: w.into(),
            })
            .unwrap();
        let bias = t(&b, &[2], vec![0.25, -0.25]);
        let out = get(&b, &b.linear(&t(&b, &[1, 2], vec![3.0, 4.0]), &w, Some(&bias)).unwrap());
        assert_eq!(out, vec![3.0 + 8.0 + 0.25, -3.0 + 2.0 - 0.25]);
    }

    #[test]
    fn gather_rows_refuses_an_out_of_range_index() {
        let b = CpuBackend::new();
        let src = t(&b, &[2, 1], vec![1.0, 2.0]);
        let idx = b.upload(&HostTensor::i32([1], vec![2]).unwrap()).unwrap();
        let err = b.gather_rows(&src, &idx).unwrap_err().to_string();
        assert!(err.contains("gather_rows") && err.contains("out of"), "{err}");
    }
}
