// The tile loads of linear over a block-format weight, shared by both tile bodies (tile_fma.wgsl,
// tile_coop.wgsl) and both precisions: y[n, out] = x[n, k] · W[out, k]ᵀ + b[out], one row chunk of
// W per dispatch, or a part of it as linear_tile.wgsl's. Not a complete shader: the lane builds it
// per format and precision as emitted tables + dequant/common.wgsl + dequant/<format>.wgsl
// (`decode_run8`) + an operands file (`operand`, `to_operand`: see operands_exact.wgsl) +
// tile_rows.wgsl (parameters, bindings, the tile's rows, the store) + this part + a tile body.
// Tiling as linear_tile.wgsl, with K walked in runs of 32 (k is a whole number of blocks, so of
// runs): per step, an x tile of 64 rows × 32 k and a W tile of BN rows × 32 k in workgroup memory
// (declared by the body, as linear_tile.wgsl's), the W tile decoded by all 256 invocations, a
// quarter run (8 values of one row) at a time, BN / 64 each.
// Dispatch: (ceil(chunk_rows/BN), ceil(n/64), 1).

@group(0) @binding(2) var<storage, read> w: array<u32>;

const BM: u32 = 64u;
const BK: u32 = 32u;

// Fills xs and ws with run k0 / 32 of the output tile of rows `t` and weight rows col0 …; `li`
// is the invocation's index in the workgroup (0..256).
fn load_tiles(k0: u32, t: TileRows, col0: u32, li: u32) {
    // x tile: 64 rows × 32 k, 8 elements per invocation, consecutive invocations walk k.
    for (var e = 0u; e < 8u; e++) {
        let idx = li + e * 256u;
        let m = idx / BK;
        let kk = idx % BK;
        var v = operand(0.0);
        if (m < t.n) {
            v = x[(t.first + m) * p.x_stride + p.x_col + k0 + kk];
        }
        xs[xs_at(m, kk)] = v;
    }
    // W tile: item i = li + 256·e decodes values 8·(i / BN) … + 7 of run k0/32 of row
    // col0 + i % BN (every invocation a quarter run at a time: a whole run each kept three
    // quarters of the workgroup waiting at the barrier while a quarter decoded).
    for (var e = 0u; e < BN / 64u; e++) {
        let item = li + e * 256u;
        let c = item % BN;
        let part = item / BN;
        let gc = col0 + c;
        if (gc < p.chunk_rows) {
            let v = decode_run8((t.w_row0 + gc) * p.w_stride, k0 / 8u + part);
            for (var j = 0u; j < 8u; j++) {
                ws[ws_at(c, 8u * part + j)] = to_operand(v[j]);
            }
        } else {
            for (var j = 0u; j < 8u; j++) {
                ws[ws_at(c, 8u * part + j)] = operand(0.0);
            }
        }
    }
}
