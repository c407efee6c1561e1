// The tiled GEMM's body on f32 FMAs, every device: after a tile-load part (linear_tile.wgsl, or
// dequant/linear.wgsl for the block formats), which declares `load_tiles` and `store` and fills
// this body's tiles through `xs_at` and `ws_at`.
// Workgroup 16×16 invocations, a 64×64 output tile (BN = 64): 4×4 outputs per invocation (rows
// lid.y + 16·i, columns lid.x + 16·j), held in four vec4 accumulators.
//
// The tiles are k-major (a k's 64 rows side by side), as the products read them: an x value
// shared by 16 invocations, 16 consecutive W values. Within a k, row m sits at m ^ (k % 16) so
// the loads' stores, whose invocations walk k, spread over 16 banks (unswizzled, a warp's 32
// stores of one row went to one bank; k and k + 16 still share one); the swizzle moves only the
// low 4 bits, so an invocation's rows lid + 16·i stay 16 apart, and the tiles keep their size
// (16 KiB for exact precision's f32 operands: WebGPU's least workgroup memory).

const BN: u32 = 64u;

var<workgroup> xs: array<operand, BK * BM>;
var<workgroup> ws: array<operand, BK * BN>;

fn xs_at(m: u32, k: u32) -> u32 {
    return k * BM + (m ^ (k % 16u));
}

fn ws_at(n: u32, k: u32) -> u32 {
    return k * BN + (n ^ (k % 16u));
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let t = tile_rows(wg.y);
    let col0 = wg.x * BN;
    // Row i of this invocation's 4×4 block in acc_i, columns lid.x + 16·j in its components.
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);

    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        load_tiles(k0, t, col0, li);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk++) {
            // xs_at(lid.y + 16·i, kk) = xo + 16·i and ws_at(lid.x + 16·j, kk) = wo + 16·j: the
            // swizzle leaves bit 4 and above alone
            let xo = xs_at(lid.y, kk);
            let wo = ws_at(lid.x, kk);
            let b = vec4<f32>(vec4<operand>(ws[wo], ws[wo + 16u], ws[wo + 32u], ws[wo + 48u]));
            acc0 = fma(vec4<f32>(f32(xs[xo])), b, acc0);
            acc1 = fma(vec4<f32>(f32(xs[xo + 16u])), b, acc1);
            acc2 = fma(vec4<f32>(f32(xs[xo + 32u])), b, acc2);
            acc3 = fma(vec4<f32>(f32(xs[xo + 48u])), b, acc3);
        }
        workgroupBarrier();
    }

    store_row(t, lid.y, col0 + lid.x, acc0);
    store_row(t, lid.y + 16u, col0 + lid.x, acc1);
    store_row(t, lid.y + 32u, col0 + lid.x, acc2);
    store_row(t, lid.y + 48u, col0 + lid.x, acc3);
}

// Row m of the tile's rows, columns gc + 16·j from acc[j].
fn store_row(t: TileRows, m: u32, gc: u32, acc: vec4<f32>) {
    for (var j = 0u; j < 4u; j++) {
        store(t, m, gc + 16u * j, acc[j]);
    }
}
