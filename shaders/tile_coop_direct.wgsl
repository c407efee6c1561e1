// The tiled GEMM on cooperative matrices over f16 copies of both operands, fast precision only:
// in `main` and `main_128` each subgroup's matrix loads read x's f16 copy (half_rows.wgsl) and
// W's (half_weight.wgsl) straight from their buffers, as attention_coop_direct.wgsl reads q, k
// and v (tile_coop.wgsl copies both tiles into workgroup memory element by element between two
// barriers every 32 of k); `main_wide` (at the end) stages them after all, by 16-byte copies.
// Built after operands_fast.wgsl and tile_rows.wgsl (parameters, x at binding 1 as f16, the
// rows, the store), then tile_coop_store.wgsl; the lane builds it only where tile_coop.wgsl runs
// (16×16×16 f16 → f32, subgroups of exactly 32 invocations: 4 per workgroup here).
// Both copies hold the operands rounded once as linear_tile.wgsl's tile loads round them, and the
// k blocks of 16 go through each accumulator in the same order as in tile_coop.wgsl, so the
// result is the same f32 GEMM of the same f16 operands (the op harness holds both kernels to
// fast precision's bound; it does not assume the device's products round alike in both).
//
// What the loads need, which the lane guarantees (linear.rs, `takes_direct_tiles`): k a multiple of 16
// (every matrix load's 16 k in its row; rows start 32-byte aligned); x's copy padded with zero
// rows so that every 64-row tile is whole; W's copy `[rows, w_stride]` f16 (w_stride = k here,
// counted in f16 elements, not words) with its rows padded with zeros to a multiple of BN. The
// store drops what falls outside y (tile rows past the tile's n, weight rows past chunk_rows).
//
// The output tile is 64 rows × 128 weight rows (BN); subgroup s owns rows 32·(s / 2) .. + 32 and
// weight rows 64·(s % 2) .. + 64: per 16 of k, two A and four B loads feed eight multiply-adds.
// Dispatch: (ceil(chunk_rows/BN), ceil(n/64), 1), workgroups of 128.

const BM: u32 = 64u;
const BN: u32 = 128u;
const STAGING_STRIDE: u32 = 20u;

@group(0) @binding(2) var<storage, read> w: array<f16>; // [≥ w_row0 + chunk_rows rounded up to BN, w_stride]
var<workgroup> staging: array<f32, 4 * 16 * STAGING_STRIDE>; // [subgroup][16][STAGING_STRIDE]
// main_wide's view of the same two copies, by 16-byte pieces (8 f16 of a row each)
struct Piece {
    lo: vec4<f16>,
    hi: vec4<f16>,
}
@group(0) @binding(6) var<storage, read> x_wide: array<Piece>;
@group(0) @binding(7) var<storage, read> w_wide: array<Piece>;
// main_wide's tiles: 128 rows × 32 of k each, a row 32 f16 + 8 of padding (80 bytes: eight
// rows' 16-byte pieces fall in distinct banks), counted in vec4<f16> (a matrix load's index and
// stride count its pointer's type)
const WIDE_ROW: u32 = 10u;
var<workgroup> wide_x: array<vec4<f16>, 128 * WIDE_ROW>;
var<workgroup> wide_w: array<vec4<f16>, 128 * WIDE_ROW>;

