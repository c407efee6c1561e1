// Q8_0 against int8 activations (dequant/q8x.wgsl): Σ_{i<32} w[32g + i] · q_i for block g (34
// bytes: d f16, then 32 signed codes) as d · Σ code·q, eight dot4I8Packed. A block starts on an
// even byte, so its codes are the 9 words from its first, shifted by 16 bits when it starts
// mid-word (the shift chosen by `select`, as common.wgsl's loads).
fn q8x_dot32(base: u32, g: u32, xq: array<u32, 8>) -> f32 {
    let o = g * 34u;
    let i = base + o / 4u;
    let mid = (o % 4u) != 0u;
    var word = w[i];
    let d = half_to_f32(select(word & 0xffffu, word >> 16u, mid));
    var dot = 0;
    for (var j = 0u; j < 8u; j++) {
        let next = w[i + 1u + j];
        dot += dot4I8Packed(select((word >> 16u) | (next << 16u), next, mid), xq[j]);
        word = next;
    }
    return d * f32(dot);
}

// No tables to stage (dequant/q8x/iq2_xxs.wgsl's q8x_stage).
fn q8x_stage(li: u32) {}
