// The tiled GEMM's body on cooperative matrices (tensor cores), fast precision only: after a
// tile-load part (linear_tile.wgsl, or dequant/linear.wgsl for the block formats) whose tiles hold
// f16 operands (operands_fast.wgsl), xs [BK][BM] and ws [BK][BN] k-major. The lane builds it only
// on an adapter with EXPERIMENTAL_COOPERATIVE_MATRIX, a 16×16×16 f16 → f32 configuration and
// subgroups of exactly 32 invocations: 8 subgroups per workgroup, as this body assumes.
// The products of f16 operands are exact and accumulate in f32, so the result is the f32 GEMM of
// the rounded operands as in tile_fma.wgsl, summed in another order.
// The 64×64 output tile is 4×4 blocks of 16×16; subgroup s owns row block s / 2 and column blocks
// 2·(s % 2), 2·(s % 2) + 1. The accumulators go through workgroup memory (`tile_out`) to the
// bounds-checked `store`, since a tile may cross the edge of y.

var<workgroup> tile_out: array<f32, 4096>; // [BM][BN]

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_id) sg: u32) {
    let t = tile_rows(wg.y);
    let col0 = wg.x * BN;
    let rb = (sg / 2u) * 16u; // the subgroup's first row in the tile
    let cb = (sg % 2u) * 32u; // its first column
    var c0 = coop_mat16x16<f32, C>();
    var c1 = coop_mat16x16<f32, C>();

    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        load_tiles(k0, t, col0, li);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            // A: x rows rb.., k kk.. (element (m, k) at xs[k·BM + m]: column-major, stride BM);
            // B = Wᵀ: (k, n) at ws[k·BN + n], row-major, stride BN.
            let a = coopLoad<coop_mat16x16<f16, A>>(&xs[kk * BM + rb], BM);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&ws[kk * BN + cb], BN);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&ws[kk * BN + cb + 16u], BN);
            c0 = coopMultiplyAdd(a, b0, c0);
            c1 = coopMultiplyAdd(a, b1, c1);
        }
        workgroupBarrier();
    }

    coopStoreT(c0, &tile_out[rb * BN + cb], BN);
    coopStoreT(c1, &tile_out[rb * BN + cb + 16u], BN);
    workgroupBarrier();
    for (var e = 0u; e < 16u; e++) {
        let idx = li + e * 256u;
        store(t, idx / BN, col0 + idx % BN, tile_out[idx]);
    }
}