@compute @workgroup_size(128, 1, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_id) sg: u32,
        @builtin(subgroup_invocation_id) lane: u32) {
    let t = tile_rows(wg.y);
    let col0 = wg.x * BN;
    let rb = (sg / 2u) * 32u; // the subgroup's first row in the tile
    let cb = (sg % 2u) * 64u; // its first weight row in the tile
    // A = x rows: (m, k) at x[(first + m)·x_stride + x_col + k], row-major
    let xa = (t.first + rb) * p.x_stride + p.x_col;
    let xb = xa + 16u * p.x_stride;
    // B = Wᵀ: (k, n) at w[(w_row0 + n)·w_stride + k], column-major
    let wa = (t.w_row0 + col0 + cb) * p.w_stride;
    let w16 = 16u * p.w_stride;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();

    for (var k0 = 0u; k0 < p.k; k0 += 16u) {
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&x[xa + k0], p.x_stride);
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&x[xb + k0], p.x_stride);
        let b0 = coopLoad<coop_mat16x16<f16, B>>(&w[wa + k0], p.w_stride);
        let b1 = coopLoad<coop_mat16x16<f16, B>>(&w[wa + w16 + k0], p.w_stride);
        let b2 = coopLoad<coop_mat16x16<f16, B>>(&w[wa + 2u * w16 + k0], p.w_stride);
        let b3 = coopLoad<coop_mat16x16<f16, B>>(&w[wa + 3u * w16 + k0], p.w_stride);
        c00 = coopMultiplyAdd(a0, b0, c00);
        c01 = coopMultiplyAdd(a0, b1, c01);
        c02 = coopMultiplyAdd(a0, b2, c02);
        c03 = coopMultiplyAdd(a0, b3, c03);
        c10 = coopMultiplyAdd(a1, b0, c10);
        c11 = coopMultiplyAdd(a1, b1, c11);
        c12 = coopMultiplyAdd(a1, b2, c12);
        c13 = coopMultiplyAdd(a1, b3, c13);
    }

    let n0 = col0 + cb;
    store_block(t, sg, lane, c00, rb, n0);
    store_block(t, sg, lane, c01, rb, n0 + 16u);
    store_block(t, sg, lane, c02, rb, n0 + 32u);
    store_block(t, sg, lane, c03, rb, n0 + 48u);
    store_block(t, sg, lane, c10, rb + 16u, n0);
    store_block(t, sg, lane, c11, rb + 16u, n0 + 16u);
    store_block(t, sg, lane, c12, rb + 16u, n0 + 32u);
    store_block(t, sg, lane, c13, rb + 16u, n0 + 48u);
}

// The same over 128 rows × 128 weight rows a workgroup (a diagnostic variant: linear.rs,
// `Options::direct_tile_rows`), subgroup s owning rows 64·(s / 2) .. + 64 and weight rows
// 64·(s % 2) .. + 64: per 16 of k, four A and four B loads feed sixteen multiply-adds. The rows
// are tile_rows.wgsl's 64-row tiles 2·wg.y and 2·wg.y + 1 (its store checks a row against the
// dispatch's n, not against 64), x's copy padded to a multiple of 128 rows.
// Dispatch: (ceil(chunk_rows/BN), ceil(n/128), 1), workgroups of 128.
@compute @workgroup_size(128, 1, 1)
fn main_128(@builtin(workgroup_id) wg: vec3<u32>, @builtin(subgroup_id) sg: u32,
            @builtin(subgroup_invocation_id) lane: u32) {
    let t = tile_rows(2u * wg.y);
    let col0 = wg.x * BN;
    let rb = (sg / 2u) * 64u;
    let cb = (sg % 2u) * 64u;
    let x16 = 16u * p.x_stride;
    let xa = (t.first + rb) * p.x_stride + p.x_col;
    let wa = (t.w_row0 + col0 + cb) * p.w_stride;
    let w16 = 16u * p.w_stride;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
    var c20 = coop_mat16x16<f32, C>();
    var c21 = coop_mat16x16<f32, C>();
    var c22 = coop_mat16x16<f32, C>();
    var c23 = coop_mat16x16<f32, C>();
    var c30 = coop_mat16x16<f32, C>();
    var c31 = coop_mat16x16<f32, C>();
    var c32 = coop_mat16x16<f32, C>();
    var c33 = coop_mat16x16<f32, C>();

    for (var k0 = 0u; k0 < p.k; k0 += 16u) {
        let a0 = coopLoadT<coop_mat16x16<f16, A>>(&x[xa + k0], p.x_stride);
        let a1 = coopLoadT<coop_mat16x16<f16, A>>(&x[xa + x16 + k0], p.x_stride);
        let a2 = coopLoadT<coop_mat16x16<f16, A>>(&x[xa + 2u * x16 + k0], p.x_stride);
        let a3 = coopLoadT<coop_mat16x16<f16, A>>(&x[xa + 3u * x16 + k0], p.x_stride);
        let b0 = coopLoad<coop_mat16x16<f16, B>>(&w[wa + k0], p.w_stride);
        let b1 = coopLoad<coop_mat16x16<f16, B>>(&w[wa + w16 + k0], p.w_stride);
        let b2 = coopLoad<coop_mat16x16<f16, B>>(&w[wa + 2u * w16 + k0], p.w_stride);
        let b3 = coopLoad<coop_mat16x16<f16, B>>(&w[wa + 3u * w16 + k0], p.w_stride);
        c00 = coopMultiplyAdd(a0, b0, c00);
        c01 = coopMultiplyAdd(a0, b1, c01);
        c02 = coopMultiplyAdd(a0, b2, c02);
        c03 = coopMultiplyAdd(a0, b3, c03);
        c10 = coopMultiplyAdd(a1, b0, c10);
        c11 = coopMultiplyAdd(a1, b1, c11);
        c12 = coopMultiplyAdd(a1, b2, c12);
        c13 = coopMultiplyAdd(a1, b3, c13);
        c20 = coopMultiplyAdd(a2, b0, c20);
        c21 = coopMultiplyAdd(a2, b1, c21);
        c22 = coopMultiplyAdd(a2, b2, c22);
        c23 = coopMultiplyAdd(a2, b3, c23);
        c30 = coopMultiplyAdd(a3, b0, c30);
        c31 = coopMultiplyAdd(a3, b1, c31);
        c32 = coopMultiplyAdd(a3, b2, c32);
        c33 = coopMultiplyAdd(a3, b3, c33);
    }

    let n0 = col0 + cb;
    store_block(t, sg, lane, c00, rb, n0);
    store_block(t, sg, lane, c01, rb, n0 + 16u);
    store_block(t, sg, lane, c02, rb, n0 + 32u);
    store_block(t, sg, lane, c03, rb, n0 + 48u);
    store_block(t, sg, lane, c10, rb + 16u, n0);
    store_block(t, sg, lane, c11, rb + 16u, n0 + 16u);
    store_block(t, sg, lane, c12, rb + 16u, n0 + 32u);
    store_block(t, sg, lane, c13, rb + 16u, n0 + 48u);
    store_block(t, sg, lane, c20, rb + 32u, n0);
    store_block(t, sg, lane, c21, rb + 32u, n0 + 16u);
    store_block(t, sg, lane, c22, rb + 32u, n0 + 32u);
    store_block(t, sg, lane, c23, rb + 32u, n0 + 48u);
    store_block(t, sg, lane, c30, rb + 48u, n0);
    store_block(t, sg, lane, c31, rb + 48u, n0 + 16u);
    store_block(t, sg, lane, c32, rb + 48u, n0 + 32u);
    store_block(t, sg, lane, c33, rb + 48u, n0 + 48u);
}

