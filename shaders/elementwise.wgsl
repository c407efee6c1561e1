// Elementwise ops on f32 tensors, one thread per output element.
// Workgroup 256 threads; dispatch (gx, gy, 1) with gx·gy·256 ≥ n, element = (wg.y·gx + wg.x)·256 + lid.
//   add:      a [n], b [n] → out [n]
//   swiglu:   a [rows, 2h] → out [rows, h], out = silu(a[:, :h]) · a[:, h:]   (gate = first half)
//   gelu_erf: a [n] → out [n], out = x/2 · (1 + erf(x/√2)) with a float32 erf (≤ 1 ulp + exp error)
//   sum_slices: a [slices, rows, cols] (partial sums: rows.wgsl's linear_rows split over k),
//             b = bias [col_off + cols] if has_bias → out[r, col_off + c] (out_cols per row) =
//             Σ_z a[z, r, c] in slice order (+ b[col_off + c]); n = rows·cols

struct P {
    n: u32,        // output elements
    h: u32,        // swiglu: half width
    cols: u32,     // sum_slices: columns of a slice's row
    slices: u32,
    out_cols: u32,
    col_off: u32,
    has_bias: u32,
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p7: u32, _p8: u32, _p9: u32, _p10: u32, _p11: u32, _p12: u32,
    _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> a: array<f32>;
@group(0) @binding(2) var<storage, read> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn flat(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * 256u + li;
}

@compute @workgroup_size(256, 1, 1)
fn add(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.n) { return; }
    out[i] = a[i] + b[i];
}

@compute @workgroup_size(256, 1, 1)
fn swiglu(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.n) { return; }
    let r = i / p.h;
    let c = i % p.h;
    let g = a[r * 2u * p.h + c];
    let u = a[r * 2u * p.h + p.h + c];
    out[i] = g / (1.0 + exp(-g)) * u;
}

// erf for f32: two minimax polynomials (N. Juffa), max error 0.99 ulp with an exact exp.
fn erf_f32(x: f32) -> f32 {
    let t = abs(x);
    let s = x * x;
    if (t > 0.927734375) {
        var r = fma(-1.72853470e-5, t, 3.83197126e-4);
        let u = fma(-3.88396438e-3, t, 2.42546219e-2);
        r = fma(r, s, u);
        r = fma(r, t, -1.06777877e-1);
        r = fma(r, t, -6.34846687e-1);
        r = fma(r, t, -1.28717512e-1);
        r = fma(r, t, -t);
        r = 1.0 - exp(r);
        return select(r, -r, x < 0.0);
    }
    var r = -5.96761703e-4;
    r = fma(r, s, 4.99119423e-3);
    r = fma(r, s, -2.67681349e-2);
    r = fma(r, s, 1.12819925e-1);
    r = fma(r, s, -3.76125336e-1);
    r = fma(r, s, 1.28379166e-1);
    return fma(r, x, x);
}

@compute @workgroup_size(256, 1, 1)
fn gelu_erf(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.n) { return; }
    let v = a[i];
    out[i] = v * 0.5 * (1.0 + erf_f32(v * 0.70710678118654752));
}

@compute @workgroup_size(256, 1, 1)
fn sum_slices(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.n) { return; }
    let r = i / p.cols;
    let c = i % p.cols;
    // in slice order, four slices' loads issued before their sums (a decode step's few outputs
    // are one workgroup: only the loads in flight in each thread hide their latency)
    var v = 0.0;
    var z = 0u;
    for (; z + 4u <= p.slices; z += 4u) {
        let t = vec4<f32>(a[z * p.n + i], a[(z + 1u) * p.n + i], a[(z + 2u) * p.n + i], a[(z + 3u) * p.n + i]);
        v = (((v + t.x) + t.y) + t.z) + t.w;
    }
    for (; z < p.slices; z++) {
        v += a[z * p.n + i];
    }
    if (p.has_bias != 0u) {
        v += b[p.col_off + c];
    }
    out[r * p.out_cols + p.col_off + c] = v;
}
