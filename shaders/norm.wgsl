// rms_norm: x [n, d], weight [d] → out [n, d], out = (x · rsqrt(mean(x²) + eps)) · weight.
// One workgroup (256 threads) per row; row = wg.y·gx + wg.x; tree reduction in workgroup memory.

struct P {
    n: u32,
    d: u32,
    eps: f32,
    _a: u32,
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p4: u32, _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32,
    _p10: u32, _p11: u32, _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> wt: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256, 1, 1)
fn rms_norm(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let row = wg.y * nwg.x + wg.x; // uniform across the workgroup
    let base = row * p.d;
    var s = 0.0;
    if (row < p.n) {
        for (var c = li; c < p.d; c += 256u) {
            let v = x[base + c];
            s = fma(v, v, s);
        }
    }
    red[li] = s;
    workgroupBarrier();
    for (var w = 128u; w > 0u; w >>= 1u) {
        if (li < w) {
            red[li] += red[li + w];
        }
        workgroupBarrier();
    }
    if (row >= p.n) { return; }
    let inv = inverseSqrt(red[0] / f32(p.d) + p.eps);
    for (var c = li; c < p.d; c += 256u) {
        out[base + c] = (x[base + c] * inv) * wt[c];
    }
}