// main_128's tile (128 rows × 128 weight rows, each subgroup 64 × 64) with both operands staged
// in workgroup memory 32 of k at a time: every thread copies four 16-byte pieces of x's rows and
// four of W's (`Piece`), the next step's pieces loaded into registers before this step's
// products, and the matrix loads read the tiles. Needs k a multiple of 32 and x_stride, x_col
// and w_stride multiples of 8 (linear.rs, `linear_direct`: k, 0 and k).
// The k blocks of 16 meet each accumulator in the same order as in main_128. The 1920×1080
// image's GEMMs on an H100: 54.4 ms in main_128, 23.8 here; 28.5 with two tiles of each
// operand (45 KiB) and one barrier a step (thirtieth sitting).
// Dispatch: (ceil(chunk_rows/BN), ceil(n/128), 1), workgroups of 128.
@compute @workgroup_size(128, 1, 1)
fn main_wide(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) li: u32,
               @builtin(subgroup_id) sg: u32, @builtin(subgroup_invocation_id) lane: u32) {
    let t = tile_rows(2u * wg.y);
    let col0 = wg.x * BN;
    let rb = (sg / 2u) * 64u;
    let cb = (sg % 2u) * 64u;
    // this thread's pieces: rows li / 4 + 32·i of either tile, k 8·(li % 4) .. + 8 of the step
    let piece = li % 4u;
    let row = li / 4u;
    let xw = ((t.first + row) * p.x_stride + p.x_col) / 8u + piece; // in 16-byte words
    let ww = (t.w_row0 + col0 + row) * (p.w_stride / 8u) + piece;
    let xw32 = 4u * p.x_stride; // 32 rows on, in 16-byte words
    let ww32 = 4u * p.w_stride;
    let at = row * WIDE_ROW + 2u * piece; // the first piece's place in either tile
    let at32 = 32u * WIDE_ROW;
    var px: array<Piece, 4>;
    var pw: array<Piece, 4>;
    for (var i = 0u; i < 4u; i++) {
        px[i] = x_wide[xw + i * xw32];
        pw[i] = w_wide[ww + i * ww32];
    }
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>();
    var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>();
    var c13 = coop_mat16x16<f32, C>();
    var c20 = coop_mat16x16<f32, C>();
    var c21 = coop_mat16x16<f32, C>();
    var c22 = coop_mat16x16<f32, C>();
    var c23 = coop_mat16x16<f32, C>();
    var c30 = coop_mat16x16<f32, C>();
    var c31 = coop_mat16x16<f32, C>();
    var c32 = coop_mat16x16<f32, C>();
    var c33 = coop_mat16x16<f32, C>();
    let xa = rb * WIDE_ROW;
    let wa = cb * WIDE_ROW;
    let r16 = 16u * WIDE_ROW;

    for (var k0 = 0u; k0 < p.k; k0 += 32u) {
        for (var i = 0u; i < 4u; i++) {
            let q = px[i];
            wide_x[at + i * at32] = q.lo;
            wide_x[at + i * at32 + 1u] = q.hi;
            let v = pw[i];
            wide_w[at + i * at32] = v.lo;
            wide_w[at + i * at32 + 1u] = v.hi;
        }
        workgroupBarrier();
        // the next step's pieces (the last step reloads its own: in bounds, unused)
        let next = select(k0, k0 + 32u, k0 + 32u < p.k) / 8u;
        for (var i = 0u; i < 4u; i++) {
            px[i] = x_wide[xw + next + i * xw32];
            pw[i] = w_wide[ww + next + i * ww32];
        }
        for (var h = 0u; h < 8u; h += 4u) { // k 0 .. 16, then 16 .. 32 of the step (in vec4<f16>)
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&wide_x[xa + h], WIDE_ROW);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&wide_x[xa + r16 + h], WIDE_ROW);
            let a2 = coopLoadT<coop_mat16x16<f16, A>>(&wide_x[xa + 2u * r16 + h], WIDE_ROW);
            let a3 = coopLoadT<coop_mat16x16<f16, A>>(&wide_x[xa + 3u * r16 + h], WIDE_ROW);
            let b0 = coopLoad<coop_mat16x16<f16, B>>(&wide_w[wa + h], WIDE_ROW);
            let b1 = coopLoad<coop_mat16x16<f16, B>>(&wide_w[wa + r16 + h], WIDE_ROW);
            let b2 = coopLoad<coop_mat16x16<f16, B>>(&wide_w[wa + 2u * r16 + h], WIDE_ROW);
            let b3 = coopLoad<coop_mat16x16<f16, B>>(&wide_w[wa + 3u * r16 + h], WIDE_ROW);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c02 = coopMultiplyAdd(a0, b2, c02);
            c03 = coopMultiplyAdd(a0, b3, c03);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
            c12 = coopMultiplyAdd(a1, b2, c12);
            c13 = coopMultiplyAdd(a1, b3, c13);
            c20 = coopMultiplyAdd(a2, b0, c20);
            c21 = coopMultiplyAdd(a2, b1, c21);
            c22 = coopMultiplyAdd(a2, b2, c22);
            c23 = coopMultiplyAdd(a2, b3, c23);
            c30 = coopMultiplyAdd(a3, b0, c30);
            c31 = coopMultiplyAdd(a3, b1, c31);
            c32 = coopMultiplyAdd(a3, b2, c32);
            c33 = coopMultiplyAdd(a3, b3, c33);
        }
        workgroupBarrier();
    }

    let n0 = col0 + cb;
    store_block(t, sg, lane, c00, rb, n0);
    store_block(t, sg, lane, c01, rb, n0 + 16u);
    store_block(t, sg, lane, c02, rb, n0 + 32u);
    store_block(t, sg, lane, c03, rb, n0 + 48u);
    store_block(t, sg, lane, c10, rb + 16u, n0);
    store_block(t, sg, lane, c11, rb + 16u, n0 + 16u);
    store_block(t, sg, lane, c12, rb + 16u, n0 + 32u);
    store_block(t, sg, lane, c13, rb + 16u, n0 + 48u);
    store_block(t, sg, lane, c20, rb + 32u, n0);
    store_block(t, sg, lane, c21, rb + 32u, n0 + 16u);
    store_block(t, sg, lane, c22, rb + 32u, n0 + 32u);
    store_block(t, sg, lane, c23, rb + 32u, n0 + 48u);
    store_block(t, sg, lane, c30, rb + 48u, n0);
    store_block(t, sg, lane, c31, rb + 48u, n0 + 16u);
    store_block(t, sg, lane, c32, rb + 48u, n0 + 32u);
    store_block(t, sg, lane, c33, rb + 48u, n0 + 48u);
}
