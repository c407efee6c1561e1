// Q2_K against int8 activations (dequant/q8x.wgsl): Σ_{i<32} w[32g + i] · q_i for the 32-value
// group g of a row, ggml's run (n, j) = (G / 4, G % 4) of the block (G = g % 8; dequant/q2_k.wgsl):
// per 16 values h, d·sc · Σ code·q − dmin·mn · Σ q, both sums integer (codes 0..3 as bytes of a
// word masked out of qs; Σ q as a dot with 0x01010101), the scales applied once per 16, as
// cuda/dequant.cuh's q8x_dot32 does. 84-byte blocks and offsets 16 + 32n keep qs word-aligned.
fn q8x_dot32(base: u32, g: u32, xq: array<u32, 8>) -> f32 {
    let o = (g / 8u) * 84u;
    let G = g % 8u;
    let shift = 2u * (G % 4u);
    let qs = base + (o + 16u + 32u * (G / 4u)) / 4u;
    let dd = w[base + (o + 80u) / 4u];
    let d = half_to_f32(dd & 0xffffu);
    let dmin = half_to_f32(dd >> 16u);
    var sum = 0.0;
    for (var h = 0u; h < 2u; h++) {
        var dot = 0;
        var qsum = 0;
        for (var j = 0u; j < 4u; j++) {
            dot += dot4I8Packed((w[qs + 4u * h + j] >> shift) & 0x03030303u, xq[4u * h + j]);
            qsum += dot4I8Packed(0x01010101u, xq[4u * h + j]);
        }
        let sc = byte_at(base, o + 2u * G + h);
        sum = fma(d * f32(sc & 0xfu), f32(dot), sum);
        sum = fma(-(dmin * f32(sc >> 4u)), f32(qsum), sum);
    }
    return sum;
}

// No tables to stage (dequant/q8x/iq2_xxs.wgsl's q8x_stage).
fn q8x_stage(li: u32) {}
