// linear over a block-format weight: y[n, out] = x[n, k] · W[out, k]ᵀ + b[out], one row chunk of W
// per dispatch, or a part of it as linear_tile.wgsl's. Not a complete shader: the lane builds it per format and precision as emitted
// tables + dequant/common.wgsl + dequant/<format>.wgsl (`decode_run8`) + an operands file
// (`operand`, `to_operand`: see operands_exact.wgsl) + this body.
// Tiling as linear_tile.wgsl, with K walked in runs of 32 (k is a whole number of blocks, so of
// runs): workgroup 16×16 threads, 64×64 output tile (4×4 per thread, strided by 16); per step,
// x tile [32][64] and W tile [32][64] in workgroup memory, the W tile decoded by all 256 threads,
// a quarter run (8 values of one row) each.
// Dispatch: (ceil(chunk_rows/64), ceil(n/64), 1).

struct P {
    n: u32,          // rows of x this dispatch covers: row_off .. row_off + n
    k: u32,          // in_features (a multiple of 32)
    out_cols: u32,   // columns of y (= total out_features)
    col_off: u32,    // y's column of this dispatch's first weight row
    chunk_rows: u32, // weight rows this dispatch covers: w_row0 .. w_row0 + chunk_rows of the binding
    w_stride: u32,   // words per (padded) W row
    has_bias: u32,
    row_off: u32,    // first row of x and of y (one expert's slots in moe_experts; else 0)
    x_stride: u32,   // x's row length (k, or g·k for a group of grouped_linear)
    x_col: u32,      // x's first column (the group's)
    w_row0: u32,     // the binding's first weight row this dispatch reads
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;

var<workgroup> xs: array<operand, 2048>; // [BK][BM]
var<workgroup> ws: array<operand, 2048>; // [BK][BN]

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row0 = wg.y * BM;
    let col0 = wg.x * BN;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);

    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        // x tile: 64 rows × 32 k, 8 elements per thread, consecutive threads walk k.
        for (var e = 0u; e < 8u; e++) {
            let idx = li + e * 256u;
            let m = idx / BK;
            let kk = idx % BK;
            let gr = row0 + m;
            var v = 0.0;
            if (gr < p.n) {
                v = x[(p.row_off + gr) * p.x_stride + p.x_col + k0 + kk];
            }
            xs[kk * BM + m] = to_operand(v);
        }
        // W tile: thread li decodes values 8·(li / 64) … + 7 of run k0/32 of row col0 + li % 64
        // (every thread a quarter run: a whole run each kept three quarters of the workgroup
        // waiting at the barrier while a quarter decoded).
        {
            let c = li % BN;
            let part = li / BN;
            let gc = col0 + c;
            if (gc < p.chunk_rows) {
                let v = decode_run8((p.w_row0 + gc) * p.w_stride, k0 / 8u + part);
                for (var j = 0u; j < 8u; j++) {
                    ws[(8u * part + j) * BN + c] = to_operand(v[j]);
                }
            } else {
                for (var j = 0u; j < 8u; j++) {
                    ws[(8u * part + j) * BN + c] = operand(0.0);
                }
            }
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            let xo = kk * BM + lid.y;
            let wo = kk * BN + lid.x;
            let b = vec4<f32>(vec4<operand>(ws[wo], ws[wo + 16u], ws[wo + 32u], ws[wo + 48u]));
            acc0 = fma(vec4<f32>(f32(xs[xo])), b, acc0);
            acc1 = fma(vec4<f32>(f32(xs[xo + 16u])), b, acc1);
            acc2 = fma(vec4<f32>(f32(xs[xo + 32u])), b, acc2);
            acc3 = fma(vec4<f32>(f32(xs[xo + 48u])), b, acc3);
        }
        workgroupBarrier();
    }

    store_row(row0 + lid.y, col0 + lid.x, acc0);
    store_row(row0 + lid.y + 16u, col0 + lid.x, acc1);
    store_row(row0 + lid.y + 32u, col0 + lid.x, acc2);
    store_row(row0 + lid.y + 48u, col0 + lid.x, acc3);
}

// y[gr, col_off + gc + 16·j] = acc[j] (+ bias) for the columns inside this chunk.
fn store_row(gr: u32, gc: u32, acc: vec4<f32>) {
    if (gr >= p.n) { return; }
    for (var j = 0u; j < 4u; j++) {
        let c = gc + 16u * j;
        if (c >= p.chunk_rows) { return; }
        let oc = p.col_off + c;
        var v = acc[j];
        if (p.has_bias != 0u) {
            v += bias[oc];
        }
        y[(p.row_off + gr) * p.out_cols + oc] = v;
    }
}
