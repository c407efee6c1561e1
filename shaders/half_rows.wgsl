// half_rows: the x of fast precision's tiled GEMMs, rounded once. x [n, cols] f32 → y [rows, half]
// pairs of f16 (half = ⌈cols / 2⌉, a row's odd tail padded with zero; rows ≥ n, the rows past n
// zero), each value rounded as every fast GEMM operand is (operands_fast.wgsl's `to_operand`,
// built just before this part). The tiles then copy x's operands instead of rounding each value
// again in every column tile (a 4 096-wide weight's 32 tiles of 128 did it 32 times); the ViT's
// cooperative attention reads q, k and v from such copies, padded to its 64-row tiles. One
// thread per pair.
// Workgroup 256 threads; dispatch (gx, gy, 1) with gx·gy·256 ≥ words,
// pair = (wg.y·gx + wg.x)·256 + lid.

struct P {
    words: u32, // rows · half
    cols: u32,
    half: u32,
    n: u32, // x's rows
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p4: u32, _p5: u32, _p6: u32, _p7: u32, _p8: u32, _p9: u32, _p10: u32, _p11: u32,
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<vec2<f16>>;

@compute @workgroup_size(256, 1, 1)
fn half_rows(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) li: u32) {
    let i = (wg.y * nwg.x + wg.x) * 256u + li;
    if (i >= p.words) { return; }
    let r = i / p.half;
    let c = 2u * (i % p.half);
    var a = 0.0;
    var b = 0.0;
    if (r < p.n) {
        a = x[r * p.cols + c];
        if (c + 1u < p.cols) {
            b = x[r * p.cols + c + 1u];
        }
    }
    y[i] = vec2<f16>(to_operand(a), to_operand(b));
}
