// The tile loads of linear over a float weight, shared by both tile bodies (tile_fma.wgsl,
// tile_coop.wgsl) and both precisions. Not a complete shader: the lane builds it after a format
// file (linear_packed.wgsl or linear_f16.wgsl) that declares binding 2 (`w`) and defines
// `load_pair(r, k) -> vec2<f32>` (elements k, k+1 of W row r, zero past the row), and an operands
// file (operands_exact.wgsl or operands_fast.wgsl) that defines the tiles' element type `operand`
// and `to_operand`, and tile_rows.wgsl (parameters, bindings, the tile's rows, the store); then a
// tile body, which multiplies what the tiles hold with f32 accumulation.
//
// y[n, out] = x[n, k] · W[out, k]ᵀ + b[out], one row-chunk of W per dispatch; or a part of it: a
// range of x's rows (an expert's slots), x's columns of one group against that group's W rows
// (grouped_linear).
// Tiling: a workgroup of 256 invocations computes a 64 × BN output tile (64 rows of x and y, BN
// weight rows: the body declares BN, a multiple of 64), K walked in steps of 32 (BK) through
// workgroup memory: an x tile of 64 rows × 32 k and a W tile of BN rows × 32 k, of `operand`
// (steps of 16 paid two barriers for every 16 of k; 32 is the block formats' run), each laid out
// as the body reads it (the body declares `xs`, `ws` and their indices `xs_at(m, k)`,
// `ws_at(n, k)`).
// Dispatch: (ceil(chunk_rows/BN), ceil(n/64), 1).

const BM: u32 = 64u;
const BK: u32 = 32u;

// Fills xs and ws with k0 .. k0 + BK of the output tile of rows `t` and weight rows col0 …;
// `li` is the invocation's index in the workgroup (0..256).
fn load_tiles(k0: u32, t: TileRows, col0: u32, li: u32) {
    // x tile: 64 rows × BK k, 8 elements per invocation, consecutive invocations walk k.
    for (var e = 0u; e < BM * BK / 256u; e++) {
        let idx = li + e * 256u;
        let m = idx / BK;
        let kk = idx % BK;
        let gk = k0 + kk;
        var v = operand(0.0);
        if (m < t.n && gk < p.k) {
            v = x[(t.first + m) * p.x_stride + p.x_col + gk];
        }
        xs[xs_at(m, kk)] = v;
    }
    // W tile: BN rows × BK / 2 pairs of k, BN / 16 pairs per invocation.
    for (var e = 0u; e < BN * BK / 512u; e++) {
        let idx = li + e * 256u;
        let nn = idx / (BK / 2u);
        let kp = idx % (BK / 2u);
        let gc = col0 + nn;
        let gk = k0 + 2u * kp;
        var v = vec2<f32>(0.0, 0.0);
        if (gc < p.chunk_rows && gk < p.k) {
            v = load_pair(t.w_row0 + gc, gk);
        }
        ws[ws_at(nn, 2u * kp)] = to_operand(v.x);
        ws[ws_at(nn, 2u * kp + 1u)] = to_operand(v.y);
    }
}
