// rope_2d: x [n, heads·hd] → out [n, heads·hd], rotate-half pairs (d, d + hd/2) per head.
// The angle table is computed on the host in f32 (like the reference's cached cos/sin):
// tab[r·half + d] = cos, tab[n·half + r·half + d] = sin, half = hd/2.
// One thread per pair; workgroup 256, dispatch (gx, gy, 1), pair = (wg.y·gx + wg.x)·256 + lid.

struct P {
    n: u32,
    heads: u32,
    hd: u32,
    _a: u32,
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p4: u32, _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32,
    _p10: u32, _p11: u32, _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> tab: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn rope_2d(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let half = p.hd / 2u;
    let i = (wg.y * nwg.x + wg.x) * 256u + li;
    if (i >= p.n * p.heads * half) { return; }
    let r = i / (p.heads * half);
    let rem = i % (p.heads * half);
    let h = rem / half;
    let d = rem % half;
    let cols = p.heads * p.hd;
    let ia = r * cols + h * p.hd + d;
    let ib = ia + half;
    let c = tab[r * half + d];
    let s = tab[p.n * half + r * half + d];
    let a = x[ia];
    let b = x[ib];
    out[ia] = a * c - b * s;
    out[ib] = b * c + a * s;
}
