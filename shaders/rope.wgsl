// rope_2d: x [n, heads·hd] → out [n, heads·hd], rotate-half pairs (d, d + hd/2) per head.
// The angle table is computed on the host in f32 (like the reference's cached cos/sin):
// tab[r·half + d] = cos, tab[n·half + r·half + d] = sin, half = hd/2.
// One thread per pair; workgroup 256, dispatch (gx, gy, 1), pair = (wg.y·gx + wg.x)·256 + lid.

struct P {
    n: u32,
    heads: u32,
    hd: u32,
    _a: u32,
}

@group(0) @binding(0) var<uniform> p: P;
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
