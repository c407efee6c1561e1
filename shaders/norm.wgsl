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
        store4(base, c, (load4(base, c) * inv) * weight4(c));
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

// A decode step runs this twice a layer, where hc_pre then rms_norm took two dispatches. Each
// thread collapses the streams of its elements c, c + 256, c + 512, c + 768 together (hc·4 loads
// in flight: one at a time, a 4096-wide row walked 16 load latencies and took 20 µs on an H100),
// summed over the streams in hc_pre's order (k ascending), and keeps them in registers for the
// second pass: rows up to HELD·1024 wide are read once and written once; wider rows write their
// remaining groups in the first pass and reread them in the second.
const HELD: u32 = 4u;

@compute @workgroup_size(256, 1, 1)
fn hc_pre_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let row = wg.y * nwg.x + wg.x; // uniform across the workgroup
    let d = p.d;
    let xb = row * p.hc * d;
    let wb = row * p.wc;
    let ob = row * d;
    var held: array<vec4<f32>, HELD>;
    var s4 = vec4<f32>(0.0);
    if (row < p.n) {
        // a constant bound, so the groups stay in registers
        for (var g = 0u; g < HELD; g++) {
            let c = li + g * 1024u;
            if (c < d) {
                held[g] = collapsed4(xb, wb, c);
                s4 = fma(held[g], held[g], s4);
            }
        }
        for (var c = li + HELD * 1024u; c < d; c += 1024u) {
            let v = collapsed4(xb, wb, c);
            store4(ob, c, v);
            s4 = fma(v, v, s4);
        }
    }
    workgroup_sum(li, (s4.x + s4.y) + (s4.z + s4.w));
    if (row >= p.n) { return; }
    let inv = inverseSqrt(red[0] / f32(d) + p.eps);
    for (var g = 0u; g < HELD; g++) {
        let c = li + g * 1024u;
        if (c < d) {
            store4(ob, c, (held[g] * inv) * weight4(c));
        }
    }
    for (var c = li + HELD * 1024u; c < d; c += 1024u) {
        let v = vec4<f32>(out[ob + c], out[ob + min(c + 256u, d - 1u)], out[ob + min(c + 512u, d - 1u)],
                          out[ob + min(c + 768u, d - 1u)]);
        store4(ob, c, (v * inv) * weight4(c));
    }
}

// Σ_k w_k X_k at the row's elements c, c + 256, c + 512, c + 768 (0 past d; c < d).
fn collapsed4(xb: u32, wb: u32, c: u32) -> vec4<f32> {
    var v = vec4<f32>(0.0);
    for (var k = 0u; k < p.hc; k++) {
        v += sw[wb + k] * load4(xb + k * p.d, c);
    }
    return v;
}

// The norm weight at elements c, c + 256, c + 512, c + 768 (clamped into [0, d): lanes past d
// are not stored).
fn weight4(c: u32) -> vec4<f32> {
    return vec4<f32>(wt[c], wt[min(c + 256u, p.d - 1u)], wt[min(c + 512u, p.d - 1u)], wt[min(c + 768u, p.d - 1u)]);
}

// v's lanes into out at ob + c, + 256, + 512, + 768, those within d.
fn store4(ob: u32, c: u32, v: vec4<f32>) {
    out[ob + c] = v.x;
    if (c + 256u < p.d) { out[ob + c + 256u] = v.y; }
    if (c + 512u < p.d) { out[ob + c + 512u] = v.z; }
    if (c + 768u < p.d) { out[ob + c + 768u] = v.w; }
}
