// half_weight: the W of fast precision's direct cooperative tiles (tile_coop_direct.wgsl), rounded
// once. Weight rows w_row0 .. w_row0 + rows of a float weight → y [rows_out, k / 2] pairs of f16
// (k even; rows_out ≥ rows, the rows past `rows` zero), each value read by the format's part
// built before this one (linear_packed.wgsl: f32 and bf16, or linear_f16.wgsl: `load_pair`) and
// rounded as linear_tile.wgsl's tile loads round it (operands_fast.wgsl's `to_operand`), so the
// direct tiles multiply the same operands. One thread per pair.
// Workgroup 256 threads; dispatch (gx, gy, 1) with gx·gy·256 ≥ words,
// pair = (wg.y·gx + wg.x)·256 + lid.

struct P {
    words: u32,    // rows_out · k / 2
    k: u32,        // elements of a row (even), as load_pair reads it
    w_stride: u32, // words per (padded) row of the weight's binding, as load_pair reads it
    rows: u32,     // weight rows to copy
    w_row0: u32,   // the binding's first weight row to copy
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(4) var<storage, read_write> y: array<vec2<f16>>;

@compute @workgroup_size(256, 1, 1)
fn half_weight(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 256u + li;
    if (i >= p.words) { return; }
    let half = p.k / 2u;
    let r = i / half;
    var v = vec2<f32>(0.0, 0.0);
    if (r < p.rows) {
        v = load_pair(p.w_row0 + r, 2u * (i % half));
    }
    y[i] = vec2<f16>(to_operand(v.x), to_operand(v.y));
}
