// IQ2_XXS against int8 activations (dequant/q8x.wgsl): Σ_{i<32} w[32g + i] · q_i for the 32-value
// group g of a row (the group's run of dequant/iq2_xxs.wgsl: four grid entries of 8 values, their
// sign patterns, one scale). Grid bytes are 8, 25 or 43, so positive as signed bytes:
// Σ s·grid·q = Σ grid·q − 2 Σ_{s<0} grid·q, each sum of four products one dot4I8Packed. The
// block scale multiplies the integer total once, as cuda/dequant.cuh's q8x_dot32 does.
fn q8x_dot32(base: u32, g: u32, xq: array<u32, 8>) -> f32 {
    let o = (g / 8u) * 66u;
    let q = o + 2u + 8u * (g % 8u);
    let a0 = u32_at(base, q);
    let a1 = u32_at(base, q + 4u);
    var all = 0;
    var neg = 0;
    for (var l = 0u; l < 4u; l++) {
        let gi = (a0 >> (8u * l)) & 0xffu;
        let signs = ksigns_iq2xs((a1 >> (7u * l)) & 127u);
        let lo = iq2xxs_grid(2u * gi);
        let hi = iq2xxs_grid(2u * gi + 1u);
        all += dot4I8Packed(lo, xq[2u * l]) + dot4I8Packed(hi, xq[2u * l + 1u]);
        neg += dot4I8Packed(lo & q8x_byte_mask4(signs), xq[2u * l])
            + dot4I8Packed(hi & q8x_byte_mask4(signs >> 4u), xq[2u * l + 1u]);
    }
    let db = f16_at(base, o) * (0.5 + f32(a1 >> 28u)) * 0.25;
    return db * f32(all - 2 * neg);
}
