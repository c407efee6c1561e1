// rms_norm: x [n, d], weight [d] → out [n, d], out = (x · rsqrt(mean(x²) + eps)) · weight.
// hc_pre_norm: rms_norm of the streams collapsed, x = X [n, hc·d], sw = w [n, wc] (its first hc
// columns) → out [n, d] = rms_norm(Σ_k w_k X_k, weight, eps).
// One workgroup (256 threads) per row; row = wg.y·gx + wg.x; tree reduction in workgroup memory.

struct P {
    n: u32,
    d: u32,
    eps: f32,
    // hc_pre_norm's streams and w's columns
    hc: u32,
    wc: u32,
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32,
    _p10: u32, _p11: u32, _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> wt: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> sw: array<f32>;

var<workgroup> red: array<f32, 256>;

// The sum of every thread's `s` over the workgroup, in red[0] (all threads call it).
fn workgroup_sum(li: u32, s: f32) {
    red[li] = s;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w >>= 1u) {
        if (li < w) {
            red[li] += red[li + w];
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(256, 1, 1)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let row = wg.y * nwg.x + wg.x; // uniform across the workgroup
    let base = row * p.d;
    // a thread's elements c, c + 256, c + 512, c + 768 loaded together before they are used: a
    // decode step's norm is one workgroup, and nothing but the loads in flight in each thread
    // hides their latency (one at a time, a 4096-wide row took 11 µs on an H200)
    var s4 = vec4<f32>(0.0);
    if (row < p.n) {
        for (var c = li; c < p.d; c += 1024u) {
            let v = load4(base, c);
            s4 = fma(v, v, s4);
        }
    }
    workgroup_sum(li, (s4.x + s4.y) + (s4.z + s4.w));
    if (row >= p.n) { return; }
    let inv = inverseSqrt(red[0] / f32(p.d) + p.eps);
    for (var c = li; c < p.d; c += 1024u) {
        let v = load4(base, c);
        let g = vec4<f32>(wt[c], wt[min(c + 256u, p.d - 1u)], wt[min(c + 512u, p.d - 1u)], wt[min(c + 768u, p.d - 1u)]);
        let o = (v * inv) * g;
        out[base + c] = o.x;
        if (c + 256u < p.d) { out[base + c + 256u] = o.y; }
        if (c + 512u < p.d) { out[base + c + 512u] = o.z; }
        if (c + 768u < p.d) { out[base + c + 768u] = o.w; }
    }
}

// Row elements c, c + 256, c + 512, c + 768 of the row at `base` (0 past d).
fn load4(base: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    v.x = x[base + c];
    if (c + 256u < p.d) { v.y = x[base + c + 256u]; }
    if (c + 512u < p.d) { v.z = x[base + c + 512u]; }
    if (c + 768u < p.d) { v.w = x[base + c + 768u]; }
    return v;
}

// A decode step runs this twice a layer, where hc_pre then rms_norm took two dispatches. The
// first pass writes the collapsed row (summed over the streams in hc_pre's order, k ascending)
// and sums its squares; the second scales it in place, each thread rereading only the elements
// it wrote. A thread's hc loads of an element are in flight together.
@compute @workgroup_size(256, 1, 1)
fn hc_pre_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let row = wg.y * nwg.x + wg.x; // uniform across the workgroup
    let d = p.d;
    let xb = row * p.hc * d;
    let wb = row * p.wc;
    let ob = row * d;
    var s = 0.0;
    if (row < p.n) {
        for (var c = li; c < d; c += 256u) {
            var v = 0.0;
            for (var k = 0u; k < p.hc; k++) {
                v += sw[wb + k] * x[xb + k * d + c];
            }
            out[ob + c] = v;
            s = fma(v, v, s);
        }
    }
    workgroup_sum(li, s);
    if (row >= p.n) { return; }
    let inv = inverseSqrt(red[0] / f32(d) + p.eps);
    for (var c = li; c < d; c += 256u) {
        out[ob + c] = (out[ob + c] * inv) * wt[c];
    }
}
