// The tile loads of linear over a block-format weight, shared by both tile bodies (tile_fma.wgsl,
// tile_coop.wgsl) and both precisions: y[n, out] = x[n, k] · W[out, k]ᵀ + b[out], one row chunk of
// W per dispatch, or a part of it as linear_tile.wgsl's. Not a complete shader: the lane builds it
// per format and precision as emitted tables + dequant/common.wgsl + dequant/<format>.wgsl
// (`decode_run8`) + an operands file (`operand`, `to_operand`: see operands_exact.wgsl) + this
// part + a tile body.
// Tiling as linear_tile.wgsl, with K walked in runs of 32 (k is a whole number of blocks, so of
// runs): per step, x tile [32][64] and W tile [32][64] in workgroup memory, the W tile decoded by
// all 256 invocations, a quarter run (8 values of one row) each.
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
    expert_stride: u32, // 0, or a dispatch over every expert's rows (`row_tiles`): the weight rows
                        // from one expert's first row to the next's in the binding
}

@group(0) @binding(0) var<uniform> p: P;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> w: array<u32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
// A dispatch over every expert (moe_experts' prefill): per workgroup row, the first row of x and y
// its tile covers, how many (≤ 64), and the expert whose weight rows it reads; three words each.
@group(0) @binding(5) var<storage, read> row_tiles: array<u32>;

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 32u;

var<workgroup> xs: array<operand, 2048>; // [BK][BM]
var<workgroup> ws: array<operand, 2048>; // [BK][BN]

// The rows of x and y one workgroup covers (at most BM), and the first weight row it reads.
struct TileRows {
    first: u32,
    n: u32,
    w_row0: u32,
}

// Workgroup row `wy`'s rows: entry wy of `row_tiles` in a dispatch over every expert, else rows
// row_off + wy·BM … of the dispatch's n.
fn tile_rows(wy: u32) -> TileRows {
    if (p.expert_stride != 0u) {
        let t = 3u * wy;
        return TileRows(row_tiles[t], row_tiles[t + 1u], row_tiles[t + 2u] * p.expert_stride);
    }
    return TileRows(p.row_off + wy * BM, p.n - wy * BM, p.w_row0);
}

// Fills xs and ws with run k0 / 32 of the output tile of rows `t` and weight rows col0 …; `li` is the invocation's index in
// the workgroup (0..256).
fn load_tiles(k0: u32, t: TileRows, col0: u32, li: u32) {
    // x tile: 64 rows × 32 k, 8 elements per invocation, consecutive invocations walk k.
    for (var e = 0u; e < 8u; e++) {
        let idx = li + e * 256u;
        let m = idx / BK;
        let kk = idx % BK;
        var v = 0.0;
        if (m < t.n) {
            v = x[(t.first + m) * p.x_stride + p.x_col + k0 + kk];
        }
        xs[kk * BM + m] = to_operand(v);
    }
    // W tile: invocation li decodes values 8·(li / 64) … + 7 of run k0/32 of row col0 + li % 64
    // (every invocation a quarter run: a whole run each kept three quarters of the workgroup
    // waiting at the barrier while a quarter decoded).
    let c = li % BN;
    let part = li / BN;
    let gc = col0 + c;
    if (gc < p.chunk_rows) {
        let v = decode_run8((t.w_row0 + gc) * p.w_stride, k0 / 8u + part);
        for (var j = 0u; j < 8u; j++) {
            ws[(8u * part + j) * BN + c] = to_operand(v[j]);
        }
    } else {
        for (var j = 0u; j < 8u; j++) {
            ws[(8u * part + j) * BN + c] = operand(0.0);
        }
    }
}

// y[t.first + m, col_off + c] = v (+ bias) for an output inside the tile's rows and the
// dispatch's weight rows.
fn store(t: TileRows, m: u32, c: u32, v: f32) {
    if (m >= t.n || c >= p.chunk_rows) { return; }
    let oc = p.col_off + c;
    var out = v;
    if (p.has_bias != 0u) {
        out += bias[oc];
    }
    y[(t.first + m) * p.out_cols + oc] = out;
}
