// half_weight over a block format (half_weight.wgsl's float part's counterpart, fast precision):
// weight rows w_row0 .. w_row0 + rows → y [rows_out, k / 2] pairs of f16 (rows_out ≥ rows, the
// rows past `rows` zero), each run of 8 values decoded by the format's `decode_run8` and rounded
// by `to_operand` as dequant/linear.wgsl's tile loads decode and round them, so the direct tiles
// multiply the same operands. One thread per run (four words of y).
// Workgroup 256 threads; dispatch (gx, gy, 1) with gx·gy·256 ≥ words / 4,
// run = (wg.y·gx + wg.x)·256 + lid.

struct P {
    words: u32,    // rows_out · k / 2
    k: u32,        // elements of a row (a multiple of the format's block)
    w_stride: u32, // words per (padded) row of the weight's binding
    rows: u32,     // weight rows to copy
    w_row0: u32,   // the binding's first weight row to copy
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(4) var<storage, read_write> y: array<vec2<f16>>;

@compute @workgroup_size(256, 1, 1)
fn half_weight(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) li: u32) {
    let run = (wg.y * nwg.x + wg.x) * 256u + li;
    if (4u * run >= p.words) { return; }
    let runs = p.k / 8u;
    let r = run / runs;
    var v: array<f32, 8>;
    if (r < p.rows) {
        v = decode_run8((p.w_row0 + r) * p.w_stride, run % runs);
    }
    for (var j = 0u; j < 4u; j++) {
        y[4u * run + j] = vec2<f16>(to_operand(v[2u * j]), to_operand(v[2u * j + 1u]));
    }
}
