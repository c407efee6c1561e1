// IQ2_XXS against int8 activations (dequant/q8x.wgsl): Σ_{i<32} w[32g + i] · q_i for the 32-value
// group g of a row (the group's run of dequant/iq2_xxs.wgsl: four grid entries of 8 values, their
// sign patterns, one scale). Grid bytes are 8, 25 or 43, so positive as signed bytes:
// Σ s·grid·q = Σ grid·q − 2 Σ_{s<0} grid·q, each sum of four products one dot4I8Packed. The
// block scale multiplies the integer total once, as cuda/dequant.cuh's q8x_dot32 does.
// The grid is read from a copy in workgroup memory (q8x_stage) and the sign patterns computed
// (q8x_signs): from the table buffer, a subgroup's 32 lookups of random entries spread over up to
// the grid's 16 cache lines, each line a pass of the load (the routed gate and up of a decode
// step, H100, timed: 46.0 µs a dispatch with the table buffer's, 40.8 with the copy).
fn q8x_dot32(base: u32, g: u32, xq: array<u32, 8>) -> f32 {
    let o = (g / 8u) * 66u;
    let q = o + 2u + 8u * (g % 8u);
    let a0 = u32_at(base, q);
    let a1 = u32_at(base, q + 4u);
    var all = 0;
    var neg = 0;
    for (var l = 0u; l < 4u; l++) {
        let gi = (a0 >> (8u * l)) & 0xffu;
        let signs = q8x_signs((a1 >> (7u * l)) & 127u);
        let lo = q8x_grid[2u * gi];
        let hi = q8x_grid[2u * gi + 1u];
        all += dot4I8Packed(lo, xq[2u * l]) + dot4I8Packed(hi, xq[2u * l + 1u]);
        neg += dot4I8Packed(lo & q8x_byte_mask4(signs), xq[2u * l])
            + dot4I8Packed(hi & q8x_byte_mask4(signs >> 4u), xq[2u * l + 1u]);
    }
    let db = f16_at(base, o) * (0.5 + f32(a1 >> 28u)) * 0.25;
    return db * f32(all - 2 * neg);
}

// The grid's 512 words, copied into workgroup memory by every workgroup before its first barrier.
var<workgroup> q8x_grid: array<u32, 512>;

fn q8x_stage(li: u32) {
    for (var i = li; i < 512u; i += WG) {
        q8x_grid[i] = iq2xxs_grid(i);
    }
}

// ggml's ksigns_iq2xs[i]: the 7 sign bits and, as bit 7, their parity (each pattern has an even
// number of minus signs); formats.rs's tests check it against the table.
fn q8x_signs(i: u32) -> u32 {
    return i | ((countOneBits(i) & 1u) << 7u);
}
