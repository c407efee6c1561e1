// What the tile loads of linear share, float weights (linear_tile.wgsl) and block formats
// (dequant/linear.wgsl): the parameters, the bindings but the weight's (binding 2, which the
// format's part declares), the rows of x and y a workgroup covers, and the bounds-checked store.
// Not a complete shader: the lane builds it just before either tile-load part, which defines the
// tile height BM.

struct P {
    n: u32,          // rows of x this dispatch covers: row_off .. row_off + n
    k: u32,          // in_features (a multiple of 32 for the block formats)
    out_cols: u32,   // columns of y (= total out_features)
    col_off: u32,    // y's column of this dispatch's first weight row
    chunk_rows: u32, // weight rows this dispatch covers: w_row0 .. w_row0 + chunk_rows of the binding
    w_stride: u32,   // words per (padded) W row
    has_bias: u32,
    row_off: u32,    // first row of x and of y (one expert's slots in moe_experts; else 0)
    x_stride: u32,   // x's row length in operands (k, or g·k for a group of grouped_linear; even
                     // in fast precision)
    x_col: u32,      // x's first column (the group's)
    w_row0: u32,     // the binding's first weight row this dispatch reads
    expert_stride: u32, // 0, or a dispatch over every expert's rows (`row_tiles`): the weight rows
                        // from one expert's first row to the next's in the binding
    // padding: every dispatch pushes 16 words (mod.rs, PARAM_BYTES)
    _p12: u32, _p13: u32, _p14: u32, _p15: u32,
}

var<immediate> p: P; // the dispatch's immediate data (mod.rs, PARAM_BYTES)
// x's operands: f32 in exact precision; in fast, x rounded to f16 once by half_rows.wgsl (rows
// padded to an even length: `x_stride` counts f16 values), so the tiles copy them.
@group(0) @binding(1) var<storage, read> x: array<operand>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
// A dispatch over every expert (moe_experts' prefill): per workgroup row, the first row of x and y
// its tile covers, how many (≤ 64), and the expert whose weight rows it reads; three words each.
@group(0) @binding(5) var<storage, read> row_tiles: array<u32>;

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
