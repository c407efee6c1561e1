// The tiled GEMM's body on cooperative matrices (tensor cores), fast precision only: after a
// tile-load part (linear_tile.wgsl, or dequant/linear.wgsl for the block formats) whose tiles hold
// f16 operands (operands_fast.wgsl) and which fills this body's tiles through `xs_at`, `ws_at`.
// The lane builds it only on an adapter with EXPERIMENTAL_COOPERATIVE_MATRIX, a 16×16×16 f16 →
// f32 configuration, subgroups of exactly 32 invocations (8 subgroups per workgroup, as this body
// assumes) and `Tiles::COOP_WORKGROUP_BYTES` of workgroup memory.
// The products of f16 operands are exact and accumulate in f32, so the result is the f32 GEMM of
// the rounded operands as in tile_fma.wgsl, summed in another order.
//
// The output tile is 64 rows × 128 weight rows (BN), 4×8 blocks of 16×16; subgroup s owns row
// blocks 2·(s / 4), + 1 and column blocks 2·(s % 4), + 1: per 16 of k, two A and two B loads feed
// four multiply-adds (a 64×64 tile with a row block a subgroup loaded three matrices for two).
// Each subgroup's accumulators go one at a time through its own 16×16 of workgroup memory
// (`staging`) to the bounds-checked `store` (tile_coop_store.wgsl, built after this body), since
// a tile may cross the edge of y.
//
// Layouts, chosen for the banks of workgroup memory: the x tile is row-major (a row's k side by
// side), so the loads' stores, whose invocations walk k, are consecutive (k-major put a warp's
// 32 stores in one bank); the W tile is k-major: the block formats' stores walk its rows
// (consecutive), the float weights' walk k in pairs (a warp's stores in 4 banks, their global
// loads kept consecutive). Rows of either tile
// are padded by 8 elements (16 bytes) so the 8 rows of 16 bytes that a matrix load reads at once
// fall in different banks, each row start staying 16-byte aligned; the staging rows by 4 f32.

const BN: u32 = 128u;
const XS_STRIDE: u32 = BK + 8u;
const WS_STRIDE: u32 = BN + 8u;
const STAGING_STRIDE: u32 = 20u;

var<workgroup> xs: array<f16, BM * XS_STRIDE>;
var<workgroup> ws: array<f16, BK * WS_STRIDE>;
var<workgroup> staging: array<f32, 8 * 16 * STAGING_STRIDE>; // [subgroup][16][STAGING_STRIDE]

fn xs_at(m: u32, k: u32) -> u32 {
    return m * XS_STRIDE + k;
}

fn ws_at(n: u32, k: u32) -> u32 {
    return k * WS_STRIDE + n;
}

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let t = tile_rows(wg.y);
    let col0 = wg.x * BN;
    let rb = (sg / 4u) * 32u; // the subgroup's first row in the tile
    let cb = (sg % 4u) * 32u; // its first column
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();

    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        load_tiles(k0, t, col0, li);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            // A: x rows rb.., k kk.. (element (m, k) at xs[m·XS_STRIDE + k]: row-major);
            // B = Wᵀ: (k, n) at ws[k·WS_STRIDE + n], row-major.
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&xs[xs_at(rb, kk)], XS_STRIDE);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&xs[xs_at(rb + 16u, kk)], XS_STRIDE);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&ws[ws_at(cb, kk)], WS_STRIDE);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&ws[ws_at(cb + 16u, kk)], WS_STRIDE);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }

    store_block(t, sg, lane, c00, rb, col0 + cb);
    store_block(t, sg, lane, c01, rb, col0 + cb + 16u);
    store_block(t, sg, lane, c10, rb + 16u, col0 + cb);
    store_block(t, sg, lane, c11, rb + 16u, col0 + cb + 16u);
}
