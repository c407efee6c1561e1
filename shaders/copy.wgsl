// Data movement, one thread per output element. Workgroup 256 threads; dispatch (gx, gy, 1) with
// gx·gy·256 ≥ n_out, element = (wg.y·gx + wg.x)·256 + lid.
//   slice_cols:  src [rows, src_cols] → out [rows, len], out[r, c] = src[r, start + c]
//   gather_rows: src [m, d], idx i32 [rows] → out [rows, d], out[r] = src[idx[r]];
//                an index outside 0..m writes a row of NaN (bounds-checked, loud, never reads OOB)
//   unfold:      src [h·w, c] → out [ceil(h/r)·ceil(w/r), c·r²], feature ch·r² + dy·r + dx,
//                cells row-major, zero padding bottom/right
//   concat_rows: wa [a words], wb [n_out − a words] → wout [n_out]: the rows of a then b, as
//                4-byte words of either dtype (u32 bindings: the bits copied as they are)

struct P {
    n_out: u32,
    a: u32, // slice: len       gather: d   unfold: c   concat: a's words
    b: u32, // slice: src_cols  gather: m   unfold: h
    c: u32, // slice: start                 unfold: w
    d: u32, //                              unfold: r
    e: u32, //                              unfold: cells per row = ceil(w/r)
    _f: u32,
    _g: u32,
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p8: u32, _p9: u32, _p10: u32, _p11: u32, _p12: u32, _p13: u32,
    _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> idx: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<storage, read> wa: array<u32>;
@group(0) @binding(5) var<storage, read> wb: array<u32>;
@group(0) @binding(6) var<storage, read_write> wout: array<u32>;

fn flat(wg: vec3<u32>, nwg: vec3<u32>, li: u32) -> u32 {
    return (wg.y * nwg.x + wg.x) * 256u + li;
}

@compute @workgroup_size(256, 1, 1)
fn slice_cols(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.n_out) { return; }
    let r = i / p.a;
    let c = i % p.a;
    out[i] = src[r * p.b + p.c + c];
}

@compute @workgroup_size(256, 1, 1)
fn gather_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.n_out) { return; }
    let r = i / p.a;
    let c = i % p.a;
    let j = idx[r];
    if (j < 0 || u32(j) >= p.b) {
        out[i] = bitcast<f32>(0x7fc00000u);
        return;
    }
    out[i] = src[u32(j) * p.a + c];
}

@compute @workgroup_size(256, 1, 1)
fn unfold(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.n_out) { return; }
    let ch_n = p.a;
    let r = p.d;
    let feat = ch_n * r * r;
    let cell = i / feat;
    let f = i % feat;
    let ch = f / (r * r);
    let rem = f % (r * r);
    let dy = rem / r;
    let dx = rem % r;
    let yy = (cell / p.e) * r + dy;
    let xx = (cell % p.e) * r + dx;
    var v = 0.0;
    if (yy < p.b && xx < p.c) {
        v = src[(yy * p.c + xx) * ch_n + ch];
    }
    out[i] = v;
}

@compute @workgroup_size(256, 1, 1)
fn concat_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let i = flat(wg, nwg, li);
    if (i >= p.n_out) { return; }
    if (i < p.a) {
        wout[i] = wa[i];
    } else {
        wout[i] = wb[i - p.a];
    }
}
